# kubedevice container image: the generic /dev plugin, the NVIDIA GPU plugin and every other
# subcommand. Every Python dependency is pinned by constraints.txt.
#   docker build -t kubedevice:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY constraints.txt pyproject.toml README.md LICENSE ./
COPY src ./src
# Wheels for kubedevice with the generic, nvidia and dra extras and everything they need, at the
# pinned versions. Not the official Kubernetes client (kube-client): in a pod the DRA drivers
# read the service account themselves.
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt ".[generic,nvidia,dra]" dumb-init

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kubedevice" \
      org.opencontainers.image.description="Kubernetes device plugins in Python: generic /dev plugin, NVIDIA GPU plugin, kubelet emulator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kubedevice/kubedevice" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir --no-index --find-links /wheels -c /tmp/constraints.txt \
        "kubedevice[generic,nvidia,dra]" dumb-init \
    && rm -rf /wheels /tmp/constraints.txt
# The plugin must create its socket in the kubelet's root-owned 0750 directory, so it runs as
# uid 0, but the DaemonSet drops every capability and has a read-only root file system.
USER 0:0
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 KUBEDEVICE_LOG_FORMAT=json
# dumb-init is pid 1: it forwards signals to kubedevice and reaps the children that health
# commands leave behind.
ENTRYPOINT ["dumb-init", "--", "kubedevice"]
CMD ["run", "--config", "/etc/kubedevice/config.yaml", "--dev-root", "/host/dev", "--sys-root", "/host/sys"]
