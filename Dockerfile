# eorouter in a container, for users who have an image registry.
#   docker build -t eorouter .
#   docker run --rm -v $PWD/router.toml:/etc/eorouter/router.toml -p 5672:5672 eorouter
# The config's listeners must bind 0.0.0.0 inside the container to be reachable.
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
