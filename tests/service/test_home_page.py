"""The hub's home page lists the user's servers with their GPUs and states, and the spawn page's stop box
until the next start (``workbench_hub/home_page.py``).

Config tables (template paths kept in order, template_vars merged), the
lazy value against a user stand-in (default and named servers over a real
GPU database and policy: GPUs and slices, running, starting, waiting in line
with its place, an engine's words, stopping, the stop box; nothing read
unless the home page asks, one worker-thread hop), our ``home.html`` through
JupyterHub's own loader layout, and the real hub's ``/hub/home`` with named
servers.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import nativeauthenticator
import pytest
import requests
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader
from jupyterhub._data import DATA_FILES_PATH
from traitlets.config import Config

from tests.conftest import hub_form, native_sign_up, wait_until
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_hub.home_page import TEMPLATES, VARIABLE, ServerTable, describe_gpus, update_home_page
from workbench_spawner.form.options import SpawnRequest
from workbench_spawner.form.progress import SpawnEvents
from workbench_spawner.ledger.notices import NoticeBook, render_stop_notice
from workbench_spawner.ledger.store import AllocationStore, Lease, utcnow
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings

NATIVE = str(Path(nativeauthenticator.__file__).parent / "templates")
PASSWORD = "correct horse battery"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({}, [str(TEMPLATES)]),
        ({"template_paths": [NATIVE]}, [NATIVE, str(TEMPLATES)]),
        ({"template_paths": ["/site", NATIVE]}, ["/site", NATIVE, str(TEMPLATES)]),
        ({"template_paths": [NATIVE, str(TEMPLATES)]}, [NATIVE, str(TEMPLATES)]),
    ],
)
def test_our_templates_come_after_the_site_and_the_authenticator(before, after):
    c = Config()
    for key, value in before.items():
        setattr(c.JupyterHub, key, value)
    update_home_page(c, "sqlite:///unused")
    assert c.JupyterHub.template_paths == after


def test_the_sites_template_vars_stay():
    c = Config()
    c.JupyterHub.template_vars = {"site": "kept"}
    update_home_page(c, "sqlite:///unused")
    assert c.JupyterHub.template_vars["site"] == "kept"
    assert isinstance(c.JupyterHub.template_vars[VARIABLE], ServerTable)


@pytest.fixture
def store(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield store
    store.dispose()


def make_policy(store: AllocationStore, spec: str = "2xH100-80GB,1xH200-141GB:mig=7x1g.18gb") -> GPUPolicy:
    settings = PolicySettings(store.url, DeviceInventory("simulated", parse_simulated_spec(spec), "test"), node="n")
    return GPUPolicy(settings, store, recheck_interval=5.0)


class GPUServer:
    """A user's server as the home page meets it: JupyterHub's state, and the GPU spawner's policy and request."""

    placement_mode = "host"

    def __init__(self, policy=None, *, ready=False, pending=None, gpus=0, mode="host", events=()):
        self._policy = policy
        self.ready, self.pending = ready, pending
        self.active = ready or pending is not None
        self.gpu_request = SpawnRequest(gpus=gpus)
        self.placement_mode = mode
        self._gpu_events = SpawnEvents()
        for text in events:
            self._gpu_events.add(text)

    @property
    def gpu_policy(self) -> GPUPolicy:
        return self._policy

    def gpu_start_words(self) -> str:
        return self._gpu_events.latest()


def user(name="alice", named=(), servers=None, allow_named=True):
    """A JupyterHub ``User`` stand-in: its server rows (``orm_spawners``), the spawners loaded, its URLs."""
    servers = servers or {}
    return SimpleNamespace(
        name=name,
        allow_named_servers=allow_named,
        orm_user=SimpleNamespace(orm_spawners={s: object() for s in ("", *named)}),
        spawners=servers,
        server_url=lambda server="": f"/user/{name}/{server + '/' if server else ''}",
    )


def rows_of(table: ServerTable, u) -> list:
    return asyncio.run(table(u).rows())


def test_each_server_shows_its_gpus_and_state(store):
    policy = make_policy(store)
    big, sliced = next(d for d in policy.devices if not d.mig), next(d for d in policy.devices if d.mig)
    assert store.allocate("alice", "big", 1, [big.uuid])
    assert store.allocate("alice", "slice", 1, [sliced.uuid])
    assert store.allocate("bob", "", 1, [policy.devices[1].uuid])
    servers = {
        "": GPUServer(policy),  # loaded by the home page, never started
        "big": GPUServer(policy, ready=True, gpus=1),
        "slice": GPUServer(policy, ready=True, gpus=1),
        "small": GPUServer(policy, ready=True),
        "<i>x</i>": GPUServer(policy, pending="stop"),
    }
    rows = rows_of(ServerTable(store.url), user(named=("big", "slice", "small", "<i>x</i>", "quiet"), servers=servers))
    table = {r.name: (r.label, r.url, r.gpus, r.simulated, r.state) for r in rows}
    assert list(table) == ["", "<i>x</i>", "big", "quiet", "slice", "small"], "the default server first, then by name"
    assert table[""] == ("default server", "", "", False, "not running")
    assert table["big"] == ("big", "/user/alice/big/", "H100-80GB (GPU 0)", True, "running")
    assert table["slice"] == ("slice", "/user/alice/slice/", "1g.18gb slice of H200-141GB (GPU 2)", True, "running")
    assert table["small"] == ("small", "/user/alice/small/", "none (CPU only)", False, "running")
    assert table["<i>x</i>"][4] == "stopping"
    assert table["quiet"] == ("quiet", "", "", False, "not running"), "a server row JupyterHub has not loaded"


def test_an_engines_lease_names_its_node_and_an_unknown_device_its_uuid(store):
    policy = make_policy(store)
    devices = {d.uuid: d for d in policy.devices}
    [first] = [d for d in policy.devices if d.index == 0]
    lease = Lease("alice", "big", (first.uuid, "GPU-gone"), utcnow(), node="wbnode1")
    assert describe_gpus(lease, devices, engine=True) == ("H100-80GB (GPU 0), GPU-gone on wbnode1", True)
    assert describe_gpus(lease, devices, engine=False) == ("H100-80GB (GPU 0), GPU-gone", True)
    assert describe_gpus(None, devices, engine=True) == ("none (CPU only)", False)


def test_a_server_waiting_in_line_shows_its_place(store):
    policy = make_policy(store, "1")

    async def scenario():
        await policy.place("bob", "", 1, None, 5)  # the one GPU is taken
        carol = asyncio.create_task(policy.place("carol", "", 1, None, 30))
        await asyncio.sleep(0.05)
        mine = asyncio.create_task(policy.place("alice", "big", 1, None, 30))
        await asyncio.sleep(0.05)
        servers = {"": GPUServer(policy), "big": GPUServer(policy, pending="spawn", gpus=1)}
        try:
            return await ServerTable(store.url)(user(named=("big",), servers=servers)).rows()
        finally:
            for task in (carol, mine):
                task.cancel()
            await asyncio.gather(carol, mine, return_exceptions=True)

    rows = asyncio.run(scenario())
    [big] = [r for r in rows if r.name == "big"]
    assert (big.gpus, big.state) == ("asks for 1 GPU", "waiting in line for 1 GPU: place 2 of 2")


def test_an_engines_server_says_what_the_engine_says(store):
    policy = make_policy(store, "1")
    words = "Waiting for 1 GPU: 3 jobs ahead of yours in the Slurm queue (Resources)"
    servers = {
        "": GPUServer(policy, pending="spawn", gpus=1, mode="engine", events=["Checking the queue", words]),
        "b": GPUServer(policy, pending="spawn", mode="engine"),
        "c": GPUServer(policy, pending="spawn"),  # host, not in line: past its GPUs, starting
    }
    rows = {r.name: r.state for r in rows_of(ServerTable(store.url), user(named=("b", "c"), servers=servers))}
    assert rows == {"": f"waiting for the engine: {words}", "b": "starting", "c": "starting"}


def test_a_stopped_server_shows_the_spawn_pages_stop_box(store):
    book = NoticeBook(store)
    default = book.done("alice", "", kind="idle", message="Your server was stopped at 10:30: idle <GPU>.", hint="h")
    book.done("alice", "big", kind="session", message="Your server was stopped at 14:00: session limit.")
    book.done("alice", "live", kind="idle", message="old news")
    table = ServerTable(store.url)
    servers = {"live": SimpleNamespace(active=True, ready=True, pending=None)}
    rows = {r.name: r for r in rows_of(table, user(named=("big", "live", "quiet"), servers=servers))}
    assert rows[""].state == "stopped"
    assert str(rows[""].stop_box) == render_stop_notice(default), "exactly the spawn page's box"
    assert "idle &lt;GPU&gt;" in rows[""].stop_box
    assert "session limit" in rows["big"].stop_box
    assert (rows["live"].state, str(rows["live"].stop_box)) == ("running", ""), "a running server's old stop is no news"
    assert (rows["quiet"].state, str(rows["quiet"].stop_box)) == ("not running", "")
    # Without named servers: the default server only, and only when there is something to say.
    assert [r.name for r in rows_of(table, user(named=("big",), allow_named=False))] == [""]
    book.acknowledge("alice", "")
    assert rows_of(table, user(named=("big",), allow_named=False)) == [], "the next start forgets it"


def test_nothing_is_read_until_the_home_page_asks(tmp_path):
    table = ServerTable(f"sqlite:///{tmp_path / 'never.sqlite'}")
    assert table(None) == "", "pages without a user (login) get nothing"
    lazy = table(user(allow_named=False))
    assert not (tmp_path / "never.sqlite").exists(), "other pages never open the GPU database"
    assert asyncio.run(lazy.rows()) == []
    assert (tmp_path / "never.sqlite").exists()


def test_a_database_that_fails_leaves_the_home_page_whole(tmp_path, caplog):
    table = ServerTable(f"sqlite:///{tmp_path}/no/such/dir/wb.sqlite")
    assert rows_of(table, user()) == []
    assert "could not be read" in caplog.text


def test_one_worker_thread_hop_per_render(store, thread_hops):
    policy = make_policy(store)
    servers = {"": GPUServer(policy, ready=True), "big": GPUServer(policy)}
    rows_of(ServerTable(store.url), user(named=("big", "small"), servers=servers))
    assert len(thread_hops) == 1


def test_our_home_html_extends_jupyterhubs(store):
    """The loaders as JupyterHub 6 builds them (app.py): its own pages under the templates/ prefix, then the
    template paths, NativeAuthenticator's page.html among them."""
    builtin = str(Path(DATA_FILES_PATH) / "templates")
    loader = ChoiceLoader(
        [
            PrefixLoader({"templates": FileSystemLoader([builtin])}, "/"),
            FileSystemLoader([NATIVE, str(TEMPLATES), builtin]),
        ]
    )
    env = Environment(loader=loader, autoescape=True)
    source, filename, _ = loader.get_source(env, "home.html")
    assert filename == str(TEMPLATES / "home.html")
    NoticeBook(store).done("alice", "", kind="idle", message="Your server was stopped at 10:30: idle GPU reclaimed.")
    # It compiles, and what it extends is JupyterHub's own page, found through the prefix (never itself).
    env.get_template("home.html")
    assert loader.get_source(env, "templates/home.html")[1] == str(Path(builtin) / "home.html")
    assert '{% extends "templates/home.html" %}' in source
    assert "{{ super() }}" in source


def home_rows(page: str) -> dict[str, tuple[str, str]]:
    """The server table of a home page: server name -> (GPUs, state), as the user reads them (tags dropped)."""
    rows = re.findall(
        r'<tr class="workbench-server-row" data-server="([^"]*)">\s*<td[^>]*>.*?</td>\s*'
        r'<td class="workbench-server-gpus">(.*?)</td>\s*<td class="workbench-server-state">(.*?)</td>',
        page,
        re.S,
    )
    text = lambda html: " ".join(re.sub(r"<[^>]+>", " ", html).split())  # noqa: E731
    return {name: (text(gpus), text(state)) for name, gpus, state in rows}


@pytest.mark.integration
def test_the_hub_home_page_shows_each_server_and_says_why_until_the_next_start(running_hub):
    hub = running_hub(
        env={"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_NAMED_SERVERS": "2", "WORKBENCH_DEFAULT_MAX_GPUS": "2"}
    )
    assert "The signup was successful" in native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    browser = requests.Session()
    assert hub_form(browser, hub.url, "/hub/login", {"username": "admin", "password": PASSWORD}).status_code == 302

    def home() -> str:
        r = browser.get(f"{hub.url}/hub/home", timeout=30)
        assert r.status_code == 200, r.text[-2000:]
        assert 'id="start"' in r.text, "JupyterHub's own home page is still there"
        return r.text

    assert home_rows(home()) == {"": ("", "not running")}
    store = AllocationStore(f"sqlite:///{hub.data_dir / 'workbench.sqlite'}")
    try:
        NoticeBook(store).done(
            "admin",
            "",
            kind="session",
            message="Your server was stopped at 14:00: session limit of 4 hours reached. Your files are kept.",
            reason="session limit: 4 h",
        )
    finally:
        store.dispose()
    page = home()
    assert home_rows(page) == {
        "": ("", "stopped Your server was stopped at 14:00: session limit of 4 hours reached. Your files are kept.")
    }
    assert 'class="container mb-4 workbench-home-servers"' in page
    assert page.index("workbench-stopped") < page.index('id="start"'), "above the Start button"
    # The login page (no user) renders as before.
    assert requests.get(f"{hub.url}/hub/login", timeout=30).status_code == 200
    # The next start forgets it; named servers show beside it, each with what it holds.
    assert hub.spawn("admin").status_code in (201, 202)
    assert hub.api("POST", "/users/admin/servers/big", json={"gpus": 1}).status_code in (201, 202)
    assert hub.api("POST", "/users/admin/servers/small", json={"gpus": 0}).status_code in (201, 202)
    hub.wait_ready("admin")
    wait_until(
        lambda: all(s.get("ready") for s in hub.api("GET", "/users/admin").json()["servers"].values()),
        90,
        "the named servers to be ready",
    )
    page = home()
    assert "session limit of 4 hours reached" not in page
    assert home_rows(page) == {
        "": ("H100-80GB (GPU 0) simulated", "running"),
        "big": ("H100-80GB (GPU 1) simulated", "running"),
        "small": ("none (CPU only)", "running"),
    }
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        states = [s for (s,) in db.execute("SELECT state FROM workbench_notices WHERE kind = 'session'")]
    assert states == ["cleared"]
