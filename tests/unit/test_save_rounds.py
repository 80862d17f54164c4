"""Save rounds: who must report, what ``done`` means, what bad reports are told, and the bounds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The extension's source, ahead of the wheel installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "extensions" / "gpu-monitor"))

from workbench_gpu_monitor.saves import MAX_ROUNDS, SaveError, SaveRounds, parse_report


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def report(client="tab-a", notice_id="7", saved=1, failed=0, names=("a.ipynb",)):
    return parse_report(
        {"notice_id": notice_id, "client": client, "saved": saved, "failed": failed, "names": list(names)}
    )


def test_done_waits_for_every_tab_active_when_the_stopping_notice_came():
    clock = Clock()
    rounds = SaveRounds(clock)
    rounds.polled("tab-a")
    rounds.polled("tab-b")
    clock.t += 31
    rounds.polled("tab-c")  # tab-a and tab-b went quiet 31 s ago: not active
    rounds.polled("tab-b")
    rounds.stopping("7")
    rounds.polled("tab-d")  # opened after the stopping notice: not waited for
    rounds.stopping("7")  # the hub repeats it; the set stays
    assert rounds.summary("7") == {
        "notice_id": "7",
        "active_clients": 2,
        "reported": 0,
        "saved": 0,
        "failed": 0,
        "names": [],
        "done": False,
    }
    rounds.report(report("tab-b", saved=2, names=["a.ipynb", "b.py"]))
    assert rounds.summary("7")["done"] is False
    rounds.report(report("tab-c", saved=1, failed=1, names=["a.ipynb", "c.md"]))
    s = rounds.summary("7")
    assert (s["reported"], s["saved"], s["failed"], s["names"], s["done"]) == (
        2,
        3,
        1,
        ["a.ipynb", "b.py", "c.md"],
        True,
    )
    # The same tab's later save retried what failed: only its latest failures count; saves add up.
    rounds.report(report("tab-c", saved=1, failed=0, names=["d.ipynb"]))
    s = rounds.summary("7")
    assert (s["reported"], s["saved"], s["failed"], s["done"]) == (2, 4, 0, True)


def test_before_a_stopping_notice_the_tabs_active_now_count_and_none_means_done():
    clock = Clock()
    rounds = SaveRounds(clock)
    assert rounds.summary("x")["done"] is True
    assert rounds.summary("x")["active_clients"] == 0
    rounds.polled("tab-a")
    assert rounds.summary("x")["done"] is False
    rounds.report(report("tab-a", notice_id="x"))
    assert rounds.summary("x")["done"] is True
    # A stopping notice with no tab open at all: done at once.
    clock.t += 100
    rounds.stopping("y")
    assert rounds.summary("y") == {**rounds.summary("y"), "active_clients": 0, "done": True}


def test_rounds_and_names_are_bounded():
    rounds = SaveRounds(Clock())
    for i in range(MAX_ROUNDS + 5):
        rounds.report(report(notice_id=str(i)))
    assert len(rounds.rounds) == MAX_ROUNDS
    assert "0" not in rounds.rounds
    assert str(MAX_ROUNDS + 4) in rounds.rounds
    for i in range(3):
        rounds.report(report(client=f"t{i}", notice_id="n", names=[f"{i}-{j}.ipynb" for j in range(30)]))
    assert len(rounds.summary("n")["names"]) == 50


GOOD = {"notice_id": "7", "client": "tab-1", "saved": 0, "failed": 0, "names": []}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (None, "the body must be"),
        ([], "the body must be"),
        ({**GOOD, "colour": "red"}, "unknown field(s): colour"),
        ({**GOOD, "notice_id": ""}, "notice_id"),
        ({**GOOD, "notice_id": 7}, "notice_id"),
        ({**GOOD, "notice_id": "x" * 129}, "notice_id"),
        ({**GOOD, "client": "a b"}, "client must be"),
        ({**GOOD, "client": "x" * 65}, "client must be"),
        ({k: v for k, v in GOOD.items() if k != "client"}, "client must be"),
        ({**GOOD, "saved": -1}, "saved must be a whole number"),
        ({**GOOD, "saved": True}, "saved must be a whole number"),
        ({**GOOD, "failed": 1.5}, "failed must be a whole number"),
        ({**GOOD, "names": "a.ipynb"}, "names must be a list"),
        ({**GOOD, "names": ["x"] * 51}, "at most 50"),
        ({**GOOD, "names": [""]}, "each name"),
        ({**GOOD, "names": [3]}, "each name"),
    ],
)
def test_bad_reports_are_refused_with_a_sentence(body, words):
    with pytest.raises(SaveError) as caught:
        parse_report(body)
    assert words in str(caught.value)


def test_names_may_be_left_out():
    assert parse_report({k: v for k, v in GOOD.items() if k != "names"})["names"] == []
