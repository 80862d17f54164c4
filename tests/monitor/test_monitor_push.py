"""The stream's fast path: one send() per sample, and nothing lost or reordered when the kernel takes less.

Drives ``GPUStreamHandler.push`` with a socket that takes part of a chunk, or
nothing, or fails, and a stream that records what tornado would queue: the
cases a loopback test cannot produce on demand.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

pytest.importorskip("jupyter_server")

from tests.monitor import monitor_support  # noqa: F401  (puts the extension on sys.path)
from workbench_gpu_monitor.handlers import MAX_CLIENT_BACKLOG_BYTES, GPUStreamHandler


class FakeSocket:
    def __init__(self, *answers):
        self.answers = list(answers)  # per send(): bytes taken, or an exception to raise
        self.sent = b""

    def send(self, data: bytes) -> int:
        answer = self.answers.pop(0) if self.answers else len(data)
        if isinstance(answer, BaseException):
            raise answer
        self.sent += data[:answer]
        return answer


class FakeStream:
    """What tornado's IOStream would queue; the queue drains only when a test says so."""

    def __init__(self):
        self.queued = b""
        self.is_closed = False
        self.pending: list[Future] = []

    def writing(self) -> bool:
        return bool(self.queued)

    def closed(self) -> bool:
        return self.is_closed

    def write(self, data: bytes) -> Future:
        self.queued += data
        future: Future = Future()
        self.pending.append(future)
        return future

    def drain(self) -> None:
        """The kernel took everything: each write's future resolves, as tornado's do."""
        self.queued = b""
        for future in self.pending:
            future.set_result(None)
        self.pending = []


def handler(sock: FakeSocket | None, stream: FakeStream) -> GPUStreamHandler:
    h = GPUStreamHandler.__new__(GPUStreamHandler)  # no request: push() needs only these
    h._closed = asyncio.Event()
    h._raw_stream = stream
    h._raw_socket = sock
    h._queued_bytes = 0
    return h


def chunk(n: int) -> bytes:
    payload = b'data: {"n":%d}\n\n' % n
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def test_whole_chunk_goes_out_in_one_send_and_nothing_is_queued():
    sock, stream = FakeSocket(), FakeStream()
    h = handler(sock, stream)
    for n in range(3):
        h.push(b"", chunk(n))
    assert sock.sent == chunk(0) + chunk(1) + chunk(2)
    assert stream.queued == b""


def test_partial_send_queues_the_rest_and_later_chunks_follow_it_in_order():
    sock, stream = FakeSocket(5, BlockingIOError()), FakeStream()
    h = handler(sock, stream)
    h.push(b"", chunk(0))  # the kernel takes 5 bytes
    h.push(b"", chunk(1))  # something is queued: no send, straight behind it
    assert sock.sent == chunk(0)[:5]
    assert stream.queued == chunk(0)[5:] + chunk(1)
    stream.drain()  # tornado sent the queue
    sock.answers = [BlockingIOError()]
    h.push(b"", chunk(2))  # the socket is full: all of it is queued
    h.push(b"", chunk(3))
    assert stream.queued == chunk(2) + chunk(3)
    assert sock.sent == chunk(0)[:5]  # and nothing was sent out of order


def test_a_reset_connection_closes_the_stream():
    sock, stream = FakeSocket(ConnectionResetError()), FakeStream()
    h = handler(sock, stream)
    h.push(b"", chunk(0))
    assert h._closed.is_set()
    assert stream.queued == b""
    h.push(b"", chunk(1))  # later samples are not even tried
    assert sock.sent == b""
    assert stream.queued == b""


def test_a_client_that_stopped_reading_is_dropped_not_buffered_forever():
    big = b"x" * (MAX_CLIENT_BACKLOG_BYTES + 1)
    sock, stream = FakeSocket(BlockingIOError()), FakeStream()
    h = handler(sock, stream)
    h.push(b"", big)  # the socket takes nothing: all of it waits in the stream
    assert not h._closed.is_set()
    assert stream.queued == big
    h.push(b"", chunk(0))  # still not read: this client is dropped
    assert h._closed.is_set()
    assert stream.queued == big
    assert sock.sent == b""


def test_the_backlog_counts_down_as_tornado_sends():
    big = b"x" * (MAX_CLIENT_BACKLOG_BYTES + 1)
    sock, stream = FakeSocket(BlockingIOError()), FakeStream()
    h = handler(sock, stream)
    h.push(b"", big)
    stream.drain()
    h.push(b"", chunk(0))
    assert not h._closed.is_set()
    assert sock.sent == chunk(0)


def test_without_a_plain_socket_the_stream_queues_everything():
    """TLS streams (SSLIOStream) get no raw socket: tornado does every write."""
    stream = FakeStream()
    h = handler(None, stream)
    h.push(b"", chunk(0))
    h.push(b"", chunk(1))
    assert stream.queued == chunk(0) + chunk(1)
