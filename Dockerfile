# eorouter in a container, for users who have an image registry.
#   docker build -t eorouter .
#   docker run --rm -v $PWD/router.toml:/etc/eorouter/router.toml -p 5672:5672 eorouter
# The config's listeners must bind 0.0.0.0 inside the container to be reachable (or run with --network host),
# and its [router] data_dir must be /var/lib/eorouter (the volume; the default, next to the config, is read-only).
# The container suite runs against this image too: EOROUTER_IMAGE=eorouter python -m pytest -m containers tests/containers
# (scripts/containers builds a registry-free image with the same entrypoint, config and data paths instead).
FROM python:3.11-slim
WORKDIR /opt/eorouter
COPY pyproject.toml README.md ./
COPY router ./router
COPY spark ./spark
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/eorouter eorouter \
    && mkdir -p /var/lib/eorouter /etc/eorouter && chown eorouter /var/lib/eorouter
USER eorouter
VOLUME /var/lib/eorouter
EXPOSE 5672 5673
ENTRYPOINT ["eorouter", "run", "--config", "/etc/eorouter/router.toml"]
