# Corral's router image: the OpenAI-compatible router (and the rest of the `corral` CLI) on a slim Python.
# Build from the repository root after `scripts/check-package` (or `python -m build`) has put the wheel in
# dist/; see docs/images.md.
FROM python:3.11-slim-bookworm

ARG CORRAL_VERSION=0.1.0
LABEL org.opencontainers.image.title="corral-router" \
      org.opencontainers.image.description="Corral: the OpenAI-compatible router in front of a vLLM fleet" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${CORRAL_VERSION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The runtime dependencies only (no dev or test packages): the wheel's own requirements, and the `k8s`
# extra: the rendered router runs `--discovery k8s`, which imports kubernetes-asyncio.
COPY dist/corral-${CORRAL_VERSION}-py3-none-any.whl /tmp/
RUN pip install --no-cache-dir "/tmp/corral-${CORRAL_VERSION}-py3-none-any.whl[k8s]" \
    && rm /tmp/corral-*.whl \
    && groupadd --gid 1000 corral \
    && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin corral

# uid/gid 1000: the user `corral k8s render` runs every container as (security.run_as_user).
USER 1000:1000
WORKDIR /home/corral

# The router's OpenAI port (`corral router --port`, 8000 by default in rendered manifests).
EXPOSE 8000
# Liveness: the router answers GET /health; python is in the image, curl is not.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]

ENTRYPOINT ["corral", "router"]
CMD ["--help"]
