# The worker image: Python plus tuneyard with its training extra, torch from PyTorch's CUDA
# wheel index at the version CI tests (constraints.txt pins torch==2.13.0; the CUDA wheel's
# `+cu128` label satisfies the pin, and its CUDA libraries come as wheels, so no CUDA base
# image is needed: the host's driver is mounted by the NVIDIA container runtime).
# Build from the repository root:
#   docker build -f deploy/worker.Dockerfile -t tuneyard-worker:$(python3 -c "import tomllib;print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])") .
# TORCH_INDEX_URL picks the CUDA build (cu126, cu128, ...); a CPU-only worker can use
# https://download.pytorch.org/whl/cpu.
FROM python:3.11-slim
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

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
COPY pyproject.toml constraints.txt README.md ./
COPY jobs ./jobs
COPY api ./api
COPY worker ./worker
COPY cli ./cli
COPY models ./models
COPY trainer ./trainer
COPY migrations ./migrations
COPY alembic.ini ./

# Every package at the version CI tested (constraints.txt); torch from the CUDA index;
# bitsandbytes for QLoRA recipes (`quantization:`).
# Editable: migrations find alembic.ini next to them in /app.
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" -c constraints.txt -e '.[train,qlora]' \
    && python -c "import torch, trainer; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && python -c "import re, sys, torch; pin = re.search(r'^torch==(\S+)$', open('constraints.txt').read(), re.M)[1]; sys.exit(torch.__version__.split('+')[0] != pin)"

USER tuneyard
# The worker holds no port: its heartbeat thread leaves a probe file that
# `tuneyard health worker` reads (liveness; `--ready` also needs the database).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD tuneyard health worker --max-age 60 || exit 1
CMD ["tuneyard", "worker"]
