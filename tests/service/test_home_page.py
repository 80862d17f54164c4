"""The hub's home page shows the spawn page's stop box until the next start (``workbench_hub/home_page.py``).

Config tables (template paths kept in order, template_vars merged), the
lazy value against a user stand-in (default and named servers, running
ones skipped, nothing read unless printed), our ``home.html`` rendered
through JupyterHub's own loader layout, and the real hub's ``/hub/home``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import nativeauthenticator
import pytest
import requests
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader
from jupyterhub._data import DATA_FILES_PATH
from traitlets.config import Config

from tests.conftest import hub_form, native_sign_up
from workbench_hub.home_page import TEMPLATES, VARIABLE, StopNotices, update_home_page
from workbench_spawner.ledger.notices import NoticeBook, render_stop_notice
from workbench_spawner.ledger.store import AllocationStore

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
    assert isinstance(c.JupyterHub.template_vars[VARIABLE], StopNotices)


@pytest.fixture
def store(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield store
    store.dispose()


def user(name="alice", named=(), running=(), allow_named=True):
    spawners = {s: SimpleNamespace(active=s in running) for s in ("", *named) if s in running or s == ""}
    return SimpleNamespace(
        name=name,
        allow_named_servers=allow_named,
        orm_user=SimpleNamespace(orm_spawners={s: object() for s in ("", *named)}),
        spawners=spawners,
    )


def test_the_box_is_the_spawn_pages_for_each_server_not_running(store):
    book = NoticeBook(store)
    default = book.done("alice", "", kind="idle", message="Your server was stopped at 10:30: idle <GPU>.", hint="h")
    book.done("alice", "big", kind="session", message="Your server was stopped at 14:00: session limit.")
    book.done("alice", "live", kind="idle", message="old news")
    notices = StopNotices(store.url)
    html = notices.boxes(user(named=("big", "live", "quiet"), running=("live",)))
    assert html.startswith(render_stop_notice(default)), "the default server's box first, exactly the spawn page's"
    assert "idle &lt;GPU&gt;" in html
    assert "<GPU>" not in html
    assert '<div class="workbench-stop-named" data-server="big"><p>Server <strong>big</strong>:</p>' in html
    assert "session limit" in html, "a running server's old stop is not news"
    assert "old news" not in html, "a running server's old stop is not news"
    assert html.count("workbench-stopped") == 2
    # Named servers only where the hub allows them; the default server's box when it is not running.
    assert "session limit" not in notices.boxes(user(named=("big",), allow_named=False))
    assert notices.boxes(user(running=("",))) == ""
    book.acknowledge("alice", "")
    assert "10:30" not in notices.boxes(user(named=("big",))), "the next start forgets it"


def test_nothing_is_read_until_the_home_page_prints_it(tmp_path):
    notices = StopNotices(f"sqlite:///{tmp_path / 'never.sqlite'}")
    assert notices(None) == "", "pages without a user (login) get nothing"
    lazy = notices(user())
    assert not (tmp_path / "never.sqlite").exists(), "other pages never open the GPU database"
    assert lazy.__html__() == ""
    assert (tmp_path / "never.sqlite").exists()


def test_a_database_that_fails_leaves_the_home_page_whole(tmp_path, caplog):
    notices = StopNotices(f"sqlite:///{tmp_path}/no/such/dir/wb.sqlite")
    assert notices(user()).__html__() == ""
    assert "could not be read" in caplog.text


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


@pytest.mark.integration
def test_the_hub_home_page_says_why_until_the_next_start(running_hub):
    hub = running_hub(env={"WORKBENCH_SIMULATED_GPUS": "2"})
    assert "The signup was successful" in native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    browser = requests.Session()
    assert hub_form(browser, hub.url, "/hub/login", {"username": "admin", "password": PASSWORD}).status_code == 302

    def home() -> str:
        r = browser.get(f"{hub.url}/hub/home", timeout=30)
        assert r.status_code == 200, r.text[-2000:]
        assert 'id="start"' in r.text, "JupyterHub's own home page is still there"
        return r.text

    assert "workbench-stopped" not in home()
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
    assert "session limit of 4 hours reached" in page
    assert 'class="container workbench-home-stops"' in page
    assert page.index("workbench-stopped") < page.index('id="start"'), "above the Start button"
    # The login page (no user) renders as before.
    assert requests.get(f"{hub.url}/hub/login", timeout=30).status_code == 200
    # The next start forgets it.
    assert hub.spawn("admin").status_code in (201, 202)
    hub.wait_ready("admin")
    assert "session limit of 4 hours reached" not in home()
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        states = [s for (s,) in db.execute("SELECT state FROM workbench_notices WHERE kind = 'session'")]
    assert states == ["cleared"]
