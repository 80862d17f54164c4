"""The hub's log hides secrets in URLs in every line, as its access log does (hub/workbench_hub/log_secrets.py)."""

from __future__ import annotations

import logging

import pytest

from workbench_hub import log_secrets

HIDDEN = [
    (
        "403 GET /hub/api/users?token=abc123 (127.0.0.1): Missing or invalid credentials.",
        "403 GET /hub/api/users?token=[secret] (127.0.0.1): Missing or invalid credentials.",
    ),
    ("GET /user/bob/lab?x=1&api_token=s3cr3t&y=2 (::1)", "GET /user/bob/lab?x=1&api_token=[secret]&y=2 (::1)"),
    (
        "GET /services/workbench/oauth_callback?code=c0de&state=st4te (10.0.0.1)",
        "GET /services/workbench/oauth_callback?code=[secret]&state=[secret] (10.0.0.1)",
    ),
    (
        "HTTPServerRequest(uri='/hub/api/user?token=t0k', ip='1.2.3.4')",
        "HTTPServerRequest(uri='/hub/api/user?token=[secret]', ip='1.2.3.4')",
    ),
    (
        "POST /hub/login?next=%2Fhub%2Fhome&_xsrf=2|ab (127.0.0.1)",
        "POST /hub/login?next=%2Fhub%2Fhome&_xsrf=[secret] (127.0.0.1)",
    ),
    ("GET /hub/home?next=/hub/token (127.0.0.1)", "GET /hub/home?next=/hub/token (127.0.0.1)"),
    ("token=abc without a question mark stays", "token=abc without a question mark stays"),
]


@pytest.mark.parametrize(("line", "logged"), HIDDEN)
def test_hide_url_secrets(line: str, logged: str) -> None:
    assert log_secrets.hide_url_secrets(line) == logged


def test_the_filter_rewrites_tornados_http_error_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The very line JupyterHub 6 wrote with the raw token: tornado's ``gen_log.warning("%d %s: %s", ...)``."""
    log_secrets.install(("test.log_secrets",))
    log_secrets.install(("test.log_secrets",))  # once per logger
    logger = logging.getLogger("test.log_secrets")
    assert sum(isinstance(f, log_secrets.HideURLSecrets) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="test.log_secrets"):
        logger.warning(
            "%d %s: %s", 403, "GET /hub/api/users?token=abc123 (127.0.0.1)", "Missing or invalid credentials."
        )
        logger.warning("%d %s: %s", 404, "GET /hub/nothing (127.0.0.1)", "Not Found")
    assert [r.getMessage() for r in caplog.records] == [
        "403 GET /hub/api/users?token=[secret] (127.0.0.1): Missing or invalid credentials.",
        "404 GET /hub/nothing (127.0.0.1): Not Found",
    ]
    assert "abc123" not in caplog.text
