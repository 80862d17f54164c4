"""WORKBENCH_AUTHENTICATOR=ldap|oidc: the environment -> config tables, and the sentences of bad settings.

The directory and the provider themselves are tested for real in
tests/integration/test_university_login.py; here nothing is started.
"""

from __future__ import annotations

import pytest
from traitlets.config import Config

from workbench_hub import configurer
from workbench_hub.configurer import ConfigError
from workbench_hub.ldap_login import WorkbenchLDAPAuthenticator
from workbench_hub.oidc_login import WorkbenchOIDCAuthenticator

LDAP = {
    "WORKBENCH_AUTHENTICATOR": "ldap",
    "WORKBENCH_ADMIN_USERS": "tina",
    "WORKBENCH_LDAP_URL": "ldap://ldap.example.edu",
    "WORKBENCH_LDAP_BIND_TEMPLATE": "uid={username},ou=people,dc=example,dc=edu",
    "WORKBENCH_LDAP_GROUP_BASE": "ou=groups,dc=example,dc=edu",
}
SERVICE_ACCOUNT = {
    **{k: v for k, v in LDAP.items() if k != "WORKBENCH_LDAP_BIND_TEMPLATE"},
    "WORKBENCH_LDAP_USER_BASE": "ou=people,dc=example,dc=edu",
    "WORKBENCH_LDAP_BIND_DN": "cn=hub,ou=services,dc=example,dc=edu",
    "WORKBENCH_LDAP_BIND_PASSWORD": " secret with spaces ",
}
OIDC = {
    "WORKBENCH_AUTHENTICATOR": "oidc",
    "WORKBENCH_ADMIN_GROUPS": "staff",
    "WORKBENCH_OIDC_ISSUER": "https://login.example.edu",
    "WORKBENCH_OIDC_CLIENT_ID": "workbench-hub",
    "WORKBENCH_OIDC_CLIENT_SECRET": "s3cret",
}


def build(env: dict[str, str]) -> Config:
    c = Config()
    c.JupyterHub.bind_url = "http://127.0.0.1:8000"
    configurer.update_auth(c, env)
    return c


def get(c: Config, dotted: str):
    section, name = dotted.split(".")
    return c[section][name]


@pytest.mark.parametrize(
    ("env", "key", "expected"),
    [
        (LDAP, "JupyterHub.authenticator_class", "workbench_hub.ldap_login.WorkbenchLDAPAuthenticator"),
        (LDAP, "WorkbenchLDAPAuthenticator.server_address", "ldap.example.edu"),
        (LDAP, "WorkbenchLDAPAuthenticator.tls_strategy", "before_bind"),  # ldap:// is StartTLS
        (
            {**LDAP, "WORKBENCH_LDAP_URL": "ldaps://ldap.example.edu:1636"},
            "WorkbenchLDAPAuthenticator.tls_strategy",
            "on_connect",
        ),
        (
            {**LDAP, "WORKBENCH_LDAP_URL": "ldaps://ldap.example.edu:1636"},
            "WorkbenchLDAPAuthenticator.server_port",
            1636,
        ),
        (
            {**LDAP, "WORKBENCH_LDAP_URL": "ldap://127.0.0.1:3389", "WORKBENCH_LDAP_STARTTLS": "0"},
            "WorkbenchLDAPAuthenticator.tls_strategy",
            "insecure",
        ),
        (
            {**LDAP, "WORKBENCH_LDAP_BIND_TEMPLATE": "uid={username},ou=staff,dc=x; uid={username},ou=students,dc=x"},
            "WorkbenchLDAPAuthenticator.bind_dn_template",
            ["uid={username},ou=staff,dc=x", "uid={username},ou=students,dc=x"],
        ),
        (LDAP, "Authenticator.manage_groups", True),
        (LDAP, "Authenticator.allow_all", True),
        (LDAP, "Authenticator.admin_users", {"tina"}),
        (LDAP, "WorkbenchLDAPAuthenticator.allowed_failed_logins", 5),  # the hub's lock-out, as with sign-ups
        ({**LDAP, "WORKBENCH_LOGIN_ATTEMPTS": "3"}, "WorkbenchLDAPAuthenticator.allowed_failed_logins", 3),
        (
            LDAP,
            "WorkbenchLDAPAuthenticator.group_search_filter",
            "(|(member={userdn})(uniqueMember={userdn})(memberUid={uid}))",
        ),
        (
            {**LDAP, "WORKBENCH_LOGIN_GROUPS": "ml-course, staff"},
            "WorkbenchLDAPAuthenticator.login_groups",
            {"ml-course", "staff"},
        ),
        ({**LDAP, "WORKBENCH_LOGIN_GROUPS": "ml-course"}, "Authenticator.allow_all", True),  # checked at login
        ({**OIDC, "WORKBENCH_LOGIN_GROUPS": "ml-course"}, "Authenticator.allow_all", False),  # oauthenticator's
        (
            {**OIDC, "WORKBENCH_DOMAIN": "GPU.Example.edu"},
            "WorkbenchOIDCAuthenticator.oauth_callback_url",
            "https://gpu.example.edu/hub/oauth_callback",
        ),
        (SERVICE_ACCOUNT, "WorkbenchLDAPAuthenticator.lookup_dn", True),
        (SERVICE_ACCOUNT, "WorkbenchLDAPAuthenticator.lookup_dn_search_password", " secret with spaces "),
        (SERVICE_ACCOUNT, "WorkbenchLDAPAuthenticator.user_attribute", "uid"),
        (OIDC, "JupyterHub.authenticator_class", "workbench_hub.oidc_login.WorkbenchOIDCAuthenticator"),
        (OIDC, "WorkbenchOIDCAuthenticator.issuer", "https://login.example.edu"),
        (OIDC, "WorkbenchOIDCAuthenticator.oauth_callback_url", "http://127.0.0.1:8000/hub/oauth_callback"),
        (OIDC, "WorkbenchOIDCAuthenticator.scope", ["openid", "profile", "email"]),
        (OIDC, "WorkbenchOIDCAuthenticator.username_claim", "preferred_username"),
        (OIDC, "WorkbenchOIDCAuthenticator.admin_groups", {"staff"}),
        (OIDC, "Authenticator.admin_users", set()),  # no default 'admin': anyone could be called that
        (OIDC, "Authenticator.manage_groups", True),
        ({**OIDC, "WORKBENCH_LOGIN_GROUPS": "ml-course"}, "WorkbenchOIDCAuthenticator.allowed_groups", {"ml-course"}),
        (
            {**OIDC, "WORKBENCH_OIDC_ISSUER": "http://127.0.0.1:18080"},
            "WorkbenchOIDCAuthenticator.issuer",
            "http://127.0.0.1:18080",
        ),
    ],
)
def test_settings_become_the_authenticators_config(env, key, expected):
    assert get(build(env), key) == expected


def test_without_a_group_base_the_directory_does_not_manage_groups():
    c = build({k: v for k, v in LDAP.items() if k != "WORKBENCH_LDAP_GROUP_BASE"})
    assert "manage_groups" not in c.Authenticator


def test_the_config_makes_authenticators_that_verify_tls_and_lowercase_names():
    c = build({**LDAP, "WORKBENCH_LDAP_CA_FILE": "/etc/ssl/campus-ca.pem"})
    auth = WorkbenchLDAPAuthenticator(config=c)
    assert auth.tls_kwargs == {"validate": 2, "ca_certs_file": "/etc/ssl/campus-ca.pem"}  # ssl.CERT_REQUIRED
    assert auth.normalize_username("  Alice ") == "alice"
    oidc = WorkbenchOIDCAuthenticator(config=build(OIDC))
    assert oidc.manage_groups
    assert oidc.admin_groups == {"staff"}


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        ({**LDAP, "WORKBENCH_LDAP_URL": ""}, "WORKBENCH_AUTHENTICATOR=ldap needs WORKBENCH_LDAP_URL"),
        ({**LDAP, "WORKBENCH_LDAP_URL": "https://ldap.example.edu"}, "is not a directory address; write ldaps://"),
        ({**LDAP, "WORKBENCH_LDAP_URL": "ldap://ldap.example.edu:port"}, "is not a directory address"),
        ({**LDAP, "WORKBENCH_LDAP_STARTTLS": "0"}, "would send every password to the directory unencrypted"),
        ({**LDAP, "WORKBENCH_LDAP_BIND_TEMPLATE": "uid=alice,ou=people"}, "has no {username}"),
        ({**SERVICE_ACCOUNT, "WORKBENCH_LDAP_BIND_TEMPLATE": "uid={username},dc=x"}, "not both"),
        ({**SERVICE_ACCOUNT, "WORKBENCH_LDAP_BIND_PASSWORD": ""}, "WORKBENCH_LDAP_BIND_PASSWORD is empty"),
        ({**LDAP, "WORKBENCH_LDAP_BIND_TEMPLATE": ""}, "needs how to find a user's DN"),
        (
            {**{k: v for k, v in LDAP.items() if k != "WORKBENCH_LDAP_GROUP_BASE"}, "WORKBENCH_LOGIN_GROUPS": "ml"},
            "need the directory's groups: set WORKBENCH_LDAP_GROUP_BASE",
        ),
        ({**LDAP, "WORKBENCH_ADMIN_USERS": ""}, "needs the hub's admins named"),
        (
            {**LDAP, "WORKBENCH_ADMIN_PASSWORD": "longpassword1"},
            "WORKBENCH_ADMIN_PASSWORD is for the hub's own accounts",
        ),
        ({**OIDC, "WORKBENCH_OIDC_CLIENT_SECRET": ""}, "needs WORKBENCH_OIDC_CLIENT_SECRET"),
        ({**OIDC, "WORKBENCH_OIDC_ISSUER": "login.example.edu"}, "is not a URL"),
        ({**OIDC, "WORKBENCH_OIDC_ISSUER": "http://login.example.edu"}, "is plain HTTP"),
    ],
)
def test_bad_settings_are_refused_with_a_sentence(env, sentence):
    with pytest.raises(ConfigError) as raised:
        build(env)
    assert sentence in str(raised.value)


def test_the_admin_pages_say_that_groups_come_from_the_directory():
    c = build(LDAP)
    configurer.update_services(c, LDAP)
    workbench = next(s for s in c.JupyterHub.services if s["name"] == "workbench")
    assert workbench["environment"] == {"WORKBENCH_GROUPS_FROM": "the university directory (LDAP)"}
    assert c.JupyterHub.template_vars["workbench_groups_from"] == "the university directory (LDAP)"
    assert c.JupyterHub.template_paths[-1].endswith("directory_templates")
    oidc = build(OIDC)
    assert oidc.JupyterHub.template_vars["workbench_groups_from"] == "the university's single sign-on (OpenID Connect)"


@pytest.mark.parametrize(
    ("userinfo", "groups"),
    [
        ({"sub": "dave"}, set()),  # LemonLDAP::NG leaves an empty claim out
        ({"groups": None}, set()),
        ({"groups": "ml-course"}, {"ml-course"}),
        ({"groups": ["stats-course", "ml-course", ""]}, {"ml-course", "stats-course"}),
    ],
)
def test_the_groups_claim_may_be_missing_one_name_or_a_list(userinfo, groups):
    import asyncio

    oidc = WorkbenchOIDCAuthenticator(config=build(OIDC))
    assert asyncio.run(oidc.get_user_groups({"oauth_user": userinfo})) == groups


def test_login_groups_let_admins_in_by_name_or_by_group():
    auth = WorkbenchLDAPAuthenticator(
        config=build({**LDAP, "WORKBENCH_LOGIN_GROUPS": "ml-course", "WORKBENCH_ADMIN_GROUPS": "staff"})
    )
    assert not auth.refuses("bob", ["ml-course"])
    assert auth.refuses("carol", ["stats-course"])
    assert not auth.refuses("tina", ["staff"])  # an admin group
    assert not auth.refuses("tina", [])  # WORKBENCH_ADMIN_USERS=tina
