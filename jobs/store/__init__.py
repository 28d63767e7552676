"""Persistence: everything tuneyard keeps in its database, and nothing that decides statuses.

Owns the tables (`tables`), engines and sessions (`engine`), the status values (`status`),
job queries for the API (`queries`), idempotent ingestion of what the trainer wrote
(`ingest`), worker leases and heartbeats (`leases`), API keys (`api_keys`) and the
services' settings (`settings`). Status changes are `jobs.orchestration`'s; the only status
this room writes is a new job's `queued`.

May import: the standard library, sqlalchemy, `jobs.recipe` (alembic inside functions).
"""
