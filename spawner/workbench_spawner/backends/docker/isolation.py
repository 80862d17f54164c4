"""The docker backend's tenant isolation, as spawner settings and steps: see ``tenancy.py`` for the why.

A mixin of :class:`DockerGPUSpawner` (it uses DockerSpawner's
``format_volume_name``, ``escaped_name``, ``volumes`` and the GPU mixin's
policy store), kept apart so that the lock-down and the isolation each stay
one readable module.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import docker
from traitlets import Bool, Enum, TraitError, Unicode, default, observe, validate
from traitlets.config import LoggingConfigurable

from workbench_spawner.backends.docker import tenancy
from workbench_spawner.backends.docker.tenancy import LABEL_HUB, LABEL_SERVER, LABEL_USER
from workbench_spawner.ledger.hub_identity import hub_id

if TYPE_CHECKING:  # checked as the spawner it is mixed into (base.py); a configurable with traits at run time
    from workbench_spawner.backends.docker.base import DockerGPUBase as _IsolationBase
else:
    _IsolationBase = LoggingConfigurable


class TenantIsolation(_IsolationBase):
    """Networks, names and labels that keep users, and hubs, apart on one Docker engine."""

    network_isolation = Bool(
        True,
        help="""
        Put each user's container on a network that only the hub and the
        proxy share with it (``tenancy.py``): with the hub on the host, one
        network with inter-container traffic off; with the hub in a container
        (``hub_container`` set), a network per user that the hub's container
        joins. A student's TensorBoard or ``http.server`` on ``0.0.0.0`` is
        then unreachable from other students' containers. False: the
        containers go on ``network_name`` as DockerSpawner does (Docker's
        default bridge lets every container reach every other). Setting
        ``network_name`` while this is on stops the hub at start with a
        sentence, since the setting would be ignored.
        """,
    ).tag(config=True)

    egress = Enum(
        ["internet", "none"],
        "internet",
        help="""
        Where user containers may open connections beyond the hub:
        ``internet`` (pip, datasets, git; the default) or ``none`` (their
        networks are made ``internal``: no route out of the host). Set by
        ``WORKBENCH_USER_EGRESS``. A change applies to servers started after
        it (their networks are named for it).
        """,
    ).tag(config=True)

    hub_container = Unicode(
        "",
        help="""
        Name or id of the container the hub runs in, when it runs in one
        (``docker compose``; the docker backend's config sets it from the
        container's hostname, or ``WORKBENCH_HUB_CONTAINER``). It joins each
        user's network as ``hub``. Empty: the hub runs on the host.
        """,
    ).tag(config=True)

    user_subnets = Unicode(
        "10.213.0.0/16",
        help="""
        Private IPv4 range the per-user networks take their /28 from when the
        hub runs in a container (``WORKBENCH_USER_SUBNETS``). Docker's own
        pools hold about thirty networks, too few for a class; a /16 holds
        4096. Pick a range that no network of this host or its LAN uses; a
        /28 that overlaps a Docker network is skipped.
        """,
    ).tag(config=True)

    @validate("user_subnets")
    def _validate_user_subnets(self, proposal):
        problem = tenancy.subnets_problem(proposal.value)
        if problem:
            raise TraitError(f"user_subnets {problem}")
        return proposal.value.strip()

    @default("prefix")
    def _default_prefix(self):
        # Container names carry the hub's id: two hubs on one engine never
        # reuse (and so replace) each other's containers.
        return f"workbench-{self.hub_id()}"

    @observe("image")
    def _image_changed(self, change):
        # DockerSpawner renders the container name again whenever the image
        # changes, also while config is loaded in __init__, before this
        # hub's id can be read. Forget the name instead; it is rendered from
        # the current image (and the hub id) when it is first needed.
        self._trait_values.pop("object_name", None)

    def hub_id(self) -> str:
        """This hub's id (blocking the first time: the GPU database)."""
        return hub_id(self.gpu_policy.store)

    def template_namespace(self):
        return {**super().template_namespace(), "hub": self.hub_id()}

    def tenant_labels(self) -> dict[str, str]:
        """The labels of everything made for this server: whose it is and which hub made it."""
        return {LABEL_HUB: self.hub_id(), LABEL_USER: self.user.name, LABEL_SERVER: self.name}

    def tenant_network(self) -> str:
        """The network this server's container joins (made if missing)."""
        client, hub, internal = self._sync_client(), self.hub_id(), self.egress == "none"
        if self.hub_container:
            name = tenancy.user_network_name(hub, self.escaped_name, self.egress)
            labels = {LABEL_HUB: hub, LABEL_USER: self.user.name}
            tenancy.ensure_network(client, name, labels, internal=internal, icc=True, pool=self.user_subnets)
            tenancy.join_network(client, name, self.hub_container)
        else:
            name = tenancy.shared_network_name(hub, self.egress)
            tenancy.ensure_network(client, name, {LABEL_HUB: hub}, internal=internal, icc=False)
        return name

    def prepare_tenancy(self) -> None:
        """Before the create call (blocking): the user's volumes with this hub's labels, and the network.

        Volumes are made here rather than implicitly by the create call
        because Docker only labels a volume when it is created: an implicit
        one could not be told apart from another hub's.
        """
        client, labels = self._sync_client(), self.tenant_labels()
        del labels[LABEL_SERVER]
        for template in self.volumes:
            if template.startswith("/") or template == self.datasets_volume:
                continue
            name = self.format_volume_name(template, self)
            if "{hub}-" in template:
                legacy = self.format_volume_name(template.replace("{hub}-", ""), self)
                if tenancy.move_legacy_volume(client, legacy, name, labels, self.image):
                    self.log.info("Moved %s's volume %s (made before hub ids) to %s", self.user.name, legacy, name)
            tenancy.ensure_volume(client, name, labels)
        if self.network_isolation:
            self.network_name = self.tenant_network()
            self.use_internal_ip = True

    async def stop(self, now=False):
        await super().stop(now=now)
        if self.network_isolation and self.hub_container and self.remove:
            name = tenancy.user_network_name(self.hub_id(), self.escaped_name, self.egress)
            await asyncio.to_thread(tenancy.remove_user_network, self._sync_client(), name, self.hub_container)

    def rejoin_networks(self, client: docker.DockerClient, containers: list) -> None:
        # A recreated hub container (docker compose up after an upgrade) is on
        # none of its users' networks: without this the proxy could not reach
        # the servers it is about to route to.
        prefix = f"workbench-{hub_id(self.gpu_policy.store)}-u-"
        for container in containers:
            for network in container.attrs.get("NetworkSettings", {}).get("Networks", {}):
                if network.startswith(prefix):
                    try:
                        tenancy.join_network(client, network, self.hub_container)
                    except docker.errors.DockerException as exc:
                        self.log.error("Cannot rejoin %s's network %s: %s", container.name, network, exc)
