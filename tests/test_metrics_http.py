"""The exporter's one-thread HTTP server: protocol, keep-alive, many clients, and close()."""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.error
import urllib.request

import pytest

from autok.metrics_http import MAX_HEAD, MetricsHTTPServer, answer

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
