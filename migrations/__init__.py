"""Alembic migrations for the tuneyard database (PostgreSQL and SQLite)."""
