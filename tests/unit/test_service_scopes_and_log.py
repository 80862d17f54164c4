"""The workbench service's scope decisions (scopes.py) and its scrubbed log lines (access_log.py), without a hub."""

from __future__ import annotations

import logging

import pytest
from tornado.log import app_log

from workbench_hub.service import scopes
from workbench_hub.service.access_log import HideOAuthState, hide_oauth_state, scrub_uri


def user(*held: str, name: str = "carol", groups: tuple[str, ...] = ("ml-course",)) -> dict:
    return {"kind": "user", "name": name, "groups": list(groups), "scopes": list(held)}


@pytest.mark.parametrize(
    ("held", "own"),
    [
        (["custom:workbench:self"], True),
        (["custom:workbench:self!user=carol"], True),
        (["custom:workbench:self!group=ml-course"], True),
        (["custom:workbench:self!user=alice"], False),
        (["custom:workbench:self!group=other"], False),
        (["custom:workbench:self!server=carol/"], False),
        (["custom:workbench:read"], True),
        (["custom:workbench:admin"], True),
        (["read:users:name!user=carol"], False),
        (["custom:workbench:selfish"], False),
        ([], False),
    ],
)
def test_a_user_reads_their_own_data_with_the_self_scope_for_them(held, own):
    assert scopes.reads_own(user(*held)) is own


def test_a_service_has_no_data_of_its_own():
    service = {
        "kind": "service",
        "name": "workbench-metrics",
        "scopes": ["custom:workbench:read", "custom:workbench:self"],
    }
    assert scopes.reads_everyone(service)
    assert not scopes.reads_own(service)
    assert scopes.own_data_refusal(service, "reading your own GPUs (api/me)") == (
        "reading your own GPUs (api/me) is for a hub user's own data, and a service has none: read everyone's with "
        "the custom:workbench:read scope (api/usage?user=NAME)"
    )


def test_reading_everyone_needs_an_unfiltered_read_or_admin_scope():
    assert not scopes.reads_everyone(user("custom:workbench:read!user=carol", "custom:workbench:self"))
    assert scopes.reads_everyone(user("custom:workbench:admin"))
    assert scopes.is_admin(user("custom:workbench:admin"))
    assert not scopes.is_admin(user("custom:workbench:read"))
    assert not scopes.reads_own(None)


@pytest.mark.parametrize(
    ("uri", "logged"),
    [
        ("/services/workbench/api/usage?token=abc123", "/services/workbench/api/usage?token=[secret]"),
        ("/x/oauth_callback?code=c0de&state=s7a7e", "/x/oauth_callback?code=[secret]&state=[secret]"),
        ("/x/api/usage?user=carol&_xsrf=2|ab", "/x/api/usage?user=carol&_xsrf=[secret]"),
        ("/x/api/usage?api_key=k&group=ml", "/x/api/usage?api_key=[secret]&group=ml"),
        ("/x/api/usage?user=carol", "/x/api/usage?user=carol"),
    ],
)
def test_secrets_in_a_query_are_logged_as_secret(uri, logged):
    assert scrub_uri(uri) == logged


def test_the_oauth_state_mismatch_warning_keeps_its_words_and_loses_its_values(caplog):
    hide_oauth_state()
    hide_oauth_state()
    assert sum(isinstance(f, HideOAuthState) for f in app_log.filters) == 1, "installed once"
    with caplog.at_level(logging.WARNING, logger=app_log.name):
        app_log.warning(
            "oauth state argument %r != cookie %s=%r", "arg-secret", "service-workbench-oauth-state", "c-secret"
        )
    assert caplog.messages == ["oauth state argument [secret] != cookie service-workbench-oauth-state=[secret]"]
