"""The docker backend's tenancy rules as tables: names, the subnet range, which /28 a user network
gets, and which existing networks a hub may put users on. (On a real engine: tests/docker.)"""

from __future__ import annotations

import ipaddress

import docker
import pytest

from workbench_spawner.backends.docker import tenancy


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("10.213.0.0/16", ""),
        ("192.168.64.0/20", ""),
        ("172.30.0.0/28", ""),
        ("lan", "is not an IPv4 range"),
        ("10.213.0.1/16", "is not an IPv4 range"),  # host bits set: a typo, not a range
        ("8.8.0.0/16", "is not a private IPv4 range"),
        ("10.1.2.0/29", "is not a private IPv4 range of /28 or larger"),
        ("fd00::/64", "is not a private IPv4 range"),
    ],
)
def test_the_user_subnet_range(value, problem):
    found = tenancy.subnets_problem(value)
    assert (problem in found) if problem else found == ""


def test_names_carry_the_hub_and_the_egress():
    assert tenancy.shared_network_name("1a2b3c4d", "internet") == "workbench-1a2b3c4d-users"
    assert tenancy.shared_network_name("1a2b3c4d", "none") == "workbench-1a2b3c4d-users-internal"
    assert tenancy.user_network_name("1a2b3c4d", "ann-2e", "internet") == "workbench-1a2b3c4d-u-ann-2e"
    assert tenancy.user_network_name("1a2b3c4d", "ann", "none") == "workbench-1a2b3c4d-u-ann-internal"


class FakeAPI:
    """What ensure_network asks of the engine: its networks, and a create that refuses overlaps."""

    def __init__(self, subnets: list[str]):
        self.nets = {f"n{i}": {"IPAM": {"Config": [{"Subnet": s}]}} for i, s in enumerate(subnets)}
        self.created: list[tuple[str, dict]] = []

    def networks(self):
        return list(self.nets.values())

    def inspect_network(self, name):
        if name not in self.nets:
            raise docker.errors.NotFound(name)
        return self.nets[name]

    def create_network(self, name, ipam=None, options=None, internal=False, labels=None, **kwargs):
        subnet = ipam["Config"][0]["Subnet"] if ipam else "172.31.0.0/16"
        new = ipaddress.ip_network(subnet)
        for net in self.nets.values():
            if any(new.overlaps(ipaddress.ip_network(c["Subnet"])) for c in net["IPAM"]["Config"]):
                raise docker.errors.APIError("Pool overlaps with other one on this address space")
        self.nets[name] = {
            "IPAM": {"Config": [{"Subnet": subnet}]},
            "Options": dict(options or {}),
            "Internal": internal,
            "Labels": dict(labels or {}),
        }
        self.created.append((name, self.nets[name]))


class FakeClient:
    def __init__(self, subnets: list[str]):
        self.api = FakeAPI(subnets)


def test_a_user_network_takes_the_first_free_28_and_is_made_the_hubs_way():
    client = FakeClient(["10.213.0.0/27", "10.213.0.48/28", "172.17.0.0/16"])
    labels = {tenancy.LABEL_HUB: "1a2b3c4d", tenancy.LABEL_USER: "ann"}
    attrs = tenancy.ensure_network(client, "wb-ann", labels, internal=True, icc=True, pool="10.213.0.0/16")
    assert attrs["IPAM"]["Config"][0]["Subnet"] == "10.213.0.32/28"
    assert attrs["Options"] == {tenancy.ICC_OPTION: "true"}
    assert attrs["Internal"] is True
    assert attrs["Labels"] == labels
    # asked again, it is the same network: nothing new is made
    assert tenancy.ensure_network(client, "wb-ann", labels, internal=True, icc=True, pool="10.213.0.0/16") == attrs
    assert len(client.api.created) == 1


def test_a_full_range_is_a_sentence_that_names_the_setting():
    client = FakeClient(["10.213.0.0/24"])
    with pytest.raises(tenancy.TenancyError, match=r"no free /28 is left in WORKBENCH_USER_SUBNETS=10.213.0.0/24"):
        tenancy.ensure_network(client, "wb-ann", {}, internal=False, icc=True, pool="10.213.0.0/24")


HUB = {tenancy.LABEL_HUB: "1a2b3c4d"}


@pytest.mark.parametrize(
    ("attrs", "internal", "icc", "problem"),
    [
        ({"Options": {tenancy.ICC_OPTION: "false"}, "Internal": False, "Labels": HUB}, False, False, ""),
        ({"Options": {tenancy.ICC_OPTION: "false"}, "Internal": True, "Labels": HUB}, True, False, ""),
        ({"Options": {}, "Internal": False, "Labels": HUB}, False, True, ""),
        # a same-named network made by hand: containers on it would reach each other
        ({"Options": {}, "Internal": False, "Labels": HUB}, False, False, "not made with enable_icc=false"),
        ({"Options": {tenancy.ICC_OPTION: "false"}, "Internal": False, "Labels": HUB}, True, False, "is not internal"),
        ({"Options": {tenancy.ICC_OPTION: "false"}, "Internal": True, "Labels": HUB}, False, False, "is internal"),
        ({"Options": {}, "Internal": False, "Labels": {tenancy.LABEL_HUB: "feedbeef"}}, False, True, "another hub"),
        ({"Options": {}, "Internal": False, "Labels": None}, False, True, "another hub"),
    ],
)
def test_which_existing_networks_a_hub_may_put_users_on(attrs, internal, icc, problem):
    found = tenancy.network_problems(attrs, HUB, internal, icc)
    assert (problem in found) if problem else found == ""


def test_an_existing_network_made_another_way_fails_with_what_to_remove():
    client = FakeClient([])
    client.api.nets["workbench-1a2b3c4d-users"] = {"Options": {}, "Internal": False, "Labels": HUB, "IPAM": {}}
    with pytest.raises(tenancy.TenancyError, match=r"docker network rm workbench-1a2b3c4d-users"):
        tenancy.ensure_network(client, "workbench-1a2b3c4d-users", HUB, internal=False, icc=False)
