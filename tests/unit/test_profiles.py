"""Resource profiles: the configuration is checked at hub start, every mistake named."""

import pytest

from workbench_spawner.rules.profiles import (
    ProfileError,
    ResourceProfile,
    default_profile,
    parse_profiles,
    profiles_from_text,
)

GiB = 1 << 30


def test_profiles_parse_with_limits_in_cores_and_bytes():
    profiles = parse_profiles(
        [
            {"slug": "small", "cpu_limit": 2, "mem_limit": "8G"},
            {
                "slug": "large",
                "display_name": "Large (project weeks)",
                "cpu_limit": "16",
                "mem_limit": 64 * GiB,
                "description": "for the final project",
                "default": True,
            },
            {"slug": "mem-only", "mem_limit": "512M"},
        ]
    )
    assert profiles[0] == ResourceProfile("small", "small", 2.0, 8 * GiB)
    assert profiles[1].cpu_limit == 16.0
    assert profiles[1].mem_limit == 64 * GiB
    assert profiles[2].cpu_limit is None
    assert profiles[2].mem_limit == 512 << 20
    assert default_profile(profiles).slug == "large"
    assert profiles[0].summary() == "2 CPUs, 8 GiB memory"
    assert profiles[2].summary() == "512 MiB memory"
    assert ResourceProfile("tiny", "tiny", cpu_limit=0.5).summary() == "0.5 CPUs"
    assert ResourceProfile("one", "one", cpu_limit=1).summary() == "1 CPU"


def test_without_a_marked_default_the_first_is_the_default():
    profiles = parse_profiles([{"slug": "a", "cpu_limit": 1}, {"slug": "b", "cpu_limit": 2}])
    assert default_profile(profiles).slug == "a"
    assert default_profile([]) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([{"cpu_limit": 2}], "slug must be 1-40 lower-case letters"),
        ([{"slug": "Big GPU", "cpu_limit": 2}], "not 'Big GPU'"),
        ([{"slug": "a", "cpu_limit": 1}, {"slug": "a", "cpu_limit": 2}], "'a' is defined twice"),
        ([{"slug": "a"}], "sets neither cpu_limit nor mem_limit"),
        ([{"slug": "a", "cpu_limit": 0}], "more than 0 cores"),
        ([{"slug": "a", "cpu_limit": "-1"}], "more than 0 cores"),
        ([{"slug": "a", "cpu_limit": "nan"}], "more than 0 cores"),
        ([{"slug": "a", "cpu_limit": "four"}], "number of cores such as 4 or 0.5, not 'four'"),
        ([{"slug": "a", "cpu_limit": True}], "number of cores"),
        ([{"slug": "a", "mem_limit": "16"}], "size such as 16G or 512M, not '16'"),
        ([{"slug": "a", "mem_limit": "16GB"}], "size such as 16G or 512M, not '16GB'"),
        ([{"slug": "a", "mem_limit": "-1G"}], "more than 0 bytes"),
        ([{"slug": "a", "mem_limit": ""}], "size such as 16G"),
        ([{"slug": "a", "cpu_limit": 1, "gpus": 2}], "unknown key(s) 'gpus'"),
        (
            [{"slug": "a", "cpu_limit": 1, "default": True}, {"slug": "b", "cpu_limit": 1, "default": True}],
            "only one resource profile can be the default, not a, b",
        ),
        (["small"], "must be a mapping"),
    ],
)
def test_bad_profiles_are_refused_with_a_reason(raw, message):
    with pytest.raises(ProfileError) as err:
        parse_profiles(raw)
    assert message in str(err.value)


def test_compact_text_form_of_workbench_profiles():
    entries = profiles_from_text(" small:2:8G, standard*:4:16G ,large::64G,")
    assert entries == [
        {"slug": "small", "default": False, "cpu_limit": "2", "mem_limit": "8G"},
        {"slug": "standard", "default": True, "cpu_limit": "4", "mem_limit": "16G"},
        {"slug": "large", "default": False, "mem_limit": "64G"},
    ]
    profiles = parse_profiles(entries)
    assert default_profile(profiles).slug == "standard"
    assert profiles[2].cpu_limit is None
    with pytest.raises(ProfileError, match="must be slug:cpus:memory"):
        profiles_from_text("small:2")
    with pytest.raises(ProfileError, match="sets neither"):
        parse_profiles(profiles_from_text("empty::"))
