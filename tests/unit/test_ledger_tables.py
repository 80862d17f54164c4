"""``ledger/tables.py`` registers every table of the GPU database, and the migrations make exactly those tables.

Alembic's ``env.py`` imports that one module for its metadata: a ledger
module with a table that ``tables.py`` forgets would be invisible to it, and
a table defined outside the ledger (as the quota rows once were, in
``rules/``) would put database code where the pure rules are.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sqlalchemy

from workbench_spawner.ledger import tables
from workbench_spawner.ledger.store import AllocationStore

SPAWNER = Path(tables.__file__).resolve().parents[1]


def defines_a_table(path: Path) -> bool:
    return any(
        isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__tablename__" for t in node.targets)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
    )


def test_every_module_with_a_table_is_in_the_ledger_and_registered_by_tables():
    defining = {p for p in SPAWNER.rglob("*.py") if defines_a_table(p)}
    assert defining, "the guard finds no table at all"
    outside = sorted(str(p.relative_to(SPAWNER)) for p in defining if p.parent.name != "ledger")
    assert outside == [], "tables belong in ledger/"
    registered = {Path(m.__file__).resolve() for m in tables.MODULES}
    assert sorted(p.name for p in defining - registered) == []


def test_the_migrations_make_exactly_the_registered_tables(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'gpu.sqlite'}")
    try:
        made = set(sqlalchemy.inspect(store.engine).get_table_names()) - {"alembic_version"}
    finally:
        store.dispose()
    assert made == set(tables.metadata.tables)


def test_the_rules_touch_no_database():
    """``rules/`` is pure rules, functions of their inputs: no SQLAlchemy, no ledger (which is the database)."""
    touching = []
    for path in sorted((SPAWNER / "rules").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            touching += [f"{path.name}: {n}" for n in names if n.startswith(("sqlalchemy", "workbench_spawner.ledger"))]
    assert touching == []
