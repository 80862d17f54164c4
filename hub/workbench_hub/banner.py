"""The lines the hub prints at start: where it is, which GPUs, where state lives, how to begin."""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config

from workbench_hub.transport import Transport


def public_address(c: Config, transport: Transport | None = None) -> str:
    """Where a browser opens the hub: the public URL, else the certificate's name, else this machine."""
    if "public_url" in c.JupyterHub and c.JupyterHub.public_url:
        return c.JupyterHub.public_url.rstrip("/")
    scheme, _, bind = c.JupyterHub.bind_url.partition("://")
    ip, _, public_port = bind.rstrip("/").rpartition(":")
    host = ip.strip("[]")
    if transport and transport.certificate and transport.certificate.names:
        host = transport.certificate.names[0]
    elif host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"{scheme}://{host}:{public_port}"


def banner(c: Config, backend: str, data: Path, inventory, transport: Transport | None = None) -> str:
    """The lines printed at start: where the hub is, which GPUs, where state lives, how to begin."""
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
    return "\n".join(
        [
            "",
            "=" * 72,
            f"GPU Workbench ({backend} backend) at {address}/",
            gpu_line,
            *transport_lines,
            f"Data: {data}",
            f"First admin: open {address}/hub/signup and sign up as "
            f"{' or '.join(admins) or '(set WORKBENCH_ADMIN_USERS)'}; "
            "admins are authorized at once, other sign-ups wait for an admin at /hub/authorize",
            "=" * 72,
            "",
        ]
    )
