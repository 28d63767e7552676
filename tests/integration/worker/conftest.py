"""Fixtures of the worker's integration tests (defined in worker_harness.py)."""

from worker_harness import (  # noqa: F401
    pg_url,
    procs,
    project_id,
    store_env,
    tiny_assets,
    ty_env,
)
