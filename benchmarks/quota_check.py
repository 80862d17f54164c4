"""How long the quota check adds to a placement: ``AllocationStore.allocate`` with and without limits.

The GPU quota is checked inside the transaction that writes a lease (``ledger.lease_limits``), so every
placement of a start pays for it: a read of the user's own leases (indexed by user) and, where the quota
has a GPU-hours budget, of the user's week in the usage ledger. This measures that cost where it is paid,
side by side in one run: the same allocation (one GPU of 16 free, for a student who holds one more on
another server) timed without limits, with a count-only quota, and with a count and a GPU-hours budget,
in turn, so the three see the same database and the same load. The table holds ``--leases`` (2,000)
leases of other users and ``--ledger`` (20,000) finished ones, 20 of them the student's.

Each allocation is released afterwards (not timed) and the student's new ledger row deleted, so every
timed allocation meets the same table. On SQLite (a file in a temporary directory) and on PostgreSQL (a
fresh database on the tests' server: ``WORKBENCH_TEST_POSTGRES_URL`` or ``tests/postgres/cluster.sh
start``; left out with a note when there is none).

    .venv/bin/python benchmarks/quota_check.py [--leases 2000] [--ledger 20000] [--rounds 300] [--out FILE]

The figure the issue asks for: the median the check adds, ``with`` minus ``without``, at 2,000 leases.
Next to it, the check alone (``check_alone``): the same check timed inside a write transaction, without the
allocation around it, whose own time (and its spread on a shared host) is far larger than the check's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the tests' PostgreSQL helper

from sqlalchemy import delete, insert

from workbench_spawner.ledger.connection import lock_leases
from workbench_spawner.ledger.lease_limits import LeaseLimits
from workbench_spawner.ledger.store import AllocationStore, LeaseRow, UsageRow, utcnow

STUDENT = "student"
FREE = [f"GPU-free-{i:02d}" for i in range(16)]
VARIANTS: dict[str, LeaseLimits | None] = {
    "without": None,
    "max_gpus": LeaseLimits(max_gpus=2),
    "max_gpus+gpu_hours": LeaseLimits(max_gpus=2, gpu_hours_per_week=1000.0),
}


def fill(store: AllocationStore, leases: int, ledger: int) -> None:
    """``leases`` leases of other users (one GPU each), ``ledger`` finished leases, 20 of them the student's,
    and the student's other server (one GPU): written in bulk, as a busy week leaves them."""
    now = utcnow()
    rows = [
        {"gpu_uuid": f"GPU-held-{i:05d}", "slot": 0, "user": f"u{i:05d}", "server": "", "since": now, "groups": "[]"}
        for i in range(leases)
    ]
    rows.append({"gpu_uuid": "GPU-student", "slot": 0, "user": STUDENT, "server": "big", "since": now, "groups": "[]"})
    used = [
        {
            "gpu_uuid": f"GPU-held-{i % max(leases, 1):05d}",
            "user": STUDENT if i < 20 else f"u{i % max(leases, 1):05d}",
            "server": "",
            "started": now - timedelta(hours=1 + i % 150),
            "ended": now - timedelta(minutes=i % 150),
            "reason": "stopped",
        }
        for i in range(ledger)
    ]
    with store.writes().begin() as session:
        session.execute(insert(LeaseRow), rows)
        if used:
            session.execute(insert(UsageRow), used)


def measure(store: AllocationStore, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per allocation, by variant; the variants take turns, each round in another order."""
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            began = time.perf_counter()
            lease = store.allocate(STUDENT, "small", 1, FREE, node="n1", limits=VARIANTS[name])
            times[name].append((time.perf_counter() - began) * 1000)
            assert lease is not None, "the student is within the quota: the allocation must succeed"
            store.release(STUDENT, "small", "bench")
            with store.writes().begin() as session:
                session.execute(delete(UsageRow).where(UsageRow.user == STUDENT, UsageRow.reason == "bench"))
    return times


def check_alone(store: AllocationStore, rounds: int) -> dict[str, dict[str, float]]:
    """Milliseconds of the check itself, inside a write transaction after ``lock_leases`` as ``allocate`` runs it:
    the work a placement adds, without the allocation's own time and its noise around it."""
    times: dict[str, list[float]] = {name: [] for name, limits in VARIANTS.items() if limits is not None}
    for _ in range(rounds):
        for name in times:
            limits = VARIANTS[name]
            assert limits is not None
            with store.writes().begin() as session:
                lock_leases(session)
                began = time.perf_counter()
                store._check(session, limits, STUDENT, "small", 1)
                times[name].append((time.perf_counter() - began) * 1000)
    return {
        name: {
            "median_ms": round(statistics.median(values), 3),
            "p95_ms": round(sorted(values)[int(0.95 * (len(values) - 1))], 3),
        }
        for name, values in times.items()
    }


def summary(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    base = statistics.median(times["without"])
    for name, values in times.items():
        ordered = sorted(values)
        median = statistics.median(ordered)
        out[name] = {
            "median_ms": round(median, 3),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
            "added_median_ms": round(median - base, 3),
        }
    return out


@contextmanager
def sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="wb-quota-") as tmp:
        yield f"sqlite:///{Path(tmp) / 'bench.sqlite'}"


@contextmanager
def postgres_url() -> Iterator[str]:
    from tests.postgres.server import fresh_database

    with fresh_database("wb_bench") as url:
        yield url


def run(open_url: Callable[[], AbstractContextManager[str]], leases: int, ledger: int, rounds: int) -> dict:
    with open_url() as url:
        store = AllocationStore(url)
        try:
            fill(store, leases, ledger)
            measure(store, 10)  # warm the connections and caches
            times = measure(store, rounds)
            alone = check_alone(store, rounds)
        finally:
            store.dispose()
    return {"rounds": rounds, "allocate": summary(times), "check_alone": alone}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=2000)
    parser.add_argument("--ledger", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = parser.parse_args()
    result: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
        "python": platform.python_version(),
        "leases": args.leases,
        "ledger_rows": args.ledger,
        "sqlite": run(sqlite_url, args.leases, args.ledger, args.rounds),
    }
    try:
        result["postgresql"] = run(postgres_url, args.leases, args.ledger, args.rounds)
    except BaseException as exc:  # noqa: BLE001 - pytest's skip (no server) is a BaseException: say so, go on
        result["postgresql"] = f"not measured: {exc}"
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
