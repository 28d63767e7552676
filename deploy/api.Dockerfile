# The API image: FastAPI + SQLAlchemy + Celery client, and no torch.
# Build from the repository root:  docker build -f deploy/api.Dockerfile -t tuneyard-api .
# The same image runs the API, the migration step and the scheduler (reconciler).
FROM python:3.11-slim AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TUNEYARD_HOME=/var/lib/tuneyard

RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 tuneyard \
    && mkdir -p /var/lib/tuneyard && chown tuneyard /var/lib/tuneyard

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
COPY deploy/prestart.sh ./deploy/prestart.sh

# No "[train]" extra: the API never imports torch, transformers or peft.
# Editable: migrations find alembic.ini next to them in /app.
RUN pip install -c constraints.txt -e . \
    && python -c "import api.main, sys; assert 'torch' not in sys.modules"

USER tuneyard
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8000/healthz || exit 1
CMD ["tuneyard", "api", "--host", "0.0.0.0", "--port", "8000"]
