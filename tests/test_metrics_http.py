"""The exporter's one-thread HTTP server: protocol, keep-alive, many clients, close(), and
clients that try to hold it (idle floods, slow heads, pipelining without reading).

Real sockets on 127.0.0.1. Timing never decides a result: waits are for a condition, with
wall-clock bounds generous enough for a loaded 2-core machine."""

from __future__ import annotations

import contextlib
import http.client
import resource
import select
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from autok.metrics_http import (
    MAX_CONNECTIONS,
    MAX_HEAD,
    STALL_S,
    MetricsHTTPServer,
    answer,
    check_host,
    request_line_kind,
)

BODY = b"# TYPE autok_x gauge\nautok_x 1.0\n" * 400  # ~13 KB: more than one send on slow peers
CT = "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture
def server():
    calls = []

    def body() -> bytes:
        calls.append(1)
        return BODY

    srv = MetricsHTTPServer("127.0.0.1", 0, body, CT)
    srv.calls = calls
    yield srv
    srv.close()


def test_answer_status_codes_and_keep_alive():
    def body():
        return b"x"

    ok, keep = answer(b"GET /metrics HTTP/1.1\r\nHost: a", body, CT)
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and ok.endswith(b"\r\n\r\nx") and keep
    assert b"Content-Length: 1\r\n" in ok and f"Content-Type: {CT}".encode() in ok
    assert answer(b"GET /?a=1 HTTP/1.1", body, CT)[0].startswith(b"HTTP/1.1 200")
    assert answer(b"GET /other HTTP/1.1", body, CT)[0].startswith(b"HTTP/1.1 404")
    assert answer(b"POST /metrics HTTP/1.1", body, CT)[0].startswith(b"HTTP/1.1 405")
    head, _ = answer(b"HEAD /metrics HTTP/1.1", body, CT)
    assert head.endswith(b"\r\n\r\n") and b"Content-Length: 1\r\n" in head
    bad, keep = answer(b"garbage", body, CT)
    assert bad.startswith(b"HTTP/1.1 400") and not keep
    assert not answer(b"GET /metrics HTTP/1.0", body, CT)[1]
    assert not answer(b"GET /metrics HTTP/1.1\r\nConnection: close", body, CT)[1]
    assert not answer(b"GET /metrics HTTP/1.1\r\nContent-Length: 5", body, CT)[1]

    def broken():
        raise RuntimeError("render failed")

    err, keep = answer(b"GET /metrics HTTP/1.1", broken, CT)
    assert err.startswith(b"HTTP/1.1 500") and err.endswith(b"RuntimeError: render failed\n")


def test_urllib_scrape_and_404(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
        assert r.status == 200 and r.read() == BODY
        assert r.headers["Content-Type"] == CT
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/nope", timeout=5)
    assert e.value.code == 404


def test_keep_alive_serves_many_requests_on_one_connection(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for _ in range(20):
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == BODY
    conn.close()
    assert len(server.calls) == 20


def test_pipelined_and_split_requests(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        # two requests in one segment, then one arriving a byte at a time
        s.sendall(req + req)
        for ch in req:
            s.sendall(bytes([ch]))
        s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 4
    assert data.count(BODY) == 4


def test_oversized_head_is_refused_and_closed(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD + 10))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400")


def test_fifty_concurrent_clients_get_whole_bodies(server):
    results, errors = [], []

    def client():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            for _ in range(5):
                conn.request("GET", "/metrics")
                results.append(conn.getresponse().read())
            conn.close()
        except Exception as exc:  # noqa: BLE001 (collected and asserted below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[:3]
    assert len(results) == 250 and all(r == BODY for r in results)


def test_close_stops_the_listener_and_idle_connections(server):
    idle = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    idle.request("GET", "/metrics")
    assert idle.getresponse().read() == BODY
    server.close()
    server.close()  # idempotent
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    with pytest.raises((OSError, http.client.HTTPException)):
        idle.request("GET", "/metrics")
        idle.getresponse().read()


# ----- every request form is answered or closed ------------------------------------------------

BOUND_S = 60  # a failure bound only: every wait below ends as soon as its condition holds


def read_to_eof(sock: socket.socket) -> bytes:
    sock.settimeout(BOUND_S)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def scrape(port: int, host: str = "127.0.0.1") -> bytes:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=BOUND_S) as r:
        assert r.status == 200
        return r.read()


def test_answer_and_request_line_kinds_accept_lf_only_lines():
    ok, keep = answer(b"GET /metrics HTTP/1.1\nHost: a\nConnection: close", lambda: b"x", CT)
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and ok.endswith(b"\r\n\r\nx") and not keep
    assert request_line_kind(b"GET /metrics HTTP/1.1\r") == "1.x"
    assert request_line_kind(b"GET /metrics") == "0.9"
    assert request_line_kind(b"hello") == "bad"
    assert answer(b"GET /metrics HTTQ/1.1", lambda: b"x", CT)[0].startswith(b"HTTP/1.1 400")


def test_lf_only_request_is_answered(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S) as s:
        s.sendall(b"GET /metrics HTTP/1.1\nHost: x\n\nGET /metrics HTTP/1.1\nConnection: close\n\n")
        data = read_to_eof(s)
    assert data.count(b"HTTP/1.1 200 OK") == 2 and data.count(BODY) == 2


def test_http09_request_gets_the_bare_body_and_a_close(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S) as s:
        s.sendall(b"GET /metrics\n")
        assert read_to_eof(s) == BODY
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S) as s:
        s.sendall(b"GET /elsewhere\r\n")
        assert read_to_eof(s) == b""  # closed, not hung
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S) as s:
        s.sendall(b"\r\nnonsense\r\n")  # a blank line first is skipped; then a bad line
        assert read_to_eof(s).startswith(b"HTTP/1.1 400")


# ----- clients that try to hold the server -----------------------------------------------------


def hold(n: int, port: int) -> list[socket.socket]:
    """n connections that never send a byte."""
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=BOUND_S))
    return socks


def test_hundreds_of_idle_connections_do_not_lock_out_a_scrape():
    srv = MetricsHTTPServer(
        "127.0.0.1", 0, lambda: BODY, CT, max_connections=64, idle_timeout=600, head_timeout=600
    )
    socks = []
    try:
        socks = hold(300, srv.port)
        assert scrape(srv.port) == BODY
        assert srv.connections() <= 64
    finally:
        for s in socks:
            s.close()
        srv.close()


def test_530_idle_connections_at_the_default_cap_do_not_lock_out_a_scrape():
    """The reported case: 530 idle connections used to refuse every scrape (cap 512)."""
    need = 2 * 530 + 100  # both ends live in this process
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    srv = MetricsHTTPServer("127.0.0.1", 0, lambda: BODY, CT)
    socks = []
    try:
        socks = hold(530, srv.port)
        for _ in range(3):
            assert scrape(srv.port) == BODY
        assert srv.connections() <= MAX_CONNECTIONS
    finally:
        for s in socks:
            s.close()
        srv.close()
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def closed_by_server(sock: socket.socket, trickle: bytes = b"", every: float = 0.2) -> bool:
    """Wait (at most BOUND_S) for the server to close `sock`, sending one byte of `trickle`
    every `every` seconds meanwhile. True once closed."""
    deadline, sent = time.monotonic() + BOUND_S, 0
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], every)
        try:
            if readable and sock.recv(65536) == b"":
                return True
            if sent < len(trickle):
                sock.send(trickle[sent : sent + 1])
                sent += 1
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def test_idle_keep_alive_connection_is_closed_after_idle_timeout():
    srv = MetricsHTTPServer("127.0.0.1", 0, lambda: BODY, CT, idle_timeout=0.5, head_timeout=600)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=BOUND_S)
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == BODY
        assert closed_by_server(conn.sock)
        conn.close()
        assert scrape(srv.port) == BODY
    finally:
        srv.close()


def test_half_sent_head_is_closed_after_head_timeout_even_when_trickled():
    # idle_timeout is far off and every trickled byte is activity: only the head timeout
    # (0.5 s from the head's first byte) can close these.
    srv = MetricsHTTPServer("127.0.0.1", 0, lambda: BODY, CT, idle_timeout=600, head_timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=BOUND_S) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x")
            assert closed_by_server(s)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=BOUND_S) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            assert closed_by_server(s, trickle=b"X-Slow: " + b"a" * 1000)
        assert scrape(srv.port) == BODY
    finally:
        srv.close()


def test_pipelining_client_that_never_reads_holds_a_bounded_buffer():
    bound = 64 * 1024
    srv = MetricsHTTPServer("127.0.0.1", 0, lambda: BODY, CT, max_pending=bound)
    response = answer(b"GET /metrics HTTP/1.1", lambda: BODY, CT)[0]
    n = 1500  # ~20 MB of responses: far more than the kernel's socket buffers take
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(("127.0.0.1", srv.port))

    def pipeline() -> None:
        with contextlib.suppress(OSError):  # closed at the end if the test failed
            hog.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * n)

    sender = threading.Thread(target=pipeline, daemon=True)
    try:
        sender.start()
        # The server answers until the unsent output passes the bound, then stops reading.
        peak, deadline = 0, time.monotonic() + BOUND_S
        while peak <= bound and time.monotonic() < deadline:
            peak = max(peak, srv.buffered())
            time.sleep(0.01)
        assert peak > bound, "the server never filled the connection's buffer"
        for _ in range(50):  # and holds there: output <= bound + one response, input one recv
            peak = max(peak, srv.buffered())
            time.sleep(0.01)
        assert peak <= bound + len(response) + 65536 + MAX_HEAD, peak
        # Others are served meanwhile.
        assert scrape(srv.port) == BODY
        # Once the client reads, every pipelined request is answered, in order and whole.
        hog.settimeout(BOUND_S)
        got = 0
        while got < n * len(response):
            chunk = hog.recv(1 << 20)
            assert chunk, f"closed after {got} of {n * len(response)} bytes"
            got += len(chunk)
        assert got == n * len(response)
        sender.join(timeout=BOUND_S)
        assert not sender.is_alive()
    finally:
        hog.close()
        srv.close()


def test_clients_that_pipeline_and_never_read_do_not_lock_out_a_scrape():
    """Every slot held by a client that pipelines requests and never reads: each has output
    waiting, so none is idle. A new scrape closes the one whose reader took nothing longest."""
    srv = MetricsHTTPServer("127.0.0.1", 0, lambda: BODY * 64, CT, max_connections=8)
    hogs = []
    try:
        for _ in range(8):
            hog = socket.socket()
            hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            hog.connect(("127.0.0.1", srv.port))
            hog.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                hog.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 4000)
            hogs.append(hog)
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:  # until all 8 hold output their reader has not taken
            conns, now = list(srv._conns.values()), time.monotonic()
            if len(conns) == 8 and all(c.outbuf and now - c.last_active > STALL_S for c in conns):
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the clients never filled their connections' output")
        for _ in range(3):
            assert scrape(srv.port) == BODY * 64
        assert srv.connections() <= 8
    finally:
        for hog in hogs:
            hog.close()
        srv.close()


# ----- the bind address ------------------------------------------------------------------------


def test_binds_the_given_host_and_reports_what_it_bound():
    srv = MetricsHTTPServer("localhost", 0, lambda: BODY, CT)
    try:
        assert srv.host == "127.0.0.1" and scrape(srv.port) == BODY
    finally:
        srv.close()
    srv = MetricsHTTPServer("127.0.0.1", 0, lambda: BODY, CT)
    srv.close()
    assert check_host("0.0.0.0") == "0.0.0.0" and check_host("::1") == "::1"
    for bad in ("example.com", "127.0.0.300", "", "0.0.0.0:9400"):
        with pytest.raises(ValueError, match="--metrics-host"):
            check_host(bad)
