"""The test identity servers as pytest fixtures, for tests in any folder.

A test module (or a folder's conftest.py) that wants them imports them, with no ``pytest_plugins``::

    from tests.identity.fixtures import directory, sso_provider  # noqa: F401

    def test_groups_reach_the_hub(directory, sso_provider):
        directory.add_member("ml-course", "carol")
        sso_provider.allow_hub(hub.url)
        ...

* ``directory``: a new slapd for each test (tests/identity/slapd.sh, about 0.3 s), on two free ports (StartTLS and
  LDAPS), in the test's ``tmp_path``; stopped afterwards. A ``servers.Directory``.
* ``sso_provider``: a new LemonLDAP::NG OpenID Connect provider for each test (tests/identity/lemonldap.sh, about
  1 s) on a free port, its people and groups that directory's; stopped afterwards. A ``servers.SSOProvider``;
  register the hub with ``allow_hub(hub_url)`` before a login.

Where slapd or LemonLDAP::NG is not installed the test is skipped, and fails under WORKBENCH_STRICT_TESTS=1 (CI).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port, missing
from tests.identity.servers import Directory, SSOProvider, lemonldap_missing, slapd_missing


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Directory]:
    reason = slapd_missing()
    if reason:
        missing(reason)
    served = Directory(tmp_path / "slapd", free_port(), free_port())
    try:
        served.start()
        yield served
    finally:
        served.stop()


@pytest.fixture
def sso_provider(directory: Directory, tmp_path: Path) -> Iterator[SSOProvider]:
    reason = lemonldap_missing()
    if reason:
        missing(reason)
    provider = SSOProvider(tmp_path / "lemonldap", free_port(), directory)
    try:
        provider.start()
        yield provider
    finally:
        provider.stop()
