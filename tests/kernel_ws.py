"""Run code in a kernel of a user's server through the hub's proxy, as JupyterLab does.

``POST /user/<name>/api/kernels`` starts a kernel; its websocket
``/user/<name>/api/kernels/<id>/channels`` carries the Jupyter messaging protocol (v5, JSON frames with a
``channel`` key: jupyter_server's default, no subprotocol). Authenticated with the user's API token in the
``Authorization`` header, which the server's HubAuth accepts for both.

``Kernel.execute`` (``submit`` then ``collect``) sends one ``execute_request`` and collects what the kernel
said until the request is done (its reply came and the kernel went idle), or until the kernel died on the
way: jupyter_server then sends a ``status`` of ``restarting`` or ``autorestarting`` (its restarter starts a
new kernel) or ``dead``, with no parent header; when the whole server dies the websocket simply closes. A
death, a closed websocket and a timeout are all reported in the ``Result``, not raised: the memory tests
(tests/docker) expect them, and a test that expects the code to run asserts ``result.status == "ok"``.

    kernel = Kernel.start(hub.url, "ann", token)
    result = kernel.execute("print(1 + 1)")
    assert result.status == "ok" and result.stdout == "2\\n" and not result.errors, result.describe()
    kernel.submit("while True: pass")  # runs on after the call returns
    kernel.close()  # closes the websocket and shuts the kernel down (if its server still runs)
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import requests
import websocket  # websocket-client

# The statuses jupyter_server itself sends (no parent header) when the kernel process died under a request.
DEATH_STATES = ("restarting", "autorestarting", "dead")
# The websocket closed under a receive: the server (or the proxy's route to it) went away.
_CLOSED = (websocket.WebSocketConnectionClosedException, ConnectionError, OSError)


class KernelError(AssertionError):
    """The kernel could not be started or did not answer in time."""


@dataclass
class Result:
    """What one ``execute_request`` came to.

    ``status`` is the execute_reply's ("ok", "error", "aborted"), None without a reply; ``errors`` the
    "Name: value" lines of the error messages (their tracebacks, ANSI colours stripped, in ``tracebacks``);
    ``states`` the kernel's ``execution_state`` statuses for this request, and jupyter_server's parentless
    death statuses, in order; ``closed`` the websocket closed (the server went away); ``timed_out`` none of
    the endings came within the timeout.
    """

    status: str | None = None
    stdout: str = ""
    stderr: str = ""
    results: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    closed: bool = False
    timed_out: bool = False

    @property
    def kernel_died(self) -> bool:
        """The kernel was killed under the request: jupyter_server restarted it or gave it up as dead."""
        return any(s in DEATH_STATES for s in self.states)

    def describe(self) -> str:
        return (
            f"status {self.status}; states {self.states}; kernel_died {self.kernel_died}; closed {self.closed}; "
            f"timed_out {self.timed_out}; stdout {self.stdout[-1500:]!r}; stderr {self.stderr[-1500:]!r}; "
            f"results {self.results}; errors {self.errors}; traceback {''.join(self.tracebacks)[-3000:]}"
        )


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class Kernel:
    """One kernel of a user's server and one websocket to it; ``Kernel.start`` makes one."""

    def __init__(self, hub_url: str, user: str, token: str, kernel_id: str, timeout: float = 60):
        self.hub_url = hub_url.rstrip("/")
        self.user = user
        self.token = token
        self.id = kernel_id
        self.base = f"{self.hub_url}/user/{user}/api"
        self.headers = {"Authorization": f"token {token}"}
        self.session = uuid.uuid4().hex
        ws_url = f"{self.base}/kernels/{kernel_id}/channels?session_id={self.session}".replace("http", "ws", 1)
        self.ws = websocket.create_connection(
            ws_url, header=[f"{k}: {v}" for k, v in self.headers.items()], timeout=timeout
        )

    # -- REST ------------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, hub_url: str, user: str, token: str, name: str = "python3", timeout: float = 120) -> Kernel:
        """Start a kernel through the proxy with the user's token and connect to it once it answers."""
        base = f"{hub_url.rstrip('/')}/user/{user}/api"
        r = requests.post(
            f"{base}/kernels", json={"name": name}, headers={"Authorization": f"token {token}"}, timeout=60
        )
        if r.status_code != 201:
            raise KernelError(f"POST /user/{user}/api/kernels answered {r.status_code}: {r.text[:2000]}")
        kernel = cls(hub_url, user, token, r.json()["id"])
        try:
            kernel.wait_ready(timeout)
        except BaseException:
            kernel.close()
            raise
        return kernel

    def model(self) -> requests.Response:
        """``GET api/kernels/<id>``: the server's model of the kernel (its execution_state, ...)."""
        return requests.get(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=30)

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
        """The next message; ``{}`` for a frame that is none (a binary one, or the close frame, after which
        the next receive raises). TimeoutError at the deadline; a closed websocket raises one of ``_CLOSED``."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.ws.settimeout(max(0.05, left))
        try:
            raw = self.ws.recv()
        except websocket.WebSocketTimeoutException:
            raise TimeoutError from None
        if isinstance(raw, bytes) or not raw:  # buffers (not used by these tests), or the close frame
            return {}
        return json.loads(raw)

    def wait_ready(self, timeout: float = 120) -> None:
        """Ask for kernel_info until the kernel answers (a new kernel may take a while to start; the answer
        also means its iopub is connected)."""
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
            except _CLOSED as e:
                raise KernelError(f"kernel {self.id}'s websocket closed before it answered kernel_info: {e!r}") from e
        raise KernelError(f"kernel {self.id} did not answer kernel_info within {timeout} s")

    def submit(self, code: str) -> str:
        """Send an execute request and return at once (its msg_id): the code runs on in the kernel."""
        return self._send(
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

    def collect(self, msg_id: str, timeout: float = 120) -> Result:
        """Read the kernel's messages for ``msg_id`` until its reply came and the kernel is idle again, the
        kernel died (a parentless restarting/autorestarting/dead status), the websocket closed, or
        ``timeout`` passed: each ending is in the result."""
        result = Result()
        deadline = time.monotonic() + timeout
        idle = False
        while not (idle and result.status is not None):
            try:
                msg = self._receive(deadline)
            except TimeoutError:
                result.timed_out = True
                return result
            except _CLOSED:
                result.closed = True
                return result
            kind, content = msg.get("msg_type"), msg.get("content", {})
            ours = msg.get("parent_header", {}).get("msg_id") == msg_id
            if kind == "status":
                state = content.get("execution_state", "")
                if ours or state in DEATH_STATES:  # jupyter_server's death statuses have no parent: count them
                    result.states.append(state)
                if state in DEATH_STATES:
                    return result
                if ours and state == "idle":
                    idle = True
            elif not ours:
                continue
            elif kind == "stream":
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
        return result

    def execute(self, code: str, timeout: float = 120) -> Result:
        """Run ``code``; what it printed and raised, and how the request ended (see ``collect``)."""
        return self.collect(self.submit(code), timeout)

    def close(self) -> None:
        """Close the websocket and shut the kernel down; either may fail quietly (the server may be gone)."""
        with contextlib.suppress(websocket.WebSocketException, OSError):
            self.ws.close()
        with contextlib.suppress(requests.RequestException):
            requests.delete(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=10)
