"""The conformance suite's tiers: one driver per backend, all answering the same questions.

A scenario in ``test_conformance.py`` says what happens (start a server
with one GPU, end it behind the hub's back, restart the hub with a lease row
lost) and asks the tier what came of it (the ledger's leases, the GPUs the
runtime gave the server, whether the runtime still runs it). The fakes'
tier drives the reference implementations in-process, in milliseconds; the
hub tiers start a real JupyterHub with the real backend and ask the real
runtime: the server process's environment (local), the container
(docker), the Slurm job (slurm). What a driver does for each question is
the backend's own mechanism, documented on its method.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

from jupyterhub.spawner import SpawnException

from tests.conftest import Hub, process_env, wait_until
from tests.unit.fake_backends import FakeWorld
from workbench_devices import parse_simulated_spec
from workbench_spawner.backends.local.spawner import pid_runs_jupyter
from workbench_spawner.policy.gpu_policy import _policies

GPUS = 4  # every tier offers four GPUs
QUOTA = 2  # and allows two at once by default


@dataclass
class Spawned:
    """What a spawn came to: running, or refused/failed with the hub's status and words."""

    ok: bool
    status: int
    message: str = ""
    progress: list[str] = field(default_factory=list)


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
        except Exception as exc:  # the hub answers 500 with the error
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


class HubTier(ABC):
    """A real hub with a real backend; subclasses say how their runtime is asked."""

    mode = "host"
    spawn_timeout = 120.0

    def __init__(self, start_hub: Callable[[dict[str, str], list[str]], Hub], env: dict[str, str]):
        self.env = {
            "WORKBENCH_SIMULATED_GPUS": str(GPUS),
            "WORKBENCH_DEFAULT_MAX_GPUS": str(QUOTA),
            "WORKBENCH_QUEUE_TIMEOUT": "5",
            **env,
        }
        self.args = ["--Spawner.poll_interval=2"]
        self.hub = start_hub(self.env, self.args)
        self.used: list[str] = []

    # -- the hub's part ------------------------------------------------------------------------
    def users(self, *names: str) -> list[str]:
        real = [f"{name}{uuid.uuid4().hex[:6]}" for name in names]
        self.hub.create_users(*real)
        self.used.extend(real)
        return real

    def spawn(self, user: str, **options) -> Spawned:
        """POST the spawn and follow its progress stream, as the spawn page does, to ready or failed."""
        with ThreadPoolExecutor(1) as pool:
            post = pool.submit(self.hub.spawn, user, **options)
            messages = self._follow(user, post)
            r = post.result()
        if r.status_code not in (201, 202):
            return Spawned(False, r.status_code, r.json().get("message", r.text), messages)
        server = self.hub.server(user)
        if server and server.get("ready"):
            self.remember(user, server)
            return Spawned(True, r.status_code, "", messages)
        failed = messages[-1] if messages else ""
        return Spawned(False, r.status_code, failed, messages)

    def _follow(self, user: str, post) -> list[str]:
        deadline = time.monotonic() + self.spawn_timeout
        while time.monotonic() < deadline:
            r = self.hub.api("GET", f"/users/{user}/server/progress", stream=True)
            if r.status_code != 200:  # not pending yet, or refused before it was
                r.close()
                if post.done() and post.result().status_code not in (201, 202):
                    return []
                time.sleep(0.05)
                continue
            messages = []
            with r:
                for line in r.iter_lines(decode_unicode=True):
                    if line and line.startswith("data:"):
                        event = json.loads(line[5:])
                        messages.append(event.get("message", ""))
                        if event.get("failed") or event.get("ready"):
                            break
            return messages
        raise AssertionError(f"{user}'s spawn neither became ready nor failed in {self.spawn_timeout} s")

    @abstractmethod
    def remember(self, user: str, server: dict) -> None:
        """Keep what identifies the server in the runtime, to ask about it after the hub forgot it."""

    def stop(self, user: str) -> None:
        r = self.hub.api("DELETE", f"/users/{user}/server")
        assert r.status_code in (202, 204), r.text
        self.hub.wait_stopped(user, 60)

    def listed(self, user: str) -> bool:
        return self.hub.server(user) is not None

    def wait_released(self, user: str) -> None:
        wait_until(
            lambda: user not in self.leases() and not self.listed(user),
            30,
            f"the hub to notice that {user}'s server ended (poll every 2 s)",
        )

    def restart_hub(self, while_down: Callable[[], None] = lambda: None) -> None:
        self.hub.stop()
        try:
            while_down()
        finally:
            self.hub.start()

    @contextmanager
    def failing(self) -> Iterator[None]:
        """The hub restarted with a setting that makes the runtime fail every start (``failing_config``)."""
        env, args = self.failing_config()
        self.hub.stop()
        self.hub.env.update(env)
        self.hub.args = [*self.args, *args]
        self.hub.start()
        try:
            yield
        finally:
            self.hub.stop()
            for name in env:
                self.hub.env[name] = self.env.get(name, os.environ.get(name, ""))
            self.hub.args = list(self.args)
            self.hub.start()

    @abstractmethod
    def failing_config(self) -> tuple[dict[str, str], list[str]]:
        """The env and args under which the runtime fails every start after admission."""

    # -- the ledger, read and changed in its SQLite file -----------------------------------------
    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.hub.data_dir / "workbench.sqlite")

    def leases(self) -> dict[str, list[str]]:
        return self.hub.leases()

    def lease_ref(self, user: str) -> str:
        with self._db() as db:
            row = db.execute("SELECT ref FROM gpu_leases WHERE user = ?", (user,)).fetchone()
        return row[0] if row else ""

    def forget_lease(self, user: str) -> None:
        with self._db() as db:
            db.execute("DELETE FROM gpu_leases WHERE user = ?", (user,))

    def forget_server(self, user: str) -> None:
        """Drop the hub's record of the user's running server from its database (the hub is down)."""
        with sqlite3.connect(self.hub.data_dir / "jupyterhub.sqlite") as db:
            (server_id,) = db.execute(
                "SELECT server_id FROM spawners WHERE name = '' AND user_id = (SELECT id FROM users WHERE name = ?)",
                (user,),
            ).fetchone()
            db.execute("UPDATE spawners SET server_id = NULL, state = '{}' WHERE server_id = ?", (server_id,))
            db.execute("DELETE FROM servers WHERE id = ?", (server_id,))

    def move_lease(self, source: str, target: str) -> None:
        with self._db() as db:
            ((gpu, node),) = db.execute("SELECT gpu_uuid, node FROM gpu_leases WHERE user = ?", (source,)).fetchall()
            db.execute("DELETE FROM gpu_leases WHERE user = ?", (source,))
            db.execute("UPDATE gpu_leases SET gpu_uuid = ?, node = ? WHERE user = ?", (gpu, node, target))

    # -- the runtime ------------------------------------------------------------------------------
    @abstractmethod
    def pinned(self, user: str) -> list[str]:
        """The GPUs the runtime gave the user's running server, read from the runtime itself."""

    @abstractmethod
    def runs(self, user: str) -> bool:
        """Whether the runtime still runs a server of the user."""

    @abstractmethod
    def end_outside(self, user: str) -> None:
        """End the user's server behind the hub's back (a crash, an operator)."""

    def cleanup(self) -> None:
        if self.hub.proc is None:
            self.hub.start()
        for user in self.used:
            if self.listed(user):
                self.hub.api("DELETE", f"/users/{user}/server")
        for user in self.used:
            self.hub.wait_stopped(user, 60)
        self.end_leftovers()
        with self._db() as db:  # the leases of servers the hub forgot and adopted
            db.executemany("DELETE FROM gpu_leases WHERE user = ?", [(user,) for user in self.used])
        self.used.clear()

    @abstractmethod
    def end_leftovers(self) -> None:
        """End what still runs of the test's users in the runtime (servers the hub forgot)."""


def split(value: str) -> list[str]:
    return sorted(u for u in value.split(",") if u)


class LocalTier(HubTier):
    """Local processes: the server's own environment in /proc; ended with SIGKILL."""

    def __init__(self, start_hub, env=None):
        self.pids: dict[str, int] = {}
        super().__init__(start_hub, env or {})

    def remember(self, user: str, server: dict) -> None:
        self.pids[user] = int(server["state"]["pid"])

    def pinned(self, user: str) -> list[str]:
        return split(process_env(self.pids[user])["CUDA_VISIBLE_DEVICES"])

    def runs(self, user: str) -> bool:
        return user in self.pids and pid_runs_jupyter(self.pids[user])

    def end_outside(self, user: str) -> None:
        os.kill(self.pids[user], signal.SIGKILL)

    def failing_config(self):
        return {}, ["--Spawner.cmd=/nonexistent/jupyterhub-singleuser"]

    def end_leftovers(self) -> None:
        for user in self.used:
            if self.runs(user):
                os.kill(self.pids.pop(user), signal.SIGKILL)


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=120)


class DockerTier(HubTier):
    """Containers: the device variable the NVIDIA hook set from the device request; ended with docker kill."""

    def __init__(self, start_hub, image: str):
        self.containers: dict[str, str] = {}
        super().__init__(start_hub, {"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": image})

    def remember(self, user: str, server: dict) -> None:
        self.containers[user] = server["state"]["object_name"]

    def pinned(self, user: str) -> list[str]:
        out = docker("exec", self.containers[user], "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ").stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        return [] if env["NVIDIA_VISIBLE_DEVICES"] == "void" else split(env["NVIDIA_VISIBLE_DEVICES"])

    def runs(self, user: str) -> bool:
        name = self.containers.get(user, f"jupyter-{user}")
        state = docker("inspect", "-f", "{{.State.Running}}", name, check=False)
        return state.returncode == 0 and state.stdout.strip() == "true"

    def end_outside(self, user: str) -> None:
        docker("kill", self.containers[user])

    def failing_config(self):
        return {"WORKBENCH_IMAGE": "workbench-conformance/missing:none"}, ["--DockerSpawner.pull_policy=never"]

    def end_leftovers(self) -> None:
        for user in self.used:
            docker("rm", "-f", f"jupyter-{user}", check=False)
            docker("volume", "rm", "-f", f"workbench-home-{user}", f"workbench-checkpoints-{user}", check=False)


class SlurmTier(HubTier):
    """Slurm jobs on the two-node cluster: the job's own environment; ended with scancel.

    Users are the cluster's test accounts (jobs run as the user)."""

    mode = "engine"

    def __init__(self, start_hub, env: dict[str, str], accounts: list[str]):
        self.accounts = list(accounts)
        super().__init__(start_hub, {**env, "WORKBENCH_QUEUE_TIMEOUT": "15", "WORKBENCH_SIMULATED_GPUS": "2xH100-80GB"})

    def users(self, *names: str) -> list[str]:
        real = [self.accounts[len(self.used) + i] for i in range(len(names))]
        self.hub.create_users(*real)
        self.used.extend(real)
        return real

    def remember(self, user: str, server: dict) -> None:
        """Nothing to keep: the jobs are found by the user's tag in their comment."""

    def pinned(self, user: str) -> list[str]:
        """The GPUs Slurm gave the job (``SLURM_JOB_GPUS``, its node's indices), named by the node's UUIDs."""
        from tests.slurm.conftest import job_environment

        env = job_environment(user)
        node = {
            d.index: d.uuid for d in parse_simulated_spec(self.env["WORKBENCH_SIMULATED_GPUS"], env["SLURMD_NODENAME"])
        }
        return sorted(node[int(i)] for i in split(env["SLURM_JOB_GPUS"]))

    def runs(self, user: str) -> bool:
        from tests.slurm.conftest import jobs_of

        return bool(jobs_of(user))

    def end_outside(self, user: str) -> None:
        subprocess.run(["scancel", self.lease_ref(user).removeprefix("slurm:")], check=True)

    def failing_config(self):
        # sbatch refuses a job no node can hold: the engine fails the start after admission.
        return {"WORKBENCH_SLURM_EXTRA_OPTIONS": "--mem=100000000"}, []

    def end_leftovers(self) -> None:
        from tests.slurm.conftest import cancel_all

        cancel_all()
