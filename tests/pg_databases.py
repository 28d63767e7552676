"""Throwaway PostgreSQL databases for the tests that need a real one.

Databases are named `tuneyard_api_test_<random>`, created and dropped through the
`postgres` database on 127.0.0.1:5432 (trust auth). `tests/` is on `sys.path` (its
conftest lives there), so any test folder imports this module by name.
"""

from __future__ import annotations

import uuid

import psycopg

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def create_pg_database() -> str:
    name = f"tuneyard_api_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def drop_pg_database(url: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
