"""Every table of the GPU database, registered on ``ledger.store.Base.metadata`` by importing this one module.

A table is defined in the ledger module that reads and writes it (the
store's leases and usage, each book's rows); Alembic's ``env.py`` and
anything else that needs the whole schema import this module instead of
naming each book, so a new book is added here once and cannot be missed.
A test (``tests/unit/test_ledger_tables.py``) checks that every ``ledger``
module defining a table is imported here.
"""

from __future__ import annotations

from workbench_spawner.ledger import (
    course_book,  # workbench_courses (0010)
    drain_book,  # gpu_drains (0005)
    idle_book,  # gpu_idle_tracks, gpu_idle_exemptions (0003)
    invite_book,  # workbench_invites (0010)
    notices,  # workbench_notices (0003)
    quota_book,  # gpu_quotas, gpu_session_limits (0001, 0003, 0005, 0006)
    reconcile_book,  # workbench_reconcile_fixes (0007)
    release_book,  # workbench_releases (0009)
    reservation_book,  # gpu_reservations (0004)
    settings_table,  # workbench_settings (0002)
    store,  # gpu_leases, gpu_usage (0001)
)
from workbench_spawner.ledger.store import Base

MODULES = (
    course_book,
    drain_book,
    idle_book,
    invite_book,
    notices,
    quota_book,
    reconcile_book,
    release_book,
    reservation_book,
    settings_table,
    store,
)
metadata = Base.metadata
