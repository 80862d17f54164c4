"""A web server of another origin on this machine, for the browser tests where a page elsewhere is the attacker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.conftest import free_port


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


@contextmanager
def other_site(directory: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``directory``'s files from ``host`` on a port of its own (another origin than the hub's; on
    127.0.0.1 the same site, so the admin's cookies go with its frames' requests, on 127.0.0.2 another site);
    its address. Files written while it serves are served too."""
    server = ThreadingHTTPServer((host, free_port()), partial(_Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
