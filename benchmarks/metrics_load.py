"""Training with and without 50 concurrent Prometheus scrapes, side by side.

    python -m benchmarks.metrics_load [--rounds 3] [--interval 1.0]

50 scrapers, each on its own keep-alive connection as 50 Prometheus servers would hold, fire
together every `--interval` seconds at rank 0's exporter while a run trains; runs with and
without them are interleaved, and the median wall-clock ratio is written to
benchmarks/results/metrics_load.json.

Two layouts are measured, because on a 2-core machine the scrapers' own CPU would otherwise be
charged to training:
- `isolated`: training (both workers, and the exporter inside rank 0) on core 0, the scrapers on
  core 1, as on a real host where Prometheus runs elsewhere. This is the exporter's cost.
- `shared`: everything on both cores; the scrapers' client work competes with training too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from autok.launch import free_port
from benchmarks.engine import RESULTS, machine

RUN = [
    "--workers",
    "2",
    "--epochs",
    "20",
    "--batch-size",
    "8",
    "--mnist1d-samples",
    "2000",
    "--link",
    "lan",
    "--no-progress",
]
KEEP_EVERY = 10  # scraped texts kept for validation: one in ten


async def _get_metrics(reader, writer) -> tuple[bytes, bytes]:
    """One scrape on an open connection: (status code, body)."""
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: autok\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head.split(b" ", 2)[1], await reader.readexactly(length)


async def _client(port: int, tick: list[asyncio.Event], out: dict, stop: asyncio.Event) -> None:
    """One scraper on one keep-alive connection; reconnects when the server is not up yet."""
    reader = writer = None
    seen = 0
    while not stop.is_set():
        await tick[0].wait()  # the ticker swaps in a fresh event before setting this one
        if stop.is_set():
            break
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            status, body = await _get_metrics(reader, writer)
            if status != b"200":
                out["errors"].append(f"status {status!r}")
            out["scrapes"] += 1
            seen += 1
            if seen % KEEP_EVERY == 1:
                out["texts"].append(body.decode())
        except (ConnectionError, asyncio.IncompleteReadError):
            writer = None  # not up yet, or the run just ended
        except Exception as exc:  # noqa: BLE001 (a malformed response: reported, not raised)
            out["errors"].append(repr(exc))
            writer = None
    if writer is not None:
        writer.close()


async def _scrape_all(port: int, clients: int, interval: float, stop_flag) -> dict:
    out: dict = {"scrapes": 0, "errors": [], "texts": []}
    stop = asyncio.Event()
    tick = [asyncio.Event()]
    tasks = [asyncio.create_task(_client(port, tick, out, stop)) for _ in range(clients)]
    while not stop_flag.is_set():
        # Every client fires at once: a burst of `clients` concurrent scrapes.
        burst, tick[0] = tick[0], asyncio.Event()
        burst.set()
        await asyncio.sleep(interval)
    stop.set()
    tick[0].set()
    await asyncio.wait(tasks, timeout=10)
    return out


def _scraper_main(port, clients, interval, cpus, stop_flag, queue) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    queue.put(asyncio.run(_scrape_all(port, clients, interval, stop_flag)))


def run_with_scrapers(
    out: Path,
    scrapers: int,
    *,
    interval: float = 1.0,
    train_cpus: set[int] | None = None,
    scraper_cpus: set[int] | None = None,
    extra: list[str] | None = None,
) -> tuple[float, list[str], list[str], int]:
    """One `autok train` run with `scrapers` keep-alive scrapers bursting every `interval` s.
    Returns (wall seconds, a sample of the scraped texts, errors, number of scrapes)."""
    port = free_port()
    cmd = [sys.executable, "-m", "autok.cli", "train", *RUN, *(extra or [])]
    cmd += ["--metrics-port", str(port), "--out", str(out)]
    ctx = mp.get_context("spawn")
    stop_flag, queue = ctx.Event(), ctx.Queue()
    proc = None
    if scrapers:
        proc = ctx.Process(
            target=_scraper_main,
            args=(port, scrapers, interval, scraper_cpus, stop_flag, queue),
            daemon=True,
        )
        proc.start()
    if train_cpus:  # taskset pins before exec (preexec_fn is unsafe in a threaded process)
        cmd = ["taskset", "-c", ",".join(map(str, sorted(train_cpus))), *cmd]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    result = {"scrapes": 0, "errors": [], "texts": []}
    if proc is not None:
        stop_flag.set()
        result = queue.get(timeout=60)
        proc.join(timeout=10)
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-2000:])
    wall = json.loads((out / "summary.json").read_text())["wall_seconds"]
    return wall, result["texts"], result["errors"], result["scrapes"]


def _reference_server(exp):
    """The stdlib's thread-per-connection server (what autok used before metrics_http), serving
    the same bytes: the baseline of the comparison."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = exp.render()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    class Server(ThreadingHTTPServer):  # as autok configured it
        request_queue_size = 128
        daemon_threads = False
        block_on_close = True

    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _serve_main(kind, ready, done, queue) -> None:
    """A rank 0 exporter with a realistic body; reports the CPU this process spent serving."""
    from autok.controllers.base import BoundaryStats, SyncDecision
    from autok.metrics import MetricsExporter
    from autok.trainer.engine.link import PROFILES

    exp = MetricsExporter(
        0, run_id="bench", strategy="cpdp", policy="exposed-sync", link=PROFILES["wan"]
    )
    for i in range(100):
        stats = BoundaryStats(
            boundary=i,
            global_step=4 * i,
            epoch=i // 10,
            sync_period=4,
            interval_steps=4,
            compute_seconds=0.02 * (1 + i % 7),
            exposed_sync_seconds=0.05 * (1 + i % 5),
            drift_norm=0.1,
            update_norm=0.2,
            drift_ratio=0.5,
            train_loss=1.0,
            bytes_communicated=1000,
            lr=0.1,
            warmup=False,
            samples=128,
            grad_syncs=1,
            param_syncs=1,
        )
        exp.on_boundary(stats, SyncDecision(4 + 4 * (i % 3 == 0), "raise: share high"))
    exp.render()
    ref = _reference_server(exp) if kind == "http.server" else None
    t0 = os.times()
    ready.put(ref.server_address[1] if ref else exp.port)
    done.wait()
    t1 = os.times()
    exp.close()
    if ref:
        ref.shutdown()
    queue.put((t1.user - t0.user) + (t1.system - t0.system))


async def _hammer(port: int, clients: int, per_client: int, keep_alive: bool) -> int:
    async def one() -> int:
        writer = None
        for _ in range(per_client):
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await _get_metrics(reader, writer)
            if not keep_alive:
                writer.close()
                await writer.wait_closed()
                writer = None
        if writer is not None:
            writer.close()
        return per_client

    return sum(await asyncio.gather(*(one() for _ in range(clients))))


def server_cpu_per_scrape(
    kind: str = "autok", keep_alive: bool = True, clients: int = 50, per_client: int = 200
) -> dict:
    """CPU seconds the serving process spends per scrape (its user + system time over
    clients x per_client keep-alive scrapes, the clients in another process on another core).
    Unlike wall-clock ratios, this does not drown in the machine's noise."""
    ctx = mp.get_context("spawn")
    ready, done, queue = ctx.Queue(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_serve_main, args=(kind, ready, done, queue), daemon=True)
    proc.start()
    port = ready.get(timeout=60)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(proc.pid, {cpus[0]})
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpus[1]})
    n = asyncio.run(_hammer(port, clients, per_client, keep_alive))
    done.set()
    cpu = queue.get(timeout=60)
    proc.join(timeout=10)
    if len(cpus) >= 2:
        os.sched_setaffinity(0, mine)
    per = cpu / n
    return {
        "server": kind,
        "keep_alive": keep_alive,
        "scrapes": n,
        "server_cpu_s": cpu,
        "cpu_per_scrape_s": per,
        "core_share_at_50_per_s": 50 * per,
    }


SERVERS = [("autok", True), ("autok", False), ("http.server", False)]


LAYOUTS = {
    "isolated": ({0}, {1}),  # training on core 0, scrapers on core 1
    "shared": (None, None),
}


def measure(layout: str, rounds: int, interval: float, root: Path) -> dict:
    train_cpus, scraper_cpus = LAYOUTS[layout]
    base, loaded, scrapes = [], [], 0
    for i in range(rounds):
        base.append(run_with_scrapers(root / f"{layout}-b{i}", 0, train_cpus=train_cpus)[0])
        wall, _, errors, n = run_with_scrapers(
            root / f"{layout}-l{i}",
            50,
            interval=interval,
            train_cpus=train_cpus,
            scraper_cpus=scraper_cpus,
        )
        assert not errors, errors[:3]
        loaded.append(wall)
        scrapes += n
    return {
        "without_s": base,
        "with_50_scrapers_s": loaded,
        "scrapes": scrapes,
        "ratio": statistics.median(loaded) / statistics.median(base),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("metrics_load: needs 2 cores to isolate the scrapers")
    t0 = time.time()
    res: dict = {"machine": machine(), "interval_s": args.interval}
    res["server_cpu"] = []
    for kind, keep_alive in SERVERS:
        srv = server_cpu_per_scrape(kind, keep_alive)
        res["server_cpu"].append(srv)
        print(
            f"server {kind} ({'keep-alive' if keep_alive else 'a connection per scrape'}): "
            f"{srv['cpu_per_scrape_s'] * 1e6:.0f} us of CPU per scrape ({srv['scrapes']} "
            f"scrapes); 50 scrapes/s take {srv['core_share_at_50_per_s']:.2%} of a core",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as d:
        for layout in args.layouts:
            res[layout] = r = measure(layout, args.rounds, args.interval, Path(d))
            print(
                f"{layout}: wall without scrapers {statistics.median(r['without_s']):.2f} s, "
                f"with 50 concurrent scrapers {statistics.median(r['with_50_scrapers_s']):.2f} s:"
                f" ratio {r['ratio']:.3f} ({r['scrapes']} scrapes)",
                flush=True,
            )
    res["seconds"] = time.time() - t0
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "metrics_load.json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
