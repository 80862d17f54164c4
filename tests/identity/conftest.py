"""The identity servers' fixtures (``directory``, ``sso_provider``) for the tests of this folder."""

from tests.identity.fixtures import directory, sso_provider  # noqa: F401
