"""Courses against a real hub and service: an admin sets one up, its staff run it without being admins.

One hub for the module (2 H100 + 2 A100, simulated). ``ml-101``'s students are
ann and ben (its hub group); prof is on its staff through the hub group
``ml-staff``, ta by name; ``nlp`` is another course with its own student and
instructor. Every call goes through the hub's proxy with the caller's own
hub token, as their browser or script would, and every answer is checked
against the service's OpenAPI document (``WorkbenchHub.service``).
"""

from __future__ import annotations

import datetime
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import hub_form, hub_xsrf, native_sign_up

pytestmark = pytest.mark.integration

ML = {
    "title": "Machine learning 101",
    "ceiling": {"max_gpus": 1, "gpu_hours_per_week": 10, "allowed_models": ["H100-80GB"]},
    "staff_group": "ml-staff",
    "staff": ["ta"],
}
NLP = {"title": "NLP", "ceiling": {"max_gpus": 2}, "staff": ["nlp-prof"]}


@pytest.fixture(scope="module")
def hub(workbench_hub):
    hub = workbench_hub
    hub.create_users("prof", "ta", "ann", "ben", "cat", "nlp-prof")
    for group, users in (("ml-101", ["ann", "ben", "ta"]), ("ml-staff", ["prof"]), ("nlp", ["cat"])):
        r = hub.api("POST", f"/groups/{group}", json={"users": users})
        assert r.status_code == 201, r.text
    for name, body in (("ml-101", ML), ("nlp", NLP)):
        r = hub.service("PUT", f"api/courses/{name}", json=body)
        assert r.status_code == 200, r.text
    hub.tokens = {name: hub.user_token(name) for name in ("prof", "ta", "ann", "cat", "nlp-prof")}
    return hub


def as_(hub, who: str, method: str, path: str, **kwargs):
    return hub.service(method, path, token=hub.tokens[who], **kwargs)


def quota_of(hub, user: str) -> dict | None:
    return hub.service("GET", f"api/quotas/users/{user}").json()["quota"]


def test_the_admin_sets_a_course_up_and_bad_settings_are_refused_with_a_sentence(hub):
    course = hub.service("GET", "api/courses/ml-101").json()
    assert course == {
        "name": "ml-101",
        "title": "Machine learning 101",
        "starts": None,
        "ends": None,
        "ceiling": {"max_gpus": 1, "gpu_hours_per_week": 10.0, "allowed_models": ["H100-80GB"]},
        "staff_group": "ml-staff",
        "staff": ["ta"],
        "reservation_gpus": 0,
        "phase": "running",
    }
    for body, sentence in (
        ({**ML, "ceiling": {"max_gpus": 1, "allowed_models": ["V100"]}}, 'unknown GPU model "V100"'),
        ({**ML, "starts": "2027-03-12", "ends": "2027-01-11"}, "ends (2027-01-11) before it starts (2027-03-12)"),
        ({**ML, "staff_group": "ml-101"}, "must not be the course's own group"),
        ({**ML, "title": "   "}, "invalid course: title"),
        ({"title": "x"}, "ceiling"),
    ):
        r = hub.service("PUT", "api/courses/ml-101", json=body)
        assert r.status_code == 400, (body, r.text)
        assert sentence in r.json()["message"], r.json()["message"]
    assert hub.service("GET", "api/courses/ml-101").json()["title"] == "Machine learning 101"  # nothing changed
    r = as_(hub, "prof", "PUT", "api/courses/ml-101", json={**ML, "ceiling": {"max_gpus": 4}})
    assert r.status_code == 403
    assert r.json()["message"] == "only hub admins may set up courses (scope custom:workbench:admin)"
    assert hub.service("GET", "api/courses/ml-101").json()["ceiling"]["max_gpus"] == 1


def test_each_caller_sees_the_courses_they_teach_and_nothing_else(hub):
    names = lambda r: [c["name"] for c in r.json()["courses"]]  # noqa: E731
    assert names(hub.service("GET", "api/courses")) == ["ml-101", "nlp"]
    assert names(as_(hub, "prof", "GET", "api/courses")) == ["ml-101"]  # through the staff group
    assert names(as_(hub, "ta", "GET", "api/courses")) == ["ml-101"]  # named (and in the course's group)
    assert names(as_(hub, "ann", "GET", "api/courses")) == []
    r = as_(hub, "ann", "GET", "api/courses/ml-101/students")
    assert r.status_code == 403
    assert r.json()["message"].startswith("only the staff of ml-101 (its instructors and TAs) or a hub admin")
    assert as_(hub, "nlp-prof", "GET", "api/courses/ml-101").status_code == 403
    r = as_(hub, "prof", "GET", "api/courses/no-such-course")
    assert r.status_code == 404
    assert "no course named" in r.json()["message"]


def test_staff_set_a_students_quota_within_the_ceiling_and_no_further(hub):
    r = as_(hub, "prof", "PUT", "api/courses/ml-101/students/ann/quota", json={"max_gpus": 1, "gpu_hours_per_week": 5})
    assert r.status_code == 200, r.text
    assert r.json()["effective"]["origin"] == "own quota"
    assert r.json()["quota"]["updated_by"] == "user:prof for ml-101"
    assert quota_of(hub, "ann")["gpu_hours_per_week"] == 5.0
    refusals = [
        ("prof", "ann", {"max_gpus": 2, "gpu_hours_per_week": 5}, "at most 1 GPU at once, not 2"),
        (
            "prof",
            "ann",
            {"max_gpus": 1, "gpu_hours_per_week": None},
            "a student's quota must give a weekly budget of 10 GPU-hours or less",
        ),
        ("prof", "ann", {"max_gpus": 1, "gpu_hours_per_week": 5, "allowed_models": ["A100-40GB"]}, "not A100-40GB"),
        ("prof", "cat", {"max_gpus": 1, "gpu_hours_per_week": 5}, "cat is not a student of ml-101"),
        ("prof", "ta", {"max_gpus": 1, "gpu_hours_per_week": 5}, "ta is not a student of ml-101"),  # staff
        ("nlp-prof", "ann", {"max_gpus": 1}, "only the staff of ml-101"),
        ("ann", "ann", {"max_gpus": 1, "gpu_hours_per_week": 1}, "only the staff of ml-101"),
    ]
    for who, student, body, sentence in refusals:
        r = as_(hub, who, "PUT", f"api/courses/ml-101/students/{student}/quota", json=body)
        assert r.status_code == 403, (who, student, body, r.text)
        assert sentence in r.json()["message"], r.json()["message"]
    assert quota_of(hub, "ann")["gpu_hours_per_week"] == 5.0  # no refusal changed it
    assert quota_of(hub, "cat") is None
    # Another course's instructor within their own course, at the same moment as prof in theirs.
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(as_, hub, "nlp-prof", "PUT", "api/courses/nlp/students/cat/quota", json={"max_gpus": 2})
        b = pool.submit(
            as_,
            hub,
            "ta",
            "PUT",
            "api/courses/ml-101/students/ben/quota",
            json={"max_gpus": 1, "gpu_hours_per_week": 2},
        )
        assert (a.result().status_code, b.result().status_code) == (200, 200)
    assert (quota_of(hub, "cat")["max_gpus"], quota_of(hub, "ben")["gpu_hours_per_week"]) == (2, 2.0)
    r = as_(hub, "prof", "DELETE", "api/courses/ml-101/students/ben/quota")
    assert r.status_code == 204
    assert quota_of(hub, "ben") is None


def test_staff_see_their_students_gpus_and_stop_a_server_which_is_saved_first_and_told(hub):
    assert hub.spawn("ann", gpus=1).status_code in (201, 202)
    hub.wait_ready("ann")
    students = as_(hub, "prof", "GET", "api/courses/ml-101/students").json()
    rows = {s["name"]: s for s in students["students"]}
    assert sorted(rows) == ["ann", "ben"]  # ta is on the staff, not a student
    assert rows["ann"]["held_gpus"] == 1
    assert rows["ann"]["running"] == {"": {"ready": True, "pending": None}}
    assert rows["ben"]["running"] == {}

    r = as_(hub, "nlp-prof", "POST", "api/courses/ml-101/students/ann/stop", json={})
    assert r.status_code == 403
    assert hub.server("ann") is not None
    r = as_(hub, "prof", "POST", "api/courses/ml-101/students/ben/stop", json={})
    assert r.status_code == 404
    assert r.json()["message"].startswith("ben has no running default server")

    r = as_(hub, "prof", "POST", "api/courses/ml-101/students/ann/stop", json={"server": ""})
    assert r.status_code == 202, r.text
    assert "stopped by an instructor (prof) of ml-101" in r.json()["message"]
    hub.wait_stopped("ann")
    assert "stopped by an instructor (prof) of ml-101" in hub.stop_box("ann")
    assert hub.usage_reasons()["ann"][-1] == "stopped by an instructor: prof (ml-101)"
    assert "ann" not in hub.leases()


def test_a_change_made_while_the_hub_runs_holds_at_the_next_request(hub):
    """Staff come from the hub's groups at each request: removed from the staff group, refused at once;
    a course whose end date passed is read-only for its staff."""
    body = {"max_gpus": 1, "gpu_hours_per_week": 3}
    assert as_(hub, "prof", "PUT", "api/courses/ml-101/students/ann/quota", json=body).status_code == 200
    assert hub.api("DELETE", "/groups/ml-staff/users", json={"users": ["prof"]}).status_code == 200
    try:
        r = as_(hub, "prof", "PUT", "api/courses/ml-101/students/ann/quota", json=body)
        assert r.status_code == 403
        assert [c["name"] for c in as_(hub, "prof", "GET", "api/courses").json()["courses"]] == []
    finally:
        assert hub.api("POST", "/groups/ml-staff/users", json={"users": ["prof"]}).status_code == 200
    yesterday = (datetime.date.today() - datetime.timedelta(days=2)).isoformat()
    r = hub.service("PUT", "api/courses/ml-101", json={**ML, "ends": yesterday})
    assert r.status_code == 200
    assert r.json()["phase"] == "ended"
    try:
        r = as_(hub, "prof", "PUT", "api/courses/ml-101/students/ann/quota", json=body)
        assert r.status_code == 403
        assert r.json()["message"] == (
            f"the course ml-101 ended on {yesterday}, so its staff may no longer set a student's quota; "
            "a hub admin may change its end date"
        )
        assert as_(hub, "prof", "GET", "api/courses/ml-101/students").status_code == 200  # still readable
    finally:
        assert hub.service("PUT", "api/courses/ml-101", json=ML).status_code == 200


def test_deleting_a_course_leaves_its_group_and_quotas(hub):
    assert hub.service("PUT", "api/courses/gone", json={"title": "Gone", "ceiling": {"max_gpus": 1}}).status_code == 200
    assert hub.service("DELETE", "api/courses/gone").status_code == 204
    assert hub.service("GET", "api/courses/gone").status_code == 404
    assert hub.service("DELETE", "api/courses/gone").status_code == 204  # again: nothing to delete
    assert as_(hub, "prof", "DELETE", "api/courses/ml-101").status_code == 403
    assert hub.service("GET", "api/courses/ml-101").status_code == 200


def test_the_cli_sets_a_course_up_and_an_instructors_own_token_runs_it(hub):
    r = hub.cli(
        "course", "set", "cv", "--title", "Computer vision", "--starts", "2027-01-11", "--ends", "2027-03-12",
        "--max-gpus", "1", "--gpu-hours-per-week", "4", "--staff", "prof",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Set up cv: Computer vision (2027-01-11 to 2027-03-12, upcoming); staff: prof")
    assert "ceiling per student: 1 GPU(s) at once, 4 GPU-hours/week, any model" in r.stdout
    assert hub.api("POST", "/groups/cv", json={"users": ["ben"]}).status_code == 201
    mine = hub.cli("course", token=hub.tokens["prof"])
    assert mine.returncode == 0, mine.stderr
    assert [line.split(":")[0] for line in mine.stdout.splitlines()] == ["cv", "ml-101"]
    shown = hub.cli("course", "show", "cv", token=hub.tokens["prof"])
    assert shown.returncode == 0, shown.stderr
    assert "ben: 0 GPU(s) held, 0 GPU-hours this week" in shown.stdout
    done = hub.cli("course", "quota", "cv", "ben", "--max-gpus", "1", token=hub.tokens["prof"])
    assert done.returncode == 0, done.stderr
    assert "Set ben's quota for cv: 1 GPU(s) at once, 4 GPU-hours/week" in done.stdout  # the ceiling's budget
    # Refusals: the service's sentence and exit 1; a bad command line exit 2; nothing changed.
    above = hub.cli("course", "quota", "cv", "ben", "--max-gpus", "3", token=hub.tokens["prof"])
    assert (above.returncode, above.stdout) == (1, "")
    assert "the course cv may give a student at most 1 GPU at once, not 3" in above.stderr
    other = hub.cli("course", "quota", "nlp", "cat", "--max-gpus", "1", token=hub.tokens["prof"])
    assert other.returncode == 1
    assert "only the staff of nlp" in other.stderr
    assert hub.cli("course", "quota", "cv", token=hub.tokens["prof"]).returncode == 2
    bad = hub.cli("course", "set", "cv", "--title", "x")
    assert bad.returncode == 2
    assert "needs --title and --max-gpus" in bad.stderr
    assert quota_of(hub, "ben")["max_gpus"] == 1
    assert hub.cli("course", "delete", "cv").returncode == 0


ROSTER_SIZE = 300


def test_a_roster_of_300_makes_accounts_membership_staff_and_one_time_links_once(hub, tmp_path):
    assert (
        hub.service(
            "PUT", "api/courses/big", json={"title": "Big class", "ceiling": {"max_gpus": 1}, "staff": ["prof"]}
        ).status_code
        == 200
    )
    students = [f"s{i:03d}" for i in range(ROSTER_SIZE)]
    roster = tmp_path / "roster.csv"
    roster.write_text("Username,Name,Role\n" + "".join(f"{s},Student {s},\n" for s in students) + "kim,Kim,TA\n")
    started = time.monotonic()
    done = hub.cli("--json", "course", "import", "big", str(roster), token=hub.tokens["prof"])
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    print(f"roster of {ROSTER_SIZE + 1} rows imported in {took:.2f} s")  # the closing note's figure (-s)
    assert (answer["created"], answer["joined"], answer["staff_added"]) == (ROSTER_SIZE + 1, ROSTER_SIZE, 1)
    links = {row["user"]: row["invite"] for row in answer["rows"]}
    assert all(links[s] and links[s].startswith("/hub/signup?invite=") for s in students)
    assert sorted(hub.api("GET", "/groups/big").json()["users"]) == students
    assert hub.service("GET", "api/courses/big").json()["staff"] == ["prof", "kim"]

    # The same roster again changes nothing, and says so row by row (a link is shown only once).
    again = json.loads(hub.cli("--json", "course", "import", "big", str(roster), token=hub.tokens["prof"]).stdout)
    assert (again["created"], again["joined"], again["staff_added"]) == (0, 0, 0)
    assert {row["invite"] for row in again["rows"]} == {None}
    assert again["rows"][0]["first_login"].startswith("the sign-up link given before works until ")

    # s000 signs up through her link: authorized at once, she logs in; the link works once, for her name only.
    link = f"{hub.url}{links['s000']}"
    session = requests.Session()
    session.get(link, timeout=30)
    form = {"username": "s000", "signup_password": "s000-pass-4321", "signup_password_confirmation": "s000-pass-4321"}
    r = session.post(link, data={**form, "_xsrf": hub_xsrf(session)}, timeout=30)
    assert r.status_code == 200
    assert "The signup was successful! You can now log in" in r.text
    assert (
        hub_form(
            requests.Session(), hub.url, "/hub/login", {"username": "s000", "password": "s000-pass-4321"}
        ).status_code
        == 302
    )
    other = requests.Session()
    other.get(link, timeout=30)
    for name in ("s000", "s001"):  # used up; and another student's name on s000's link
        pw = f"{name}-pass-9876"
        body = {"username": name, "signup_password": pw, "signup_password_confirmation": pw, "_xsrf": hub_xsrf(other)}
        r = other.post(link, data=body, timeout=30)
        assert r.status_code == 403, r.text[-500:]
        assert "This sign-up link is not valid for that name" in r.text
    # Without a link, a roster's name waits for an admin like any sign-up (nobody takes s002's place).
    native_sign_up(requests.Session(), hub.url, "s002", "s002-pass-4321")
    assert (
        hub_form(
            requests.Session(), hub.url, "/hub/login", {"username": "s002", "password": "s002-pass-4321"}
        ).status_code
        != 302
    )


def test_a_bad_roster_is_refused_whole_with_its_line_numbers(hub, tmp_path):
    roster = tmp_path / "bad.csv"
    roster.write_text("username,role\nnew-one,student\nnew two,student\nnew-three,prof\n")
    r = hub.cli("course", "import", "ml-101", str(roster), token=hub.tokens["prof"])
    assert r.returncode == 1
    assert "line 3: 'new two' cannot be a login name" in r.stderr
    assert "line 4: role 'prof' is not one of student, ta, instructor" in r.stderr
    assert hub.api("GET", "/users/new-one").status_code == 404  # nothing of the file applied
    roster.write_text("username\nadmin\n")
    r = as_(hub, "prof", "POST", "api/courses/ml-101/roster", json={"csv": roster.read_text()})
    assert r.status_code == 403
    assert "line 2: admin is a hub admin" in r.json()["message"]
    r = as_(hub, "nlp-prof", "POST", "api/courses/ml-101/roster", json={"csv": "username\nx\n"})
    assert r.status_code == 403
    assert (
        hub.cli("course", "import", "ml-101", str(tmp_path / "missing.csv"), token=hub.tokens["prof"]).returncode == 2
    )


def test_staff_book_gpus_within_the_allowance_and_exempt_the_course_for_a_session(hub):
    r = as_(hub, "prof", "POST", "api/courses/ml-101/reservations", json={"gpus": 1, "window": "Thu 14:00-16:00"})
    assert r.status_code == 403
    assert r.json()["message"].startswith("the course ml-101 has no reservation allowance")
    assert hub.service("PUT", "api/courses/ml-101", json={**ML, "reservation_gpus": 2}).status_code == 200
    try:
        over = as_(
            hub, "prof", "POST", "api/courses/ml-101/reservations", json={"gpus": 3, "window": "Thu 14:00-16:00"}
        )
        assert over.status_code == 403
        assert "may reserve at most 2 GPUs at once, not 3" in over.json()["message"]
        made = hub.cli(
            "course", "reserve", "ml-101", "--gpus", "2", "--window", "Thu 14:00-16:00", token=hub.tokens["ta"]
        )
        assert made.returncode == 0, made.stderr
        assert "2 GPUs for ml-101, weekly Thu 14:00-16:00" in made.stdout
        listed = as_(hub, "prof", "GET", "api/courses/ml-101/reservations").json()["reservations"]
        assert [(x["group"], x["gpus"], x["preempt"]) for x in listed] == [("ml-101", 2, False)]
        rid = listed[0]["id"]
        assert as_(hub, "nlp-prof", "DELETE", f"api/courses/ml-101/reservations/{rid}").status_code == 403
        assert as_(hub, "nlp-prof", "DELETE", f"api/courses/nlp/reservations/{rid}").status_code == 404  # not nlp's
        assert hub.cli("course", "unreserve", "ml-101", str(rid), token=hub.tokens["prof"]).returncode == 0
        assert hub.service("GET", "api/reservations").json()["reservations"] == []

        # A session without idle reclaim, which ends by itself; an admin's exemption is not theirs to change.
        done = hub.cli(
            "course", "exempt", "ml-101", "--hours", "3", "--reason", "Thursday lab", token=hub.tokens["prof"]
        )
        assert done.returncode == 0, done.stderr
        exempt = {g["group"]: g for g in hub.service("GET", "api/idle").json()["exempt_groups"]}
        assert exempt["ml-101"]["reason"] == "Thursday lab"
        assert exempt["ml-101"]["until"] is not None
        long = as_(hub, "prof", "PUT", "api/courses/ml-101/idle-exemption", json={"hours": 13})
        assert long.status_code == 400
        assert hub.cli("course", "unexempt", "ml-101", token=hub.tokens["prof"]).returncode == 0
        assert hub.service("PUT", "api/idle/exemptions/ml-101", json={"reason": "research week"}).status_code == 200
        r = as_(hub, "prof", "PUT", "api/courses/ml-101/idle-exemption", json={"hours": 1})
        assert r.status_code == 409
        assert "a hub admin exempted ml-101 from idle reclaim without an end" in r.json()["message"]
        assert as_(hub, "prof", "DELETE", "api/courses/ml-101/idle-exemption").status_code == 409
        assert as_(hub, "nlp-prof", "PUT", "api/courses/ml-101/idle-exemption", json={"hours": 1}).status_code == 403
    finally:
        hub.service("DELETE", "api/idle/exemptions/ml-101")
        assert hub.service("PUT", "api/courses/ml-101", json=ML).status_code == 200
