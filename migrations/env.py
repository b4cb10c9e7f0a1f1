"""Alembic environment: migrates the URL set by ``draftscope.store.db.alembic_config`` (batch mode on SQLite)."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import draftscope.store.models  # noqa: F401  (registers the tables on SQLModel.metadata)
from draftscope.store.db import make_engine

target_metadata = SQLModel.metadata


def run_migrations_offline() -> None:
    """Emit SQL for ``alembic upgrade --sql`` without a database connection."""
    url = context.config.get_main_option("sqlalchemy.url")
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through a live connection (one passed in ``config.attributes`` or a new engine)."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(context.config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
