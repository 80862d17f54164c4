"""``WORKBENCH_BACKEND=docker``: the hub on one GPU host, user servers in locked-down containers.

The docker backend's variables (``WORKBENCH_IMAGE``, ``WORKBENCH_IMAGES``,
``WORKBENCH_DOCKER_NETWORK``, ``WORKBENCH_DATASETS_VOLUME``,
``WORKBENCH_MEM_LIMIT``, ``WORKBENCH_CPU_LIMIT``, ``WORKBENCH_USER_EGRESS``,
``WORKBENCH_USER_SUBNETS``, ``WORKBENCH_HUB_CONTAINER``) become config here;
the README's table lists them. With the hub on the host, containers reach it
through the default bridge's gateway, which is asked of the Docker engine.
With the hub in a container (``WORKBENCH_DOCKER_NETWORK``, the network it is
on), each user gets a network of their own that the hub's container joins.
"""

from __future__ import annotations

import ipaddress
import socket

from traitlets.config import Config

from workbench_hub.env_values import ConfigError, Env, number, text
from workbench_spawner.backend import HubContext
from workbench_spawner.backends.docker.tenancy import subnets_problem
from workbench_spawner.image_config import configure_images


def bridge_gateway() -> str:
    """The default bridge's gateway: how containers reach a hub that runs on the host."""
    import docker

    from workbench_spawner.backends.docker.base import ENGINE_ERRORS

    # No engine, or a bridge network without the address plan read here.
    errors: tuple[type[Exception], ...] = (*ENGINE_ERRORS, LookupError, ValueError, StopIteration)
    try:
        ipam = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"][0]
        # The gateway is the bridge's first address when the engine does not name it.
        return ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))
    except errors as exc:
        raise ConfigError(f"the docker backend cannot reach the Docker engine ({exc}); is dockerd running?") from None


def configure(c: Config, env: Env, hub: HubContext) -> None:
    """``WORKBENCH_BACKEND=docker``: the image, the network, limits, and where containers reach the hub."""
    docker_bridge = hub.lookups.get("docker_bridge", bridge_gateway)
    c.JupyterHub.spawner_class = "gpu-docker"
    spawner = c.DockerGPUSpawner
    configure_images(spawner, env, "docker", "the single-user image (e.g. gpu-workbench/singleuser:latest)")
    hub_ip = env.get("WORKBENCH_HUB_IP")
    connect_ip = env.get("WORKBENCH_HUB_CONNECT_IP")
    network = text(env, "WORKBENCH_DOCKER_NETWORK")
    egress = text(env, "WORKBENCH_USER_EGRESS", "internet")
    if egress not in ("internet", "none"):
        raise ConfigError(f"WORKBENCH_USER_EGRESS is {egress!r}; it takes internet (the default) or none")
    spawner.egress = egress
    subnets = text(env, "WORKBENCH_USER_SUBNETS")
    if subnets:
        problem = subnets_problem(subnets)
        if problem:
            raise ConfigError(f"WORKBENCH_USER_SUBNETS is {problem}; per-user networks take their /28 from it")
        spawner.user_subnets = subnets
    if network:
        # The hub runs in a container on this network (docker compose). Each
        # user's container gets a network of its own, which the hub's
        # container joins; the compose network stays the hub's.
        spawner.hub_container = text(env, "WORKBENCH_HUB_CONTAINER") or socket.gethostname()
        c.JupyterHub.hub_ip = (hub_ip if hub_ip is not None else "0.0.0.0").strip()
        c.JupyterHub.hub_connect_ip = (connect_ip if connect_ip is not None else "hub").strip()
    else:
        # The hub runs on the host: containers reach it through the default
        # bridge's gateway address, which is a local address of the host.
        if hub_ip is None or connect_ip is None:
            bridge = docker_bridge()
        c.JupyterHub.hub_ip = (hub_ip if hub_ip is not None else bridge).strip()
        c.JupyterHub.hub_connect_ip = (connect_ip if connect_ip is not None else bridge).strip()
    spawner.datasets_volume = text(env, "WORKBENCH_DATASETS_VOLUME", "workbench-datasets")
    if text(env, "WORKBENCH_MEM_LIMIT"):
        spawner.mem_limit = text(env, "WORKBENCH_MEM_LIMIT")
    if text(env, "WORKBENCH_CPU_LIMIT"):
        spawner.cpu_limit = number(env, "WORKBENCH_CPU_LIMIT", "1")
