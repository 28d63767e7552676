"""Alembic environment: the URL comes from the Alembic config or `jobs.store.settings`.

`tuneyard migrate` (and `jobs.store.engine.upgrade_database`) pass the URL explicitly; plain
`alembic upgrade head` from the repo root falls back to `TUNEYARD_DATABASE_URL` or the
embedded SQLite default. SQLite runs in batch mode so later ALTERs work there too.
"""

from __future__ import annotations

from logging.config import fileConfig
from pathlib import Path

from alembic import context
from sqlalchemy.pool import NullPool

from jobs.store.engine import database_url, make_engine
from jobs.store.tables import Base

config = context.config
_has_ini = config.config_file_name and Path(config.config_file_name).exists()
if _has_ini and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or database_url()


def run_offline() -> None:
    context.configure(
        url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = make_engine(_url(), poolclass=NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
