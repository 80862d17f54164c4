"""Run code in a kernel of a user's server through the hub's proxy, as JupyterLab does.

``POST /user/<name>/api/kernels`` starts a kernel; its websocket
``/user/<name>/api/kernels/<id>/channels`` carries the Jupyter messaging protocol (v5, JSON
frames with a ``channel`` key: jupyter_server's default subprotocol). Authenticated with the
user's API token in the ``Authorization`` header, which the server's HubAuth accepts for both.

``Kernel.execute`` sends one ``execute_request`` and collects what the kernel said until the
request is done (the reply and the kernel going idle), or until the kernel died on the way:
jupyter_server then sends a ``status`` of ``restarting`` (its restarter starts a new kernel)
or ``dead``, and when the whole server dies the websocket simply closes. Both are results,
not errors: the memory tests expect them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import requests
import websocket


@dataclass
class Outcome:
    """What one ``execute_request`` came to."""

    status: str = ""  # the execute_reply's status ("ok", "error"), or "" without a reply
    stdout: str = ""
    stderr: str = ""
    error: str = ""  # "ename: evalue" of an error reply
    states: list[str] = field(default_factory=list)  # the kernel's execution_state statuses seen, in order
    closed: bool = False  # the websocket closed (the server went away)
    timed_out: bool = False

    @property
    def kernel_died(self) -> bool:
        """The kernel was killed under the request: jupyter_server restarted it or gave it up as dead."""
        return any(s in ("restarting", "dead", "autorestarting") for s in self.states)


class Kernel:
    """One kernel of ``user``'s server, started through the hub at ``hub_url``; close() shuts it down."""

    def __init__(self, hub_url: str, user: str, token: str, name: str = "python3", timeout: float = 60):
        self.base = f"{hub_url}/user/{user}/api"
        self.headers = {"Authorization": f"token {token}"}
        r = requests.post(f"{self.base}/kernels", json={"name": name}, headers=self.headers, timeout=timeout)
        assert r.status_code == 201, f"starting a kernel: {r.status_code} {r.text[:2000]}"
        self.id = r.json()["id"]
        self.session = uuid.uuid4().hex
        ws_url = f"{self.base}/kernels/{self.id}/channels?session_id={self.session}".replace("http", "ws", 1)
        self.ws = websocket.create_connection(
            ws_url, header=[f"{k}: {v}" for k, v in self.headers.items()], timeout=timeout
        )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        """A kernel_info_request answered: the kernel is up and its iopub is connected."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg_id = self._send("kernel_info_request", {})
            end = min(deadline, time.monotonic() + 5)
            while time.monotonic() < end:
                msg = self._recv(end - time.monotonic())
                if (
                    msg
                    and msg.get("parent_header", {}).get("msg_id") == msg_id
                    and msg["msg_type"] == "kernel_info_reply"
                ):
                    return
        raise AssertionError(f"kernel {self.id} did not answer kernel_info_request within {timeout} s")

    def _send(self, msg_type: str, content: dict, channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": msg_type,
                        "username": "test",
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

    def _recv(self, timeout: float) -> dict | None:
        self.ws.settimeout(max(0.05, timeout))
        try:
            frame = self.ws.recv()
        except websocket.WebSocketTimeoutException:
            return None
        if isinstance(frame, bytes):  # a binary frame (buffers): not used by these tests
            return {}
        return json.loads(frame) if frame else {}

    def execute(self, code: str, timeout: float = 120) -> Outcome:
        """Run ``code``; the outcome once the kernel replied and went idle, died, or the server went away."""
        out = Outcome()
        msg_id = self._send(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )
        replied = idle = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self._recv(deadline - time.monotonic())
            except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError):
                out.closed = True
                return out
            if msg is None or not msg:
                continue
            kind, content = msg.get("msg_type"), msg.get("content", {})
            if kind == "status":
                state = content.get("execution_state", "")
                ours = msg.get("parent_header", {}).get("msg_id") == msg_id
                # jupyter_server's own restarting/dead statuses have no parent: count them too.
                if ours or state in ("restarting", "dead", "autorestarting"):
                    out.states.append(state)
                if state in ("restarting", "dead", "autorestarting"):
                    return out
                if ours and state == "idle":
                    idle = True
            elif msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            elif kind == "stream":
                if content.get("name") == "stderr":
                    out.stderr += content.get("text", "")
                else:
                    out.stdout += content.get("text", "")
            elif kind == "error":
                out.error = f"{content.get('ename')}: {content.get('evalue')}"
            elif kind == "execute_reply":
                out.status = content.get("status", "")
                replied = True
                if out.status == "error" and not out.error:
                    out.error = f"{content.get('ename')}: {content.get('evalue')}"
            if replied and idle:
                return out
        out.timed_out = True
        return out

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass
        try:
            requests.delete(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=10)
        except requests.RequestException:
            pass
