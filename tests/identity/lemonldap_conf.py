"""The test OpenID Connect provider's configuration: LemonLDAP::NG 2.16 as Debian packages it, with no manager.

``write_configuration`` writes what ``lemonldap.sh`` starts the portal with, all in one run folder:

* ``lemonldap-ng.ini``: the configuration is the File backend in ``conf/``, re-read once a second (``checkTime``),
  so a test that registers a hub or changes the client's secret sees the provider use it at once;
* ``conf/lmConf-<n>.json``: the portal (``http://127.0.0.1:PORT/``, sessions in files: no database), its users and
  groups from the test directory (StartTLS or LDAPS, the directory's CA required, bound as the service account),
  and the OpenID Connect issuer with one relying party, the hub: client ``workbench-hub``, a client secret, PKCE
  required, ``groups`` among the claims (in userinfo and the id_token), logout without a confirmation page;
* ``oidc/oidc.key``: the RS256 signing key (2048 bits: 0.1 s to make).

``update_client`` writes the next ``lmConf-<n>.json`` with more redirect URIs or another secret: a configuration
with a new number is what LemonLDAP's portal looks for each ``checkTime``.

Run as ``python -m tests.identity.lemonldap_conf RUN PORT LDAP_URL CA_FILE [HUB_URL...]`` from the repository (what
``lemonldap.sh`` does). Only the standard library: any Python 3 runs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.identity.accounts import GROUPS_DN, PEOPLE_DN, READER_DN, password_of

CLIENT_ID = "workbench-hub"
CLIENT_SECRET = "workbench-hub-secret"
RP = "workbench-hub"  # the relying party's key in the configuration (LemonLDAP's name for it, not the client_id)
SIGNING_KEY_ID = "workbench-test-1"
_REDIRECTS = "oidcRPMetaDataOptionsRedirectUris"
_AFTER_LOGOUT = "oidcRPMetaDataOptionsPostLogoutRedirectUris"
_SECRET = "oidcRPMetaDataOptionsClientSecret"
_CONF_FILE = re.compile(r"lmConf-(\d+)\.json")


def issuer(port: int) -> str:
    """The provider's issuer: the portal's URL without the trailing slash, the exact string a client compares."""
    return f"http://127.0.0.1:{port}"


def ldap_server(url: str) -> str:
    """LemonLDAP's name for a directory URL: ``ldap://`` is spoken with StartTLS (``ldap+tls://``), ``ldaps://`` with
    TLS from the first byte. Plain LDAP is refused: the provider sends people's passwords to the directory."""
    if url.startswith("ldap://"):
        return "ldap+tls://" + url.removeprefix("ldap://")
    if url.startswith(("ldaps://", "ldap+tls://")):
        return url
    raise ValueError(f"a directory URL is ldap://HOST:PORT (StartTLS) or ldaps://HOST:PORT, not {url!r}")


def hub_uris(hub_url: str) -> tuple[list[str], list[str]]:
    """A hub's redirect URI (its OAuth callback) and the pages the provider may send people to after logging them
    out (the hub's login page, and its logout page)."""
    hub = hub_url.rstrip("/")
    return [f"{hub}/hub/oauth_callback"], [f"{hub}/hub/login", f"{hub}/hub/logout"]


def _signing_key(run: Path) -> tuple[str, str]:
    key, pub = run / "oidc" / "oidc.key", run / "oidc" / "oidc.pub"
    if not key.exists():
        for command in (["genrsa", "-out", str(key), "2048"], ["rsa", "-pubout", "-in", str(key), "-out", str(pub)]):
            subprocess.run(["openssl", *command], check=True, capture_output=True)
        key.chmod(0o600)
    return key.read_text(), pub.read_text()


def _ini(run: Path) -> str:
    # checkTime = 1: the portal looks for a newer configuration once a second (the default is 10 minutes).
    return f"""[all]
logLevel = notice
checkTime = 1

[configuration]
type = File
dirName = {run}/conf
prettyPrint = 1
localStorage = Cache::FileCache
localStorageOptions = {{ 'namespace' => 'lemonldap-ng-config', 'default_expires_in' => 600, \
'directory_umask' => '007', 'cache_root' => '{run}/cache', 'cache_depth' => 3, }}

[portal]
staticPrefix = /static
templateDir = /usr/share/lemonldap-ng/portal/templates
languages = en

[handler]
status = 0
useRedirectOnError = 1
"""


def configuration(
    run: Path, port: int, ldap_url: str, ca_file: Path, hub_urls: Sequence[str] = (), client_secret: str = CLIENT_SECRET
) -> dict[str, Any]:
    """The whole ``lmConf-1.json`` (see the module's docstring)."""
    private, public = _signing_key(run)
    portal = f"{issuer(port)}/"
    redirects: list[str] = []
    after_logout: list[str] = []
    for hub in hub_urls:
        more, more_after = hub_uris(hub)
        redirects += more
        after_logout += more_after
    return {
        "cfgNum": 1,
        "cfgVersion": "2.16.1",
        "cfgAuthor": "tests/identity/lemonldap_conf.py",
        "cfgDate": str(int(time.time())),
        "portal": portal,
        "domain": "127.0.0.1",  # a host-only cookie for the portal's address (requests and Chromium keep it)
        "cookieName": "lemonldap",
        "securedCookie": 0,
        "https": 0,
        "portalDisplayLogout": 1,
        "portalDisplayRegister": 0,  # no "Create an account" button
        "portalDisplayResetPassword": 0,
        "portalCheckLogins": 0,  # no "Check my last logins" box
        "requireToken": 1,  # the login form carries a one-time token (CSRF)
        "checkXSS": 1,
        "timeout": 72000,
        "whatToTrace": "uid",
        "multiValuesSeparator": "; ",
        "globalStorage": "Apache::Session::File",
        "globalStorageOptions": {
            "Directory": f"{run}/sessions",
            "LockDirectory": f"{run}/sessions/lock",
            "generateModule": "Lemonldap::NG::Common::Apache::Session::Generate::SHA256",
        },
        "persistentStorage": "Apache::Session::File",
        "persistentStorageOptions": {"Directory": f"{run}/psessions", "LockDirectory": f"{run}/psessions/lock"},
        "localSessionStorage": "Cache::FileCache",
        "localSessionStorageOptions": {
            "namespace": "lemonldap-ng-sessions",
            "default_expires_in": 600,
            "directory_umask": "007",
            "cache_root": f"{run}/cache",
            "cache_depth": 3,
        },
        "loginHistoryEnabled": 0,
        "notification": 0,
        "applicationList": {},
        "exportedHeaders": {},
        "locationRules": {},
        "vhostOptions": {},
        "post": {},
        "reloadUrls": {},
        "groups": {},
        "macros": {},
        "exportedVars": {"cn": "cn", "mail": "mail", "uid": "uid"},
        # People and their groups: the test directory.
        "authentication": "LDAP",
        "userDB": "Same",
        "passwordDB": "LDAP",
        "registerDB": "Null",
        "ldapServer": ldap_server(ldap_url),
        "ldapCAFile": str(ca_file),
        "ldapVerify": "require",
        "ldapBase": PEOPLE_DN,
        "managerDn": READER_DN,
        "managerPassword": password_of("hub-reader"),
        "AuthLDAPFilter": "(&(uid=$user)(objectClass=inetOrgPerson))",
        "LDAPFilter": "(&(uid=$user)(objectClass=inetOrgPerson))",
        "ldapExportedVars": {"uid": "uid", "cn": "cn", "mail": "mail"},
        # Groups are groupOfNames whose member is the person's DN (posixGroups are not seen: one class only).
        "ldapGroupBase": GROUPS_DN,
        "ldapGroupObjectClass": "groupOfNames",
        "ldapGroupAttributeName": "member",
        "ldapGroupAttributeNameUser": "dn",
        "ldapGroupAttributeNameSearch": "cn",
        "ldapPpolicyControl": 1,
        "ldapTimeout": 5,
        "ldapIOTimeout": 5,
        # The OpenID Connect provider.
        "issuerDBOpenIDConnectActivation": 1,
        "issuerDBOpenIDConnectPath": "^/oauth2/",
        "issuerDBOpenIDConnectRule": 1,
        "oidcServiceMetaDataIssuer": issuer(port),
        "oidcServicePrivateKeySig": private,
        "oidcServicePublicKeySig": public,
        "oidcServiceKeyIdSig": SIGNING_KEY_ID,
        "oidcServiceAllowAuthorizationCodeFlow": 1,
        "oidcServiceIgnoreScopeForClaims": 1,  # every exported claim is released without a scope of its own
        "oidcServiceAllowDynamicRegistration": 0,
        "oidcRPMetaDataOptions": {
            RP: {
                "oidcRPMetaDataOptionsClientID": CLIENT_ID,
                _SECRET: client_secret,
                "oidcRPMetaDataOptionsDisplayName": "GPU Workbench",
                _REDIRECTS: " ".join(redirects),  # exact matches, separated by spaces; none: every URI refused
                _AFTER_LOGOUT: " ".join(after_logout),
                "oidcRPMetaDataOptionsLogoutBypassConfirm": 1,
                "oidcRPMetaDataOptionsBypassConsent": 1,
                "oidcRPMetaDataOptionsIDTokenSignAlg": "RS256",
                "oidcRPMetaDataOptionsIDTokenForceClaims": 1,  # the claims in the id_token too
                "oidcRPMetaDataOptionsRequirePKCE": 1,  # oauthenticator sends S256 by default
                "oidcRPMetaDataOptionsUserIDAttr": "uid",
                "oidcRPMetaDataOptionsIDTokenExpiration": 3600,
                "oidcRPMetaDataOptionsAccessTokenExpiration": 3600,
                "oidcRPMetaDataOptionsAuthorizationCodeExpiration": 60,
                "oidcRPMetaDataOptionsPublic": 0,
                "oidcRPMetaDataOptionsRule": "",
            }
        },
        "oidcRPMetaDataExportedVars": {
            RP: {
                "preferred_username": "uid",
                "name": "cn",
                "email": "mail",
                # The session's groups ("ml-course; stats-course") as a JSON array. A person in no group gets no
                # groups claim at all: LemonLDAP leaves empty values out.
                "groups": "groups;string;always",
            }
        },
        "oidcRPMetaDataOptionsExtraClaims": {},
        "oidcRPMetaDataMacros": {},
    }


def _write_json(path: Path, conf: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(conf, indent=1, sort_keys=True))
    os.replace(tmp, path)  # the portal never reads half a file


def write_configuration(
    run: Path, port: int, ldap_url: str, ca_file: Path, hub_urls: Sequence[str] = (), client_secret: str = CLIENT_SECRET
) -> Path:
    """A new provider in ``run`` (its folders, signing key, ini and first configuration); the ini's path."""
    run = run.resolve()
    for folder in ("conf", "sessions/lock", "psessions/lock", "cache", "oidc"):
        (run / folder).mkdir(parents=True, exist_ok=True)
    conf = configuration(run, port, ldap_url, ca_file.resolve(), hub_urls, client_secret)
    _write_json(run / "conf" / "lmConf-1.json", conf)
    ini = run / "lemonldap-ng.ini"
    ini.write_text(_ini(run))
    return ini


def current(run: Path) -> tuple[Path, dict[str, Any]]:
    """The configuration the portal reads now: the highest-numbered ``lmConf-<n>.json``, and its content."""
    numbered = [(int(m[1]), p) for p in (run / "conf").iterdir() if (m := _CONF_FILE.fullmatch(p.name))]
    if not numbered:
        raise FileNotFoundError(f"no LemonLDAP configuration in {run / 'conf'}")
    path = max(numbered)[1]
    return path, json.loads(path.read_text())


def update_client(run: Path, *, hub_urls: Sequence[str] = (), client_secret: str | None = None) -> int:
    """Register more hubs (their redirect and after-logout URIs, kept with those there already) and/or set the client
    secret, as the configuration with the next number; that number. The portal takes it within ``checkTime``."""
    old_path, conf = current(run)
    options = conf["oidcRPMetaDataOptions"][RP]
    for hub in hub_urls:
        redirects, after_logout = hub_uris(hub)
        for key, uris in ((_REDIRECTS, redirects), (_AFTER_LOGOUT, after_logout)):
            known = options[key].split()
            options[key] = " ".join(known + [u for u in uris if u not in known])
    if client_secret is not None:
        options[_SECRET] = client_secret
    conf["cfgNum"] += 1
    conf["cfgDate"] = str(int(time.time()))
    _write_json(run / "conf" / f"lmConf-{conf['cfgNum']}.json", conf)
    old_path.unlink()
    # A portal that runs as an ordinary account trusts its local cache of the configuration without looking at the
    # files (as root it always looks); without the cache it reads the files again.
    shutil.rmtree(run / "cache" / "lemonldap-ng-config", ignore_errors=True)
    return int(conf["cfgNum"])


def main(argv: Sequence[str]) -> int:
    if len(argv) < 4:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python -m tests.identity.lemonldap_conf RUN PORT LDAP_URL CA_FILE [HUB_URL...]", file=sys.stderr)
        return 2
    run, port, ldap_url, ca_file, *hubs = argv
    print(write_configuration(Path(run), int(port), ldap_url, Path(ca_file), hubs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
