"""A one-thread HTTP/1.1 server for `/metrics`, built to cost the training process little.

Why not `http.server`: its ThreadingHTTPServer starts a thread per connection and parses each
request with `email.parser`, so fifty scrapers a second cost the trainer's rank 0 fifty thread
starts and a few milliseconds of GIL-holding Python. Here one selector loop serves every
connection: it reads a request head, answers from bytes the exporter caches, and keeps the
connection open (Prometheus reuses it), so a scrape costs one recv and one send.

Only what a scraper needs is spoken: GET and HEAD of `/metrics` (or `/`), 404 for other paths,
405 for other methods, 400 for heads that are malformed or too long. Requests with a body are
answered and the connection closed, since the body is never read.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_HEAD = 16 * 1024  # a scrape's request head is a few hundred bytes
MAX_CONNECTIONS = 512
CLOSE_GRACE_S = 2.0  # how long close() lets responses in flight finish

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}


@dataclass
class _Conn:
    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    close_after: bool = False


def _response(status: int, body: bytes, content_type: str, keep_alive: bool, head: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return out if head else out + body


def answer(raw_head: bytes, body: Callable[[], bytes], content_type: str) -> tuple[bytes, bool]:
    """The response to one request head (without its blank line), and whether to keep the
    connection open. Pure, so the protocol is tested without sockets."""
    try:
        request_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ")
    except ValueError:
        return _response(400, b"bad request\n", "text/plain", False, False), False
    headers = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            return _response(400, b"bad request\n", "text/plain", False, False), False
        headers[name.strip().lower()] = value.strip().lower()
    keep_alive = (
        version == "HTTP/1.1"
        and headers.get("connection") != "close"
        and headers.get("content-length", "0") == "0"
        and "transfer-encoding" not in headers
    )
    head = method == "HEAD"
    if method not in ("GET", "HEAD"):
        return _response(405, b"only GET\n", "text/plain", keep_alive, False), keep_alive
    if target.split("?", 1)[0] not in ("/metrics", "/"):
        return _response(404, b"not found\n", "text/plain", keep_alive, head), keep_alive
    try:
        payload = body()
    except Exception as exc:  # noqa: BLE001 (the scraper sees it; the server thread lives on)
        msg = f"{type(exc).__name__}: {exc}\n".encode()
        return _response(500, msg, "text/plain", keep_alive, head), keep_alive
    return _response(200, payload, content_type, keep_alive, head), keep_alive


class MetricsHTTPServer:
    """Serves `body()` on (host, port) from one daemon thread until close()."""

    def __init__(self, host: str, port: int, body: Callable[[], bytes], content_type: str) -> None:
        self._body, self._content_type = body, content_type
        self._listener = socket.create_server((host, port), backlog=128, reuse_port=False)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        # close() wakes the loop through this pair rather than by polling with a timeout.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="autok-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, let responses already queued finish (up to CLOSE_GRACE_S), close all."""
        if self._closing.is_set():
            return
        self._closing.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=CLOSE_GRACE_S + 5)
        self._wake_w.close()

    # ----- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._closing.is_set():
                for key, events in self._sel.select():
                    if key.data == "wake":
                        continue
                    if key.data is None:
                        self._accept()
                    else:
                        self._serve(key.data, events)
            self._drain()
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            self._sel.close()
            self._listener.close()
            self._wake_r.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: leave it queued for the next round
                return
            if len(self._conns) >= MAX_CONNECTIONS:
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _serve(self, conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_READ and not self._read(conn):
            return
        if conn.outbuf:
            self._write(conn)

    def _read(self, conn: _Conn) -> bool:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            self._drop(conn)
            return False
        if not data:
            self._drop(conn)
            return False
        if conn.close_after:  # a body or data after a closing request: not read
            return True
        conn.inbuf += data
        while not conn.close_after:
            end = conn.inbuf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.inbuf) > MAX_HEAD:
                    conn.outbuf += _response(400, b"head too long\n", "text/plain", False, False)
                    conn.close_after = True
                break
            raw, conn.inbuf = bytes(conn.inbuf[:end]), conn.inbuf[end + 4 :]
            response, keep = answer(raw, self._body, self._content_type)
            conn.outbuf += response
            conn.close_after = not keep
        return True

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn)
            return
        del conn.outbuf[:sent]
        if not conn.outbuf and conn.close_after:
            self._drop(conn)
            return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if self._sel.get_key(conn.sock).events != want:  # most scrapes: one send, no change
            self._sel.modify(conn.sock, want, conn)

    def _drain(self) -> None:
        """At close: finish writing every queued response, so a scrape racing the end of the run
        gets a whole body, never a truncated one."""
        self._sel.unregister(self._listener)
        pending = [c for c in self._conns.values() if c.outbuf]
        for conn in pending:
            conn.sock.setblocking(True)
            conn.sock.settimeout(CLOSE_GRACE_S)
            with contextlib.suppress(OSError):
                conn.sock.sendall(conn.outbuf)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
