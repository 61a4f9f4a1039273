"""A one-thread HTTP/1.1 server for `/metrics`, built to cost the training process little.

Why not `http.server`: its ThreadingHTTPServer starts a thread per connection and parses each
request with `email.parser`, so fifty scrapers a second cost the trainer's rank 0 fifty thread
starts and a few milliseconds of GIL-holding Python. Here one selector loop serves every
connection: it reads a request head, answers from bytes the exporter caches, and keeps the
connection open (Prometheus reuses it), so a scrape costs one recv and one send.

Only what a scraper needs is spoken: GET and HEAD of `/metrics` (or `/`), 404 for other paths,
405 for other methods, 400 for heads that are malformed or too long. Requests with a body are
answered and the connection closed, since the body is never read. Lines may end in CRLF or a
bare LF; an HTTP/0.9 `GET /metrics` line gets the bare body and the connection closes.

No client can hold the server: a request head must arrive whole within `head_timeout` (a
slowloris trickle is closed), a connection with nothing to do is closed after `idle_timeout`,
at `max_connections` a new connection closes the one idle longest (or, with none idle, the one
whose reader has taken nothing for longest, if for STALL_S or more), and a connection whose
unsent output passes `max_pending` is not read from (TCP pushes back on the client) until it
drains, so a client that pipelines requests without reading costs a bounded buffer, and
clients that never read cannot hold every slot until their idle timeout.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import AfterValidator

MAX_HEAD = 16 * 1024  # a scrape's request head is a few hundred bytes
MAX_CONNECTIONS = 512
MAX_PENDING = 64 * 1024  # unsent bytes per connection before its requests are left unread (with
# MAX_CONNECTIONS, bounds what slow readers can hold in the training process to tens of MB)
IDLE_TIMEOUT_S = 300.0  # longer than any sane scrape interval, so Prometheus keeps its connection
HEAD_TIMEOUT_S = 10.0  # from a request head's first byte to its blank line
# A connection with output whose reader has taken nothing for this long is stalled: it may be
# closed for a new one when every slot is taken (a reader taking a response moves far sooner).
STALL_S = 1.0
CLOSE_GRACE_S = 2.0  # how long close() lets responses in flight finish (all together)

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

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
    last_active: float = 0.0  # time.monotonic() of the last byte read or sent
    head_since: float | None = None  # when the server began waiting for the rest of a head


def bind_family(host: str) -> tuple[str, socket.AddressFamily]:
    """(address to bind, family) for a literal IP address or "localhost" (127.0.0.1)."""
    if host == "localhost":
        return "127.0.0.1", socket.AF_INET
    ip = ipaddress.ip_address(host)  # ValueError for anything else: no name lookups here
    return str(ip), socket.AF_INET6 if ip.version == 6 else socket.AF_INET


def check_host(host: str) -> str:
    """The --metrics-host value, or a ValueError naming the flag (for the config's validation)."""
    try:
        bind_family(host)
    except ValueError:
        raise ValueError(
            f"--metrics-host: {host!r} is not an IP address or localhost (e.g. 127.0.0.1, or "
            "0.0.0.0 to be scraped from other machines)"
        ) from None
    return host


def port_taken(host: str, port: int) -> str | None:
    """Why (host, port) cannot be bound now, or None: bound as the server binds it (with
    SO_REUSEADDR, so a port in TIME_WAIT is free), but never listening, so no client that is
    already knocking (Prometheus) connects to the probe."""
    addr, family = bind_family(host)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((addr, port))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


# The config's type for --metrics-host: validated where it is set, one line naming the flag.
MetricsHost = Annotated[str, AfterValidator(check_host)]


def url_host(host: str) -> str:
    """A bound address as it goes in a URL: IPv6 in brackets."""
    return f"[{host}]" if ":" in host else host


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
    connection open. Pure, so the protocol is tested without sockets. Lines end in CRLF or LF."""
    try:
        request_line, *header_lines = (
            ln.removesuffix("\r") for ln in raw_head.decode("latin-1").split("\n")
        )
        method, target, version = request_line.split(" ")
        if not version.startswith("HTTP/"):
            raise ValueError(version)
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


def request_line_kind(line: bytes) -> str:
    """What a complete first line (without its line end) opens: "1.x" (a head follows), "0.9"
    (`GET /path`, the whole request) or "bad"."""
    parts = line.removesuffix(b"\r").split(b" ")
    if len(parts) == 3 and parts[2].startswith(b"HTTP/"):
        return "1.x"
    if len(parts) == 2 and parts[0] == b"GET":
        return "0.9"
    return "bad"


def answer_09(line: bytes, body: Callable[[], bytes]) -> bytes:
    """An HTTP/0.9 response: the bare body, or nothing (a close) for another path or an error."""
    target = line.removesuffix(b"\r").split(b" ")[1].split(b"?", 1)[0]
    if target not in (b"/metrics", b"/"):
        return b""
    try:
        return body()
    except Exception:  # noqa: BLE001 (0.9 has no status line to carry it: close)
        return b""


class MetricsHTTPServer:
    """Serves `body()` on (host, port) from one daemon thread until close(). `host` is a literal
    IP address or "localhost"; `self.host` and `self.port` are what was really bound."""

    def __init__(
        self,
        host: str,
        port: int,
        body: Callable[[], bytes],
        content_type: str,
        *,
        idle_timeout: float = IDLE_TIMEOUT_S,
        head_timeout: float = HEAD_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if min(idle_timeout, head_timeout) <= 0 or max_connections < 1 or max_pending < 1:
            raise ValueError("timeouts, max_connections and max_pending must be positive")
        self._body, self._content_type = body, content_type
        self.idle_timeout, self.head_timeout = idle_timeout, head_timeout
        self.max_connections, self.max_pending = max_connections, max_pending
        # Expiry is checked a few times per shortest timeout, and at least once a second.
        self._tick = min(1.0, max(0.01, min(idle_timeout, head_timeout) / 4))
        self._next_expiry = 0.0
        addr, family = bind_family(host)
        self._listener = socket.create_server((addr, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.host: str = self._listener.getsockname()[0]
        self.port: int = self._listener.getsockname()[1]
        self._listening = True
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
                timeout = None
                if self._conns or not self._listening:
                    timeout = max(0.0, self._next_expiry - time.monotonic())
                for key, events in self._sel.select(timeout):
                    if key.data == "wake":
                        continue
                    if key.data is None:
                        self._accept()
                        continue
                    conn = self._conns.get(key.fd)
                    if conn is not None and conn is key.data:  # not dropped earlier this round
                        self._serve(conn, events)
                now = time.monotonic()
                if now >= self._next_expiry:
                    self._expire(now)
                    self._next_expiry = now + self._tick
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
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS and self._make_room():
                    continue
                if exc.errno in _OUT_OF_FDS:  # nothing to close: stop accepting until the
                    self._sel.unregister(self._listener)  # next expiry round, not spin on it
                    self._listening = False
                    return
                continue  # e.g. ECONNABORTED: that client is gone, the next may wait
            if len(self._conns) >= self.max_connections and not self._make_room():
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, last_active=time.monotonic())
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self) -> bool:
        """Close the connection that has waited longest without output to send (an idle
        keep-alive, or a head that is not coming), so floods of idle connections cannot lock
        scrapers out; with none idle, the one whose output has waited longest for its reader
        to take a byte, if STALL_S or more (a reader taking its response moves last_active at
        every send: a scrape in progress is not cut), so clients that pipeline requests and
        never read cannot either. False when every connection is busy and none is stalled."""
        conns = list(self._conns.values())
        idle = [c for c in conns if not c.outbuf]
        if idle:
            self._drop(min(idle, key=lambda c: min(c.last_active, c.head_since or c.last_active)))
            return True
        now = time.monotonic()
        stalled = [c for c in conns if now - c.last_active >= STALL_S]
        if not stalled:
            return False
        self._drop(min(stalled, key=lambda c: c.last_active))
        return True

    def _expire(self, now: float) -> None:
        """Close connections whose head is overdue or that made no progress for idle_timeout."""
        for conn in list(self._conns.values()):
            overdue = conn.head_since is not None and now - conn.head_since > self.head_timeout
            if overdue or now - conn.last_active > self.idle_timeout:
                self._drop(conn)
        if not self._listening:
            self._sel.register(self._listener, selectors.EVENT_READ, None)
            self._listening = True

    def _serve(self, conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_READ and not self._read(conn):
            return
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
        conn.last_active = time.monotonic()
        if conn.close_after:  # a body or data after a closing request: not read
            return True
        conn.inbuf += data
        self._answer(conn)
        return True

    def _answer(self, conn: _Conn) -> None:
        """Answer the whole requests in inbuf while the unsent output stays within max_pending;
        the rest waits in inbuf (and the socket is not read) until the client takes its bytes."""
        while not conn.close_after and len(conn.outbuf) <= self.max_pending:
            # RFC 9112 §2.2: empty lines before a request line are ignored
            if conn.inbuf[:1] in (b"\r", b"\n"):
                del conn.inbuf[: len(conn.inbuf) - len(conn.inbuf.lstrip(b"\r\n"))]
            end = _HEAD_END.search(conn.inbuf)
            if end is None:
                line_end = conn.inbuf.find(b"\n")
                first = bytes(conn.inbuf[:line_end]) if line_end >= 0 else None
                kind = request_line_kind(first) if first is not None else "1.x"
                if kind == "0.9" and first is not None:  # the whole request: answer, close
                    conn.outbuf += answer_09(first, self._body)
                    conn.close_after = True
                elif kind == "bad" or len(conn.inbuf) > MAX_HEAD:
                    why = b"head too long\n" if kind != "bad" else b"bad request\n"
                    conn.outbuf += _response(400, why, "text/plain", False, False)
                    conn.close_after = True
                elif conn.inbuf and conn.head_since is None:
                    conn.head_since = time.monotonic()  # the head_timeout starts
                elif not conn.inbuf:
                    conn.head_since = None
                return
            raw = bytes(conn.inbuf[: end.start()])
            del conn.inbuf[: end.end()]
            conn.head_since = None
            response, keep = answer(raw, self._body, self._content_type)
            conn.outbuf += response
            conn.close_after = not keep
        conn.head_since = None  # paused on output: the client, not its head, is slow

    def _write(self, conn: _Conn) -> None:
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn)
                return
            if sent <= 0:
                break
            conn.last_active = time.monotonic()
            del conn.outbuf[:sent]
            if conn.inbuf and not conn.close_after and len(conn.outbuf) <= self.max_pending:
                self._answer(conn)  # pipelined requests held back while the output was full
        if not conn.outbuf and conn.close_after:
            self._drop(conn)
            return
        want = (selectors.EVENT_READ if len(conn.outbuf) <= self.max_pending else 0) | (
            selectors.EVENT_WRITE if conn.outbuf else 0
        )
        if self._sel.get_key(conn.sock).events != want:  # most scrapes: one send, no change
            self._sel.modify(conn.sock, want, conn)

    def _drain(self) -> None:
        """At close: finish writing every queued response, so a scrape racing the end of the run
        gets a whole body, never a truncated one; CLOSE_GRACE_S for all of them together."""
        if self._listening:
            self._sel.unregister(self._listener)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for conn in [c for c in self._conns.values() if c.outbuf]:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            conn.sock.setblocking(True)
            conn.sock.settimeout(left)
            with contextlib.suppress(OSError):
                conn.sock.sendall(conn.outbuf)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    # ----- observation (tests, benchmarks) -----------------------------------------------------

    def connections(self) -> int:
        return len(self._conns)

    def buffered(self) -> int:
        """The most bytes one connection holds (unsent output plus unanswered input)."""
        conns = list(self._conns.values())
        return max((len(c.outbuf) + len(c.inbuf) for c in conns), default=0)
