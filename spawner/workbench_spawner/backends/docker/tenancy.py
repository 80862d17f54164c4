"""Tenants on one Docker engine: who may reach a user's container, and what belongs to which hub.

**The network.** A user's container accepts connections only from the hub and
the proxy, and cannot open connections to other users' containers (Zero to
JupyterHub's singleuser NetworkPolicy, said with Docker's own means). Two
topologies, two mechanisms, both kept by the Docker engine itself, so they
hold across hub and dockerd restarts and need no privilege beyond the Docker
socket the hub already has:

* **hub on the host** (``make run`` with ``WORKBENCH_BACKEND=docker``): every
  user container of this hub joins one bridge network,
  ``workbench-<hub>-users``, made with inter-container traffic off
  (``com.docker.network.bridge.enable_icc=false``). Docker drops traffic
  between two containers of that bridge; the hub and the proxy, on the host,
  reach each container by its address; the containers reach the hub's API on
  the host, where it listens on the default bridge's gateway.
* **hub in a container** (``docker compose``): with inter-container traffic
  off, the hub's container could not reach the users either, so each user gets
  a bridge network of their own, ``workbench-<hub>-u-<user>``, which the hub's
  container joins (as ``hub``). Docker isolates bridges from each other, so a
  user's network holds their containers and the hub, nothing else; the
  compose network (Caddy, Prometheus, Grafana) is not one of them. Each such
  network takes a /28 from ``user_subnets``, because Docker's default pools
  hold about thirty networks.

``egress = "none"`` makes these networks ``internal``: no route out of the
host (the hub stays reachable, it is on the host or on the network).

**Ownership.** Containers, volumes and networks carry ``workbench.hub`` (the
hub's id, :mod:`workbench_spawner.ledger.hub_identity`) and their names
contain it, so two hubs on one engine never share a name and each hub's
reconcile touches only its own. Volumes made before hub ids
(``workbench-home-<user>``) move into the new names the first time their user
starts a server (:func:`move_legacy_volume`).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import docker
from docker.types import IPAMConfig, IPAMPool

LABEL_HUB = "workbench.hub"
LABEL_USER = "workbench.user"
LABEL_SERVER = "workbench.server"
LABEL_GPUS = "workbench.gpus"
LABEL_ROLE = "workbench.role"

ICC_OPTION = "com.docker.network.bridge.enable_icc"
HUB_ALIAS = "hub"
USER_SUBNET_PREFIX = 28

log = logging.getLogger(__name__)


class TenancyError(RuntimeError):
    """The engine cannot give a user the isolation this hub promises; the message says why."""


def subnets_problem(value: str) -> str:
    """Why ``value`` cannot be the range per-user networks take their subnets from ('' when it can)."""
    try:
        net = ipaddress.ip_network(value.strip())
    except ValueError:
        return f"{value!r} is not an IPv4 range such as 10.213.0.0/16"
    if net.version != 4 or not net.is_private or net.prefixlen > USER_SUBNET_PREFIX:
        return f"{value!r} is not a private IPv4 range of /{USER_SUBNET_PREFIX} or larger, such as 10.213.0.0/16"
    return ""


def shared_network_name(hub: str, egress: str) -> str:
    """The one users' network of a hub that runs on the host."""
    return f"workbench-{hub}-users" + ("" if egress == "internet" else "-internal")


def user_network_name(hub: str, username: str, egress: str) -> str:
    """A user's own network when the hub runs in a container; ``username`` is already escaped."""
    return f"workbench-{hub}-u-{username}" + ("" if egress == "internet" else "-internal")


def _subnets_in_use(client: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    used = []
    for net in client.api.networks():
        for conf in (net.get("IPAM") or {}).get("Config") or []:
            try:
                subnet = ipaddress.ip_network(conf.get("Subnet", ""), strict=False)
            except ValueError:
                continue
            if subnet.version == 4:
                used.append(subnet)
    return used


def free_subnets(client: docker.DockerClient, pool: str) -> Iterator[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The /28s of ``pool`` that overlap no network on the engine, in order."""
    used = _subnets_in_use(client)
    for candidate in ipaddress.ip_network(pool).subnets(new_prefix=USER_SUBNET_PREFIX):
        if not any(candidate.overlaps(u) for u in used):
            yield candidate


def ensure_network(
    client: docker.DockerClient,
    name: str,
    labels: Mapping[str, str],
    *,
    internal: bool,
    icc: bool,
    pool: str = "",
) -> dict:
    """The network ``name`` (its ``docker network inspect``), made if missing.

    ``icc``: whether containers on it may reach each other (off for the
    shared network; on for a user's own, where the hub's container must
    reach the user's). An existing network is used only if it is made the
    way this hub makes it (ICC and ``internal`` as asked, this hub's label):
    a network of the same name made by hand would otherwise silently undo
    the isolation.
    ``pool``: take the subnet from it (a /28 per network), else Docker picks.
    """
    try:
        attrs = client.api.inspect_network(name)
    except docker.errors.NotFound:
        attrs = None
    if attrs is None:
        options = {ICC_OPTION: "true" if icc else "false"}
        kwargs: dict[str, Any] = dict(
            driver="bridge", options=options, internal=internal, labels=dict(labels), check_duplicate=True
        )
        if not pool:
            client.api.create_network(name, **kwargs)
        else:
            for subnet in free_subnets(client, pool):
                ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet))])
                try:
                    client.api.create_network(name, ipam=ipam, **kwargs)
                    break
                except docker.errors.APIError as exc:
                    if "overlap" in str(exc).lower():
                        continue  # another hub took it between our look and our create
                    if "already exists" in str(exc).lower():
                        break
                    raise
            else:
                raise TenancyError(
                    f"no free /{USER_SUBNET_PREFIX} is left in WORKBENCH_USER_SUBNETS={pool} for {name}: "
                    "every one overlaps a network on this Docker engine. Give the hub a larger or another "
                    "private range (c.DockerGPUSpawner.user_subnets)."
                )
        attrs = client.api.inspect_network(name)
    problems = network_problems(attrs, labels, internal, icc)
    if problems:
        raise TenancyError(f"the Docker network {name} exists but {problems}; remove it (docker network rm {name}).")
    return attrs


def network_problems(attrs: Mapping, labels: Mapping[str, str], internal: bool, icc: bool) -> str:
    """Why an existing network is not one this hub may put users on ('' when it is)."""
    if not icc and (attrs.get("Options") or {}).get(ICC_OPTION) != "false":
        return "lets containers on it reach each other (it was not made with enable_icc=false)"
    if bool(attrs.get("Internal")) != internal:
        return "is internal" if attrs.get("Internal") else "is not internal, while WORKBENCH_USER_EGRESS=none"
    if (attrs.get("Labels") or {}).get(LABEL_HUB) != labels.get(LABEL_HUB):
        return f"belongs to another hub (label {LABEL_HUB}={(attrs.get('Labels') or {}).get(LABEL_HUB)!r})"
    return ""


def join_network(client: docker.DockerClient, network: str, container: str) -> None:
    """Connect the hub's container to a user's network as ``hub`` (nothing to do if it is connected)."""
    attrs = client.api.inspect_network(network)
    hub_id = client.api.inspect_container(container)["Id"]
    if hub_id in (attrs.get("Containers") or {}):
        return
    try:
        client.api.connect_container_to_network(container, network, aliases=[HUB_ALIAS])
    except docker.errors.APIError as exc:
        if "already exists" not in str(exc):
            raise


def remove_user_network(client: docker.DockerClient, network: str, hub_container: str) -> bool:
    """Remove a user's network once none of the user's containers is on it; the hub leaves it first."""
    try:
        attrs = client.api.inspect_network(network)
    except docker.errors.NotFound:
        return True
    hub = _container_id(client, hub_container) if hub_container else ""
    if set(attrs.get("Containers") or {}) - {hub}:
        return False
    try:
        if hub_container:
            client.api.disconnect_container_from_network(hub_container, network, force=True)
        client.api.remove_network(network)
    except docker.errors.APIError as exc:
        log.info("Kept network %s: %s", network, exc)
        return False
    return True


def _container_id(client: docker.DockerClient, name_or_id: str) -> str:
    try:
        return client.api.inspect_container(name_or_id)["Id"]
    except docker.errors.NotFound:
        return ""


def ensure_volume(client: docker.DockerClient, name: str, labels: Mapping[str, str]) -> None:
    """Make the named volume with this hub's labels, unless it exists."""
    try:
        client.api.inspect_volume(name)
    except docker.errors.NotFound:
        client.api.create_volume(name, labels=dict(labels))


def move_legacy_volume(
    client: docker.DockerClient, legacy: str, new: str, labels: Mapping[str, str], image: str
) -> bool:
    """Move a volume made before hub ids into this hub's name: copy it with a helper container, then remove it.

    Only a volume with no ``workbench.hub`` label and no container using it
    moves, and only into a name that does not exist yet, so a home is never
    merged into another or taken while in use. Docker cannot rename a
    volume; the copy keeps owners, modes and times (``cp -a`` as root in a
    container with no network). Returns whether it moved.
    """
    try:
        old = client.api.inspect_volume(legacy)
    except docker.errors.NotFound:
        return False
    if (old.get("Labels") or {}).get(LABEL_HUB):
        return False
    try:
        client.api.inspect_volume(new)
        return False
    except docker.errors.NotFound:
        pass
    if client.api.containers(all=True, filters={"volume": legacy}):
        return False
    client.api.create_volume(new, labels=dict(labels))
    client.containers.run(
        image,
        ["sh", "-c", "cp -a /from/. /to/"],
        entrypoint=[],
        user="0",
        network_mode="none",
        volumes={legacy: {"bind": "/from", "mode": "ro"}, new: {"bind": "/to", "mode": "rw"}},
        labels={**labels, LABEL_ROLE: "volume-move"},
        remove=True,
    )
    client.api.remove_volume(legacy)
    return True
