"""Prometheus exporter: rank 0 serves cluster-wide values, already reduced at boundaries.

Names follow the Prometheus conventions: prefix `autok_`, base units in the name (`_seconds`,
`_bytes`), `_total` on counters, ratios in 0..1. Labels are few and of low cardinality: run_id,
strategy, policy (and `reason` on K changes, `rank` on per-rank metrics). The K-change events
(`autok_sync_period_change_timestamp_seconds`) carry `change`, `old_k`, `new_k` and `reason` as
well, but only the last CHANGES_KEPT are served, so a run never has more of them at once.

All values live under one lock and a collector builds the families from a snapshot, so a scrape
never sees a histogram half-updated. The text is rendered once per change and cached: fifty
concurrent scrapes cost one render, not fifty, on the training process.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from autok.config import ConfigError
from autok.controllers import POLICIES
from autok.controllers.base import BoundaryStats, SyncDecision
from autok.metrics_http import MetricsHTTPServer, bind_family, port_taken
from autok.trainer.engine.link import PROFILES, LinkProfile

if TYPE_CHECKING:
    from autok.config import TrainConfig

# The classic text format, which every Prometheus release parses (all our names are legacy-valid,
# so prometheus_client's newer "version=1.0.0" output is byte-identical to it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

GAUGES = {
    "sync_period": "K in force for the interval that just ended",
    "next_sync_period": "K chosen for the next interval",
    "learning_rate": "learning rate at the last boundary",
    "sync_share_ratio": "exposed sync / (compute + exposed sync) of the last boundary interval",
    "drift_norm": "sqrt(mean_i ||theta_i - theta_avg||^2) before the last averaging",
    "drift_ratio": "drift_norm / update_norm at the last boundary",
    "update_norm": "||theta_avg - theta_ref|| at the last boundary",
    "train_loss": "mean training loss over the last interval and the ranks",
    "test_accuracy_ratio": "test accuracy after the last finished epoch (classification)",
    "test_metric": "the task's test metric after the last finished epoch (its name in the "
    "metric label: accuracy, perplexity, ...)",
    "epoch": "epoch being trained (0-based)",
    "target_sync_share_ratio": "the exposed-sync share the policy raises K to stay under "
    "(--target-sync-share; exposed-sync and composite only)",
    "start_time_seconds": "unix time the exporter started serving: the run's start",
}
# Gauges of what the last boundary moved: with --fragments each is the fragment's slice, so they
# carry a `fragment` label ("0".."F-1", "whole" for the whole model), one series per fragment,
# each its own last value; a fragment's drift is never compared with another's on one line.
PER_FRAGMENT = ("drift_norm", "drift_ratio", "update_norm")
# The policies that steer K by --target-sync-share: those that read it (each policy declares its
# reads, controllers/__init__.py); only they get autok_target_sync_share_ratio, the reference
# line of the dashboard's share panel.
TARGET_SHARE_POLICIES = frozenset(n for n, p in POLICIES.items() if "target_sync_share" in p.reads)
# K-change events served at once: each its own series, so that Grafana can mark every change at
# its instant even when several fall between two scrapes (K 1 -> 32 -> 64 within one 5 s scrape).
# Older events drop out of the exposition but stay in Prometheus's storage.
CHANGES_KEPT = 32
COUNTERS = {
    "samples": "training samples processed, all ranks",
    "boundaries": "boundaries (synchronization points)",
    "grad_syncs": "gradient AllReduce events",
    "param_syncs": "parameter averaging events",
    "communicated_bytes": "payload bytes of the collectives, per rank",
}


class _Hist:
    def __init__(self) -> None:
        self.counts = [0] * (len(SECONDS_BUCKETS) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        for i, le in enumerate(SECONDS_BUCKETS):
            if v <= le:
                self.counts[i] += 1
        self.counts[-1] += 1
        self.sum += v
        self.n += 1

    def buckets(self) -> list[tuple[str, int]]:
        edges = [repr(le) for le in SECONDS_BUCKETS] + ["+Inf"]
        return list(zip(edges, self.counts, strict=True))


def served_ports(cfg: TrainConfig) -> dict[int, int]:
    """{rank: port} of the metrics servers this process's launch starts: rank 0's, or with
    --metrics-per-rank every rank's (PORT + rank); under torchrun only this process's rank."""
    if cfg.metrics_port == 0:
        return {}
    from autok.procs import under_torchrun

    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        ranks = [rank] if rank == 0 or cfg.metrics_per_rank else []
    else:
        world = cfg.workers
        ranks = list(range(world)) if cfg.metrics_per_rank else [0]
    if cfg.metrics_per_rank and cfg.metrics_port + world - 1 > 65535:
        raise ConfigError(
            f"--metrics-port: {cfg.metrics_port} + rank {world - 1} = "
            f"{cfg.metrics_port + world - 1} is above 65535 (with --metrics-per-rank rank r "
            f"serves on PORT + r); use at most {65536 - world}"
        )
    return {r: cfg.metrics_port + r for r in ranks}


def check_metrics_ports(cfg: TrainConfig) -> None:
    """Before anything is written: every port the launch will serve metrics on is in range and
    free on --metrics-host, else one ConfigError naming --metrics-port."""
    addr, _ = bind_family(cfg.metrics_host)
    for rank, port in served_ports(cfg).items():
        if why := port_taken(cfg.metrics_host, port):
            which = f"{port}" if rank == 0 else f"{port} (PORT + rank {rank})"
            raise ConfigError(
                f"--metrics-port: {which} cannot be served on {addr}: {why}; choose another "
                "port, or 0 to turn metrics off"
            )


def reason_kind(reason: str) -> str:
    """The low-cardinality part of a decision's reason: 'raise', 'back_off', 'qsr', ..."""
    head = reason.split(":", 1)[0].strip().lower()
    return re.sub(r"[^a-z0-9]+", "_", head).strip("_") or "other"


class MetricsExporter:
    def __init__(
        self,
        port: int,
        *,
        run_id: str,
        strategy: str,
        policy: str,
        link: LinkProfile | None = None,
        rank: int = 0,
        cluster: bool = True,
        per_rank: bool = False,
        host: str = "127.0.0.1",
        target_sync_share: float | None = None,
    ) -> None:
        """`target_sync_share` is the run's --target-sync-share: served as
        autok_target_sync_share_ratio when the policy steers by it (TARGET_SHARE_POLICIES)."""
        self.labels = {"run_id": run_id, "strategy": strategy, "policy": policy}
        self.link, self.rank = link, rank
        self.cluster, self.per_rank = cluster, per_rank
        self._lock = threading.RLock()
        self._version = 0
        self._cache: tuple[int, bytes] = (-1, b"")
        self._gauges: dict[str, float] = {}
        self._per_fragment: dict[str, dict[str, float]] = {}  # PER_FRAGMENT: {fragment: value}
        self._metric_name = "accuracy"  # the task's, labelled on autok_test_metric
        self._counters = {name: 0.0 for name in COUNTERS}
        self._k_changes: dict[str, int] = {}
        # (change number, old K, new K, reason kind, unix time) of the last CHANGES_KEPT changes
        self._change_events: deque[tuple[int, int, int, str, float]] = deque(maxlen=CHANGES_KEPT)
        self._n_changes = 0
        self._warmup_end: tuple[float, int] | None = None  # (time, K) of the last warmup boundary
        self._gauges["start_time_seconds"] = time.time()
        if target_sync_share is not None and policy in TARGET_SHARE_POLICIES:
            self._gauges["target_sync_share_ratio"] = float(target_sync_share)
        self._exposed, self._compute = _Hist(), _Hist()
        self._rank_compute = self._rank_wait = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server: MetricsHTTPServer | None = MetricsHTTPServer(
            host, port, self.render, CONTENT_TYPE
        )
        self.host, self.port = self._server.host, self._server.port

    # ----- trainer events ----------------------------------------------------------------------

    def on_boundary(self, stats: BoundaryStats, decision: SyncDecision) -> None:
        now = time.time()
        with self._lock:
            g = self._gauges
            g["sync_period"] = stats.sync_period
            g["next_sync_period"] = decision.next_sync_period
            g["learning_rate"] = stats.lr
            g["sync_share_ratio"] = stats.sync_share
            g["train_loss"] = stats.train_loss
            moved = "whole" if stats.fragment < 0 else str(stats.fragment)
            for name in PER_FRAGMENT:
                self._per_fragment.setdefault(name, {})[moved] = getattr(stats, name)
            g["epoch"] = stats.epoch
            if self.link is not None and stats.link in PROFILES and stats.link != self.link.name:
                self.link = PROFILES[stats.link]  # a --link-schedule moved on: label the new one
            self._exposed.observe(stats.exposed_sync_seconds)
            self._compute.observe(stats.compute_seconds)
            c = self._counters
            c["boundaries"] += 1
            c["samples"] += stats.samples
            c["grad_syncs"] += stats.grad_syncs
            c["param_syncs"] += stats.param_syncs
            c["communicated_bytes"] += stats.bytes_communicated
            if stats.warmup:
                self._warmup_end = (now, stats.sync_period)
            elif self._warmup_end is not None:  # the first interval after warmup: K left 1
                when, warm_k = self._warmup_end
                self._warmup_end = None
                if stats.sync_period != warm_k:
                    self._k_event(warm_k, stats.sync_period, "warmup_end", when)
            if decision.next_sync_period != stats.sync_period and not stats.warmup:
                kind = reason_kind(decision.reason)
                self._k_changes[kind] = self._k_changes.get(kind, 0) + 1
                self._k_event(stats.sync_period, decision.next_sync_period, kind, now)
            self._version += 1

    def _k_event(self, old: int, new: int, kind: str, when: float) -> None:
        self._n_changes += 1
        self._change_events.append((self._n_changes, old, new, kind, when))

    def on_epoch(self, row: dict[str, Any]) -> None:
        with self._lock:
            if "test_accuracy" in row:
                self._gauges["test_accuracy_ratio"] = row["test_accuracy"]
            self._gauges["test_metric"] = row["test_metric"]
            self._metric_name = str(row.get("metric_name", "accuracy"))
            self._version += 1

    def on_local_interval(self, compute_seconds: float, wait_seconds: float) -> None:
        """This rank's own, unreduced times: spots stragglers."""
        with self._lock:
            self._rank_compute += compute_seconds
            self._rank_wait += wait_seconds
            self._version += 1

    def close(self) -> None:
        """Called by the worker once the summary is written (the server stays up until then)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    # ----- exposition --------------------------------------------------------------------------

    def render(self) -> bytes:
        with self._lock:
            if self._cache[0] != self._version:
                self._cache = (self._version, generate_latest(self.registry))
            return self._cache[1]

    def collect(self):
        names, values = list(self.labels), list(self.labels.values())
        with self._lock:
            if self.cluster:
                for name, doc in GAUGES.items():
                    if name in PER_FRAGMENT and name in self._per_fragment:
                        g = GaugeMetricFamily(f"autok_{name}", doc, labels=[*names, "fragment"])
                        for moved, v in sorted(self._per_fragment[name].items()):
                            g.add_metric([*values, moved], v)
                        yield g
                    elif name in self._gauges:
                        extra = {"metric": self._metric_name} if name == "test_metric" else {}
                        g = GaugeMetricFamily(f"autok_{name}", doc, labels=[*names, *extra])
                        g.add_metric([*values, *extra.values()], self._gauges[name])
                        yield g
                for name, doc in COUNTERS.items():
                    m = CounterMetricFamily(f"autok_{name}", doc, labels=names)
                    m.add_metric(values, self._counters[name])
                    yield m
                m = CounterMetricFamily(
                    "autok_sync_period_changes",
                    "changes of K by the controller, by reason",
                    labels=[*names, "reason"],
                )
                for kind, n in sorted(self._k_changes.items()):
                    m.add_metric([*values, kind], n)
                yield m
                g = GaugeMetricFamily(
                    "autok_sync_period_change_timestamp_seconds",
                    "unix time of each of the last K changes (the end of warmup included), "
                    "one series per change",
                    labels=[*names, "change", "old_k", "new_k", "reason"],
                )
                for n, old, new, kind, when in self._change_events:
                    g.add_metric([*values, str(n), str(old), str(new), kind], when)
                yield g
                for name, hist, doc in (
                    ("exposed_sync_seconds", self._exposed, "exposed sync per boundary interval"),
                    ("compute_seconds", self._compute, "compute per boundary interval"),
                ):
                    h = HistogramMetricFamily(f"autok_{name}", doc, labels=names)
                    h.add_metric(values, hist.buckets(), hist.sum)
                    yield h
                if self.link is not None:
                    info = GaugeMetricFamily(
                        "autok_link_info",
                        "the emulated link profile in force (a --link-schedule changes it)",
                        labels=[*names, "profile", "rtt_ms", "bandwidth_gbps", "jitter_ms"],
                    )
                    info.add_metric(
                        [
                            *values,
                            self.link.name,
                            f"{self.link.rtt_ms:g}",
                            f"{self.link.bandwidth_gbps:g}",
                            f"{self.link.jitter_ms:g}",
                        ],
                        1.0,
                    )
                    yield info
            if self.per_rank:
                for name, v, doc in (
                    ("rank_compute_seconds", self._rank_compute, "this rank's compute"),
                    ("rank_wait_seconds", self._rank_wait, "this rank's exposed sync waits"),
                ):
                    m = CounterMetricFamily(f"autok_{name}", doc, labels=[*names, "rank"])
                    m.add_metric([*values, str(self.rank)], v)
                    yield m
