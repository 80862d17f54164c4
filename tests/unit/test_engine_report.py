"""The start report's shared checks: a report speaks only for a starting server, named as log lines name it, and
carries only the fields its engine reads; the handler sets them on that spawner."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tornado import web

from workbench_spawner.placement.engine_report import (
    MAX_TEXT,
    ReportRefusedError,
    is_text,
    report_fields,
    require_starting,
    start_report_handler,
    token_spawner,
)


def test_a_report_for_a_server_that_is_not_starting_is_a_409_naming_the_server():
    with pytest.raises(web.HTTPError) as caught:
        require_starting(SimpleNamespace(pending=None, server_label="ann:lab"))
    assert caught.value.status_code == 409
    assert caught.value.log_message.startswith("ann:lab is not starting")
    require_starting(SimpleNamespace(pending="spawn", server_label="ann:lab"))  # starting: taken


def test_a_token_finds_only_its_own_spawner():
    mine = SimpleNamespace(api_token="secret-1")
    other = SimpleNamespace(api_token="secret-2")
    user = SimpleNamespace(spawners={"": other, "lab": mine})

    def handler(token: str) -> SimpleNamespace:
        return SimpleNamespace(get_auth_token=lambda: token, current_user=user)

    assert token_spawner(handler("secret-1")) is mine
    for token in ("", "secret-3"):
        with pytest.raises(web.HTTPError) as caught:
            token_spawner(handler(token))
        assert caught.value.status_code == 403


# -- the handler every engine serves, and the rules it shares -------------------------------------------------


def read_node(body):
    report = report_fields(body, ("node",))
    if not is_text(report.get("node")):
        raise ReportRefusedError("node must be a name")
    return report


def post(handler_class, body, spawner):
    """What ``handler_class.post`` answers for ``body`` presented with ``spawner``'s token: (status, answer)."""
    answer = {}
    handler = SimpleNamespace(
        current_user=SimpleNamespace(spawners={"": spawner}),
        get_auth_token=lambda: spawner.api_token,
        get_json_body=lambda: body,
        set_status=lambda status: answer.update(status=status),
        finish=lambda text: answer.update(json.loads(text)),
    )
    handler_class.post(handler)
    return answer


def starting(**attributes):
    return SimpleNamespace(**{"api_token": "secret-1", "pending": "spawn", "server_label": "ann", **attributes})


def test_a_report_is_kept_whole_in_the_engines_attribute_and_answered_with_its_fields():
    handler = start_report_handler("NodeReportHandler", read_node, keep_in="workbench_report")
    assert handler.__name__ == "NodeReportHandler"
    spawner = starting(workbench_report=None)
    assert post(handler, {"node": "n1"}, spawner) == {
        "status": 201,
        "message": "start report taken",
        "fields": ["node"],
    }
    assert spawner.workbench_report == {"node": "n1"}


def test_without_an_attribute_to_keep_it_in_each_field_is_set_by_its_name():
    spawner = starting()
    assert post(start_report_handler("H", read_node), {"node": "n1"}, spawner)["fields"] == ["node"]
    assert spawner.node == "n1"


@pytest.mark.parametrize(
    ("body", "spawner", "status", "words"),
    [
        ({"node": "n1"}, starting(), 400, "This server's backend takes no start report."),
        ({"node": ""}, starting(workbench_report=None), 400, "Start report refused: node must be a name."),
        ({"node": "n1"}, starting(workbench_report=None, pending=None), 409, "ann is not starting"),
    ],
)
def test_a_refused_report_changes_nothing(body, spawner, status, words):
    handler = start_report_handler("H", read_node, keep_in="workbench_report")
    before = dict(vars(spawner))
    with pytest.raises(web.HTTPError) as caught:
        post(handler, body, spawner)
    assert caught.value.status_code == status
    assert caught.value.log_message.startswith(words)
    assert vars(spawner) == before


@pytest.mark.parametrize(
    ("body", "carry", "words"),
    [
        ([1], "may carry only", "the start report must be a JSON object with node and gpus"),
        ({"node": "n", "x": 1, "cmd": 2}, "carries only", "a start report carries only node and gpus; refused: cmd, x"),
        ({"port": 1}, "may carry only", "a start report may carry only node and gpus; refused: port"),
    ],
)
def test_a_report_carries_only_the_engines_fields(body, carry, words):
    with pytest.raises(ReportRefusedError) as refused:
        report_fields(body, ("node", "gpus"), carry)
    assert str(refused.value) == words


def test_a_text_is_short_and_not_empty():
    assert is_text("GPU-a")
    assert is_text("G" * MAX_TEXT)
    assert not [v for v in ("", "G" * (MAX_TEXT + 1), 7, None, ["GPU-a"]) if is_text(v)]
