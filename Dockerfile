# Tessera on CPU, for local and Kubernetes use. Build from the repository root:
#
#   docker build -t tessera .
#
# Run it as Infinity's and TEI's images are run, with their flags or Tessera's own (README, "Docker"):
#
#   docker run -p 8000:8000 -v tessera-cache:/cache tessera --model-id BAAI/bge-small-en-v1.5
#   docker run -p 8000:8000 -v tessera-cache:/cache tessera v2 --model-id BAAI/bge-small-en-v1.5
#   docker run -p 8000:8000 tessera        # the embedded all-MiniLM-L6-v2, offline
#
# The ENTRYPOINT is the `tessera` command (`python -m core`): the arguments are `serve`'s, Infinity's
# `v2 ...` or TEI's `--model-id ...`. Hub models are fetched into HF_HOME and ONNX graphs exported on the first
# start into the export cache, both on the /cache volume: a later container finds them there. The server runs
# as the unprivileged user `tessera`; the HEALTHCHECK asks /health on the port the server was given.
FROM python:3.11-slim
# CPU wheels of torch (for folders without an ONNX graph: exported on first start, or served with torch)
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# TOKENIZERS_PARALLELISM is a Hugging Face tokenizers switch, not a credential.
# hadolint ignore=DL3064
ENV PYTHONUNBUFFERED=1 \
    TESSERA_HOST=0.0.0.0 \
    TESSERA_PORT=8000 \
    TESSERA_CACHE_DIR=/cache/tessera \
    HF_HOME=/cache/huggingface \
    TOKENIZERS_PARALLELISM=false
WORKDIR /opt/tessera
COPY docker/requirements-cpu.txt ./
# TORCH_SPEC is pinned by default; a build argument lets another pin be chosen.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}" \
 && pip install --no-cache-dir -r requirements-cpu.txt
COPY pyproject.toml ./
COPY core ./core
RUN (test -f README.md || echo "# Tessera" > README.md) \
 && pip install --no-cache-dir --no-deps . \
 && useradd --create-home --uid 10001 tessera \
 && mkdir -p /cache \
 && chown tessera /cache
USER 10001
VOLUME ["/cache"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 CMD ["python", "-m", "core.healthcheck"]
ENTRYPOINT ["tessera"]
CMD ["serve"]
