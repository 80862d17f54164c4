"""Run code in a kernel of a user server through the hub's proxy, as JupyterLab does: the Jupyter server's
REST API starts the kernel (``POST /user/<name>/api/kernels``), its websocket
(``/user/<name>/api/kernels/<id>/channels``) carries the messages (the server's JSON form of the Jupyter
messaging protocol, no subprotocol). Used by tests that need a kernel to do something before a stop.

    kernel = Kernel.start(hub.url, "ann", token)
    result = kernel.execute("print(1 + 1)")
    assert result.stdout == "2\\n" and not result.errors
    kernel.submit("while True: pass")  # runs on after the call returns
    kernel.close()
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import requests
import websocket  # websocket-client


class KernelError(AssertionError):
    """The kernel or its websocket did not do what was asked in time."""


@dataclass
class Result:
    """What one execute request printed and raised: ``errors`` as "Name: value" lines (tracebacks in
    ``tracebacks``), ``status`` the execute_reply's ("ok", "error", "aborted")."""

    stdout: str = ""
    stderr: str = ""
    results: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    status: str | None = None

    def describe(self) -> str:
        return (
            f"status {self.status}; stdout {self.stdout[-1500:]!r}; stderr {self.stderr[-1500:]!r}; "
            f"errors {self.errors}; traceback {''.join(self.tracebacks)[-3000:]}"
        )


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class Kernel:
    """One kernel of a user server and one websocket to it."""

    def __init__(self, hub_url: str, user: str, token: str, kernel_id: str, timeout: float = 60):
        self.hub_url = hub_url.rstrip("/")
        self.user = user
        self.token = token
        self.id = kernel_id
        self.session = uuid.uuid4().hex
        ws_url = self.hub_url.replace("http", "ws", 1) + f"/user/{user}/api/kernels/{kernel_id}/channels"
        self.ws = websocket.create_connection(
            f"{ws_url}?session_id={self.session}",
            header=[f"Authorization: token {token}"],
            timeout=timeout,
        )

    # -- REST ------------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, hub_url: str, user: str, token: str, name: str = "python3", timeout: float = 120) -> Kernel:
        """Start a kernel through the proxy with the user's token and connect to it once it answers."""
        r = requests.post(
            f"{hub_url.rstrip('/')}/user/{user}/api/kernels",
            json={"name": name},
            headers={"Authorization": f"token {token}"},
            timeout=60,
        )
        if r.status_code != 201:
            raise KernelError(f"POST /user/{user}/api/kernels answered {r.status_code}: {r.text[:2000]}")
        kernel = cls(hub_url, user, token, r.json()["id"])
        kernel.wait_ready(timeout)
        return kernel

    def model(self) -> requests.Response:
        return requests.get(
            f"{self.hub_url}/user/{self.user}/api/kernels/{self.id}",
            headers={"Authorization": f"token {self.token}"},
            timeout=30,
        )

    # -- messages --------------------------------------------------------------------------------------------
    def _send(self, msg_type: str, content: dict, channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": msg_type,
                        "username": self.user,
                        "session": self.session,
                        "date": datetime.now(UTC).isoformat(),
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": content,
                    "channel": channel,
                    "buffers": [],
                }
            )
        )
        return msg_id

    def _receive(self, deadline: float) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.ws.settimeout(left)
        try:
            raw = self.ws.recv()
        except websocket.WebSocketTimeoutException:
            raise TimeoutError from None
        if isinstance(raw, bytes):  # a binary frame (buffers): not used by these tests
            return {}
        return json.loads(raw)

    def wait_ready(self, timeout: float = 120) -> None:
        """Ask for kernel_info until the kernel answers (a new kernel may take a while to start)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg_id = self._send("kernel_info_request", {})
            answer_by = min(deadline, time.monotonic() + 5)
            try:
                while True:
                    msg = self._receive(answer_by)
                    if (
                        msg.get("parent_header", {}).get("msg_id") == msg_id
                        and msg.get("msg_type") == "kernel_info_reply"
                    ):
                        return
            except TimeoutError:
                continue
        raise KernelError(f"kernel {self.id} did not answer kernel_info within {timeout} s")

    def submit(self, code: str) -> str:
        """Send an execute request and return at once (its msg_id): the code runs on in the kernel."""
        return self._send(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": False,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )

    def collect(self, msg_id: str, timeout: float = 120) -> Result:
        """Read the kernel's messages for ``msg_id`` until it is idle again and its reply came."""
        result = Result()
        deadline = time.monotonic() + timeout
        idle = False
        try:
            while not (idle and result.status is not None):
                msg = self._receive(deadline)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg.get("msg_type"), msg.get("content", {})
                if kind == "stream":
                    if content.get("name") == "stderr":
                        result.stderr += content.get("text", "")
                    else:
                        result.stdout += content.get("text", "")
                elif kind in ("execute_result", "display_data"):
                    result.results.append(content.get("data", {}).get("text/plain", ""))
                elif kind == "error":
                    result.errors.append(f"{content.get('ename')}: {content.get('evalue')}")
                    result.tracebacks.append(_strip_ansi("\n".join(content.get("traceback", []))))
                elif kind == "execute_reply":
                    result.status = content.get("status")
                    if result.status == "error" and not result.errors:
                        result.errors.append(f"{content.get('ename')}: {content.get('evalue')}")
                elif kind == "status" and content.get("execution_state") == "idle":
                    idle = True
        except TimeoutError:
            raise KernelError(f"the code did not finish within {timeout} s; so far: {result.describe()}") from None
        return result

    def execute(self, code: str, timeout: float = 120) -> Result:
        """Run ``code`` and return what it printed and raised."""
        return self.collect(self.submit(code), timeout)

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass
