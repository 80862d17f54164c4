"""The spawn form with named servers: which server it starts, and which of the student's servers holds each GPU.

The words (``form/servers.py``) as a table over GPU states, and the whole form as a named server's spawner
renders it (``form/spawn_page.py``) over a real GPU database with leases of the student's other servers.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from tests.unit.fake_backends import FakeHostSpawner
from workbench_devices import discover_devices
from workbench_spawner.form.servers import gpu_state, held_by_server, held_sentence, names_servers, starting_sentence
from workbench_spawner.ledger.store import Lease
from workbench_spawner.policy.gpu_policy import GPUStatus, _policies
from workbench_spawner.rules.quota import Quota

[DEVICE] = discover_devices("1").devices


def status(holders=(), slots=1, drained=False, unavailable="") -> GPUStatus:
    return GPUStatus(DEVICE, list(holders), slots, drained, unavailable)


@pytest.mark.parametrize(
    ("gpu", "naming", "text"),
    [
        (status(), True, "free"),
        (status(slots=3), True, "free (time-sliced: up to 3 servers)"),
        (status([("alice", "")]), False, "yours"),
        (status([("alice", "big")]), True, "yours: big"),
        (status([("alice", "")]), True, "yours: default server"),
        (status([("bob", "")]), True, "in use"),
        (status([("alice", "big"), ("bob", "")], slots=3), True, "yours: big, shared with 1 other, 1 slot left"),
        (status([("alice", "big"), ("alice", "small")], slots=3), True, "yours: big and small, 1 slot left"),
        (status([("bob", ""), ("carol", "x")], slots=3), True, "shared with 2 others, 1 slot left"),
        (status([("alice", "big")], drained=True), True, "draining (no new servers), in use by you (big)"),
        (
            status([("alice", "big")], unavailable="node n1 is down"),
            True,
            "unavailable: node n1 is down, held by you (big)",
        ),
        (status([("alice", "")], unavailable="node n1 is down"), False, "unavailable: node n1 is down, held by you"),
    ],
)
def test_each_gpus_state_names_the_students_server_that_holds_it(gpu, naming, text):
    assert gpu_state(gpu, "alice", naming) == text


def lease(user: str, server: str, *uuids: str) -> Lease:
    return Lease(user, server, tuple(uuids), datetime(2026, 12, 8, tzinfo=UTC))


def test_what_the_student_holds_is_said_per_server():
    leases = [lease("alice", "big", "g0"), lease("bob", "", "g1"), lease("alice", "", "g2", "g3"), lease("alice", "w")]
    held = held_by_server("alice", leases)
    assert held == {"big": 1, "": 2}, "a CPU-only server holds nothing and is not listed"
    assert held_sentence(held, naming=True) == "You hold 3 GPUs now: 1 on big, 2 on your default server."
    assert held_sentence({"": 1}, naming=False) == "You hold 1 GPU now."
    assert held_sentence({}, naming=True) == "You hold 0 GPUs now."
    # Servers are named where the form starts a named one, or a named one holds GPUs; not otherwise.
    assert names_servers("", held)
    assert names_servers("small", {})
    assert not names_servers("", {"": 1})
    assert starting_sentence("big") == "Starting server big."
    assert starting_sentence("") == "Starting your default server."


def states(html: str) -> list[str]:
    """The State column of the form's GPU table, row by row."""
    return re.findall(r"<td>[^<]*</td>\s*<td>[^<]*</td>\s*<td>[^<]* GiB</td>\s*<td>([^<]*)</td>", html)


@pytest.fixture
def make_spawner(db_url):
    _policies.clear()

    def make(name: str = "", allow_named: bool = True) -> FakeHostSpawner:
        user = SimpleNamespace(
            name="alice", url="/user/alice/", escaped_name="alice", groups=[], allow_named_servers=allow_named
        )
        hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
        return FakeHostSpawner(
            user=user,
            hub=hub,
            orm_spawner=SimpleNamespace(name=name, server=None),
            gpu_db_url=db_url,
            simulated_gpus="4",
        )

    yield make
    _policies.clear()


async def test_a_named_servers_form_says_what_it_starts_and_where_the_gpus_are(make_spawner):
    spawner = make_spawner("third")
    store = spawner.gpu_policy.store
    spawner.gpu_quota_book.set("user", "alice", Quota(3))
    uuids = [d.uuid for d in spawner.gpu_policy.devices]
    assert store.allocate("alice", "big", 1, uuids[:1])
    assert store.allocate("alice", "", 1, uuids[1:2])
    assert store.allocate("bob", "", 1, uuids[2:3])
    html = await spawner._render_options_form()
    assert '<p class="fs-5 mb-3" id="workbench-starting">Starting server third.</p>' in html
    assert '<li id="workbench-held">You hold 2 GPUs now: 1 on big, 1 on your default server.</li>' in html
    assert states(html) == ["yours: big", "yours: default server", "in use", "free"]
    # The student may hold one more (3 at once): the form offers 1 for this server.
    assert 'max="1"' in html


async def test_the_default_servers_form_reads_as_before_without_named_servers(make_spawner):
    spawner = make_spawner("", allow_named=False)
    uuids = [d.uuid for d in spawner.gpu_policy.devices]
    assert spawner.gpu_policy.store.allocate("alice", "", 1, uuids[:1])
    html = await spawner._render_options_form()
    assert 'id="workbench-starting"' not in html
    assert '<li id="workbench-held">You hold 1 GPU now.</li>' in html
    assert states(html) == ["yours", "free", "free", "free"]
    # With named servers on, the default server's form says which one it starts.
    _policies.clear()
    assert "Starting your default server." in await make_spawner("", allow_named=True)._render_options_form()


async def test_server_names_on_the_form_are_escaped(make_spawner):
    spawner = make_spawner("<b>x</b>")
    html = await spawner._render_options_form()
    assert "Starting server &lt;b&gt;x&lt;/b&gt;." in html
    assert "<b>x</b>" not in html
