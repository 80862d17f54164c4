"""No token or password of a real run reaches a log (issue 46, item 4).

A real run of the local backend, as a class uses it: the admin logs in with a password (the account
``WORKBENCH_ADMIN_PASSWORD`` made at start, or signed up where the hub does not make it),
a student signs up, is authorized, mistypes the password once and logs in; the admin's browser opens
the workbench service and the student's browser their server (the hub's OAuth both times); a user
token is made through the hub's API, and spawns and stops the student's server; the hub's API, the
service's API and the user server are called with ``?token=`` (the student's token and the hub's
``WORKBENCH_ADMIN_TOKEN``), which JupyterHub 6 ignores but every access log sees.

Then every log the run wrote is read for every secret it used (each password, the tokens, the login
cookies of the hub, the service and the user server, the OAuth codes the browsers carried, and the
tokens the hub gave its services, its proxy and the user server): none may be there, as is or
URL-encoded. The logs are found, not listed: every file an open descriptor of any process of the
run pointed at while all of them ran (the hub, its proxy, its services, the user server; their
stdout and stderr among them), and every file under the data dir. The test prints which files it
read, and fails if a process writes its output somewhere it cannot read (a pipe, a socket).
JupyterHub hides such values as ``[secret]``; the test checks that the requests were logged at all,
so a quiet log cannot pass it.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

import pytest
import requests

from tests.conftest import hub_form, process_env
from tests.integration.hub_state import sign_ups
from tests.integration.sign_ups import admin_session, authorized_student, log_in
from tests.integration.test_hub_killed import service_processes
from tests.service.conftest import WorkbenchHub, shut_down, start_workbench_hub

pytestmark = pytest.mark.integration

STUDENT = "carol"
# Letters, digits and hyphens: a password reads the same in a form body, a URL and JSON.
ADMIN_PASSWORD = f"admin-{secrets.token_hex(8)}"
STUDENT_PASSWORD = f"student-{secrets.token_hex(8)}"
WRONG_PASSWORD = f"mistyped-{secrets.token_hex(8)}"
# Cookies that are no credential: _xsrf is echoed in every form by design; jupyterhub-session-id names
# the browser's session (JupyterHub logs it as it sets the _xsrf cookie), logging in takes the login cookie.
NOT_SECRET_COOKIES = ("_xsrf", "jupyterhub-session-id")
OAUTH_CODE = "an OAuth code"


def run_processes(hub: WorkbenchHub) -> dict[int, str]:
    """Every process of the run now: the hub and its descendants (proxy, services), its proxy, the user
    servers (which JupyterHub lets outlive the hub, found by their home), each with what it runs."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    assert hub.proc is not None
    found = {hub.proc.pid}
    found |= {int((hub.data_dir / "jupyterhub-proxy.pid").read_text())} | set(hub.server_pids())
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            break
        found |= more
    named = {}
    for pid in found:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        # The program and what it runs: "python -m workbench_hub.service", "node configurable-http-proxy".
        named[pid] = " ".join(Path(arg).name if arg.startswith("/") else arg for arg in argv[:3] if arg)
    return named


def open_files(pids: dict[int, str]) -> tuple[dict[Path, set[str]], list[str]]:
    """The regular files the processes hold open, each with the processes whose stdout or stderr it is;
    and each stdout or stderr that is no file (a pipe, a socket: somewhere this test cannot read)."""
    files: dict[Path, set[str]] = {}
    unreadable = []
    for pid, command in pids.items():
        try:
            descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in descriptors:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            output = fd.name in ("1", "2")
            if target.startswith("/") and Path(target).is_file():
                files.setdefault(Path(target), set()).update({command} if output else set())
            elif output and target != "/dev/null":
                unreadable.append(f"{command} writes fd {fd.name} to {target}")
    return files, unreadable


def oauth_codes(response: requests.Response) -> list[str]:
    """The OAuth codes a browser carried through the redirects that led to ``response``."""
    codes = []
    for step in [*response.history, response]:
        for url in (step.url, step.headers.get("Location", "")):
            codes += parse_qs(urlparse(url).query).get("code", [])
    return list(dict.fromkeys(codes))


def cookie_secrets(session: requests.Session, whose: str) -> dict[str, str]:
    return {
        f"{whose}'s cookie {c.name}": c.value
        for c in session.cookies
        if c.value and c.name not in NOT_SECRET_COOKIES and "oauth-state" not in c.name
    }


def found_in(files: set[Path], used: dict[str, str]) -> list[str]:
    """Where each secret appears, as is or URL-encoded (the first three places in each file), one line
    each, the secret itself left out; except an OAuth code in JupyterHub's database, which keeps each
    code until it is redeemed (SQLite's write-ahead log may hold the bytes a while after)."""
    found = []
    for path in sorted(files):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for label, value in used.items():
            if label.startswith(OAUTH_CODE) and path.name.startswith("jupyterhub.sqlite"):
                continue
            for form in {value, quote(value, safe="")}:
                at = data.find(form.encode())
                for _ in range(3):
                    if at < 0:
                        break
                    start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
                    line = data[start : end if end >= 0 else None].decode(errors="replace")
                    found.append(f"{label} in {path}: {line.replace(form, f'<{label}>')[:300]}")
                    at = data.find(form.encode(), at + 1)
    return found


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = start_workbench_hub(
        tmp_path_factory.mktemp("hub") / "hub",
        {"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_ADMIN_PASSWORD": ADMIN_PASSWORD},
    )
    try:
        yield hub
    finally:
        shut_down(hub)


def test_no_token_or_password_of_a_real_run_is_in_any_log(hub, capsys):
    url = hub.url
    used: dict[str, str] = {
        "WORKBENCH_ADMIN_TOKEN": hub.token,
        "the admin's password (WORKBENCH_ADMIN_PASSWORD)": ADMIN_PASSWORD,
        "the student's password": STUDENT_PASSWORD,
        "a mistyped password": WRONG_PASSWORD,
    }
    # WORKBENCH_ADMIN_PASSWORD: the admin's account made at start where the hub does that, else signed up.
    made = "admin" in sign_ups(hub)
    admin = log_in(hub, "admin", ADMIN_PASSWORD) if made else admin_session(hub, ADMIN_PASSWORD)
    authorized_student(admin, hub, STUDENT, STUDENT_PASSWORD)
    wrong = hub_form(requests.Session(), url, "/hub/login", {"username": STUDENT, "password": WRONG_PASSWORD})
    assert wrong.status_code != 302, "a wrong password logged in"
    student = log_in(hub, STUDENT, STUDENT_PASSWORD)
    token = used["the student's API token"] = hub.user_token(STUDENT)

    # The token in the URL, on the hub's API, the service's API and the user server. JupyterHub 6 and
    # its services take a token only from the Authorization header (a URL's is ignored: 403), but a
    # client that puts it in the URL still sends it, and every access log sees the URL.
    r = requests.post(
        f"{url}/hub/api/users/{STUDENT}/server",
        json={"gpus": 1},
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(STUDENT)
    in_url = [
        ("/hub/api/user", token),
        ("/hub/api/users", hub.token),
        ("/services/workbench/api/usage", token),
        ("/services/workbench/api/quotas", hub.token),
        (f"/user/{STUDENT}/api/status", token),
    ]
    for path, secret in in_url:
        r = requests.get(f"{url}{path}?token={secret}", allow_redirects=False, timeout=30)
        assert r.status_code < 500, f"GET {path}?token=...: {r.status_code} {r.text[:300]}"

    # The browsers through the hub's OAuth: the admin to the service, the student to their server.
    codes = []
    for session, path in ((admin, "/services/workbench/"), (student, f"/user/{STUDENT}/lab")):
        r = session.get(f"{url}{path}", timeout=60)
        assert r.status_code == 200, f"GET {path} in the browser: {r.status_code} {r.text[-500:]}"
        codes += oauth_codes(r)
    assert len(codes) >= 2, "the browsers went through no OAuth login"
    used |= {f"{OAUTH_CODE} ({i + 1})": code for i, code in enumerate(codes)}
    used |= cookie_secrets(admin, "the admin") | cookie_secrets(student, "the student")

    # What the hub gave the processes of the run, and where they all write, while they all run.
    processes = run_processes(hub)
    services = service_processes(hub)
    assert "workbench" in services.values()
    for pid, name in services.items():
        used[f"the {name} service's API token"] = process_env(pid)["JUPYTERHUB_API_TOKEN"]
    server_pids = hub.server_pids()
    assert server_pids, "no user server ran"
    used["the user server's API token"] = next(
        env["JUPYTERHUB_API_TOKEN"] for env in map(process_env, server_pids) if "JUPYTERHUB_API_TOKEN" in env
    )
    proxy_pid = int((hub.data_dir / "jupyterhub-proxy.pid").read_text())
    used["the proxy's auth token"] = process_env(proxy_pid)["CONFIGPROXY_AUTH_TOKEN"]
    held, unreadable = open_files(processes)
    assert not unreadable, f"output the test cannot read: {unreadable}"

    r = requests.delete(
        f"{url}/hub/api/users/{STUDENT}/server", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert r.status_code in (202, 204), r.text
    hub.wait_stopped(STUDENT)
    hub.stop()  # every log written and closed

    logs = set(held) | {path for path in hub.data_dir.rglob("*") if path.is_file()}
    read = [
        f"{path}" + (f" (the output of {'; '.join(sorted(held[path]))})" if held.get(path) else "")
        for path in sorted(logs)
    ]
    text = "\n".join(path.read_text(errors="replace") for path in logs if path.suffix == ".log")
    with capsys.disabled():
        print(f"\n{len(logs)} files read for {len(used)} secrets ({', '.join(sorted(used))}):\n" + "\n".join(read))
    # The requests with a token in the URL were logged (hidden or not): a quiet log would pass for nothing.
    for path, _ in in_url:
        assert re.search(re.escape(path) + r"\?\S*token=", text), f"no log line for {path}?token=..."
    short = [label for label, value in used.items() if len(value) < 8]
    assert not short, f"too short to be told apart from other text: {short}"
    leaks = found_in(logs, used)
    assert not leaks, "secrets in the run's files:\n" + "\n".join(leaks)
