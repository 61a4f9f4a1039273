"""Training with and without 50 concurrent Prometheus scrapes, side by side.

    python -m benchmarks.metrics_load [--rounds 3]

50 scrapers fire together once a second (as 50 Prometheus servers at a 1 s interval would) at
rank 0's exporter while a run trains; runs with and without them are interleaved, and the
median wall-clock ratio is printed and written to benchmarks/results/metrics_load.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
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


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def run_with_scrapers(
    out: Path, scrapers: int, extra: list[str] | None = None, interval: float = 1.0
):
    """One `autok train` run, with `scrapers` concurrent scrapers bursting every `interval` s.
    Returns (wall_seconds, scraped texts, errors other than connection refusals)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "autok.cli",
        "train",
        *RUN,
        *(extra or []),
        "--metrics-port",
        str(port),
        "--out",
        str(out),
    ]
    texts: list[str] = []
    errors: list[str] = []
    stop = threading.Event()

    def scraper(barrier: threading.Barrier) -> None:
        while not stop.is_set():
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                return
            try:
                texts.append(scrape(port))
            except OSError:
                pass  # not up yet, or already finished
            except Exception as exc:  # a malformed response
                errors.append(repr(exc))
            time.sleep(interval)

    threads = []
    if scrapers:
        barrier = threading.Barrier(scrapers)
        threads = [
            threading.Thread(target=scraper, args=(barrier,), daemon=True) for _ in range(scrapers)
        ]
        for t in threads:
            t.start()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    wall = json.loads((out / "summary.json").read_text())["wall_seconds"]
    return wall, texts, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base, loaded, scraped = [], [], 0
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.rounds):
            base.append(run_with_scrapers(Path(d) / f"b{i}", 0)[0])
            wall, texts, errors = run_with_scrapers(Path(d) / f"l{i}", 50)
            assert not errors, errors[:3]
            loaded.append(wall)
            scraped += len(texts)
    ratio = statistics.median(loaded) / statistics.median(base)
    res = {
        "machine": machine(),
        "without_s": base,
        "with_50_scrapers_s": loaded,
        "scrapes": scraped,
        "ratio": ratio,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "metrics_load.json").write_text(json.dumps(res, indent=2) + "\n")
    print(
        f"wall without scrapers {statistics.median(base):.2f} s, with 50 concurrent scrapers "
        f"{statistics.median(loaded):.2f} s: ratio {ratio:.3f} ({scraped} scrapes)"
    )


if __name__ == "__main__":
    main()
