# eorouter in a container, for users who have an image registry.
#   docker build -t eorouter .
#   docker run --rm -v $PWD/router.toml:/etc/eorouter/router.toml -p 5672:5672 eorouter
# The config's listeners must bind 0.0.0.0 inside the container to be reachable (or run with --network host),
# and its [router] data_dir must be /var/lib/eorouter (the volume; the default, next to the config, is read-only).
# The container suite runs against this image too: EOROUTER_IMAGE=eorouter python -m pytest -m containers tests/containers
# (scripts/containers builds a registry-free image with the same entrypoint, config and data paths instead).
# tests/containers/test_dockerfile.py builds this file wherever its base image is already in the engine
# (BASE: any Debian-based image with Python 3.11+ as python3; python3-dev is installed when its headers are missing).
ARG BASE=python:3.11-slim

# The build stage: a C compiler for the compiled fast path (setup.py builds router/adapter/_fastpath.c; without
# a compiler pip installs quietly without it and the router runs the slower Python path), and the venv.
FROM ${BASE} AS build
RUN apt-get update \
    && include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
    && headers="$([ -f "$include/Python.h" ] || echo python3-dev)" \
    && apt-get install -y --no-install-recommends gcc libc6-dev $headers \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY router ./router
COPY spark ./spark
COPY eorouter_tools ./eorouter_tools
# The check runs from / so that it imports the installed package, not /src/router: the build fails here
# when the fast path did not compile.
RUN python3 -m venv /opt/eorouter \
    && /opt/eorouter/bin/pip install --no-cache-dir . \
    && cd / && /opt/eorouter/bin/python -c "from router.adapter import fastpath; \
assert fastpath.status == 'compiled', 'the compiled fast path is missing: ' + fastpath.status"

# The image: the base, the venv, and an unprivileged user; no compiler.
FROM ${BASE}
COPY --from=build /opt/eorouter /opt/eorouter
ENV PATH=/opt/eorouter/bin:$PATH
RUN useradd --system --home /var/lib/eorouter eorouter \
    && mkdir -p /var/lib/eorouter /etc/eorouter && chown eorouter /var/lib/eorouter
USER eorouter
VOLUME /var/lib/eorouter
EXPOSE 5672 5673
ENTRYPOINT ["eorouter", "run", "--config", "/etc/eorouter/router.toml"]
