"""The idle culler, end to end: an open SSH session that prints nothing keeps the server alive
past the idle timeout; once the session closes, the culler stops the server and its GPU is
given back. A hub of its own (the shared one never culls), with a 10 s idle timeout (the culler
checks every 5 s) and activity reported every 2 s, so the whole story takes about a minute.
"""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest

from tests.conftest import hub_pool, wait_until
from tests.docker.conftest import remove_user_objects
from tests.ssh.conftest import SSHHub

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.integration]

IDLE_SECONDS = 10


def test_the_culler_spares_a_server_with_an_open_ssh_session_and_culls_it_after(
    tmp_path, ssh_client_tools, singleuser_image
):
    user = f"cull{uuid.uuid4().hex[:6]}"
    with hub_pool(tmp_path) as start:
        hub = start(
            {
                "WORKBENCH_BACKEND": "docker",
                "WORKBENCH_IMAGE": singleuser_image,
                "WORKBENCH_SIMULATED_GPUS": "1",
                "WORKBENCH_CULL_IDLE_SECONDS": str(IDLE_SECONDS),
            },
            [
                "--Spawner.poll_interval=2",
                "--Spawner.http_timeout=120",
                "--Spawner.start_timeout=240",
                "--JupyterHub.last_activity_interval=2",
                "--Spawner.environment=JUPYTERHUB_ACTIVITY_INTERVAL=2",
            ],
        )
        try:
            hub.create_users(user)
            assert hub.spawn(user, gpus=1).status_code in (201, 202)
            hub.wait_ready(user, timeout=180)
            ssh = SSHHub(hub, tmp_path, ssh_client_tools)
            token = ssh.enroll(user, 1).token
            cfg, alias = ssh.config(user)  # for after the cull, when the server's page is gone
            # keepalives every 2 s, inside the 10 s limit
            with ssh.silent_session(user, token, 120) as session:
                held = time.monotonic()
                while time.monotonic() - held < 2.5 * IDLE_SECONDS:  # five culler rounds
                    assert hub.server(user) is not None, f"culled with an open SSH session:\n{hub.log()[-3000:]}"
                    assert session.poll() is None, session.stderr.read()
                    time.sleep(1)
                assert hub.leases() == {user: hub.leases()[user]}
                assert len(hub.leases()[user]) == 1
            closed = time.monotonic()

            wait_until(
                lambda: hub.server(user) is None, 4 * IDLE_SECONDS, "the idle culler stopping the server", log=hub.log
            )
            assert time.monotonic() - closed >= IDLE_SECONDS - 4  # culled for being idle, not at once
            assert f"Culling server {user} (inactive for" in hub.log()  # the culler did it
            assert user not in hub.leases()  # and the GPU is given back

            # and ssh now says why it cannot get in
            r = subprocess.run(
                ["ssh", "-F", str(cfg), alias, "echo reached"],
                capture_output=True,
                text=True,
                timeout=60,
                env=ssh.env(token),
            )
            assert r.returncode != 0, r.stderr
            assert "your server is not running (HTTP 424)" in r.stderr, r.stderr
        finally:
            remove_user_objects(user)
