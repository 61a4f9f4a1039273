"""The Prometheus exporter: names, types, labels, monotone counters, agreement with the run's
files, and valid text under concurrent scrapes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from autok.controllers.base import BoundaryStats, SyncDecision
from autok.metrics import CHANGES_KEPT, TARGET_SHARE_POLICIES, MetricsExporter, reason_kind
from autok.metrics_http import port_taken
from autok.trainer.engine.link import PROFILES
from tests.dist import run_dist
from tests.helpers import tiny_cfg

LABELS = {"run_id", "strategy", "policy"}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, name: str, suffix: str = "", **labels) -> float:
    fam = fams[name]
    for s in fam.samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(name + suffix)


def stats(i, k=4, nxt=4, **kw):
    base = dict(
        boundary=i,
        global_step=4 * i,
        epoch=0,
        sync_period=k,
        interval_steps=k,
        compute_seconds=0.02,
        exposed_sync_seconds=0.05,
        drift_norm=0.1,
        update_norm=0.2,
        drift_ratio=0.5,
        train_loss=1.5 - 0.01 * i,
        bytes_communicated=1000,
        lr=0.1,
        warmup=False,
        samples=128,
        grad_syncs=1,
        param_syncs=1,
    )
    base.update(kw)
    return BoundaryStats(**base), SyncDecision(nxt, "raise: share 90% > target 20%")


def promtool_check(text: str) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        return
    res = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_names_types_and_labels():
    exp = MetricsExporter(
        0,
        run_id="r1",
        strategy="cpdp",
        policy="exposed-sync",
        link=PROFILES["wan"],
        host="127.0.0.1",
    )
    try:
        for i in range(3):
            exp.on_boundary(*stats(i, k=4, nxt=8 if i == 2 else 4))
        exp.on_epoch({"test_accuracy": 0.75, "test_metric": 0.75, "metric_name": "accuracy"})
        text = scrape(exp.port)
    finally:
        exp.close()
    promtool_check(text)
    fams = families(text)
    want = {
        "autok_sync_period": "gauge",
        "autok_learning_rate": "gauge",
        "autok_sync_share_ratio": "gauge",
        "autok_drift_norm": "gauge",
        "autok_drift_ratio": "gauge",
        "autok_update_norm": "gauge",
        "autok_train_loss": "gauge",
        "autok_test_accuracy_ratio": "gauge",
        "autok_test_metric": "gauge",
        "autok_epoch": "gauge",
        "autok_exposed_sync_seconds": "histogram",
        "autok_compute_seconds": "histogram",
        "autok_samples": "counter",
        "autok_boundaries": "counter",
        "autok_grad_syncs": "counter",
        "autok_param_syncs": "counter",
        "autok_communicated_bytes": "counter",
        "autok_sync_period_changes": "counter",
        "autok_link_info": "gauge",
    }
    for name, kind in want.items():
        assert fams[name].type == kind, name
    for fam in fams.values():
        assert fam.name.startswith("autok_")
        for s in fam.samples:
            assert set(s.labels) >= LABELS, s
            assert set(s.labels) - LABELS <= {
                "le",
                "reason",
                "profile",
                "rtt_ms",
                "bandwidth_gbps",
                "jitter_ms",
                "rank",
                "metric",
                "change",
                "old_k",
                "new_k",
                "fragment",
            }
    assert sample(fams, "autok_boundaries", "_total") == 3
    assert sample(fams, "autok_samples", "_total") == 384
    assert sample(fams, "autok_exposed_sync_seconds", "_count") == 3
    assert sample(fams, "autok_exposed_sync_seconds", "_sum") == pytest.approx(0.15)
    assert sample(fams, "autok_exposed_sync_seconds", "_bucket", le="0.05") == 3
    assert sample(fams, "autok_exposed_sync_seconds", "_bucket", le="0.025") == 0
    assert sample(fams, "autok_sync_period_changes", "_total", reason="raise") == 1
    assert sample(fams, "autok_sync_share_ratio") == pytest.approx(0.05 / 0.07)
    assert sample(fams, "autok_link_info", profile="wan", rtt_ms="16.6") == 1


def exporter(**kw) -> MetricsExporter:
    base = dict(run_id="r1", strategy="cpdp", policy="exposed-sync", host="127.0.0.1")
    return MetricsExporter(0, **(base | kw))


def scraped(exp: MetricsExporter) -> dict:
    try:
        return families(scrape(exp.port))
    finally:
        exp.close()


def change_events(fams: dict) -> list[tuple[int, int, int, str, float]]:
    """(change, old K, new K, reason, unix time) of each K-change series, in change order."""
    fam = fams["autok_sync_period_change_timestamp_seconds"]
    assert fam.type == "gauge"
    rows = [
        (int(s.labels["change"]), int(s.labels["old_k"]), int(s.labels["new_k"]),
         s.labels["reason"], s.value)
        for s in fam.samples
    ]  # fmt: skip
    return sorted(rows)


def test_k_changes_are_timestamped_events_with_old_and_new_k_and_reason():
    before = time.time()
    exp = exporter()
    for i in range(3):  # warmup at K=1: the controller's K (4) is not in force, nothing marked
        exp.on_boundary(*stats(i, k=1, nxt=4, warmup=True))
    after_warmup = time.time()
    exp.on_boundary(*stats(3, k=4, nxt=4))  # K left 1 at the last warmup boundary
    exp.on_boundary(*stats(4, k=4, nxt=8))  # raise
    exp.on_boundary(*stats(5, k=8, nxt=8))  # hold
    exp.on_boundary(stats(6, k=8)[0], SyncDecision(4, "back off: drift ratio 9 > 3"))
    end = time.time()
    fams = scraped(exp)
    events = change_events(fams)
    assert [e[:4] for e in events] == [
        (1, 1, 4, "warmup_end"),
        (2, 4, 8, "raise"),
        (3, 8, 4, "back_off"),
    ]
    times = [e[4] for e in events]
    assert before <= times[0] <= after_warmup <= times[1] <= times[2] <= end
    # the counter counts the policy's decisions only, not the end of warmup
    assert sample(fams, "autok_sync_period_changes", "_total", reason="raise") == 1
    assert sample(fams, "autok_sync_period_changes", "_total", reason="back_off") == 1
    assert "warmup_end" not in {
        s.labels["reason"] for s in fams["autok_sync_period_changes"].samples
    }


def test_only_the_last_k_changes_are_served_and_numbering_goes_on():
    exp = exporter()
    n = CHANGES_KEPT + 5
    for i in range(n):
        k = 4 if i % 2 == 0 else 8
        exp.on_boundary(*stats(i, k=k, nxt=12 - k))
    fams = scraped(exp)
    events = change_events(fams)
    assert [e[0] for e in events] == list(range(6, n + 1))
    assert all(old != new for _, old, new, _, _ in events)
    assert sum(s.value for s in fams["autok_sync_period_changes"].samples) == n


def test_no_k_change_no_event_series():
    exp = exporter(policy="fixed")
    for i in range(3):
        exp.on_boundary(*stats(i, k=4, nxt=4))
    assert change_events(scraped(exp)) == []


def test_target_share_is_served_for_the_policies_that_steer_by_it():
    for policy in ("exposed-sync", "composite"):
        fams = scraped(exporter(policy=policy, target_sync_share=0.35))
        assert sample(fams, "autok_target_sync_share_ratio") == pytest.approx(0.35)
        assert fams["autok_target_sync_share_ratio"].type == "gauge"
    # a policy that ignores it, or no value given: no reference line to draw
    assert "autok_target_sync_share_ratio" not in scraped(
        exporter(policy="fixed", target_sync_share=0.35)
    )
    assert "autok_target_sync_share_ratio" not in scraped(exporter())


def test_target_share_policies_are_those_whose_controller_holds_the_target():
    from autok.controllers import REGISTRY, PolicyOptions, build_controller

    def holds(obj, value, depth=2) -> bool:
        fields = getattr(obj, "__dict__", {})
        return any(
            v == value or (depth > 0 and holds(v, value, depth - 1))
            for v in fields.values()
            if isinstance(v, float) or hasattr(v, "__dict__")
        )

    steering = {
        name
        for name in REGISTRY
        if holds(build_controller(name, 4, PolicyOptions(target_sync_share=0.37)), 0.37)
    }
    assert steering == TARGET_SHARE_POLICIES


def test_start_time_is_served_from_the_start():
    before = time.time()
    fams = scraped(exporter())  # before any boundary
    assert before - 1 <= sample(fams, "autok_start_time_seconds") <= time.time()


def test_reason_kind_is_low_cardinality():
    assert reason_kind("raise: sync share 93% > target 20%") == "raise"
    assert reason_kind("back off: drift ratio 9 > 3 x calibrated 1") == "back_off"
    assert reason_kind("composite (qsr): hold ...; qsr K=8") == "composite_qsr"


def _run_with_exporter(rank, world, out_dir):
    from autok.trainer.loop.run import Trainer

    cfg = tiny_cfg(
        workers=world,
        link="wan",
        policy="exposed-sync",
        sync_period=1,
        sync_window=2,
        warmup_epochs=0,
        mnist1d_samples=1000,
    )
    exp = (
        MetricsExporter(
            0,
            run_id="t",
            strategy=cfg.strategy,
            policy=cfg.policy,
            link=cfg.link_profile,
            host="127.0.0.1",
        )
        if rank == 0
        else None
    )
    seen = []

    class Watch:  # scrape after every boundary: counters must never go down
        def on_boundary(self, stats, decision):
            if exp is not None:
                seen.append(scrape(exp.port))

    obs = [o for o in (exp, Watch()) if o is not None]
    tr = Trainer(cfg, rank, world, Path(out_dir), observers=obs)
    tr.run()
    if exp is None:
        return None
    text = scrape(exp.port)
    exp.close()
    return text, seen


def test_values_match_boundaries_jsonl_and_counters_only_increase(tmp_path):
    text, seen = run_dist(_run_with_exporter, 2, str(tmp_path))[0]
    records = [json.loads(line) for line in (tmp_path / "boundaries.jsonl").open()]
    fams = families(text)
    last = records[-1]
    assert sample(fams, "autok_boundaries", "_total") == len(records)
    assert sample(fams, "autok_sync_period") == last["sync_period"]
    assert sample(fams, "autok_next_sync_period") == last["next_sync_period"]
    assert sample(fams, "autok_train_loss") == pytest.approx(last["train_loss"])
    assert sample(fams, "autok_drift_norm") == pytest.approx(last["drift_norm"])
    assert sample(fams, "autok_learning_rate") == pytest.approx(last["lr"])
    assert sample(fams, "autok_exposed_sync_seconds", "_sum") == pytest.approx(
        sum(r["exposed_sync_seconds"] for r in records)
    )
    assert sample(fams, "autok_communicated_bytes", "_total") == sum(
        r["bytes_communicated"] for r in records
    )
    changes = sum(r["next_sync_period"] != r["sync_period"] for r in records)
    total_changes = sum(s.value for s in fams["autok_sync_period_changes"].samples)
    assert changes > 0 and total_changes == changes
    acc = [float(r.split(",")[3]) for r in (tmp_path / "epochs.csv").read_text().split()[1:]]
    assert sample(fams, "autok_test_accuracy_ratio") == pytest.approx(acc[-1])
    # counters only increase, scrape after scrape
    prev: dict = {}
    for t in seen:
        for fam in families(t).values():
            if fam.type not in ("counter", "histogram"):
                continue
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                assert s.value >= prev.get(key, 0.0), key
                prev[key] = s.value


@pytest.mark.slow  # 40 s of training under 50 scrapers; the default suite keeps its budget
def test_fifty_concurrent_scrapes_during_training_stay_valid(tmp_path):
    """50 keep-alive scrapers fire together twice a second (as 50 Prometheus servers would)
    while a run trains; every response must parse and pass promtool, and training must not
    crawl."""
    from benchmarks.metrics_load import LAYOUTS, run_with_scrapers

    # Training on one core, the scrapers on the other, when there are two: the scrapers' own
    # client work is then not charged to training (Prometheus runs elsewhere in real use).
    train_cpus, scraper_cpus = (
        LAYOUTS["isolated"]
        if len(os.sched_getaffinity(0)) >= 2
        else (
            None,
            None,
        )
    )
    short = ["--epochs", "8"]
    base = run_with_scrapers(tmp_path / "base", 0, train_cpus=train_cpus, extra=short)[0]
    loaded, texts, errors, scrapes = run_with_scrapers(
        tmp_path / "loaded",
        50,
        interval=0.5,
        train_cpus=train_cpus,
        scraper_cpus=scraper_cpus,
        extra=short,
    )
    assert not errors, errors[:3]
    assert scrapes >= 300, scrapes
    for t in texts[:: max(1, len(texts) // 20)]:
        families(t)
        promtool_check(t)
    # The figure itself is measured by benchmarks/metrics_load.py (see its results); here, a
    # guard against a pathological slowdown (the old server's was unbounded) that tolerates a
    # loaded 2-core CI machine, where two short runs' wall-clocks differ by tens of percent.
    assert loaded / base < 2.0, (loaded, base)


# ----- where the exporter listens, and ports checked before a run starts ------------------------

TINY_TRAIN = ["train", "--workers", "2", "--epochs", "1", "--link", "none", "--no-progress"]


@pytest.fixture
def no_launch(monkeypatch):
    """`autok train` in-process with the launcher replaced by a tripwire."""
    import autok.launch

    def tripwire(*a, **k):
        raise AssertionError("launched: the bad setting was not refused before the run")

    monkeypatch.setattr(autok.launch, "launch", tripwire)
    monkeypatch.delenv("RANK", raising=False)  # not under torchrun


def refused(capsys, argv: list[str], out: Path) -> str:
    from autok.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autok: error: "), err
    assert not out.exists(), "written before the check"
    return err


def adjacent_free_and_taken() -> tuple[int, socket.socket]:
    """(P, a listener on P + 1) with P free: rank 1's port taken, rank 0's not."""
    for _ in range(50):
        s = socket.create_server(("127.0.0.1", 0))
        port = s.getsockname()[1] - 1
        if port > 1024 and port_taken("127.0.0.1", port) is None:
            return port, s
        s.close()
    pytest.skip("no free port next to a taken one")


def test_exporter_binds_metrics_host_and_start_exporter_prints_the_bound_address(capsys):
    from autok.launch import start_exporter

    exp = MetricsExporter(0, run_id="r", strategy="cpdp", policy="fixed")
    try:
        assert exp.host == "127.0.0.1"  # this machine only unless asked
    finally:
        exp.close()
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    cfg = tiny_cfg(metrics_port=port, metrics_host="localhost", progress=True)
    exp = start_exporter(cfg, 0, None)
    try:
        assert exp.host == "127.0.0.1" and exp.port == port
        scrape(port)
    finally:
        exp.close()
    assert f"metrics at http://127.0.0.1:{port}/metrics" in capsys.readouterr().out


def test_metrics_host_must_be_an_ip_address(tmp_path, capsys, no_launch):
    out = tmp_path / "run"
    argv = [*TINY_TRAIN, "--metrics-port", "9400", "--metrics-host", "example.com"]
    err = refused(capsys, [*argv, "--out", str(out)], out)
    assert "--metrics-host" in err and "0.0.0.0" in err


def test_taken_metrics_port_is_refused_before_anything_is_written(tmp_path, capsys, no_launch):
    out = tmp_path / "run"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        err = refused(capsys, [*TINY_TRAIN, "--metrics-port", str(port), "--out", str(out)], out)
    assert "--metrics-port" in err and str(port) in err


def test_a_sweep_refuses_a_taken_metrics_port_before_any_trial(tmp_path, capsys, monkeypatch):
    """Every trial would fail on it: refused up front, no study written."""
    import autok.sweep

    monkeypatch.setattr(autok.sweep, "sweep_optuna", lambda *a: pytest.fail("a trial started"))
    out = tmp_path / "sweep"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        argv = ["sweep", "--workers", "2", "--metrics-port", str(port), "--out", str(out)]
        err = refused(capsys, argv, out)
    assert err.startswith(f"autok: error: --metrics-port: {port} cannot be served"), err


def test_taken_per_rank_port_is_refused_before_anything_is_written(tmp_path, capsys, no_launch):
    out = tmp_path / "run"
    port, taken = adjacent_free_and_taken()
    with taken:
        argv = [*TINY_TRAIN, "--metrics-port", str(port), "--metrics-per-rank"]
        err = refused(capsys, [*argv, "--out", str(out)], out)
    assert "--metrics-port" in err and f"{port + 1} (PORT + rank 1)" in err


def test_per_rank_ports_above_65535_are_refused_before_anything_is_written(
    tmp_path, capsys, no_launch
):
    out = tmp_path / "run"
    argv = [*TINY_TRAIN, "--metrics-port", "65535", "--metrics-per-rank", "--out", str(out)]
    err = refused(capsys, argv, out)
    assert "--metrics-port" in err and "65536" in err and "at most 65534" in err


def test_the_link_info_follows_a_changing_link():
    exp = MetricsExporter(
        0, run_id="r1", strategy="cpdp", policy="exposed-sync", link=PROFILES["lan"]
    )
    try:
        exp.on_boundary(*stats(0, link="lan"))
        before = families(scrape(exp.port))
        exp.on_boundary(*stats(1, link="slow-wan"))
        after = families(scrape(exp.port))
    finally:
        exp.close()
    assert sample(before, "autok_link_info", profile="lan", rtt_ms="0.1") == 1
    assert sample(after, "autok_link_info", profile="slow-wan", rtt_ms="100") == 1
    with pytest.raises(KeyError):  # one series: the profile in force
        sample(after, "autok_link_info", profile="lan")


def test_norms_of_a_boundary_carry_the_fragment_it_moved_one_series_each():
    """--fragments: drift and update norms are of the fragment's slice, so each fragment is
    its own series (label fragment, `whole` for the whole model) holding its last value."""
    exp = MetricsExporter(0, run_id="r1", strategy="localsgd", policy="fixed", host="127.0.0.1")
    try:
        exp.on_boundary(*stats(0, drift_norm=0.1, fragment=1))
        exp.on_boundary(*stats(1, drift_norm=0.2, fragment=0))
        exp.on_boundary(*stats(2, drift_norm=0.3, fragment=1, update_norm=0.6, drift_ratio=0.5))
        exp.on_boundary(*stats(3, drift_norm=0.4, fragment=-1))
        text = exp.render().decode()
    finally:
        exp.close()
    promtool_check(text)
    fams = families(text)
    for name in ("autok_drift_norm", "autok_update_norm", "autok_drift_ratio"):
        assert {s.labels["fragment"] for s in fams[name].samples} == {"0", "1", "whole"}, name
    assert sample(fams, "autok_drift_norm", fragment="1") == 0.3
    assert sample(fams, "autok_drift_norm", fragment="0") == 0.2
    assert sample(fams, "autok_drift_norm", fragment="whole") == 0.4
    assert sample(fams, "autok_update_norm", fragment="1") == 0.6
    # what is not of a fragment stays one series
    assert "fragment" not in fams["autok_train_loss"].samples[0].labels
