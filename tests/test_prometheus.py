"""The Grafana dashboard. A real Prometheus server scrapes a short training run every second;
every query of the dashboard must then return data through Prometheus's HTTP API, the K-change
markers must be the run's K changes, and once the run has ended no panel may go on showing a
live value. Fast checks of the JSON's structure need no Prometheus.

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
import yaml

from autok.launch import free_port
from autok.metrics import reason_kind
from tests.test_cli import TINY, autok

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "autok.json"
DATASOURCE = ROOT / "dashboards" / "provisioning" / "datasources" / "prometheus.yml"
SCRAPE_CONFIG = ROOT / "dashboards" / "prometheus.yml"
# What Grafana puts for $__rate_interval with a 1 s scrape interval (the test's, and
# dashboards/prometheus.yml's) at a 1 s step: max(4 x scrape interval, step + scrape interval).
RATE_INTERVAL = "4s"


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


def grafana(query: str) -> str:
    """The query as Grafana sends it: every run ("All" is the regex .*), a 1 s scrape."""
    return query.replace("$run_id", ".*").replace("$__rate_interval", RATE_INTERVAL)


def panel_queries(dash: dict | None = None) -> list[str]:
    dash = dash or json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def annotation_queries(dash: dict | None = None) -> list[str]:
    """The Prometheus annotations' queries; Grafana 11.1 reads `expr`, later ones `target`."""
    dash = dash or json.loads(DASHBOARD.read_text())
    out = []
    for a in dash["annotations"]["list"]:
        if a["datasource"]["type"] != "prometheus":
            continue
        assert a["expr"] == a["target"]["expr"], a["name"]
        out.append(a["expr"])
    return out


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    queries = panel_queries(dash) + annotation_queries(dash)
    for var in dash["templating"]["list"]:  # Grafana's label_values(metric, label)
        m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", var["query"])
        assert m, var["query"]
        queries.append(m.group(1))
    return [grafana(q) for q in queries]


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def first_failed_scrape(port: int, target: str) -> float | None:
    """Time of the first failed scrape of `target` after its last good one (when Prometheus
    marks the target's series stale), or None while it still scrapes."""
    out = api(port, "/api/v1/query", query=f'up{{instance="{target}"}}[60s]')["data"]["result"]
    samples = [(float(t), v) for t, v in out[0]["values"]] if out else []
    good = [t for t, v in samples if v == "1"]
    failed = [t for t, v in samples if v == "0" and good and t > good[-1]]
    return failed[0] if failed else None


def expected_k_changes(run_dir: Path, warmup_epochs: int) -> list[tuple[int, int, str]]:
    """(old K, new K, reason) of every K change of the run, from its boundaries.jsonl: the end
    of warmup, then each decision outside warmup that changed K."""
    out, prev = [], None
    for line in (run_dir / "boundaries.jsonl").read_text().splitlines():
        r = json.loads(line)
        warm = r["epoch"] < warmup_epochs
        if prev is not None and prev[0] and not warm and r["sync_period"] != prev[1]:
            out.append((prev[1], r["sync_period"], "warmup_end"))
        if not warm and r["next_sync_period"] != r["sync_period"]:
            out.append((r["sync_period"], r["next_sync_period"], reason_kind(r["reason"])))
        prev = (warm, r["sync_period"])
    return out


def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path):
    binary = prometheus_binary()
    mport, pport = two_free_ports(), free_port()
    targets = [f"127.0.0.1:{mport}", f"127.0.0.1:{mport + 1}"]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: autok\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
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
        # Both exporters close once the summary is written: wait (bounded, not timed) until
        # Prometheus has failed to scrape each, the instant it marks their series stale.
        deadline = time.time() + 60
        while None in (gone := [first_failed_scrape(pport, t) for t in targets]):
            assert time.time() < deadline, "prometheus never saw the run's targets go down"
            time.sleep(0.2)
        after = max(gone)
        assert len(api(pport, "/api/v1/targets")["data"]["activeTargets"]) == 2

        empty = []
        for query in dashboard_queries():
            out = api(
                pport,
                "/api/v1/query_range",
                query=query,
                start=f"{start:.3f}",
                end=f"{after:.3f}",
                step="1",
            )
            assert out["status"] == "success", (query, out)
            if not any(series["values"] for series in out["data"]["result"]):
                empty.append(query)
        assert not empty, empty

        # Once the run has ended no panel shows a live value: every panel query is empty at
        # the instant the targets went down...
        def at(query: str, when: float) -> list:
            out = api(pport, "/api/v1/query", query=grafana(query), time=f"{when:.3f}")
            assert out["status"] == "success", (query, out)
            return out["data"]["result"]

        lingering = [q for q in panel_queries() if at(q, after)]
        assert not lingering, lingering
        # ... where an ungated rate would still show the last window's throughput
        assert at('rate(autok_samples_total{run_id=~"$run_id"}[30s])', after)

        # The K-change markers: one series per change of the run, in order, each valued at the
        # change's instant in milliseconds, with old K, new K and the reason. A change in the
        # last second before the exporter closed may never have been scraped: a prefix.
        (marker_query,) = annotation_queries()
        markers = sorted(
            (int(r["metric"]["change"]), r["metric"], float(r["value"][1]))
            for r in at(marker_query, after)  # still shown after the run: they are history
        )
        want = expected_k_changes(tmp_path / "run", warmup_epochs=1)
        assert want[0][2] == "warmup_end" and any(w[2] == "raise" for w in want), want
        got = [(int(m["old_k"]), int(m["new_k"]), m["reason"]) for _, m, _ in markers]
        assert [n for n, _, _ in markers] == list(range(1, len(markers) + 1))
        assert markers and got == want[: len(got)], (got, want)
        times = [ms for _, _, ms in markers]
        assert start * 1000 <= times[0] and times == sorted(times) and times[-1] <= end * 1000
    finally:
        prom.terminate()
        prom.wait(timeout=30)


# ----- the dashboard's JSON, without Prometheus ---------------------------------------------------


def walk(node, path=""):
    """Every (path, dict) in a JSON document."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")


def served_metric_names() -> set[str]:
    """Every sample name the exporter serves, with every option on."""
    from autok.metrics import MetricsExporter
    from autok.trainer.engine.link import PROFILES
    from tests.test_metrics import families, scrape, stats

    exp = MetricsExporter(
        0, run_id="r", strategy="cpdp", policy="exposed-sync", link=PROFILES["wan"],
        per_rank=True, target_sync_share=0.2,
    )  # fmt: skip
    try:
        exp.on_boundary(*stats(0, k=4, nxt=8))
        exp.on_epoch({"test_accuracy": 0.5, "test_metric": 0.5, "metric_name": "accuracy"})
        exp.on_local_interval(0.1, 0.05)
        fams = families(scrape(exp.port))
    finally:
        exp.close()
    return {s.name for f in fams.values() for s in f.samples}


def test_dashboard_structure():
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    cells: set[tuple[int, int]] = set()
    for p in panels:
        what = f"panel {p['id']} ({p.get('title')})"
        assert p.get("title"), what
        assert len(p.get("description", "")) >= 40, what
        assert p["type"] in ("timeseries", "stat"), what
        # every panel plots numbers: a unit on its axis / value, and on any override's
        defaults = p["fieldConfig"]["defaults"]
        assert defaults.get("unit"), what
        for o in p["fieldConfig"]["overrides"]:
            for prop in o["properties"]:
                assert prop["id"] != "unit" or prop.get("value"), what
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), what
        # laid out on Grafana's 24 columns without overlapping
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, what
        mine = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & mine, what
        cells |= mine
    assert any(p["type"] == "stat" and p["gridPos"]["y"] == 0 for p in panels)
    # K as a step series
    (k_panel,) = [p for p in panels if p["title"].startswith("K (sync period)")]
    assert k_panel["fieldConfig"]["defaults"]["custom"]["lineInterpolation"] == "stepAfter"
    # counters drawn as counts: whole numbers, never increase()'s extrapolated fractions
    for p in panels:
        exprs = [t["expr"] for t in p["targets"]]
        assert not any("increase(" in e for e in exprs), p["title"]
        if any("_total{" in e and "rate(" not in e for e in exprs):
            assert p["fieldConfig"]["defaults"].get("decimals") == 0, p["title"]
    # one datasource, the provisioned one
    uid = yaml.safe_load(DATASOURCE.read_text())["datasources"][0]["uid"]
    refs = [(path, d) for path, d in walk(dash) if path.endswith(".datasource")]
    assert refs
    for path, ref in refs:
        if ref["type"] != "grafana":  # the built-in annotations' own
            assert ref == {"type": "prometheus", "uid": uid}, path
    # every query: the run picker on every selector, names the exporter really serves, rates
    # over Grafana's $__rate_interval and gated on their counter (empty once the run ended)
    served = served_metric_names()
    for q in panel_queries(dash) + annotation_queries(dash):
        for name, labels in re.findall(r"\b(autok_\w+)(\{[^}]*\})?", q):
            assert labels == '{run_id=~"$run_id"}', (name, q)
            assert name in served, (name, q)
        for window in re.findall(r"\[([^\]]+)\]", q):
            assert window == "$__rate_interval" or q in annotation_queries(dash), q
        if "rate(" in q:
            assert re.search(r"\) and (on \(run_id\) )?autok_\w+\{", q), q
    # the K-change markers: an instant each, with old K, new K and reason
    (anno,) = [a for a in dash["annotations"]["list"] if a["datasource"]["type"] == "prometheus"]
    assert anno["enable"] and anno["useValueForTime"] is True
    assert "* 1000" in anno["expr"]  # Grafana wants milliseconds
    assert "{{old_k}}" in anno["titleFormat"] and "{{new_k}}" in anno["titleFormat"]
    assert "{{reason}}" in anno["textFormat"]


def test_dashboard_json_is_what_build_py_writes():
    pytest.importorskip("grafana_foundation_sdk", reason="dashboards/build.py's generator")
    from dashboards.build import render

    assert DASHBOARD.read_text() == render(), "stale: run python -m dashboards.build"


def test_prometheus_config_is_valid_and_matches_the_datasource_interval():
    scrape = yaml.safe_load(SCRAPE_CONFIG.read_text())["global"]["scrape_interval"]
    ds = yaml.safe_load(DATASOURCE.read_text())["datasources"][0]
    assert ds["jsonData"]["timeInterval"] == scrape == "1s"
    assert RATE_INTERVAL == "4s"  # what Grafana derives from a 1 s scrape interval
    tool = shutil.which("promtool")
    if tool is not None:
        res = subprocess.run(
            [tool, "check", "config", str(SCRAPE_CONFIG)], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stdout + res.stderr
