"""Who shares a time-sliced GPU, as the workbench service tells each user server (``notice_delivery``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from workbench_hub.service.notice_delivery import NoticeDelivery, time_sliced
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.store import AllocationStore, Lease

SINCE = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def lease(user: str, *uuids: str, server: str = "") -> Lease:
    return Lease(user, server, tuple(uuids), SINCE)


@pytest.mark.parametrize(
    ("leases", "slots", "expected"),
    [
        ([lease("ann", "T4")], {"T4": 1}, {}),  # held alone: nothing to say
        ([lease("ann", "T4")], {}, {}),  # a device the settings do not list takes one server
        ([lease("ann", "T4")], {"T4": 3}, {("ann", ""): [{"uuid": "T4", "slots": 3, "others": 0}]}),
        (
            [lease("ann", "T4"), lease("bob", "T4"), lease("ann", "T4", server="gpu2")],
            {"T4": 4},
            {
                ("ann", ""): [{"uuid": "T4", "slots": 4, "others": 2}],
                ("bob", ""): [{"uuid": "T4", "slots": 4, "others": 2}],
                ("ann", "gpu2"): [{"uuid": "T4", "slots": 4, "others": 2}],  # one's own other server counts too
            },
        ),
        (
            [lease("ann", "T4", "H100"), lease("bob", "T4")],
            {"T4": 2, "H100": 1},
            {
                ("ann", ""): [{"uuid": "T4", "slots": 2, "others": 1}],  # the H100 is hers alone: not listed
                ("bob", ""): [{"uuid": "T4", "slots": 2, "others": 1}],
            },
        ),
    ],
)
def test_each_server_learns_its_time_sliced_gpus_and_the_others_on_them(leases, slots, expected):
    assert time_sliced(leases, slots) == expected


class Recorder:
    """The user servers' monitors, as far as delivery sees them: what each was sent."""

    def __init__(self):
        self.sent: list[tuple[str, list, list]] = []

    async def put_notices(self, path: str, notices: list, sharing: list | None = None) -> None:
        self.sent.append((path, notices, sharing or []))


async def test_sharing_is_sent_when_it_changes_and_withdrawn_when_it_ends(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    now = {"sharing": {("ann", ""): [{"uuid": "T4", "slots": 2, "others": 0}]}, "clock": 0.0}
    servers = Recorder()
    delivery = NoticeDelivery(
        NoticeBook(store), servers, resend_seconds=60, clock=lambda: now["clock"], sharing=lambda: now["sharing"]
    )
    running = {("ann", ""): "/user/ann/", ("bob", ""): "/user/bob/"}
    assert await delivery.deliver(running) == [("ann", "")]
    assert servers.sent == [("/user/ann/", [], [{"uuid": "T4", "slots": 2, "others": 0}])]
    assert await delivery.deliver(running) == [], "unchanged: not sent again before resend_seconds"
    now["sharing"] = {key: [{"uuid": "T4", "slots": 2, "others": 1}] for key in running}
    assert sorted(await delivery.deliver(running)) == [("ann", ""), ("bob", "")]
    now["sharing"] = {}
    assert sorted(await delivery.deliver(running)) == [("ann", ""), ("bob", "")]  # withdrawn: an empty list
    assert servers.sent[-1][1:] == ([], [])
    assert await delivery.deliver(running) == [], "nothing to withdraw any more"
    now["sharing"], now["clock"] = {("ann", ""): [{"uuid": "T4", "slots": 2, "others": 0}]}, 1.0
    await delivery.deliver(running)
    now["clock"] = 100.0
    assert await delivery.deliver(running) == [("ann", "")], "sent again after resend_seconds: a restart forgot it"
    store.dispose()
