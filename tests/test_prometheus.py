"""A real Prometheus server scrapes a short training run every second; every query of the
Grafana dashboard must then return data through Prometheus's HTTP API.

`.ci/run` installs Prometheus (Debian's package) and sets AUTOK_REQUIRE_PROMETHEUS=1, which turns
its absence into a failure instead of a skip."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from autok.launch import free_port
from tests.test_cli import TINY, autok

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "autok.json"


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("AUTOK_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("prometheus is not installed, and AUTOK_REQUIRE_PROMETHEUS=1")
        pytest.skip("prometheus is not installed (.ci/run installs Debian's package)")
    return path


def two_free_ports() -> int:
    while True:
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
                return p
            except OSError:
                continue


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queries += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    for var in dash["templating"]["list"]:  # Grafana's label_values(metric, label)
        m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", var["query"])
        assert m, var["query"]
        queries.append(m.group(1))
    # Grafana substitutes the template variable; "All" is the regex .*
    return [q.replace("$run_id", ".*") for q in queries]


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path):
    binary = prometheus_binary()
    mport, pport = two_free_ports(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: autok\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{mport}', '127.0.0.1:{mport + 1}']\n"
    )
    prom = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{pport}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{pport}/-/ready", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "prometheus did not become ready"
                assert prom.poll() is None, prom.stderr.read().decode()[-2000:]
                time.sleep(0.5)
        start = time.time()
        # ~10 s of training with K changing, scraped every second
        args = ["train", *TINY, "--epochs", "12", "--batch-size", "8"]
        args += ["--mnist1d-samples", "2000", "--link", "wan", "--policy", "exposed-sync"]
        args += ["--sync-period", "4", "--sync-window", "2", "--warmup-epochs", "1"]
        args += ["--metrics-port", str(mport), "--metrics-per-rank"]
        res = autok(*args, "--out", str(tmp_path / "run"))
        assert res.returncode == 0, res.stderr[-2000:]
        end = time.time()
        time.sleep(2.5)  # the last scrapes land
        targets = api(pport, "/api/v1/targets")["data"]["activeTargets"]
        assert len(targets) == 2

        empty = []
        for query in dashboard_queries():
            out = api(
                pport,
                "/api/v1/query_range",
                query=query,
                start=f"{start:.3f}",
                end=f"{end + 2:.3f}",
                step="1",
            )
            assert out["status"] == "success", (query, out)
            if not any(series["values"] for series in out["data"]["result"]):
                empty.append(query)
        assert not empty, empty
    finally:
        prom.terminate()
        prom.wait(timeout=30)
