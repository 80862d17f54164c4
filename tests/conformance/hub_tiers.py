"""The hub tiers: a real JupyterHub with the local, docker or slurm backend, its runtime asked directly."""

from __future__ import annotations

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

from tests.conformance.tiers import GPUS, QUOTA, Spawned
from tests.conftest import Hub, process_env, wait_until
from tests.docker.conftest import container_env, docker, remove_user_objects, user_container
from workbench_devices import parse_simulated_spec
from workbench_spawner.backends.local.spawner import pid_runs_jupyter


class HubTier(ABC):
    """A real hub with a real backend; subclasses say how their runtime is asked."""

    mode = "host"
    spawn_timeout = 120.0
    # How long a stop may take before the test calls it stuck (the engine's own time to end a server).
    stop_timeout = 60.0

    def __init__(self, start_hub: Callable[[dict[str, str], list[str]], Hub], env: dict[str, str]):
        self.env = {
            "WORKBENCH_SIMULATED_GPUS": str(GPUS),
            "WORKBENCH_DEFAULT_MAX_GPUS": str(QUOTA),
            "WORKBENCH_QUEUE_TIMEOUT": "5",
            # The reconciler runs every 2 s: every scenario runs under it, and one waits for it.
            "WORKBENCH_RECONCILE_SECONDS": "2",
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
            messages = self.hub.progress_messages(user, timeout=deadline - time.monotonic())
            if messages:  # the stream ends with the ready or the failed event
                return messages
            if post.done() and post.result().status_code not in (201, 202):
                return []  # refused before it was pending
            time.sleep(0.05)  # not pending yet
        raise AssertionError(f"{user}'s spawn neither became ready nor failed in {self.spawn_timeout} s")

    @abstractmethod
    def remember(self, user: str, server: dict) -> None:
        """Keep what identifies the server in the runtime, to ask about it after the hub forgot it."""

    def stop(self, user: str) -> None:
        r = self.hub.api("DELETE", f"/users/{user}/server")
        assert r.status_code in (202, 204), r.text
        self.hub.wait_stopped(user, self.stop_timeout)

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
        before = {name: self.hub.env.get(name) for name in env}
        self.hub.stop()
        self.hub.env.update(env)
        self.hub.args = [*self.args, *args]
        self.hub.start()
        try:
            yield
        finally:
            self.hub.stop()
            for name, value in before.items():
                if value is None:
                    self.hub.env.pop(name, None)
                else:
                    self.hub.env[name] = value
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

    def lease_rows(self, user: str) -> list[dict]:
        """The user's lease rows as stored (every column), to put back later (``put_back``)."""
        with self._db() as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute("SELECT * FROM gpu_leases WHERE user = ?", (user,))]

    def put_back(self, rows: list[dict]) -> None:
        """Write lease rows back while the hub runs (a release that was lost: the ledger says it still runs).
        The stop's sentence is written after its release (``GPUPolicy.end_server``): lost with it."""
        with self._db() as db:
            if rows:
                db.execute("DELETE FROM workbench_notices WHERE user = ?", (rows[0]["user"],))
            for row in rows:
                columns = [c for c in row if c != "id"]
                db.execute(
                    f"INSERT INTO gpu_leases ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                    [row[c] for c in columns],
                )

    def usage_reasons(self, user: str) -> list[str]:
        """Why each of the user's leases ended, oldest first (the usage ledger)."""
        with self._db() as db:
            return [r for (r,) in db.execute("SELECT reason FROM gpu_usage WHERE user = ? ORDER BY id", (user,))]

    def reconcile_fixes(self) -> dict[str, int]:
        with self._db() as db:
            return dict(db.execute("SELECT kind, count FROM workbench_reconcile_fixes").fetchall())

    def reconcile_pass(self) -> None:
        """Give the hub's reconciler time: it runs every 2 s by itself (``WORKBENCH_RECONCILE_SECONDS``)."""
        time.sleep(0.5)

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
            self.hub.wait_stopped(user, self.stop_timeout)
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


class DockerTier(HubTier):
    """Containers: the device variable the NVIDIA hook set from the device request; ended with docker kill."""

    def __init__(self, start_hub, image: str):
        self.containers: dict[str, str] = {}
        super().__init__(start_hub, {"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": image})

    def remember(self, user: str, server: dict) -> None:
        self.containers[user] = server["state"]["object_name"]

    def pinned(self, user: str) -> list[str]:
        devices = container_env(self.containers[user])["NVIDIA_VISIBLE_DEVICES"]
        return [] if devices == "void" else split(devices)

    def runs(self, user: str) -> bool:
        name = self.containers.get(user) or user_container(user)
        if not name:
            return False
        state = docker("inspect", "-f", "{{.State.Running}}", name, check=False)
        return state.returncode == 0 and state.stdout.strip() == "true"

    def end_outside(self, user: str) -> None:
        docker("kill", self.containers[user])

    def failing_config(self):
        return {"WORKBENCH_IMAGE": "workbench-conformance/missing:none"}, ["--DockerSpawner.pull_policy=never"]

    def end_leftovers(self) -> None:
        remove_user_objects(*self.used)


class SlurmTier(HubTier):
    """Slurm jobs on the two-node cluster: the job's own environment; ended with scancel.

    Users are the cluster's test accounts (jobs run as the user)."""

    mode = "engine"

    def __init__(self, start_hub, env: dict[str, str], accounts: list[str]):
        self.accounts = list(accounts)
        from tests.slurm.conftest import SIMULATED  # the cluster's GPUs and wbnode2's MIG slices, in Slurm's order

        super().__init__(start_hub, {**env, "WORKBENCH_QUEUE_TIMEOUT": "15", "WORKBENCH_SIMULATED_GPUS": SIMULATED})

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


class KubernetesTier(HubTier):
    """Pods on the test cluster (tests/kubernetes/cluster.sh): the container's own environment, where the
    device plugin put ``NVIDIA_VISIBLE_DEVICES``; ended by deleting the pod through the API."""

    mode = "engine"
    # The kubelet confirms a pod's deletion in 8-17 s here, past 60 s while CI's other lane loads the host.
    stop_timeout = 180.0

    def __init__(self, start_hub, env: dict[str, str], namespace: str):
        self.namespace = namespace
        super().__init__(start_hub, {**env, "WORKBENCH_QUEUE_TIMEOUT": "15"})

    def remember(self, user: str, server: dict) -> None:
        """Nothing to keep: the pods are found by the user's label."""

    def _pod(self, user: str) -> dict | None:
        from tests.kubernetes.kube import pods_of

        pods = [p for p in pods_of(self.namespace, user) if not p["metadata"].get("deletionTimestamp")]
        return pods[0] if pods else None

    def pinned(self, user: str) -> list[str]:
        from tests.kubernetes.kube import pod_container_env

        devices = pod_container_env(self._pod(user))["NVIDIA_VISIBLE_DEVICES"]
        return [] if devices == "void" else split(devices)

    def runs(self, user: str) -> bool:
        pod = self._pod(user)
        return bool(pod and pod["status"].get("phase") in ("Pending", "Running"))

    def end_outside(self, user: str) -> None:
        from workbench_spawner.backends.kubernetes.cluster import delete_pod

        delete_pod(self.namespace, self._pod(user)["metadata"]["name"], 0)

    def failing_config(self):
        # The image is not on the node and may not be pulled: the container never starts.
        return {"WORKBENCH_IMAGE": "workbench-conformance/missing:none"}, [
            "--KubernetesGPUSpawner.image_pull_policy=Never"
        ]

    def end_leftovers(self) -> None:
        from tests.kubernetes.kube import delete_pods_of

        delete_pods_of(self.namespace, *self.used)
