"""Fixtures of the worker's integration tests (defined in worker_harness.py)."""

from worker_harness import pg_url, procs, project_id, tiny_assets, ty_env  # noqa: F401
