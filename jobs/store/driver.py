"""Hot statements sent straight to the driver: a submit's key lookup and its insert.

`Connection.execute` on a compiled Core statement costs ~80 µs of CPU beyond the driver's
own call (cache lookup, parameter processing, an execution context, a result object), in
a process whose submits are bound by one core. A `DriverStatement` compiles its statement
once for psycopg, keeps the columns' bind processors (JSON text, UTC timestamps), and on
a psycopg connection in autocommit (the API's `read_session`) runs the SQL on the DBAPI
connection itself. Errors come out as SQLAlchemy's (`IntegrityError` for a unique
violation, `OperationalError` for a lost server), a connection the driver reports broken
is invalidated, so the pool connects afresh as it would after `Connection.execute`, and
the engine's `before_cursor_execute` / `after_cursor_execute` listeners still hear each
statement (with no execution context). Other dialects (SQLite), and connections inside a
transaction, go through `Connection.execute` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable


class _Compiled:
    def __init__(self, statement: Any, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        # Values the statement itself carries (`id == 1` binds `id_1`), then the caller's.
        self.defaults = {
            key: bind.effective_value for key, bind in compiled.binds.items() if not bind.required
        }
        self.processors: list[tuple[str, Callable[[Any], Any]]] = []
        for key, bind in compiled.binds.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                self.processors.append((key, process))


class DriverStatement:
    """One Core statement, run on psycopg's connection directly (see the module)."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._compiled: _Compiled | None = None  # psycopg's form, the only one compiled

    def _for(self, conn: Connection) -> _Compiled | None:
        """The compiled form for a psycopg connection in autocommit, else None. (In a
        transaction SQLAlchemy must see every statement: it begins and commits.)"""
        dialect = conn.dialect
        if dialect.name != "postgresql" or dialect.driver != "psycopg":
            return None
        if not getattr(conn.connection.driver_connection, "autocommit", False):
            return None
        if self._compiled is None:
            self._compiled = _Compiled(self.statement, dialect)
        return self._compiled

    def first(self, conn: Connection, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """The first row as a tuple (columns in the statement's order), or None."""
        compiled = self._for(conn)
        if compiled is None:
            row = conn.execute(self.statement, params).first()
            return None if row is None else tuple(row)
        return self._run(conn, compiled, params, fetch=True)

    def run(self, conn: Connection, params: dict[str, Any]) -> None:
        """Execute for its effect."""
        compiled = self._for(conn)
        if compiled is None:
            conn.execute(self.statement, params)
            return
        self._run(conn, compiled, params, fetch=False)

    @staticmethod
    def _run(conn: Connection, compiled: _Compiled, params: dict[str, Any], fetch: bool) -> Any:
        values = {**compiled.defaults, **params}
        for key, process in compiled.processors:
            if key in values:
                values[key] = process(values[key])
        raw = conn.connection.driver_connection
        error = conn.dialect.loaded_dbapi.Error
        events = conn.dispatch
        try:
            cursor = raw.cursor()
            if events.before_cursor_execute:
                events.before_cursor_execute(conn, cursor, compiled.sql, values, None, False)
            cursor.execute(compiled.sql, values)
            if events.after_cursor_execute:
                events.after_cursor_execute(conn, cursor, compiled.sql, values, None, False)
            return cursor.fetchone() if fetch else None
        except error as exc:
            if getattr(raw, "broken", False) or getattr(raw, "closed", False):
                conn.invalidate(exc)
            raise DBAPIError.instance(compiled.sql, values, exc, error) from exc
