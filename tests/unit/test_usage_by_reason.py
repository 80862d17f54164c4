"""Usage reports group GPU-hours by why each lease ended: ``gpu_hours_by_reason``, ``GET api/usage``
(validated against the OpenAPI document) and ``workbench usage``."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from sqlalchemy import event
from tornado.httpclient import AsyncHTTPClient

from tests.service.openapi_check import check
from tests.unit.test_quota_service import PREFIX, service_document
from tests.unit.test_quota_service import live_service as live_service  # a fixture, for pytest to find
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.gpu_hours import HELD_NOW, gpu_hours_by_reason, gpu_hours_by_user
from workbench_spawner.ledger.store import AllocationStore, UsageRow, utcnow


def ended(store: AllocationStore, user: str, hours: float, reason: str, share: float = 1.0) -> None:
    """A finished lease of ``hours`` that ended an hour ago, in the usage ledger."""
    end = utcnow() - timedelta(hours=1)
    with store.writes().begin() as session:
        session.add(
            UsageRow(
                gpu_uuid="GPU-x",
                user=user,
                server="",
                started=end - timedelta(hours=hours),
                ended=end,
                reason=reason,
                share=share,
            )
        )


def fill(store: AllocationStore) -> None:
    ended(store, "ann", 2.0, reasons.STOPPED_BY_USER)
    ended(store, "ann", 1.0, reasons.STOPPED_BY_USER)
    ended(store, "ann", 0.5, "reclaimed: GPU idle 30 min")
    ended(store, "ann", 1.5, "reclaimed: GPU idle 45 min")
    ended(store, "ann", 7.0, reasons.OUT_OF_MEMORY, share=1 / 7)  # a 1g slice: 1 GPU-hour
    ended(store, "bob", 3.0, "")  # written before reasons were kept
    store.allocate("bob", "", 1, ["GPU-held"])


def test_hours_by_reason_kind_add_up_to_the_total(store):
    fill(store)
    # One "now" for both reads: bob's lease is still held, so its hours grow between two calls that each
    # took their own clock (a clean-clone CI on a loaded machine once read 3.00000052 against 3.00000405).
    now = utcnow()
    by_reason = gpu_hours_by_reason(store, now)
    assert by_reason["ann"] == {
        reasons.STOPPED_BY_USER: pytest.approx(3.0),
        "reclaimed": pytest.approx(2.0),
        reasons.OUT_OF_MEMORY: pytest.approx(1.0),
    }
    assert set(by_reason["bob"]) == {"unknown", HELD_NOW}
    assert by_reason["bob"]["unknown"] == pytest.approx(3.0)
    totals = gpu_hours_by_user(store, now)
    for user, kinds in by_reason.items():
        # The same rows and the same clock: equal up to the rounding of summing in another order.
        assert sum(kinds.values()) == pytest.approx(totals[user], rel=1e-12, abs=0)
    assert gpu_hours_by_reason(store, now, user="bob").keys() == {"bob"}


def test_a_lease_released_while_the_hours_are_read_counts_once(store):
    """The ledger's rows and the leases held now are read from one snapshot: a release that commits between
    the two reads moves the lease into the ledger after the ledger was read, and two separate reads then
    counted it nowhere (a total that dips while a student stops a server)."""
    start = utcnow() - timedelta(hours=2)
    store.adopt("cid", "", ["GPU-a"], ref="", since=start)
    now = utcnow()
    released: list[tuple[str, ...] | None] = []

    @event.listens_for(store.read_engine, "after_cursor_execute")
    def release_between_reads(conn, cursor, statement, parameters, context, executemany):
        # On PostgreSQL the store reads and writes through one engine: the release's own statements come here too.
        if statement.lstrip().upper().startswith("SELECT") and "gpu_usage" in statement and not released:
            released.append(None)
            released[0] = store.release("cid", "", reasons.STOPPED_BY_USER)

    try:
        hours = gpu_hours_by_user(store, now, user="cid")
    finally:
        event.remove(store.read_engine, "after_cursor_execute", release_between_reads)
    assert released == [("GPU-a",)]  # the release really happened between the two reads
    assert hours["cid"] == pytest.approx(2.0, abs=1e-3)


async def test_the_usage_api_answers_by_reason_and_the_cli_prints_it(live_service, store, capsys):
    from workbench_hub.cli import main

    fill(store)
    r = await AsyncHTTPClient().fetch(f"{live_service}{PREFIX}api/usage?user=ann")
    check(service_document(), "GET", "api/usage?user=ann", r.code, r.headers["Content-Type"], r.body)
    (ann,) = json.loads(r.body)["users"]
    assert ann["gpu_hours_week"] == pytest.approx(6.0, abs=1e-3)
    assert ann["gpu_hours_week_by_reason"] == {
        reasons.OUT_OF_MEMORY: pytest.approx(1.0, abs=1e-3),
        "reclaimed": pytest.approx(2.0, abs=1e-3),
        reasons.STOPPED_BY_USER: pytest.approx(3.0, abs=1e-3),
    }
    assert await asyncio.to_thread(main, ["--url", live_service, "--token", "t", "usage", "ann"]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours from " in out
    assert "by why the leases ended" in out
    assert "ann: 6 GPU-hours, 0 GPU(s) held now: 3 stopped by the user, 2 reclaimed, 1 out of memory" in out


def test_the_cli_names_each_server_where_a_student_has_named_ones():
    from workbench_hub.cli import _usage_line

    row = {"name": "ann", "gpu_hours_week": 12.5, "held_gpus": 1, "gpu_hours_week_by_reason": {HELD_NOW: 12.5}}
    alone = _usage_line({**row, "servers": {"": {"gpu_hours_week": 12.5, "held_gpus": 1}}})
    assert alone == "ann: 12.5 GPU-hours, 1 GPU(s) held now: 12.5 held now"
    split = {"": {"gpu_hours_week": 0.5, "held_gpus": 0}, "big": {"gpu_hours_week": 12.0, "held_gpus": 1}}
    assert _usage_line({**row, "servers": split}).splitlines()[1] == (
        "  by server: default server 0.5 GPU-hours, 0 held now; big 12 GPU-hours, 1 held now"
    )
