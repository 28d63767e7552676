# The worker image: a CUDA PyTorch base plus tuneyard with its training extra.
# Build from the repository root:  docker build -f deploy/worker.Dockerfile -t tuneyard-worker .
# PYTORCH_IMAGE picks the CUDA/PyTorch base; keep its torch at or above pyproject's floor.
ARG PYTORCH_IMAGE=pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime
FROM ${PYTORCH_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TUNEYARD_HOME=/var/lib/tuneyard \
    TUNEYARD_RUNS_DIR=/var/lib/tuneyard/runs \
    OMP_NUM_THREADS=4

RUN useradd --create-home --uid 10001 tuneyard \
    && mkdir -p /var/lib/tuneyard/runs /data \
    && chown -R tuneyard /var/lib/tuneyard /data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY jobs ./jobs
COPY api ./api
COPY worker ./worker
COPY cli ./cli
COPY models ./models
COPY trainer ./trainer
COPY migrations ./migrations
COPY alembic.ini ./

# Keep the base image's CUDA build of torch: constraints.txt pins the CPU wheel used in CI,
# so it is not applied here, and pip sees torch as already satisfied.
# Editable: migrations find alembic.ini next to them in /app.
RUN pip install -e '.[train]' \
    && python -c "import torch, trainer; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

USER tuneyard
# The worker holds no port; its liveness is the heartbeat it writes to the database.
CMD ["tuneyard", "worker"]
