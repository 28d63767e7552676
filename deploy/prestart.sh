#!/bin/sh
# Prestart: wait for the database, then bring its schema to the latest revision.
# Runs once per release (compose `migrate` service, Kubernetes migration Job) before the API
# and workers start. TUNEYARD_DATABASE_URL selects the database; TUNEYARD_DB_WAIT_SECONDS
# bounds the wait (default 60).
set -eu

WAIT="${TUNEYARD_DB_WAIT_SECONDS:-60}"
if command -v tuneyard >/dev/null 2>&1; then
    exec tuneyard migrate --wait "$WAIT"
fi
exec python -m cli.main migrate --wait "$WAIT"
