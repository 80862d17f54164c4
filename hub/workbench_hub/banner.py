"""The lines the hub prints at start: where it is, which release, which GPUs, where state lives, how to begin."""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config

from workbench_hub import subdomains
from workbench_hub.accounts import Reach
from workbench_hub.transport import Transport
from workbench_spawner.release import version

SHOWN_NAMES = 5  # a class of 30 is named by its first few


def public_address(c: Config, transport: Transport | None = None) -> str:
    """Where a browser opens the hub: the public URL, else the certificate's name, else this machine."""
    if "public_url" in c.JupyterHub and c.JupyterHub.public_url:
        return c.JupyterHub.public_url.rstrip("/")
    if "subdomain_host" in c.JupyterHub and c.JupyterHub.subdomain_host:  # the hub's own host (users' are below it)
        return c.JupyterHub.subdomain_host.rstrip("/")
    scheme, _, bind = c.JupyterHub.bind_url.partition("://")
    ip, _, public_port = bind.rstrip("/").rpartition(":")
    host = ip.strip("[]")
    if transport and transport.certificate and transport.certificate.names:
        host = transport.certificate.names[0]
    elif host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"{scheme}://{host}:{public_port}"


def shared_local_warning(reach: Reach) -> list[str]:
    """What the banner says when the local backend serves more than one person (``accounts.py``: who counts).

    The local backend runs every server as the hub's own Unix account on its
    host and network, and pins GPUs only by ``CUDA_VISIBLE_DEVICES``: nothing
    keeps one user out of another's server, files or GPUs.
    """
    if not reach.shared:
        return []
    names = sorted(reach.names)
    listed = ", ".join(names[:SHOWN_NAMES]) + (
        f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else ""
    )
    if reach.open_to:
        who = f"{reach.open_to} can use this hub" + (f" ({len(names)} known: {listed})" if names else "")
    else:
        who = f"{len(names)} accounts can use this hub ({listed})"
    return [
        f"WARNING: {who},",
        "  but the local backend is for one trusted workstation: every server runs as this hub's own",
        "  Unix account on this host and its network, so users can reach each other's servers and",
        "  files (and every GPU). For several users, use the docker backend (WORKBENCH_BACKEND=docker:",
        "  one locked-down container per user; README: Production on one GPU host: Docker).",
    ]


def first_admin_line(c: Config, address: str, admins: list[str]) -> str:
    """How the first admin begins: sign up, or (``WORKBENCH_ADMIN_PASSWORD``) log in to the account made at start."""
    names = " or ".join(admins) or "(set WORKBENCH_ADMIN_USERS)"
    section = c.WorkbenchAuthenticator if "WorkbenchAuthenticator" in c else {}
    if section.get("admin_password"):
        return (
            f"First admin: log in at {address}/hub/login as {names} with WORKBENCH_ADMIN_PASSWORD (an admin "
            "without an account got one at start); other sign-ups wait for an admin at /hub/authorize"
        )
    return (
        f"First admin: open {address}/hub/signup and sign up as {names}; "
        "admins are authorized at once, other sign-ups wait for an admin at /hub/authorize"
    )


def banner(
    c: Config,
    backend: str,
    data: Path,
    inventory,
    transport: Transport | None = None,
    reach: Reach | None = None,
    class_start: str = "",
) -> str:
    """The lines printed at start: where the hub is, which GPUs, where state lives, how to begin.

    ``reach`` (who can use the hub, ``accounts.who_can_use``) adds the local
    backend's warning when more than one person can; ``class_start`` is the
    spawn limits in force (``SpawnLimits.describe``).
    """
    address = public_address(c, transport)
    admins = sorted(c.Authenticator.admin_users)
    devices = inventory.devices
    if inventory.source == "simulated":
        counts: dict[str, int] = {}
        for device in devices:
            counts[device.model or device.name] = counts.get(device.model or device.name, 0) + 1
        spec = ",".join(f"{n}x{model}" for model, n in counts.items())
        gpu_line = f"GPUs: {len(devices)} SIMULATED ({spec}); no real hardware is used"
    elif devices:
        gpu_line = f"GPUs: {len(devices)} found by {'NVML' if inventory.source == 'nvml' else inventory.source}: " + (
            ", ".join(sorted({d.name for d in devices}))
        )
    else:
        gpu_line = f"GPUs: none, servers will be CPU only ({inventory.message})"
    transport_lines = []
    if transport and transport.certificate:
        cert = transport.certificate
        left = cert.days_left()
        transport_lines.append(
            f"HTTPS: certificate for {', '.join(cert.names) or cert.subject}, valid until "
            f"{cert.not_after:%Y-%m-%d}" + (f" (ONLY {left:.0f} DAYS LEFT: renew it)" if left < 14 else "")
        )
    elif transport and transport.mode == "behind-proxy":
        transport_lines.append("HTTPS: terminated by the proxy in front (it must forward X-Forwarded-Proto)")
    transport_lines += subdomains.banner_lines(c, transport)
    warning = shared_local_warning(reach) if backend == "local" and reach else []
    return "\n".join(
        [
            "",
            "=" * 72,
            f"GPU Workbench ({backend} backend) at {address}/",
            f"Version: {version()} (before an upgrade: workbench backup; docs/upgrading.md)",
            gpu_line,
            *([f"Class start: {class_start}"] if class_start else []),
            *transport_lines,
            f"Data: {data}",
            first_admin_line(c, address, admins),
            *warning,
            "=" * 72,
            "",
        ]
    )
