"""Who can use the hub (workbench_hub.accounts) and the local backend's warning in the banner."""

from __future__ import annotations

import grp
import pwd
from pathlib import Path

import pytest
from traitlets.config import Config

from tests.unit.test_configurer import build
from workbench_devices import DeviceInventory
from workbench_hub import accounts, banner
from workbench_hub.accounts import Reach

NO_GPUS = DeviceInventory("none", [], "no driver")


def hub_database(data: Path, users: list[str] = (), signups: dict[str, bool] | None = None) -> None:
    """JupyterHub's database as the hub leaves it: its users, NativeAuthenticator's sign-ups (name -> authorized)."""
    from jupyterhub import orm
    from nativeauthenticator.orm import UserInfo  # registers users_info with JupyterHub's schema

    db = orm.new_session_factory(f"sqlite:///{data / 'jupyterhub.sqlite'}")()
    for name in users:
        db.add(orm.User(name=name))
    for name, authorized in (signups or {}).items():
        db.add(UserInfo(username=name, password=b"x", is_authorized=authorized))
    db.commit()
    db.close()


def final(tmp_path: Path, env: dict[str, str], local: dict[str, dict] | None = None) -> Config:
    """The final config: ``env`` as jupyterhub_config.py reads it, then ``local`` (section -> traits) as a local file
    would set it."""
    c = build({"WORKBENCH_DATA_DIR": str(tmp_path), **env})
    for section, traits in (local or {}).items():
        for name, value in traits.items():
            c[section][name] = value
    return c


PAM = {"WORKBENCH_AUTHENTICATOR": "pam", "WORKBENCH_ADMIN_USERS": "ada"}


@pytest.mark.parametrize(
    ("env", "local", "users", "signups", "names", "open_to"),
    [
        # a fresh workstation: the one admin, nobody else
        ({}, {}, [], {}, {"admin"}, ""),
        ({}, {}, ["admin"], {"admin": True}, {"admin"}, ""),
        # two admins named
        ({"WORKBENCH_ADMIN_USERS": "ada,bob"}, {}, [], {}, {"ada", "bob"}, ""),
        # a user the admin created (REST API, admin page), logged in or not
        ({}, {}, ["admin", "alice"], {}, {"admin", "alice"}, ""),
        # an authorized sign-up counts; one that waits for an admin cannot log in
        ({}, {}, [], {"carol": True, "dave": False}, {"admin", "carol"}, ""),
        # allowed_users from the local config file
        ({}, {"Authenticator": {"allowed_users": {"erin"}}}, [], {}, {"admin", "erin"}, ""),
        ({}, {"NativeAuthenticator": {"allowed_users": {"erin"}}}, [], {}, {"admin", "erin"}, ""),
        # open doors
        ({}, {"NativeAuthenticator": {"open_signup": True}}, [], {}, {"admin"}, "anyone who signs up"),
        (
            {},
            {"NativeAuthenticator": {"allow_self_approval_for": r"[^@]+@example\.org$"}},
            [],
            {},
            {"admin"},
            "anyone whose e-mail matches",
        ),
        (PAM, {}, [], {}, {"ada"}, "every account of this host (PAM)"),
        (
            {},
            {"JupyterHub": {"authenticator_class": "oauthenticator.github.GitHubOAuthenticator"}},
            [],
            {},
            {"admin"},
            "every account the authenticator accepts",
        ),
        (
            {},
            {
                "JupyterHub": {"authenticator_class": "ldapauthenticator.LDAPAuthenticator"},
                "Authenticator": {"allow_all": False, "allowed_users": {"ldap1"}},
            },
            [],
            {},
            {"admin", "ldap1"},
            "",
        ),
    ],
)
def test_who_can_use_the_hub(tmp_path, env, local, users, signups, names, open_to):
    if users or signups:
        hub_database(tmp_path, users, signups)
    reach = accounts.who_can_use(final(tmp_path, env, local))
    assert reach.names == names
    assert reach.open_to.startswith(open_to)
    assert bool(reach.open_to) == bool(open_to)
    assert reach.shared == (len(names) > 1 or bool(open_to))


def test_pam_groups_count_their_members(tmp_path, monkeypatch):
    groups = {"gpu": grp.struct_group(("gpu", "x", 500, ["ada"]))}
    accounts_ = [pwd.struct_passwd(("bo", "x", 1001, 500, "", "/home/bo", "/bin/sh"))]
    monkeypatch.setattr(accounts.grp, "getgrnam", lambda name: groups[name])
    monkeypatch.setattr(accounts.pwd, "getpwall", lambda: accounts_)
    reach = accounts.who_can_use(final(tmp_path, {**PAM, "WORKBENCH_PAM_GROUPS": "gpu,nosuchgroup"}))
    assert reach == Reach(frozenset({"ada", "bo"}))
    assert reach.shared


def test_a_first_start_creates_no_database_and_an_unreadable_one_counts_as_empty(tmp_path):
    accounts.who_can_use(final(tmp_path, {}))
    assert not (tmp_path / "jupyterhub.sqlite").exists()
    (tmp_path / "jupyterhub.sqlite").write_text("not a database")
    assert accounts.who_can_use(final(tmp_path, {})).names == {"admin"}


# -- the banner ----------------------------------------------------------------------------------

WARNING_TAIL = [
    "  but the local backend is for one trusted workstation: every server runs as this hub's own",
    "  Unix account on this host and its network, so users can reach each other's servers and",
    "  files (and every GPU). For several users, use the docker backend (WORKBENCH_BACKEND=docker:",
    "  one locked-down container per user; README: Production on one GPU host: Docker).",
]


@pytest.mark.parametrize(
    ("backend", "reach", "first_line"),
    [
        ("local", Reach(frozenset({"admin"})), None),
        ("local", Reach(frozenset()), None),
        ("local", None, None),
        ("local", Reach(frozenset({"admin", "alice"})), "WARNING: 2 accounts can use this hub (admin, alice),"),
        (
            "local",
            Reach(frozenset({f"s{i:02d}" for i in range(30)})),
            "WARNING: 30 accounts can use this hub (s00, s01, s02, s03, s04 and 25 more),",
        ),
        (
            "local",
            Reach(frozenset({"admin"}), "anyone who signs up (NativeAuthenticator.open_signup)"),
            "WARNING: anyone who signs up (NativeAuthenticator.open_signup) can use this hub (1 known: admin),",
        ),
        (
            "local",
            Reach(frozenset(), "every account of this host (PAM)"),
            "WARNING: every account of this host (PAM) can use this hub,",
        ),
        # the other backends keep users apart (docker) or run as each user's own account (slurm)
        ("docker", Reach(frozenset({"admin", "alice"})), None),
        ("slurm", Reach(frozenset(), "every account of this host (PAM)"), None),
    ],
)
def test_the_local_backend_warns_when_more_than_one_person_can_use_it(backend, reach, first_line):
    text = banner.banner(build({}), backend, Path("/srv/data"), NO_GPUS, None, reach)
    lines = text.splitlines()
    if first_line is None:
        assert "WARNING" not in text
        return
    at = lines.index(first_line)
    assert lines[at + 1 : at + 5] == WARNING_TAIL
    # inside the banner's frame, after how to begin
    assert lines[at - 1].startswith("First admin: ")
    assert lines[at + 5] == "=" * 72


def test_the_banner_warns_for_a_hub_whose_database_holds_a_second_user(tmp_path):
    """The whole path jupyterhub_config.py takes: the final config -> who_can_use -> the banner."""
    hub_database(tmp_path, ["admin", "alice"])
    c = final(tmp_path, {})
    text = banner.banner(c, "local", tmp_path, NO_GPUS, None, accounts.who_can_use(c))
    assert "WARNING: 2 accounts can use this hub (admin, alice)," in text.splitlines()
