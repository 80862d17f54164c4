"""Home directory names: distinct users never share one, existing homes are found.

A table of hostile and colliding names proves the slug rule of
workbench_spawner/slugs.py: distinct names give distinct slugs, each slug is one
safe path component, the same name always gives the same slug, and the names
that were safe before keep their directory.
"""

from __future__ import annotations

import random
import re
import string

import pytest
from dockerspawner import DockerSpawner

from workbench_spawner import slugs
from workbench_spawner.backends.local.spawner import safe_dir_name

HOSTILE = [
    # the collisions of the first version
    "müller",
    "m-fc-ller",
    "a~b",
    "a-7e-b",
    "a~b-c",
    "a-7e-b-c",
    # dot tricks and separators
    ".",
    "..",
    "...",
    ".alice",
    "alice.",
    ".-2e-",
    "-2e-",
    "/",
    "//",
    "../etc",
    "a/b",
    "a\\b",
    "a:b",
    # the escape character and look-alikes of escapes
    "-",
    "--",
    "-2d-",
    "-2d",
    "2d-",
    "a-",
    "-a",
    "a--b",
    "-0-",
    "-41-",
    "A",
    "-hash-" + "0" * 32,
    # the first version's special case for all-dot names
    "user-",
    "user-2e",
    "user-2e2e",
    # empty-looking names
    " ",
    "  ",
    "\t",
    "\n",
    "\x00",
    "\u200b",
    "\u00a0",
    "\ufeff",
    # case
    "alice",
    "Alice",
    "ALICE",
    "aLiCe",
    # unicode
    "日本語",
    "😀",
    "e\u0301",
    "\u00e9",
    "ü",
    "\U0010ffff",
    "\ud800",
    # ordinary names, with the characters e-mail addresses use
    "mary-jane",
    "mary_jane",
    "mary.jane",
    "mary@example.org",
    "mary+gpu@example.org",
    "x" * 8,
    # very long names: the slug is cut and hashed
    "x" * 255,
    "x" * 256,
    "x" * 1000,
    "x" * 1001,
    "ü" * 100,
    "ü" * 101,
    "ü" * 300,
    "-" * 200,
    "x" * 254 + "ü",
    "x" * 254 + "ä",
]
assert len(set(HOSTILE)) == len(HOSTILE)

SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_.@+-]+")


def test_distinct_names_give_distinct_slugs():
    produced = {slugs.dir_slug(name) for name in HOSTILE}
    assert len(produced) == len(HOSTILE)


@pytest.mark.parametrize("name", HOSTILE, ids=ascii)
def test_slug_is_one_safe_path_component(name, tmp_path):
    slug = slugs.dir_slug(name)
    assert SAFE_COMPONENT.fullmatch(slug), slug
    assert slug not in (".", "..")
    assert not slug.startswith(".")
    assert len(slug.encode()) <= 255
    (tmp_path / slug).mkdir()  # the file system takes it, as one directory
    assert [p.name for p in tmp_path.iterdir()] == [slug]


@pytest.mark.parametrize("name", HOSTILE, ids=ascii)
def test_slug_is_stable_and_reads_back(name):
    slug = slugs.dir_slug(name)
    assert slugs.dir_slug(name) == slug == safe_dir_name(name)
    if slug == slugs.dir_slug(name, max_length=10**9):  # short enough: not hashed
        assert slugs.name_of_slug(slug) == name
    else:
        assert slugs.name_of_slug(slug) is None
        assert re.search(r"-hash-[0-9a-f]{32}$", slug)


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("alice", "alice"),
        ("Alice", "Alice"),
        ("mary@example.org", "mary@example.org"),
        ("müller", "m-fc-ller"),
        ("m-fc-ller", "m-2d-fc-2d-ller"),
        ("a~b", "a-7e-b"),
        ("a-7e-b", "a-2d-7e-2d-b"),
        (".", "-2e-"),
        ("..", "-2e-."),
        (".alice", "-2e-alice"),
        ("/", "-2f-"),
        ("a b", "a-20-b"),
        ("😀", "-1f600-"),
    ],
)
def test_slug_table(name, slug):
    """Pinned: a change here moves homes, so it must be deliberate."""
    assert slugs.dir_slug(name) == slug


def test_long_names_are_cut_and_hashed():
    a, b = slugs.dir_slug("x" * 300 + "a"), slugs.dir_slug("x" * 300 + "b")
    assert a != b
    assert len(a) == len(b) == 255
    assert a.startswith("x" * 200)
    assert re.fullmatch(r"x+-hash-[0-9a-f]{32}", a)
    # Cut between tokens: no half escape before the hash mark.
    assert re.fullmatch(r"(-fc-)+-hash-[0-9a-f]{32}", slugs.dir_slug("ü" * 300))
    assert len(slugs.dir_slug("x" * 100, max_length=64)) == 64


def test_empty_name_is_refused():
    with pytest.raises(ValueError, match="empty"):
        slugs.dir_slug("")


@pytest.mark.parametrize(
    "slug", ["", "-", "--", "-2D-", "-02d-", "-61-", "a.-2e-", ".a", "-hash-", "a/b", "-110000-", "ü"]
)
def test_only_exact_slugs_read_back(slug):
    """Non-canonical spellings name nobody, so they cannot alias a real slug."""
    assert slugs.name_of_slug(slug) is None


def test_names_safe_before_keep_their_directory():
    """[A-Za-z0-9_.@+] without a leading dot: the old and the new mapping agree."""
    rng = random.Random(1234)
    alphabet = string.ascii_letters + string.digits + "_.@+"
    names = ["alice", "bob.smith", "a@b.org", "x+y", "_", "a.", "Z9"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(2000)]
    for name in names:
        if not name.startswith("."):
            assert slugs.dir_slug(name) == slugs.legacy_dir_name(name), name


def test_random_names_never_collide():
    rng = random.Random(99)
    alphabet = "a-.~/ü2de_ " + "\u200b"
    names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(20000)}
    produced = {slugs.dir_slug(n) for n in names}
    assert len(produced) == len(names)
    assert all(slugs.name_of_slug(slugs.dir_slug(n)) == n for n in names)


def test_the_old_mapping_collided():
    """Why the rule changed: the first version gave these pairs one directory."""
    for a, b in [("müller", "m-fc-ller"), ("a~b", "a-7e-b"), (".", "user-2e")]:
        assert slugs.legacy_dir_name(a) == slugs.legacy_dir_name(b)
        assert slugs.dir_slug(a) != slugs.dir_slug(b)


@pytest.mark.parametrize(
    ("dir_name", "owners"),
    [
        ("alice", 1),
        ("mary-jane", 1),
        ("a-41-b", 1),  # 'A' was never escaped, so this is only the literal name
        ("a-7e-b", 2),  # a-7e-b and a~b
        ("m-fc-ller", 2),
        ("a-7e-b-c", 2),  # a-7e-b-c and a~b-c
        ("-2d-", 1),
        ("user-2e", 2),  # the name '.' and the name 'user-2e'
        ("user-", 2),  # the empty name and 'user-'
        ("-fc--fc-", 2),  # 'üü' and '-fc--fc-'
    ],
)
def test_legacy_owner_count(dir_name, owners):
    assert slugs.legacy_owner_count(dir_name) == owners
    assert sum(slugs.legacy_dir_name(n) == dir_name for n in {*HOSTILE, dir_name, "üü"}) <= owners


def homes(tmp_path, *existing: str) -> str:
    for name in existing:
        (tmp_path / "homes" / name).mkdir(parents=True)
    return str(tmp_path / "homes" / "{username}")


@pytest.mark.parametrize(
    ("name", "existing", "home", "warns"),
    [
        # Names that were safe: the same directory, whatever exists.
        ("alice", [], "alice", False),
        ("alice", ["alice"], "alice", False),
        # An old home that is unambiguously this user's is used in place.
        ("mary-jane", ["mary-jane"], "mary-jane", False),
        (".alice", [".alice"], ".alice", False),
        ("a b", ["a-20-b"], "a-20-b", False),  # new == old: no '-' in the name
        # No old home: the new slug.
        ("mary-jane", [], "mary-2d-jane", False),
        # Once the new directory exists it wins for good.
        ("mary-jane", ["mary-jane", "mary-2d-jane"], "mary-2d-jane", False),
        # The old directory is someone else's new one: it stays theirs.
        ("m-fc-ller", ["m-fc-ller"], "m-2d-fc-2d-ller", True),
        ("müller", ["m-fc-ller"], "m-fc-ller", False),
        ("a-7e-b", ["a-7e-b"], "a-2d-7e-2d-b", True),
        # The old function gave the directory to two names: nobody gets it.
        ("a-7e-b-c", ["a-7e-b-c"], "a-2d-7e-2d-b-2d-c", True),
        ("a~b-c", ["a-7e-b-c"], "a-7e-b-2d-c", True),
        ("user-2e", ["user-2e"], "user-2d-2e", True),
        (".", ["user-2e"], "-2e-", True),
    ],
)
def test_existing_homes(tmp_path, name, existing, home, warns):
    template = homes(tmp_path, *existing)
    choice = slugs.home_dir(template, name)
    assert choice.path == str(tmp_path / "homes" / home)
    assert bool(choice.warning) == warns
    if warns:
        assert repr(name) in choice.warning
        assert str(tmp_path / "homes") in choice.warning
    # Stable: asking again, or after the server made the directory, gives the same answer.
    assert slugs.home_dir(template, name) == choice
    (tmp_path / "homes" / home).mkdir(parents=True, exist_ok=True)
    assert slugs.home_dir(template, name).path == choice.path
    assert sorted(p.name for p in (tmp_path / "homes").iterdir()) == sorted(set(existing) | {home})


def test_existing_homes_under_a_deeper_template(tmp_path):
    (tmp_path / "mary-jane" / "work").mkdir(parents=True)
    template = str(tmp_path / "{username}" / "work")
    assert slugs.home_dir(template, "mary-jane").path == str(tmp_path / "mary-jane" / "work")
    assert slugs.home_dir(template, "bob-x").path == str(tmp_path / "bob-2d-x" / "work")


def test_two_users_of_a_shared_old_home_get_different_homes(tmp_path):
    template = homes(tmp_path, "m-fc-ller", "a-7e-b-c")
    for pair in [("müller", "m-fc-ller"), ("a~b-c", "a-7e-b-c")]:
        paths = {slugs.home_dir(template, n).path for n in pair}
        assert len(paths) == 2


def test_local_spawner_home_dir(local_spawner, tmp_path, caplog):
    (tmp_path / "homes" / "mary-jane").mkdir(parents=True)
    (tmp_path / "homes" / "m-fc-ller").mkdir(parents=True)
    assert local_spawner("alice").home_dir == str(tmp_path / "homes" / "alice")
    assert local_spawner("mary-jane").home_dir == str(tmp_path / "homes" / "mary-jane")
    assert local_spawner("müller").home_dir == str(tmp_path / "homes" / "m-fc-ller")
    assert local_spawner("m-fc-ller").home_dir == str(tmp_path / "homes" / "m-2d-fc-2d-ller")


# DockerSpawner's own escape fills {username} in workbench-home-{username}: it
# is collision-free already (every '-' opens exactly '-' + two hex digits), so
# volume names are left as DockerSpawner makes them.
def test_docker_volume_names_are_distinct():
    escape = DockerSpawner._escape
    names = [n for n in HOSTILE if "\ud800" not in n]  # not UTF-8: JupyterHub cannot have it
    volumes = {f"workbench-home-{escape(n)}" for n in names}
    assert len(volumes) == len(names)
    assert escape("müller") == "m-c3-bcller"
    assert escape("m-fc-ller") == "m-2dfc-2dller"
    assert escape("a~b") != escape("a-7e-b")
    assert escape("Alice") != escape("alice")
    assert all(re.fullmatch(r"[a-z0-9-]+", escape(n)) for n in names)
