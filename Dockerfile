# kubedevice container image: the generic device plugin (and every other subcommand).
# Build: docker build -t kubedevice:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[generic]"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="kubedevice" \
      org.opencontainers.image.description="Kubernetes device plugins in Python"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The plugin must create its socket in the kubelet's root-owned 0750 directory, so it runs as
# uid 0, but the DaemonSet drops every capability and mounts /dev and /sys read-only.
ENV PYTHONUNBUFFERED=1 KUBEDEVICE_LOG_FORMAT=json
ENTRYPOINT ["kubedevice"]
CMD ["run", "--config", "/etc/kubedevice/config.yaml"]
