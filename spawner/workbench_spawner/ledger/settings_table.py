"""The ``workbench_settings`` table: small JSON documents by key, shared by the hub's processes.

The hub writes the GPU policy's resolved settings here (``policy/settings.py``,
key ``policy``) and the workbench service reads them; the hub's id, a MIG
layout change waiting for idle GPUs and each engine's GPUs by node
(Slurm's, Kubernetes') are documents of their own under other keys. The row
is defined here, in the ledger, with every other table of the GPU database,
so that the policy code above it stays free of table definitions.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.store import Base


class SettingsRow(Base):
    """One JSON document per key; the hub writes, the service reads."""

    __tablename__ = "workbench_settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True))
