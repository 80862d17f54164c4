"""The proxy's environment (workbench_hub.proxy_env): an allow-list, the operator's extra names, the exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from workbench_hub import proxy_env
from workbench_hub.env_values import ConfigError


@pytest.mark.parametrize(
    ("name", "extra", "kept"),
    [
        # what Node.js and configurable-http-proxy need
        ("PATH", "", True),
        ("HOME", "", True),
        ("LANG", "", True),
        ("LANGUAGE", "", True),
        ("LC_ALL", "", True),
        ("LC_CTYPE", "", True),
        ("TZ", "", True),
        ("TMPDIR", "", True),
        ("NODE_OPTIONS", "", True),
        ("NODE_EXTRA_CA_CERTS", "", True),
        ("SSL_CERT_FILE", "", True),
        ("SSL_CERT_DIR", "", True),
        ("CONFIGPROXY_AUTH_TOKEN", "", True),
        ("CONFIGPROXY_SSL_KEY_PASSPHRASE", "", True),
        # the hub's secrets and settings
        ("WORKBENCH_ADMIN_TOKEN", "", False),
        ("WORKBENCH_METRICS_TOKEN", "", False),
        ("WORKBENCH_DB_URL", "", False),
        ("JPY_COOKIE_SECRET", "", False),
        ("JUPYTERHUB_CRYPT_KEY", "", False),
        ("CONFIGPROXY_AUTH_TOKEN_OLD", "", True),  # the proxy's own prefix: all of it is the proxy's
        # npm's registry token looks like Node's but is a secret: Node's variables are named one by one
        ("NODE_AUTH_TOKEN", "", False),
        ("NPM_TOKEN", "", False),
        ("AWS_SECRET_ACCESS_KEY", "", False),
        # prefixes are prefixes, not substrings
        ("MY_LC_ALL", "", False),
        ("XPATH", "", False),
        # what the operator adds (WORKBENCH_PROXY_ENV_KEEP), by exact name
        ("HTTP_PROXY", "", False),
        ("HTTP_PROXY", "HTTP_PROXY,NO_PROXY", True),
        ("NO_PROXY", "HTTP_PROXY,NO_PROXY", True),
        ("HTTPS_PROXY", "HTTP_PROXY,NO_PROXY", False),
        ("http_proxy", "HTTP_PROXY", False),  # names are case-sensitive, as the environment is
    ],
)
def test_what_the_proxy_is_given(name, extra, kept):
    names = frozenset(n for n in extra.split(",") if n)
    assert proxy_env.kept(name, names) is kept
    assert (name in proxy_env.proxy_environment({name: "value", "PATH": "/bin"}, names)) is kept


def test_values_pass_unchanged():
    environ = {"PATH": "/usr/bin:/bin", "CONFIGPROXY_AUTH_TOKEN": "t0k", "WORKBENCH_ADMIN_TOKEN": "s3cret"}
    assert proxy_env.proxy_environment(environ) == {"PATH": "/usr/bin:/bin", "CONFIGPROXY_AUTH_TOKEN": "t0k"}


@pytest.mark.parametrize(
    ("env", "keep"),
    [
        ({}, []),
        ({"WORKBENCH_PROXY_ENV_KEEP": ""}, []),
        ({"WORKBENCH_PROXY_ENV_KEEP": "HTTP_PROXY"}, ["--keep=HTTP_PROXY"]),
        ({"WORKBENCH_PROXY_ENV_KEEP": " HTTP_PROXY , NO_PROXY ,"}, ["--keep=HTTP_PROXY,NO_PROXY"]),
    ],
)
def test_the_command_keeps_what_the_operator_names(tmp_path, env, keep):
    assert proxy_env.proxy_command(env, tmp_path) == [*proxy_env.LAUNCHER, *keep, "--", "configurable-http-proxy"]


@pytest.mark.parametrize("value", ["HTTP-PROXY", "$HTTP_PROXY", "NO_PROXY=x", "1ST", "HTTP_PROXY NO_PROXY"])
def test_a_name_that_is_not_a_variable_name_is_refused_with_a_sentence(tmp_path, value):
    with pytest.raises(ConfigError) as caught:
        proxy_env.proxy_command({"WORKBENCH_PROXY_ENV_KEEP": value}, tmp_path)
    assert str(caught.value).startswith(
        "WORKBENCH_PROXY_ENV_KEEP must be a comma list of environment variable names (letters, digits, _), "
        "such as HTTP_PROXY,NO_PROXY; "
    )


@pytest.mark.parametrize(
    ("argv", "parsed"),
    [
        (["--", "chp"], (frozenset(), ["chp"])),
        (
            ["--", "chp", "--no-x-forward", "--ip", "0.0.0.0"],
            (frozenset(), ["chp", "--no-x-forward", "--ip", "0.0.0.0"]),
        ),
        (["--keep=A,B", "--keep=C", "--", "chp", "--keep=D"], (frozenset({"A", "B", "C"}), ["chp", "--keep=D"])),
    ],
)
def test_launcher_arguments(argv, parsed):
    assert proxy_env.parse(argv) == parsed


@pytest.mark.parametrize("argv", [[], ["chp"], ["--"], ["--keep=A"], ["--keep=", "--", "chp"], ["-x", "--", "chp"]])
def test_launcher_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit):
        proxy_env.parse(argv)


def test_the_command_runs_with_the_allow_list_only_and_keeps_the_pid():
    """The launcher replaces itself (same pid: JupyterHub's pid file names the proxy) and the
    command sees the allow-list, the operator's extra names and nothing else."""
    environ = {
        "PATH": os.environ["PATH"],
        "LC_ALL": "C.UTF-8",
        "CONFIGPROXY_AUTH_TOKEN": "proxy-token",
        "WORKBENCH_ADMIN_TOKEN": "admin-token-0123456789",
        "JPY_COOKIE_SECRET": "ab" * 32,
        "HTTP_PROXY": "http://proxy.example:3128",
        "HTTPS_PROXY": "http://proxy.example:3128",
    }
    script = "import json, os; print(json.dumps({'pid': os.getpid(), 'env': dict(os.environ)}))"
    launcher = [*proxy_env.LAUNCHER, "--keep=HTTP_PROXY", "--", sys.executable, "-c", script]
    with subprocess.Popen(launcher, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    seen = json.loads(out)
    assert seen["pid"] == p.pid
    # (the interpreter may add LC_CTYPE when it coerces the C locale: a locale variable, kept anyway)
    assert {k: v for k, v in seen["env"].items() if k != "LC_CTYPE"} == {
        "PATH": os.environ["PATH"],
        "LC_ALL": "C.UTF-8",
        "CONFIGPROXY_AUTH_TOKEN": "proxy-token",
        "HTTP_PROXY": "http://proxy.example:3128",
    }


def test_a_missing_proxy_is_named_in_one_sentence(tmp_path):
    missing = str(tmp_path / "configurable-http-proxy")
    r = subprocess.run(
        [*proxy_env.LAUNCHER, "--", missing, "--port", "8000"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"proxy_env: cannot run {missing}: No such file or directory (run `npm install` in the checkout, "
        "or put configurable-http-proxy and node on the hub's PATH)"
    )


def test_a_pid_file_naming_another_process_is_forgotten(tmp_path):
    """A recreated hub container (same data volume, pids from 1 again) or a reboot leaves a pid file
    that names some other process: JupyterHub would try to kill it and refuse to start."""
    pid_file = tmp_path / "jupyterhub-proxy.pid"
    other = subprocess.Popen(["sleep", "30"])
    try:
        pid_file.write_text(str(other.pid))
        assert proxy_env.forget_stale_pid_file(pid_file)
        assert not pid_file.exists()
        assert other.poll() is None, "the other process is left alone"
    finally:
        other.kill()
        other.wait()
    pid_file.write_text("not a pid")
    assert not proxy_env.forget_stale_pid_file(pid_file)
    assert pid_file.exists()
    fake_proxy = subprocess.Popen(["bash", "-c", "exec -a configurable-http-proxy sleep 30"])
    try:
        time.sleep(0.2)
        pid_file.write_text(str(fake_proxy.pid))
        assert not proxy_env.forget_stale_pid_file(pid_file), "a running proxy's file stays"
        assert pid_file.exists(), "a running proxy's file stays"
    finally:
        fake_proxy.kill()
        fake_proxy.wait()
