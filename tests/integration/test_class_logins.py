"""A class logs in at once through the real login form, and the hub keeps answering.

NativeAuthenticator checked each password (bcrypt, cost 12: ~0.2 s of CPU) on the hub's event loop,
so a class pressing "Sign in" together stalled every request to the hub until the last check was
done (200 logins: the loop was unresponsive for 55 s). The checks now run in a thread pool
(workbench_hub/password_checks.py). Here 100 students, each with their own session, post the login
form at the same moment while another client samples ``GET /hub/api/`` every 100 ms: no sample may
take a second, and every student ends up logged in.

The 100 sign-ups are written into NativeAuthenticator's table before the hub starts (authorized,
with one precomputed bcrypt hash of cost 12): signing them up through the form costs ~30 s of
bcrypt. The hub makes them hub users when it starts (WorkbenchAuthenticator carries authorized
sign-ups over), as it does for sign-ups authorized on an earlier run. A second test goes through the
other forms whose bcrypt moved to the pool (sign-up, the "not authorized yet" answer, password changes)
on the same hub: NativeAuthenticator's answers are unchanged.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import bcrypt
import pytest
import requests

from tests.conftest import hub_form, hub_pool, native_sign_up, sign_up_decision

pytestmark = pytest.mark.integration

STUDENTS = [f"student{i:03d}" for i in range(100)]
PASSWORD = "a-long-enough-passphrase-42"
WORST_ALLOWED = 1.0  # seconds for one GET /hub/api/ while the class logs in
SAMPLE_EVERY = 0.1


def write_sign_ups(hub) -> None:
    """The students as authorized NativeAuthenticator sign-ups, in the hub's database before it starts.

    JupyterHub's own ``new_session_factory`` creates the database (its tables and schema revision,
    and ``users_info``, which importing nativeauthenticator's orm adds to JupyterHub's tables)."""
    from jupyterhub.orm import new_session_factory
    from nativeauthenticator.orm import UserInfo

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12))  # NativeAuthenticator's cost
    session = new_session_factory(f"sqlite:///{hub.data_dir / 'jupyterhub.sqlite'}")()
    try:
        session.add_all(UserInfo(username=name, password=hashed, is_authorized=True) for name in STUDENTS)
        session.commit()
    finally:
        session.close()
        session.get_bind().dispose()


@pytest.fixture(scope="module")
def class_hub(tmp_path_factory):
    with hub_pool(tmp_path_factory.mktemp("class"), prepare=write_sign_ups) as start:
        yield start()


class Sampler(threading.Thread):
    """``GET /hub/api/`` every 100 ms (start to start) until stopped; each answer's seconds."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.seconds: list[float] = []
        self.failures: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            while not self.done.is_set():
                started = time.monotonic()
                try:
                    r = session.get(f"{self.url}/hub/api/", timeout=60)
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code}: {r.text[:200]}")
                except requests.RequestException as exc:
                    self.failures.append(repr(exc))
                took = time.monotonic() - started
                self.seconds.append(took)
                self.done.wait(max(0.0, SAMPLE_EVERY - took))


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def test_a_class_logs_in_at_once_and_the_hub_keeps_answering(class_hub):
    hub = class_hub
    ready = threading.Barrier(len(STUDENTS))

    def log_in(name: str) -> tuple[str, requests.Response, float, requests.Session]:
        session = requests.Session()
        session.get(f"{hub.url}/hub/login", timeout=120)
        xsrf = session.cookies.get("_xsrf", "")
        ready.wait(timeout=120)  # every student has the form: all press "Sign in" together
        started = time.monotonic()
        r = session.post(
            f"{hub.url}/hub/login",
            data={"username": name, "password": PASSWORD, "_xsrf": xsrf},
            allow_redirects=False,
            timeout=120,
        )
        return name, r, time.monotonic() - started, session

    sampler = Sampler(hub.url)
    sampler.start()
    time.sleep(1)  # a few samples of the idle hub first
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(STUDENTS)) as pool:
        results = list(pool.map(log_in, STUDENTS))
    all_in = time.monotonic() - began
    time.sleep(0.5)
    sampler.done.set()
    sampler.join(60)

    worst, typical = max(sampler.seconds), p95(sampler.seconds)
    slowest_login = max(took for _, _, took, _ in results)
    print(
        f"\n100 logins in {all_in:.1f} s (slowest {slowest_login:.1f} s); {len(sampler.seconds)} samples of "
        f"GET /hub/api/: worst {worst:.3f} s, p95 {typical:.3f} s, median {statistics.median(sampler.seconds):.3f} s"
    )
    assert not sampler.failures, sampler.failures[:5]
    for name, r, _, _ in results:
        assert r.status_code == 302, f"{name}: {r.status_code} {r.text[:300]}\n{hub.log()[-3000:]}"
        assert r.headers["Location"].startswith("/hub/"), f"{name}: sent to {r.headers['Location']}"
    # Every session works: the hub's pages know the student (the login page would redirect).
    for name, _, _, session in results:
        r = session.get(f"{hub.url}/hub/api/user", timeout=30)
        assert r.status_code == 200, f"{name}: {r.status_code} {r.text[:300]}"
        assert r.json()["name"] == name
    assert worst <= WORST_ALLOWED, (
        f"GET /hub/api/ took {worst:.2f} s while the class logged in (p95 {typical:.2f} s): the hub's event loop "
        f"stalled\n{hub.log()[-3000:]}"
    )


def form_login(hub, name: str, password: str) -> tuple[requests.Session, requests.Response]:
    session = requests.Session()
    return session, hub_form(session, hub.url, "/hub/login", {"username": name, "password": password})


def test_the_forms_that_hash_keep_nativeauthenticators_answers(class_hub):
    """Sign-up, the "not authorized yet" answer, and both password changes, with their bcrypt in the pool."""
    hub = class_hub
    new, other = "another-long-passphrase-7", "yet-another-passphrase-9"
    assert "sent to the admin" in native_sign_up(requests.Session(), hub.url, "latecomer", PASSWORD)
    _, r = form_login(hub, "latecomer", PASSWORD)
    assert r.status_code == 200
    assert "has not been authorized by an administrator yet" in r.text
    _, r = form_login(hub, "latecomer", "not-the-password")
    assert r.status_code == 200
    assert "Invalid username or password." in r.text

    assert "The signup was successful" in native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    admin, r = form_login(hub, "admin", PASSWORD)
    assert r.status_code == 302, r.text
    assert sign_up_decision(admin, hub.url, "latecomer", "authorize").status_code == 302
    student, r = form_login(hub, "latecomer", PASSWORD)
    assert r.status_code == 302, r.text

    def change(session, path, fields):
        r = hub_form(session, hub.url, path, fields)
        assert r.status_code == 200, r.text
        return r.text

    fields = {"old_password": "wrong", "new_password": new, "new_password_confirmation": new}
    assert "Your current password was incorrect" in change(student, "/hub/change-password", fields)
    fields["old_password"] = PASSWORD
    mismatch = {**fields, "new_password_confirmation": other}
    assert "match the confirmation" in change(student, "/hub/change-password", mismatch)
    weak = {**fields, "new_password": "short", "new_password_confirmation": "short"}
    assert "at least 8 characters" in change(student, "/hub/change-password", weak)
    assert "changed successfully" in change(student, "/hub/change-password", fields)
    assert form_login(hub, "latecomer", new)[1].status_code == 302
    assert form_login(hub, "latecomer", PASSWORD)[1].status_code == 200

    fields = {"new_password": other, "new_password_confirmation": other}
    assert "has been changed successfully" in change(admin, "/hub/change-password/latecomer", fields)
    assert form_login(hub, "latecomer", other)[1].status_code == 302
    weak = {"new_password": "short", "new_password_confirmation": "short"}
    assert "at least 8 characters" in change(admin, "/hub/change-password/latecomer", weak)
    assert form_login(hub, "latecomer", other)[1].status_code == 302
