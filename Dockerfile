# mini_triton server image.
#
#   docker build -t mini-triton .
#   docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#       -v "$PWD/model_repository:/models:ro" mini-triton
#
# The build context is limited by .dockerignore to what the wheel needs.

ARG PYTHON_VERSION=3.11

# --- build: install the package from this checkout into a virtualenv -------
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install ".[onnx,pipeline]"

# --- runtime ---------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim
ARG UID=1000
RUN groupadd --system --gid "${UID}" triton \
    && useradd --system --uid "${UID}" --gid triton --home-dir /home/triton \
       --create-home --shell /usr/sbin/nologin triton
COPY --from=build /opt/venv /opt/venv
# The default repository is baked in so the image serves on its own;
# mounting a repository at /models replaces it.
COPY --chown=triton:triton model_repository/ /models/
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER triton
WORKDIR /home/triton

# HTTP/REST, gRPC, Prometheus metrics.
EXPOSE 8000 8001 8002

# Healthy means ready: every model that should be loaded is loaded.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status == 200 else 1)"]

# Exec form: the server is PID 1 and receives SIGTERM itself, then drains
# in-flight requests for up to --exit-timeout-secs before exiting 0. Give the
# container at least that long to stop (docker stop -t, compose
# stop_grace_period, Kubernetes terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
ENTRYPOINT ["mini-triton"]
CMD ["--model-repository=/models", "--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"]
