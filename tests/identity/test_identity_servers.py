"""The test identity servers are the real thing: slapd checks certificates, passwords and locks and keeps memberOf,
stops and comes back with its data; LemonLDAP::NG runs the whole authorization-code flow with PKCE, puts the
directory's groups in userinfo, logs out without asking, and refuses a wrong client secret.

The LDAP side binds with ldap3, the library the hub's LDAPAuthenticator uses, with the certificate checks the hub
sets; the provider is driven with requests, form by form, as a browser would.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import socket
import ssl
import time
from contextlib import suppress
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import ldap3
import pytest
import requests
from ldap3.core.exceptions import LDAPException, LDAPStartTLSError

from tests.conftest import free_port
from tests.identity.servers import Directory, SSOProvider, portal_message, sign_in

THE_DIRECTORY = {
    "alice": ["hpc-lab", "ml-course"],
    "bob": ["ml-course", "stats-course"],
    "carol": ["stats-course"],
    "tina": ["hpc-lab", "staff"],
    "dave": [],
    "mallory": [],
}


def ldap_bind(url: str, dn: str, password: str, ca_file: Path | None) -> str:
    """Bind over TLS (StartTLS for ldap://, TLS at once for ldaps://) checking the server's certificate against
    ``ca_file`` (None: the system's CAs), as the hub does; the bind's result ("success", "invalidCredentials")."""
    host, port = urlparse(url).hostname, urlparse(url).port
    tls = ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=str(ca_file) if ca_file else None)
    server = ldap3.Server(host, port=port, use_ssl=url.startswith("ldaps://"), tls=tls, connect_timeout=5)
    conn = ldap3.Connection(server, user=dn, password=password, receive_timeout=5)
    try:
        conn.open()
        if not url.startswith("ldaps://"):
            conn.start_tls()
        conn.bind()
        return str(conn.result["description"])
    finally:
        with suppress(LDAPException):  # after a refused StartTLS the socket is closed already
            conn.unbind()


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_directory_is_the_documented_one(directory: Directory) -> None:
    assert {user: directory.groups_of(user) for user in THE_DIRECTORY} == THE_DIRECTORY
    # memberOf: the groupOfNames only (hpc-lab is a posixGroup)
    assert directory.member_of("alice") == ["ml-course"]
    assert directory.member_of("tina") == ["staff"]
    assert directory.url == f"ldap://127.0.0.1:{directory.port}"
    assert directory.ldaps_url == f"ldaps://127.0.0.1:{directory.ldaps_port}"


def test_tls_binds_check_the_directory_certificate(directory: Directory) -> None:
    bob = directory.user_dn("bob")
    assert ldap_bind(directory.url, bob, "bob-pass-1", directory.ca_file) == "success"
    assert ldap_bind(directory.ldaps_url, bob, "bob-pass-1", directory.ca_file) == "success"
    assert ldap_bind(directory.url, directory.reader_dn, directory.reader_password, directory.ca_file) == "success"
    with pytest.raises(LDAPStartTLSError, match="CERTIFICATE_VERIFY_FAILED"):
        ldap_bind(directory.url, bob, "bob-pass-1", None)


def test_a_wrong_password_and_a_locked_account_are_refused(directory: Directory) -> None:
    assert ldap_bind(directory.url, directory.user_dn("bob"), "bob-pass-2", directory.ca_file) == "invalidCredentials"
    mallory = directory.user_dn("mallory")
    assert directory.is_locked("mallory")
    assert ldap_bind(directory.url, mallory, directory.password("mallory"), directory.ca_file) == "invalidCredentials"
    directory.unlock("mallory")
    assert ldap_bind(directory.url, mallory, directory.password("mallory"), directory.ca_file) == "success"
    directory.lock("dave")
    assert ldap_bind(directory.url, directory.user_dn("dave"), "dave-pass-1", directory.ca_file) == "invalidCredentials"


def test_five_wrong_passwords_lock_bob_until_an_admin_unlocks_him(directory: Directory) -> None:
    bob = directory.user_dn("bob")
    for _ in range(4):
        assert ldap_bind(directory.url, bob, "guess", directory.ca_file) == "invalidCredentials"
    assert not directory.is_locked("bob")
    assert ldap_bind(directory.url, bob, "guess", directory.ca_file) == "invalidCredentials"
    assert directory.is_locked("bob")
    assert ldap_bind(directory.url, bob, "bob-pass-1", directory.ca_file) == "invalidCredentials"
    directory.unlock("bob")
    # the count starts again: one more wrong password does not lock him
    assert ldap_bind(directory.url, bob, "guess", directory.ca_file) == "invalidCredentials"
    assert ldap_bind(directory.url, bob, "bob-pass-1", directory.ca_file) == "success"


def test_group_changes_show_in_the_groups_and_in_member_of(directory: Directory) -> None:
    directory.add_member("ml-course", "carol")
    directory.add_member("hpc-lab", "carol")  # a posixGroup: memberUid
    assert directory.groups_of("carol") == ["hpc-lab", "ml-course", "stats-course"]
    assert directory.member_of("carol") == ["ml-course", "stats-course"]
    directory.remove_member("stats-course", "carol")
    directory.remove_member("hpc-lab", "carol")
    assert directory.groups_of("carol") == ["ml-course"]
    assert directory.member_of("carol") == ["ml-course"]


def test_passwords_and_people_added_by_a_test(directory: Directory) -> None:
    directory.set_password("carol", "carol-pass-2")
    assert directory.password("carol") == "carol-pass-2"
    assert ldap_bind(directory.url, directory.user_dn("carol"), "carol-pass-2", directory.ca_file) == "success"
    assert ldap_bind(directory.url, directory.user_dn("carol"), "carol-pass-1", directory.ca_file) != "success"
    # the stored password is hashed (ppolicy's olcPPolicyHashCleartext), not kept as sent
    stored = directory.search(directory.user_dn("carol"), "(objectClass=*)", "userPassword")[0]["userPassword"]
    assert stored[0].startswith("{SSHA}")

    started = time.monotonic()
    students = [f"student{n:03d}" for n in range(200)]
    directory.add_users(students, groups=["ml-course"])
    took = time.monotonic() - started
    assert took < 5, f"adding 200 people took {took:.1f} s"
    assert directory.groups_of("student199") == ["ml-course"]
    assert directory.member_of("student000") == ["ml-course"]
    assert directory.password("student042") == "student042-pass-1"
    student = directory.user_dn("student042")
    assert ldap_bind(directory.url, student, "student042-pass-1", directory.ca_file) == "success"
    assert directory.add_user("erin", groups=["staff", "hpc-lab"]) == f"uid=erin,{directory.people_dn}"
    assert directory.groups_of("erin") == ["hpc-lab", "staff"]


def test_the_directory_stops_and_comes_back_with_its_data(directory: Directory) -> None:
    directory.add_member("staff", "dave")
    directory.stop()
    assert refuses(directory.port)
    assert refuses(directory.ldaps_port)
    started = time.monotonic()
    directory.start()
    assert time.monotonic() - started < 3
    assert directory.groups_of("dave") == ["staff"]
    assert ldap_bind(directory.ldaps_url, directory.user_dn("dave"), "dave-pass-1", directory.ca_file) == "success"


# The OpenID Connect provider --------------------------------------------------------------------------------------


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def code_flow(provider: SSOProvider, hub: str, user: str, password: str) -> tuple[requests.Session, dict]:
    """The authorization-code flow with PKCE as the hub runs it: authorize (the login page), the login form, the
    redirect to the hub's callback with the code, the token exchange; the browser's session and the token answer."""
    disco = provider.discovery()
    session = requests.Session()
    verifier, challenge = pkce()
    state = secrets.token_urlsafe(8)
    callback = f"{hub}/hub/oauth_callback"
    params = {
        "response_type": "code",
        "client_id": provider.client_id,
        "redirect_uri": callback,
        "scope": "openid profile email",
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    page = session.get(disco["authorization_endpoint"], params=params, allow_redirects=False, timeout=10)
    assert page.status_code == 200, page.text[:500]
    answer = sign_in(session, page, user, password)
    assert answer.status_code == 302, portal_message(answer.text) or answer.text[:500]
    location = answer.headers["Location"]
    assert location.startswith(f"{callback}?"), location
    query = parse_qs(urlparse(location).query)
    assert query["state"] == [state]
    exchange = {"grant_type": "authorization_code", "code": query["code"][0], "redirect_uri": callback}
    token = provider.token_request({**exchange, "code_verifier": verifier})
    assert token.status_code == 200, token.text
    return session, token.json()


def userinfo(provider: SSOProvider, access_token: str) -> requests.Response:
    return requests.get(
        provider.discovery()["userinfo_endpoint"], headers={"Authorization": f"Bearer {access_token}"}, timeout=10
    )


def test_the_discovery_document_names_the_provider_as_its_issuer(sso_provider: SSOProvider) -> None:
    disco = sso_provider.discovery()
    assert disco["issuer"] == sso_provider.issuer == f"http://127.0.0.1:{sso_provider.port}"
    assert disco["authorization_endpoint"] == f"{sso_provider.issuer}/oauth2/authorize"
    assert disco["token_endpoint"] == f"{sso_provider.issuer}/oauth2/token"
    assert disco["end_session_endpoint"] == f"{sso_provider.issuer}/oauth2/logout"
    assert "S256" in disco["code_challenge_methods_supported"]


def test_a_login_brings_the_directory_groups_and_logout_ends_it(sso_provider: SSOProvider) -> None:
    hub = f"http://127.0.0.1:{free_port()}"
    sso_provider.allow_hub(hub)

    session, bob = code_flow(sso_provider, hub, "bob", "bob-pass-1")
    info = userinfo(sso_provider, bob["access_token"])
    assert info.status_code == 200, info.text
    assert info.json()["preferred_username"] == "bob"
    assert sorted(info.json()["groups"]) == ["ml-course", "stats-course"]  # in no fixed order

    _, dave = code_flow(sso_provider, hub, "dave", "dave-pass-1")
    assert "groups" not in userinfo(sso_provider, dave["access_token"]).json()  # in no group: no claim at all

    # Logout goes back to the hub without a confirmation page, and bob's session at the provider is over.
    after = f"{hub}/hub/login"
    r = session.get(sso_provider.logout_url(after), allow_redirects=False, timeout=10)
    assert (r.status_code, r.headers.get("Location")) == (302, after)
    assert userinfo(sso_provider, bob["access_token"]).status_code == 401
    assert userinfo(sso_provider, dave["access_token"]).status_code == 200  # someone else's session goes on
    params = {"response_type": "code", "client_id": sso_provider.client_id, "redirect_uri": f"{hub}/hub/oauth_callback"}
    again = session.get(f"{sso_provider.issuer}/oauth2/authorize", params=params, allow_redirects=False, timeout=10)
    assert again.status_code == 200
    assert 'name="password"' in again.text


def portal_login(provider: SSOProvider, hub: str, user: str, password: str) -> requests.Response:
    """One login at the provider's page on the way to ``hub``; the answer to the form, not followed."""
    session = requests.Session()
    _, challenge = pkce()
    params = {
        "response_type": "code",
        "client_id": provider.client_id,
        "redirect_uri": f"{hub}/hub/oauth_callback",
        "scope": "openid",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    page = session.get(f"{provider.issuer}/oauth2/authorize", params=params, timeout=10)
    return sign_in(session, page, user, password)


def test_the_portal_says_wrong_credentials_and_directory_down(sso_provider: SSOProvider) -> None:
    hub = f"http://127.0.0.1:{free_port()}"
    sso_provider.allow_hub(hub)
    for user, password in (("bob", "bob-pass-2"), ("mallory", "mallory-pass-1")):
        answer = portal_login(sso_provider, hub, user, password)
        assert (answer.status_code, portal_message(answer.text)) == (200, "Wrong credentials"), user

    sso_provider.directory.stop()
    answer = portal_login(sso_provider, hub, "bob", "bob-pass-1")
    assert (answer.status_code, portal_message(answer.text)) == (200, "Unable to connect to LDAP server")
    sso_provider.directory.start()
    answer = portal_login(sso_provider, hub, "bob", "bob-pass-1")
    assert answer.status_code == 302
    location = urlparse(answer.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == f"{hub}/hub/oauth_callback"
    assert parse_qs(location.query)["code"]


def test_a_wrong_client_secret_is_refused_at_the_token_endpoint(sso_provider: SSOProvider) -> None:
    bogus = {"grant_type": "authorization_code", "code": "none"}
    r = sso_provider.token_request(bogus, secret="not-the-secret")
    assert (r.status_code, r.json()) == (401, {"error": "invalid_client"})
    r = sso_provider.token_request(bogus)  # the right secret: only the code is wrong
    assert (r.status_code, r.json()) == (400, {"error": "invalid_grant"})

    sso_provider.set_client_secret("workbench-hub-secret-2")
    r = sso_provider.token_request(bogus, secret="workbench-hub-secret")
    assert (r.status_code, r.json()) == (401, {"error": "invalid_client"})
