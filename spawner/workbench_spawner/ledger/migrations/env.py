"""Alembic environment: one database, the allocation store's."""

from alembic import context
from sqlalchemy import engine_from_config, pool

from workbench_spawner.ledger import drain_book as _drain_book  # noqa: F401  (drained GPUs: 0005)
from workbench_spawner.ledger import idle_book as _idle_book  # noqa: F401  (idle tracks, exemptions: 0003)
from workbench_spawner.ledger import notices as _notices  # noqa: F401  (notices: 0003)
from workbench_spawner.ledger import reservation_book as _reservation_book  # noqa: F401  (reservations: 0004)
from workbench_spawner.ledger.store import Base
from workbench_spawner.policy import settings as _settings  # noqa: F401  (registers the settings table)
from workbench_spawner.rules import quota as _quota  # noqa: F401  (registers the quota tables)

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
