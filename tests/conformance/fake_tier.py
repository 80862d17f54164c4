"""The fakes' tier: the reference implementations, driven in-process as a hub would drive them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from jupyterhub.spawner import SpawnException

from tests.conformance.tiers import GPUS, QUOTA, Spawned
from tests.unit.fake_backends import FakeWorld
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.reconcile_book import ReconcileBook
from workbench_spawner.policy.gpu_policy import _policies


class FakeTier:
    """The reference implementations (``tests/unit/fake_backends.py``), driven in-process.

    The "hub" here is this object: it keeps one spawner per user, polls them
    as JupyterHub does, and restarts by dropping the policy and loading each
    server's saved state into a new spawner (what the hub does with its
    database)."""

    def __init__(self, spawner_cls: type, db_path: str):
        self.world = FakeWorld()
        self.cls = type(f"Conforming{spawner_cls.__name__}", (spawner_cls,), {"world": self.world})
        self.mode = spawner_cls.placement_mode
        self.db_url = f"sqlite:///{db_path}"
        self.loop = asyncio.new_event_loop()
        self.spawners: dict[str, object] = {}
        self.failing_start = False
        _policies.clear()

    def close(self) -> None:
        self.loop.close()
        _policies.clear()

    # -- the hub's part ------------------------------------------------------------------------
    def _make(self, user: str):
        user_obj = SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user, groups=[])
        hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
        return self.cls(
            user=user_obj,
            hub=hub,
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=self.db_url,
            simulated_gpus=str(GPUS),
            default_max_gpus=QUOTA,
            gpu_queue_timeout=0.3,
        )

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def _store(self):
        return self._make("-probe-").gpu_policy.store

    def users(self, *names: str) -> list[str]:
        return list(names)

    def spawn(self, user: str, **options) -> Spawned:
        spawner = self.spawners.get(user) or self._make(user)
        spawner.behaviour = "fail" if self.failing_start else "ok"
        try:
            self._run(spawner._apply_gpu_options(options))
            self._run(spawner.start())
        except SpawnException as exc:
            return Spawned(False, exc.status_code or 500, exc.message, self._events(spawner))
        except Exception as exc:  # noqa: BLE001 - as the hub does: any other error is a 500 with its text
            return Spawned(False, 500, str(exc), self._events(spawner))
        self.spawners[user] = spawner
        return Spawned(True, 201, "", self._events(spawner))

    @staticmethod
    def _events(spawner) -> list[str]:
        return [event["message"] for event in spawner._gpu_events._events]

    def stop(self, user: str) -> None:
        spawner = self.spawners.pop(user)
        self._run(spawner.stop())
        spawner.clear_state()

    def listed(self, user: str) -> bool:
        return user in self.spawners

    def poll_all(self) -> None:
        """What the hub's poll loop does: a server whose poll says it ended is stopped and forgotten."""
        for user, spawner in list(self.spawners.items()):
            if self._run(spawner.poll()) is not None:
                self.stop(user)

    def wait_released(self, user: str) -> None:
        self.poll_all()

    def restart_hub(self, while_down: Callable[[], None] = lambda: None) -> None:
        while_down()
        states = {user: spawner.get_state() for user, spawner in self.spawners.items()}
        _policies.clear()  # a new hub process
        self.spawners = {}
        self._store()  # the hub's start builds the policy: its first use reconciles
        for user, state in states.items():
            spawner = self._make(user)
            spawner.load_state(state)
            spawner.alive = True  # the hub's database says it runs: the first poll checks
            self.spawners[user] = spawner
        self.poll_all()

    def forget_server(self, user: str) -> None:
        """The hub's own record of the server is lost (its server still runs)."""
        self.spawners.pop(user)

    @contextmanager
    def failing(self) -> Iterator[None]:
        self.failing_start = True
        try:
            yield
        finally:
            self.failing_start = False

    # -- the ledger -----------------------------------------------------------------------------
    def leases(self) -> dict[str, list[str]]:
        return {lease.user: sorted(lease.gpu_uuids) for lease in self._store().leases()}

    def lease_ref(self, user: str) -> str:
        lease = self._store().lease_of(user, "")
        return lease.ref if lease else ""

    def forget_lease(self, user: str) -> None:
        self._store().release(user, "", "lost with the database")

    def lease_rows(self, user: str):
        return self._store().lease_of(user, "")

    def put_back(self, lease) -> None:
        """A release that was lost, and the stop's sentence with it (written after the release)."""
        NoticeBook(self._store()).acknowledge(lease.user)
        assert self._store().adopt(lease.user, lease.server, list(lease.gpu_uuids), lease.ref, lease.since, lease.node)

    def usage_reasons(self, user: str) -> list[str]:
        return [row.reason for row in self._store().usage(user=user)]

    def reconcile_fixes(self) -> dict[str, int]:
        return ReconcileBook(self._store()).counts()

    def reconcile_pass(self) -> None:
        """One pass of the reconciler the hub runs in its thread, here at once (``reconcile_now``). The fakes'
        runtime answers from the truth, never from a cached view: no lease needs the grace of a young one."""
        policy = self._make("-probe-").gpu_policy
        policy.reconcile_grace_seconds = 0.0
        policy.reconcile_now()

    def move_lease(self, source: str, target: str) -> None:
        store = self._store()
        taken, kept = store.lease_of(source, ""), store.lease_of(target, "")
        store.release(source, "", "lost with the database")
        store.release(target, "", "rewritten")
        assert store.adopt(target, "", list(taken.gpu_uuids), kept.ref, None, taken.node)

    # -- the runtime ------------------------------------------------------------------------------
    def pinned(self, user: str) -> list[str]:
        """Host: the fake runtime's device variable; engine: what the engine placed the job on."""
        spawner = self.spawners[user]
        if self.mode == "host":
            return sorted(u for u in spawner.get_env()["FAKE_VISIBLE_DEVICES"].split(",") if u)
        return sorted(self.world.running[spawner.gpu_lease_ref()][2])

    def runs(self, user: str) -> bool:
        return any(owner == user for owner, _server, _gpus in self.world.running.values())

    def end_outside(self, user: str) -> None:
        for ref, (owner, _server, _gpus) in list(self.world.running.items()):
            if owner == user:
                del self.world.running[ref]

    def cleanup(self) -> None:
        for user in list(self.spawners):
            self.stop(user)
        store = self._store()
        for ref, (user, server, _gpus) in list(self.world.running.items()):  # servers the hub forgot
            del self.world.running[ref]
            store.release(user, server, "test over")
