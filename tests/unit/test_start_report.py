"""The start report's checks: a report speaks only for a starting server, named as log lines name it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tornado import web

from workbench_spawner.start_report import require_starting, token_spawner


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
