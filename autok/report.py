"""`autok report DIR`: the study's table format over an experiment's runs.

report.md: per method (and varied setting) mean ± std over seeds of the best and final test
metric (accuracy in %, or a --task's own metric, e.g. perplexity), wall-clock and exposed sync;
Δ vs DDP (percentage points for accuracy); a Welch two-sided t-test p-value against DDP's seeds.
report.csv: one row per run. PNGs, each answering one question (the docstring of the function
that draws it says which): the quality-time frontier over the settings the grid varies, the
test metric against wall-clock per method, the K paths of the adaptive policies (when there
are any), where each method's wall-clock goes. Rows and plots follow the experiment's order
(see `row_order`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import stat
import statistics
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from autok.controllers import RAN_BEFORE, reads
from autok.trainer.engine.clock import training_seconds
from autok.trainer.engine.link import exposed_wait

# every file the report writes replaces its name whole, never through a link (docs/design.md §7)
from autok.trainer.loop.atomic_write import replacing, write_text
from autok.trainer.loop.plots import (
    MARKERS,
    family_colors,
    family_markers,
    k_axis,
    k_cmap,
    k_colorbar,
    k_norm,
    label_points,
    pyplot,
    save,
    short_lr,
    staircase,
    without_lr,
)

BASELINE = "ddp"


@dataclass
class RunResult:
    label: str
    seed: int
    dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    epochs: list[dict[str, str]]
    boundaries: list[dict[str, Any]] | None = None  # boundaries.jsonl, read by collect
    order: int | None = None  # the run's place in the experiment's grid (experiment.json)
    stage: str = "main"  # "pilot": a run on a panel's pilot seeds (autok/pilot.py)

    @property
    def method(self) -> str:
        return self.label.split(" ", 1)[0]

    @property
    def variant(self) -> str:
        """The varied settings, e.g. 'lr=0.4' ('' when nothing varies)."""
        return self.label.split(" ", 1)[1] if " " in self.label else ""


class ReportError(ValueError):
    """A run's file that the report cannot read: names the file and the field."""


SUMMARY_NUMBERS = ("wall_seconds", "compute_seconds", "exposed_sync_seconds")
# null in summary.json where a run has no value (docs/design.md §7); read as NaN, as written once
METRIC_KEYS = ("peak_test_metric", "final_test_metric", "peak_test_accuracy", "final_test_accuracy")
EPOCH_NUMBERS = ("epoch_seconds",)
EPOCH_COUNTS = ("epoch", "grad_syncs", "param_syncs")
BOUNDARY_NUMBERS = ("exposed_sync_seconds", "compute_seconds")
BOUNDARY_COUNTS = ("epoch", "global_step", "sync_period")


def _is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_seconds(v: Any) -> bool:
    """A duration: finite and not negative (an infinite one cannot be drawn or rounded)."""
    return _is_number(v) and math.isfinite(v) and v >= 0


def _is_fraction_or_nan(v: Any) -> bool:
    """An accuracy: in [0, 1], or NaN (a run that never evaluated)."""
    return _is_number(v) and (math.isnan(v) or 0 <= v <= 1)


def _is_count(v: Any) -> TypeGuard[int]:
    return type(v) is int and v >= 0


def _brief(exc: Exception) -> str:
    return " ".join(str(exc).split())[:80]


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ReportError(f"{path}: missing")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: malformed JSON or UTF-8
        raise ReportError(f"{path}: not readable JSON ({_brief(exc)})") from None
    except RecursionError:  # arrays or objects nested deeper than the parser recurses
        raise ReportError(f"{path}: not readable JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise ReportError(f"{path}: not a JSON object")
    return obj


def _need(path: Path | str, obj: dict[str, Any], key: str, ok, what: str) -> None:
    if key not in obj:
        raise ReportError(f"{path}: {key}: missing")
    if not ok(obj[key]):
        raise ReportError(f"{path}: {key}: {_show(obj[key])} is not {what}")


def read_meta(path: Path) -> dict[str, Any]:
    meta = read_json_object(path)
    # printable: a label is a table row and a plot's text (a newline would break both)
    is_label = lambda v: isinstance(v, str) and v.strip() and v.isprintable()  # noqa: E731
    _need(path, meta, "label", is_label, "a label of printable characters")
    _need(path, meta, "seed", lambda v: type(v) is int, "an integer")
    if "order" in meta:
        _need(path, meta, "order", _is_count, "a count")
    if "stage" in meta:
        _need(path, meta, "stage", lambda v: v in ("pilot", "main"), "pilot or main")
    return meta


@dataclass(frozen=True)
class Quality:
    """What the runs are judged by: accuracy (shown in %), or a task's own metric."""

    name: str = "accuracy"
    higher_is_better: bool = True

    @property
    def scale(self) -> float:
        return 100.0 if self.is_accuracy else 1.0

    @property
    def is_accuracy(self) -> bool:
        return self.name == "accuracy" and self.higher_is_better

    @property
    def column(self) -> str:
        return "test accuracy" if self.is_accuracy else f"test {self.name}"

    @property
    def best(self) -> str:  # the summary's peak_test_metric: the best in the metric's direction
        return "peak" if self.is_accuracy else "best"

    @property
    def unit(self) -> str:
        return " (%)" if self.is_accuracy else ""

    @property
    def delta_unit(self) -> str:
        return "pp" if self.is_accuracy else self.name

    def better(self, values: list[float]) -> float:
        if not values:
            return math.nan
        return max(values) if self.higher_is_better else min(values)


def _a_metric(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and isinstance(v.get("name"), str)
        and bool(v["name"].strip())
        and isinstance(v.get("higher_is_better"), bool)
    )


def read_summary(path: Path) -> dict[str, Any]:
    """summary.json, checked, with the test metric under one set of keys: a task's run has
    `metric`, peak_test_metric and final_test_metric (docs/design.md §7); a run written before tasks
    had only the accuracies, which are its metric."""
    summary = read_json_object(path)
    for key in METRIC_KEYS:  # summary.json is strict JSON: a metric with no value is null
        if key in summary and summary[key] is None:
            summary[key] = math.nan
    for key in SUMMARY_NUMBERS:
        _need(path, summary, key, _is_seconds, "a finite number of seconds >= 0")
    if "metric" in summary:
        _need(path, summary, "metric", _a_metric, "a {name, higher_is_better} object")
        is_accuracy = summary["metric"]["name"] == "accuracy"
        for key in ("peak_test_metric", "final_test_metric"):
            if is_accuracy:
                _need(path, summary, key, _is_fraction_or_nan, "an accuracy in [0, 1]")
            else:
                _need(path, summary, key, _is_number, "a number")
    else:
        for key in ("peak_test_accuracy", "final_test_accuracy"):
            _need(path, summary, key, _is_fraction_or_nan, "an accuracy in [0, 1]")
        summary["metric"] = {"name": "accuracy", "higher_is_better": True}
        summary["peak_test_metric"] = summary["peak_test_accuracy"]
        summary["final_test_metric"] = summary["final_test_accuracy"]
    return summary


def quality_of(runs: list[RunResult]) -> Quality:
    """The one metric every run of the experiment is judged by; runs judged by different ones
    cannot share a table."""
    kinds = {(r.summary["metric"]["name"], r.summary["metric"]["higher_is_better"]) for r in runs}
    if len(kinds) > 1:
        names = ", ".join(sorted(n for n, _ in kinds))
        raise ReportError(f"the runs are judged by different metrics ({names}); report them apart")
    name, higher = kinds.pop() if kinds else ("accuracy", True)
    return Quality(name, higher)


def epoch_metric(row: dict[str, str]) -> float:
    """An epochs.csv row's test metric: a task's test_metric, else the test accuracy."""
    return float(row["test_metric"] if "test_metric" in row else row["test_accuracy"])


def read_config(path: Path) -> dict[str, Any]:
    config = read_json_object(path)
    for key in ("warmup_epochs", "sync_period"):
        if config.get(key) is not None and not _is_count(config[key]):
            raise ReportError(f"{path}: {key}: {_show(config[key])} is not a count")
    if not isinstance(config.get("policy", "fixed"), str):
        raise ReportError(f"{path}: policy: {_show(config['policy'])} is not a name")
    return config


def read_epochs(
    path: Path, numbers=EPOCH_NUMBERS, counts=EPOCH_COUNTS, torn_ok: bool = False
) -> list[dict[str, str]]:
    """epochs.csv's rows (strings, as csv reads them), each field the report uses checked.
    `torn_ok`: a run that crashed may have cut its last row short; that row is dropped."""
    if not path.is_file():
        raise ReportError(f"{path}: missing")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (OSError, ValueError, csv.Error) as exc:  # ValueError: malformed UTF-8
        raise ReportError(f"{path}: not readable CSV ({_brief(exc)})") from None
    if torn_ok and not columns:  # killed before its header reached the disk: no epoch yet
        return []
    # The test metric's column: a task's test_metric, or a classification's test_accuracy.
    numbers = (*numbers, "test_metric" if "test_metric" in columns else "test_accuracy")
    for key in (*counts, *numbers):
        if key not in columns:
            raise ReportError(f"{path}: {key}: no such column")
    for i, row in enumerate(rows, 2):
        for key in (*counts, *numbers):
            value = row.get(key)
            try:
                ok = value is not None and (
                    int(value) >= 0 if key in counts else math.isfinite(float(value))
                )
            except ValueError:
                ok = False
            if not ok and torn_ok and i == len(rows) + 1:
                return rows[:-1]
            if not ok:
                kind = "a count" if key in counts else "a finite number"
                raise ReportError(f"{path}: line {i}: {key}: {_show(value)} is not {kind}")
    return rows


def read_boundaries(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ReportError(f"{path}: missing")
    recs = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: not readable ({_brief(exc)})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply
            rec = None
        if not isinstance(rec, dict):
            raise ReportError(f"{path}: line {i}: not a JSON object")
        for key in BOUNDARY_COUNTS:
            _need(f"{path}: line {i}", rec, key, _is_count, "a count")
        for key in BOUNDARY_NUMBERS:
            _need(f"{path}: line {i}", rec, key, _is_seconds, "a finite number of seconds >= 0")
        recs.append(rec)
    return recs


def boundary_records(r: RunResult) -> list[dict[str, Any]]:
    if r.boundaries is None:
        r.boundaries = read_boundaries(r.dir / "boundaries.jsonl")
    return r.boundaries


def collect(root: Path) -> list[RunResult]:
    """The finished runs under `root`, their files checked: a malformed one is a ReportError
    naming the file and the field (never a crash half-way through the plots)."""
    return [
        read_run(tag.parent)
        for tag in sorted(root.rglob("experiment.json"))
        if (tag.parent / "summary.json").exists()  # else unfinished
    ]


def read_run(d: Path) -> RunResult:
    """One finished run of an experiment, its files checked."""
    meta = read_meta(d / "experiment.json")
    run = RunResult(
        meta["label"],
        meta["seed"],
        d,
        read_config(d / "config.json"),
        read_summary(d / "summary.json"),
        read_epochs(d / "epochs.csv"),
        order=meta.get("order"),
        stage=meta.get("stage", "main"),
    )
    run.boundaries = read_boundaries(d / "boundaries.jsonl")
    return run


@dataclass
class StoppedRun:
    """A run of the grid that did not finish: the divergence guard stopped it, it crashed, or it
    is still running. Reported, never silently dropped from the tables."""

    label: str
    seed: int
    epochs_done: int
    peak: float  # best test metric over the epochs it finished (nan if none)
    why: str
    stage: str = "main"  # a panel's: "pilot" or "main" (experiment.json)
    # the rows of the epochs it finished, as read: a panel reads from them whether it crossed
    # its target before it stopped (autok/panel.py, stopped_outcome)
    epochs: tuple[dict[str, str], ...] = ()


LOG_TAIL_BYTES = 64 * 1024  # a log grows without bound; why a run stopped is at its end


def read_log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of a log, from its first whole line; '' when it is no regular
    file. A FIFO would block the report until a writer came, and a device may never end: both
    are checked before the open (lstat: a link is not followed) and again on what was opened
    (O_NONBLOCK: opening a FIFO does not wait), docs/design.md §7, Report."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return ""
        fd = os.open(path, flags)
    except OSError:  # missing, a link (ELOOP), unreadable
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for another kind since the lstat
            return ""
        start = max(0, st.st_size - limit)
        data = os.pread(fd, limit, start)
    except OSError:
        return ""
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    return text.partition("\n")[2] if start > 0 else text  # the first line was cut


def collect_stopped(root: Path, quality: Quality = Quality()) -> list[StoppedRun]:
    out = []
    for tag in sorted(root.rglob("experiment.json")):
        d = tag.parent
        if (d / "summary.json").exists():
            continue
        meta = read_meta(tag)
        epochs = []
        if (d / "epochs.csv").exists():
            epochs = read_epochs(d / "epochs.csv", numbers=(), counts=(), torn_ok=True)
        why = "no summary (running, or killed)"
        # console.log: what an experiment's run printed, errors too
        log = next((t for n in ("console.log", "train.log") if (t := read_log_tail(d / n))), "")
        if log:
            lines = [x for x in log.splitlines() if x.startswith("autok:")]
            if lines:
                # "autok: training failed: pkg.Error: what; advice" -> "what"
                why = lines[-1].removeprefix("autok: ").removeprefix("training failed: ")
                why = re.sub(r"^[\w.]+(Error|Exception|Diverged): ", "", why).split("; ")[0]
        values = [epoch_metric(e) for e in epochs]
        best = quality.better(values)
        stage = meta.get("stage", "main")
        out.append(
            StoppedRun(meta["label"], meta["seed"], len(epochs), best, why, stage, tuple(epochs))
        )
    return out


def render_stopped(stopped: list[StoppedRun], quality: Quality = Quality()) -> str:
    if not stopped:
        return ""
    q = quality
    lines = [
        "## Runs that did not finish",
        "",
        f"Not in the tables above (their final {q.name} does not exist); {q.best} {q.name} is "
        "the best over the epochs they finished.",
        "",
        f"| method | seed | epochs finished | {q.best} {q.name} before the stop{q.unit} | why |",
        "|---|---|---|---|---|",
    ]
    for r in stopped:
        why = r.why.replace("|", "\\|")
        best = f"{q.scale * r.peak:.{_digits(q)}f}"
        lines.append(f"| {r.label} | {r.seed} | {r.epochs_done} | {best} | {why} |")
    return "\n".join(lines) + "\n"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for a single value)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided Welch t-test p-value (nan when either side has fewer than 2 values)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    import warnings

    from scipy import stats

    with warnings.catch_warnings():
        # Collapsed runs can share one accuracy (chance): scipy warns, and its p is still right.
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


@dataclass
class Row:
    label: str
    n: int
    peak: tuple[float, float]
    final: tuple[float, float]
    wall: tuple[float, float]
    exposed: tuple[float, float]
    delta: float  # mean best metric minus DDP's (percentage points for accuracy)
    p_value: float
    peaks: list[float]
    speedup: float = math.nan  # DDP's mean wall-clock / this row's


def resolvable(values: list[float], n: int) -> float:
    """The smallest difference of means a Welch test at p < 0.05 resolves between two methods
    with this spread and n seeds each: t(0.975, 2n − 2) · s · sqrt(2/n)."""
    if n < 2 or len(values) < 2:
        return math.nan
    from scipy import stats

    return float(stats.t.ppf(0.975, 2 * n - 2) * statistics.stdev(values) * math.sqrt(2 / n))


def render_resolution(rows: list[Row], quality: Quality = Quality()) -> str:
    """What the seeds can tell apart: per DDP row (or, with none, the best row), the
    difference its spread resolves."""
    q, d = quality, _digits(quality)
    base = [r for r in rows if r.label.split(" ", 1)[0] == BASELINE]
    what = "DDP"
    if not base:
        if not rows:
            return ""
        # No DDP row (a grid over one method's settings): its best row is the reference (the
        # steadiest would often be a setting that broke down and sits at chance).
        seeded = [r for r in rows if r.n >= 2 and math.isfinite(r.peak[0])]
        sign = 1.0 if q.higher_is_better else -1.0
        base = [max(seeded, key=lambda r: sign * r.peak[0])] if seeded else rows[:1]
        what = f"its best row ({base[0].label})"
    if all(r.n < 2 for r in base):
        return (
            "One seed per row: no difference in this table is resolved by a test; read "
            "differences of a few points as noise.\n"
        )
    parts = []
    for r in base:
        if r.n >= 2:
            res = q.scale * resolvable(r.peaks, r.n)
            parts.append(f"{r.label}: {res:.{d}f} {q.delta_unit} (std {q.scale * r.peak[1]:.{d}f})")
    return (
        f"Resolution: between two methods as steady as {what}, {max(r.n for r in base)} seeds "
        f"each, a Welch test at p < 0.05 resolves differences of mean {q.best} {q.name} of about "
        + "; ".join(parts)
        + ". Smaller ones are noise here, and a method with a wider spread (its row's std) "
        "needs a larger one.\n"
    )


def label_key(label: str) -> list[tuple[int, float | str]]:
    """Natural order: 'cpdp sync_period=2' before 'cpdp sync_period=16'."""
    return [
        (0, float(t)) if re.fullmatch(r"-?\d+(\.\d+)?", t) else (1, t)
        for t in re.split(r"[ =]", label)
    ]


def variant_of(label: str) -> str:
    return label.split(" ", 1)[1] if " " in label else ""


def row_order(runs: list[RunResult]) -> list[str]:
    """The labels in the experiment's order, in blocks that each open with the DDP row they are
    compared against: paper-wan's LR 0.1 rows (DDP first, then the runs as its file lists
    them), then its LR 0.4 rows; the K sweep's one DDP row, then CPDP at K = 1..64, then
    LocalSGD. The experiment's order is experiment.json's `order` (the run's place in the
    grid); runs that lack it (written before it was recorded) are in natural label order."""
    labels = {r.label for r in runs}
    if runs and all(r.order is not None for r in runs):
        first: dict[str, int] = {}
        for r in runs:
            o = int(r.order or 0)
            first[r.label] = min(first.get(r.label, o), o)
        place = {label: (first[label], label_key(label)) for label in labels}
    else:
        place = {label: (0, label_key(label)) for label in labels}

    def key(label: str):
        base = baseline_label(labels, variant_of(label))
        block = place[base] if base is not None else place[label]
        return (block, label != base, place[label])

    return sorted(labels, key=key)


def group(runs: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs by label, in the report's row order (row_order), each label's runs by seed."""
    groups: dict[str, list[RunResult]] = {label: [] for label in row_order(runs)}
    for r in sorted(runs, key=lambda r: r.seed):
        groups[r.label].append(r)
    return groups


def baseline_label(groups: Collection[str], variant: str) -> str | None:
    """DDP at the same varied settings, else the one DDP run of the grid (DDP has no K to vary:
    in the K sweep it is a single row)."""
    for cand in (f"{BASELINE} {variant}".strip(), BASELINE):
        if cand in groups:
            return cand
    return None


def table_rows(runs: list[RunResult]) -> list[Row]:
    groups = group(runs)
    scale = quality_of(runs).scale
    rows = []
    for label, rs in groups.items():
        peaks = [r.summary["peak_test_metric"] for r in rs]
        walls = [training_seconds(r.summary) for r in rs]  # (virtual: modelled, docs/design.md §4)
        base_label = baseline_label(groups, rs[0].variant)
        base_runs = groups.get(base_label, []) if base_label not in (None, label) else []
        base = [r.summary["peak_test_metric"] for r in base_runs]
        delta = scale * (statistics.fmean(peaks) - statistics.fmean(base)) if base else math.nan
        speedup = (
            statistics.fmean(training_seconds(r.summary) for r in base_runs)
            / statistics.fmean(walls)
            if base_runs
            else math.nan
        )
        rows.append(
            Row(
                label=label,
                n=len(rs),
                peak=mean_std(peaks),
                final=mean_std([r.summary["final_test_metric"] for r in rs]),
                wall=mean_std(walls),
                exposed=mean_std([r.summary["exposed_sync_seconds"] for r in rs]),
                delta=delta,
                p_value=welch_p(peaks, base) if base else math.nan,
                peaks=peaks,
                speedup=speedup,
            )
        )
    return rows


@dataclass
class SyncProfile:
    """Table 8's columns, per epoch after the warmup epochs (which run at K=1), mean over seeds."""

    label: str
    boundaries: float  # synchronization points per epoch
    events: float  # logical syncs: gradient syncs + parameter syncs per epoch
    collectives: float  # what crossed the network per epoch (a fused boundary: 1 for 2 syncs)
    per_boundary_ms: float  # exposed sync per synchronization point
    exposed: float  # exposed sync, seconds per epoch
    compute: float  # compute, seconds per epoch: the floor with a free network


def _run_profile(r: RunResult) -> tuple[float, float, float, float, float, float]:
    warmup = int(r.config.get("warmup_epochs") or 0)
    recs = boundary_records(r)
    steady = [b for b in recs if b["epoch"] >= warmup] or recs
    if not steady:  # a run with no boundary at all: nothing to profile
        return (math.nan,) * 6
    epochs = {b["epoch"] for b in steady}
    rows = [e for e in r.epochs if int(e["epoch"]) in epochs]
    n = len(epochs)
    exposed = sum(b["exposed_sync_seconds"] for b in steady)
    events = sum(int(e["grad_syncs"]) + int(e["param_syncs"]) for e in rows)
    # runs written before the column existed have no count of collectives
    counted = bool(rows) and "collectives" in rows[0]
    collectives = sum(int(e["collectives"]) for e in rows) if counted else math.nan
    return (
        len(steady) / n,
        events / n,
        collectives / n,
        1000 * exposed / len(steady),
        exposed / n,
        sum(b["compute_seconds"] for b in steady) / n,
    )


def sync_profile(runs: list[RunResult]) -> list[SyncProfile]:
    out = []
    for label, rs in group(runs).items():
        cols = list(zip(*(_run_profile(r) for r in rs), strict=True))
        out.append(SyncProfile(label, *(statistics.fmean(c) for c in cols)))
    return out


def render_profile(profiles: list[SyncProfile]) -> str:
    lines = [
        "## Synchronization profile",
        "",
        "Per epoch after the warmup epochs, mean over seeds: synchronization points (boundaries),"
        " logical syncs (gradient syncs + parameter syncs) and collectives (what crossed the "
        "network: a fused cpdp boundary carries both syncs in one), exposed sync per point, "
        "exposed sync and compute per epoch (compute is the floor a free network would leave).",
        "",
        "| method | boundaries/epoch | syncs/epoch (grad + param) | collectives/epoch | "
        "exposed per boundary (ms) | exposed sync/epoch (s) | compute/epoch (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in profiles:
        coll = "—" if math.isnan(p.collectives) else f"{p.collectives:.1f}"
        lines.append(
            f"| {p.label} | {p.boundaries:.1f} | {p.events:.1f} | {coll} | "
            f"{p.per_boundary_ms:.1f} | {p.exposed:.2f} | {p.compute:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _pm(ms: tuple[float, float], scale: float = 1.0, digits: int = 2, n: int = 2) -> str:
    """Mean ± std; a single seed's value alone (it has no spread to show: not "± 0.00")."""
    if n < 2:
        return f"{ms[0] * scale:.{digits}f}"
    return f"{ms[0] * scale:.{digits}f} ± {ms[1] * scale:.{digits}f}"


def _digits(q: Quality) -> int:
    return 2 if q.is_accuracy else 4


def exposed_waits(runs: list[RunResult]) -> str:
    """What the runs' exposed sync waited on (trainer/engine/link.py exposed_wait): the network, the
    modelled link, or peers when no link was emulated; several joined by "or"."""
    seen = {
        exposed_wait(
            str(r.summary.get("link", "?")),
            r.config.get("clock") == "virtual" or "virtual_seconds" in r.summary,
        )
        for r in runs
    }
    return " or ".join(sorted(seen)) if seen else "the network"


def render(
    rows: list[Row], title: str, quality: Quality = Quality(), waits: str | None = None
) -> str:
    q = quality
    direction = (
        "" if q.is_accuracy else f" ({'higher' if q.higher_is_better else 'lower'} is better)"
    )
    lines = [
        f"# {title}",
        "",
        "Mean ± standard deviation over seeds (n; where n = 1, the one run's value), judged by "
        f"test {q.name}{direction}. Δ vs "
        f"DDP: difference of mean {q.best} {q.name} ({q.delta_unit}), with the two-sided Welch "
        "t-test p-value against DDP's seeds; speedup: DDP's mean wall-clock over the row's."
        + (f" Exposed sync: time waiting on {waits}." if waits else ""),
        "",
        f"| method | n | {q.best} {q.name}{q.unit} | final {q.name}{q.unit} | wall (s) | "
        f"exposed sync (s) | Δ vs DDP ({q.delta_unit}) | p (Welch) | speedup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    d = _digits(q)
    for r in rows:
        delta = "—" if math.isnan(r.delta) else f"{r.delta:+.{d}f}"
        p = "—" if math.isnan(r.p_value) else f"{r.p_value:.3g}"
        speedup = "—" if math.isnan(r.speedup) else f"{r.speedup:.2f}×"
        lines.append(
            f"| {r.label} | {r.n} | {_pm(r.peak, q.scale, d, r.n)} | "
            f"{_pm(r.final, q.scale, d, r.n)} | {_pm(r.wall, digits=1, n=r.n)} | "
            f"{_pm(r.exposed, digits=1, n=r.n)} | {delta} | {p} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def relative_dir(run_dir: Path, root: Path) -> str:
    """A run's directory as the experiment directory sees it, so a CSV moves with it."""
    try:
        return str(Path(run_dir).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(run_dir)


CSV_CONFIG = (
    "strategy",
    "policy",
    "sync_period",
    "slowmo_beta",  # empty when an outer optimizer is given: the outer_* columns say what ran
    "outer_optimizer",
    "outer_lr",
    "outer_momentum",
    "compress",
    "lr",
    "workers",
)


def write_csv(runs: list[RunResult], path: Path) -> None:
    cols = [
        "label",
        "seed",
        *CSV_CONFIG,
        "peak_test_accuracy",
        "final_test_accuracy",
        "metric",
        "peak_test_metric",
        "final_test_metric",
        "wall_seconds",
        "compute_seconds",
        "exposed_sync_seconds",
        "boundaries",
        "grad_syncs",
        "param_syncs",
        "final_sync_period",
        "run_dir",
    ]
    with replacing(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in runs:
            w.writerow(
                {
                    "label": r.label,
                    "seed": r.seed,
                    "run_dir": relative_dir(r.dir, path.parent),
                    **{k: r.config.get(k) for k in CSV_CONFIG},
                    **{k: r.summary.get(k) for k in cols[2 + len(CSV_CONFIG) : -1]},
                    "metric": r.summary["metric"]["name"],
                }
            )


# ----- plots: one question each -----------------------------------------------------------------

PLOT_TITLES = {  # the alt text of each image in report.md
    "frontier": "quality-time frontier over the settings the grid varies",
    "accuracy_vs_time": "test accuracy against wall-clock",
    "metric_vs_time": "test metric against wall-clock",
    "k_paths": "K paths of the adaptive policies",
    "exposed_vs_compute": "where the wall-clock goes: compute, exposed sync, the rest",
}


def _lr_of(rs: list[RunResult]) -> float | None:
    lr = rs[0].config.get("lr")
    return float(lr) if _is_number(lr) else None


def _k_of(rs: list[RunResult]) -> int:
    """The row's K: fixed, or where an adaptive policy started (DDP: 1)."""
    k = rs[0].config.get("sync_period")
    return 1 if rs[0].config.get("strategy") == "ddp" or not _is_count(k) or k < 1 else k


def _adaptive(rs: list[RunResult]) -> bool:
    return rs[0].config.get("policy", "fixed") != "fixed"


def lr_facets(groups: dict[str, list[RunResult]]) -> list[tuple[float | None, list[str]]]:
    """The panels of the plots against time: one per LR when 2 to 4 LRs appear (the LR drives
    the result: methods are compared at equal LR), else one panel (with its LR, if one)."""
    lrs = {label: _lr_of(rs) for label, rs in groups.items()}
    distinct = sorted({v for v in lrs.values() if v is not None})
    if 2 <= len(distinct) <= 4 and None not in lrs.values():
        return [(lr, [label for label in groups if lrs[label] == lr]) for lr in distinct]
    return [(distinct[0] if len(distinct) == 1 else None, list(groups))]


def epoch_clock(r: RunResult) -> list[float]:
    """Seconds at each epoch's end on the clock of the table and the frontier (summary.json's
    wall_seconds, or virtual_seconds under --clock virtual: trainer/engine/clock.py): each epoch's
    training time (epoch_seconds) plus an equal share of the rest (evaluation, checkpoints),
    so the last epoch ends at the run's training time."""
    secs = [float(e["epoch_seconds"]) for e in r.epochs]
    if not secs:
        return []
    rest = max(0.0, training_seconds(r.summary) - sum(secs)) / len(secs)
    out, t = [], 0.0
    for s in secs:
        t += s + rest
        out.append(t)
    return out


def _usual_n(groups: dict[str, list[RunResult]]) -> int:
    """The most common number of seeds of a row: a row with another says so in its label."""
    ns = [len(rs) for rs in groups.values()]
    return max(sorted(set(ns)), key=ns.count)


def _n_note(rs: list[RunResult], usual: int) -> str:
    return "" if len(rs) == usual else f" (n = {len(rs)})"


def _seeds_note(groups: dict[str, list[RunResult]], what: str) -> str:
    ns = {len(rs) for rs in groups.values()}
    if ns == {1}:
        return "one seed per row"
    n = f"n = {_usual_n(groups)}" + ("" if len(ns) == 1 else " unless labelled")
    return f"mean over seeds ({n}), {what} ± 1 std"


# Settings that differ between runs without being what the grid compares: where a run lives
# and which seed it drew (seeds are averaged, never an axis).
# environment, policy_revision: not settings a grid varies; runs of several installations, or of
# several revisions of one policy's rule, are said apart (installations, rules)
NOT_AN_AXIS = frozenset(
    {
        "seed",
        "out",
        "data_dir",
        "resume",
        "metrics_port",
        "run_name",
        "environment",
        "policy_revision",
    }
)
AXIS_NAMES = {"sync_period": "K", "strategy": "method", "lr": "LR"}


def varied_settings(runs: list[RunResult]) -> list[str]:
    """The config.json settings whose values differ across `runs`, in config order: the axes
    the grid varies (a β grid varies the outer momentum, not K), so a plot names what it
    compares instead of assuming K."""
    keys = list(dict.fromkeys(k for r in runs for k in r.config))
    return [
        k
        for k in keys
        if k not in NOT_AN_AXIS
        and not k.endswith(("_dir", "_path"))
        and len({json.dumps(_as_read(k, r.config), sort_keys=True, default=str) for r in runs}) > 1
    ]


def _as_read(key: str, config: dict) -> object:
    """A setting as the run used it. An option whose default moved (RAN_BEFORE) reads, where the
    run's policy does not read it or its config.json predates it, as what such a run ran with: no
    K floor is 1 and no faster-link check 0, so fixed K beside exposed-sync on SGD varies the
    policy, and runs made before and after the move vary only where the policy read it."""
    value = config.get(key)
    if key in RAN_BEFORE and (value is None or not reads(config.get("policy"), key)):
        return RAN_BEFORE[key]
    return value


def axis_title(varied: list[str]) -> str:
    """How a title names the varied settings: "K", "method, outer_momentum", ..."""
    return ", ".join(AXIS_NAMES.get(k, k) for k in varied) if varied else "the methods"


def plots(runs: list[RunResult], out: Path, stopped: Collection[StoppedRun] = ()) -> list[Path]:
    """The report's PNGs (written into `out`), in the experiment's row order; k_paths.png only
    when an adaptive policy ran (otherwise there is nothing to show). `stopped`: the grid's
    runs that did not finish, which the frontier lists rather than drops."""
    groups = group(runs)
    rows = table_rows(runs)
    q = quality_of(runs)
    made = [_frontier(groups, rows, q, out / "frontier.png", stopped)]
    name = "accuracy_vs_time" if q.is_accuracy else "metric_vs_time"
    made.append(_metric_vs_time(groups, q, out / f"{name}.png"))
    k_paths = _k_paths(groups, out / "k_paths.png")
    if k_paths is not None:
        made.append(k_paths)
    made.append(_time_split(groups, rows, out / "exposed_vs_compute.png"))
    return made


def _frontier(
    groups: dict[str, list[RunResult]],
    rows: list[Row],
    q: Quality,
    out: Path,
    stopped: Collection[StoppedRun] = (),
) -> Path:
    """frontier.png. The question: which settings buy wall-clock without losing quality, and
    what is the best quality reachable within a time budget? Each row of the table is one point
    (its number is its row in report.md): mean best metric against mean wall-clock, bars ± 1
    std over its seeds; colour: K on a log2 scale (an adaptive policy's starting K, black edge)
    when K varies, else the numeric setting the grid varies; marker: the LR when it varies.
    The staircase is the Pareto front: the best quality any row reaches within the time on the
    x axis. Runs that did not finish (diverged, failed) have no wall-clock to place: a note
    lists them, so a grid's missing points are never silent."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D

    from autok.pareto import pareto_front

    plt = pyplot()
    labels = [row.label for row in rows]
    ks = {label: _k_of(groups[label]) for label in labels}
    lrs = {label: _lr_of(groups[label]) for label in labels}
    distinct_lr = sorted({v for v in lrs.values() if v is not None})
    lr_marker = {lr: MARKERS[i % len(MARKERS)] for i, lr in enumerate(distinct_lr)}
    if len(distinct_lr) < 2:  # one LR: the marker tells the methods apart instead
        lr_marker = {}
    methods = list(dict.fromkeys(label.split(" ", 1)[0] for label in labels))
    method_marker = {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(methods)}
    norm, cmap = k_norm(list(ks.values())), k_cmap()
    all_runs = [r for label in labels for r in groups[label]]
    varied = varied_settings(all_runs)
    shade = {label: float(ks[label]) for label in labels}
    shade_name = "K (sync period)"
    if len(set(ks.values())) < 2:  # K fixed across the grid: colour by what does vary
        numeric = [
            k
            for k in varied
            if k != "lr" and all(_is_number(groups[lb][0].config.get(k)) for lb in labels)
        ]
        if numeric:
            shade_name = numeric[0]
            shade = {lb: float(groups[lb][0].config[shade_name]) for lb in labels}
            lo, hi = min(shade.values()), max(shade.values())
            norm, cmap = Normalize(lo, hi if hi > lo else lo + 1), pyplot().get_cmap("viridis")
    xy = [(row.wall[0], q.scale * row.peak[0]) for row in rows]
    usual = _usual_n(groups)
    fig, ax = plt.subplots(figsize=(10, 5.4), layout="constrained")
    for row, (x, y) in zip(rows, xy, strict=True):
        if row.n > 1:
            ax.errorbar(
                x, y, xerr=row.wall[1], yerr=q.scale * row.peak[1], fmt="none", ecolor="0.7",
                elinewidth=0.8, zorder=1,
            )  # fmt: skip
    front = pareto_front([(y if q.higher_is_better else -y, x) for x, y in xy])
    right = max(x for x, _ in xy) * 1.04
    fx, fy = staircase([xy[i] for i in front], right)
    (stairs,) = ax.plot(fx, fy, color="crimson", lw=1.2, zorder=2)
    handles = []
    for i, (label, (x, y)) in enumerate(zip(labels, xy, strict=True)):
        lr = lrs[label]  # a run without a numeric LR takes its method's marker
        style = {
            "marker": lr_marker[lr]
            if lr_marker and lr is not None
            else method_marker[label.split()[0]],
            "color": cmap(norm(shade[label])),
            "markeredgecolor": "black" if _adaptive(groups[label]) else "white",
            "markeredgewidth": 1.4 if _adaptive(groups[label]) else 0.6,
            "markersize": 8,
            "linestyle": "none",
        }
        ax.plot([x], [y], zorder=3, **style)
        note = _n_note(groups[label], usual)
        handles.append(Line2D([], [], label=f"{i + 1}  {label}{note}", **style))
    handles.append(
        Line2D(
            [], [], color="crimson", lw=1.2, label=f"Pareto front: best {q.name} in a time budget"
        )
    )
    if any(_adaptive(groups[label]) for label in labels):
        handles.append(
            Line2D([], [], ls="none", marker="o", color="0.85", markeredgecolor="black",
                   markeredgewidth=1.4, label="adaptive K (colour: starting K)")
        )  # fmt: skip
    for lr, m in lr_marker.items():
        handles.append(Line2D([], [], ls="none", marker=m, color="0.5", label=f"LR {short_lr(lr)}"))
    fig.legend(
        handles=handles, loc="outside right upper", title=_seeds_note(groups, "\nbars"),
        alignment="left",
    )  # fmt: skip
    if shade_name == "K (sync period)":
        k_colorbar(fig, ScalarMappable(norm=norm, cmap=cmap), ax, list(ks.values()))
    else:
        fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=shade_name, pad=0.02)
    if stopped:
        listed = [f"{s.label} seed {s.seed}: {s.why}"[:70] for s in stopped]
        more = f"\n… and {len(listed) - 6} more" if len(listed) > 6 else ""
        ax.text(
            0.01, 0.01, "did not finish (not plotted):\n" + "\n".join(listed[:6]) + more,
            transform=ax.transAxes, fontsize=8, va="bottom", ha="left", color="tab:red",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "tab:red", "lw": 0.6},
        )  # fmt: skip
    direction = "" if q.higher_is_better else " (lower is better)"
    ax.set(
        xlabel="wall-clock (s), as in the table",
        ylabel=f"{q.best} {q.column}{q.unit}{direction}",
        title=f"{q.name}-time frontier over {axis_title(varied)}: what does each setting buy?",
    )
    ax.grid(alpha=0.3)
    # last: it needs the final layout
    label_points(ax, xy, [str(i + 1) for i in range(len(xy))], lines=[(fx, fy)])
    return save(fig, out)


def _facet_axes(plt, n: int, height: float, legend_width: float = 2.6):
    fig, axes = plt.subplots(
        1, n, figsize=(max(6.4, min(4.4 * n, 11)) + legend_width, height), sharey=True, sharex=True,
        squeeze=False, layout="constrained",
    )  # fmt: skip
    return fig, list(axes[0])


def _keys(facets: list[tuple[float | None, list[str]]]) -> dict[str, str]:
    """Each row's legend entry: its label, less `lr=...` when the panels already say the LR."""
    faceted = len(facets) > 1
    return {label: without_lr(label) if faceted else label for _, ls in facets for label in ls}


def _metric_vs_time(groups: dict[str, list[RunResult]], q: Quality, out: Path) -> Path:
    """accuracy_vs_time.png (metric_vs_time.png for a task's own metric). The question: how
    soon, in wall-clock, does each method reach a given quality, at each LR? One line per row
    (mean over its seeds, shaded ± 1 std; a marker at each epoch's end) against the clock of the
    table and the frontier (epoch_clock); one panel per LR when the LR varies."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    facets = lr_facets(groups)
    keys = _keys(facets)
    order = list(dict.fromkeys(keys.values()))
    colors, markers = family_colors(order), family_markers(order)
    fig, axes = _facet_axes(plt, len(facets), 4.8)
    for ax, (lr, labels) in zip(axes, facets, strict=True):
        for label in labels:
            rs = groups[label]
            clocks = [epoch_clock(r) for r in rs]
            values = [[q.scale * epoch_metric(e) for e in r.epochs] for r in rs]
            n = min(len(c) for c in clocks)
            if n == 0:
                continue
            t = [statistics.fmean(c[i] for c in clocks) for i in range(n)]
            m = [statistics.fmean(v[i] for v in values) for i in range(n)]
            color = colors[keys[label]]
            ax.plot(t, m, color=color, marker=markers[keys[label]], ms=4, lw=1.4)
            if len(rs) > 1:
                s = [statistics.stdev(v[i] for v in values) for i in range(n)]
                lo = [a - b for a, b in zip(m, s, strict=True)]
                hi = [a + b for a, b in zip(m, s, strict=True)]
                ax.fill_between(t, lo, hi, color=color, alpha=0.12, lw=0)
        ax.set_title(f"LR {short_lr(lr)}" if lr is not None else "")
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
    direction = "" if q.higher_is_better else " (lower is better)"
    axes[0].set_ylabel(f"{q.column}{q.unit}{direction}")
    fig.supxlabel(
        "wall-clock (s), as in the table and the frontier: an epoch ends after its training "
        "time plus an equal share of evaluation",
        fontsize=9,
    )
    handles = [
        Line2D([], [], color=colors[key], marker=markers[key], ms=4, lw=1.4, label=key)
        for key in order
    ]
    fig.legend(
        handles=handles, loc="outside right center", title=_seeds_note(groups, "\nband"),
        alignment="left",
    )  # fmt: skip
    fig.suptitle(f"{q.column} against wall-clock: how soon does each method get there?")
    return save(fig, out)


def _lr_schedule(r: RunResult) -> tuple[list[int], list[float]] | None:
    """The run's LR at every optimizer step, from its config (the schedule is deterministic:
    trainer/engine/optim.py's lr_factor) and its steps per epoch (every epoch ends with a boundary);
    None when the config does not say."""
    from autok.trainer.engine.optim import lr_factor

    c, recs = r.config, boundary_records(r)
    epochs, lr = c.get("epochs"), c.get("lr")
    warm = c.get("lr_warmup_epochs", c.get("warmup_epochs"))
    schedule = c.get("lr_schedule")
    first = [b["global_step"] for b in recs if b["epoch"] == 0]
    if not (_is_count(epochs) and _is_number(lr) and _is_count(warm) and first):
        return None
    if schedule not in ("cosine", "constant"):
        return None
    per_epoch = max(first) + 1
    total = epochs * per_epoch
    steps = list(range(0, total, max(1, total // 800)))
    return steps, [lr * lr_factor(s, total, warm * per_epoch, schedule) for s in steps]


def _k_paths(groups: dict[str, list[RunResult]], out: Path) -> Path | None:
    """k_paths.png. The question: how did each adaptive policy move K during training (every
    seed, one line each), after the warmup at K = 1, and against the LR schedule it may follow
    (QSR grows K as the LR decays)? K on a log2 axis with whole-number labels; one panel per
    LR when the LR varies. None (no file) when no adaptive policy ran."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    adaptive = {label for label, rs in groups.items() if _adaptive(rs)}
    if not adaptive:
        return None
    plt = pyplot()
    facets = [(lr, [lb for lb in ls if lb in adaptive]) for lr, ls in lr_facets(groups)]
    facets = [(lr, ls) for lr, ls in facets if ls]
    keys = _keys(facets)
    order = list(dict.fromkeys(keys.values()))
    colors = family_colors(order)
    fig, axes = _facet_axes(plt, len(facets), 4.4, legend_width=3.0)
    all_ks: list[int] = []
    twins = []
    for ax, (lr, labels) in zip(axes, facets, strict=True):
        warm_end = 0
        schedule = None
        for label in labels:
            for r in groups[label]:
                recs = boundary_records(r)
                if not recs:
                    continue
                edges = [0] + [b["global_step"] + 1 for b in recs]
                ks = [b["sync_period"] for b in recs]
                all_ks += ks
                ax.stairs(ks, edges, color=colors[keys[label]], lw=1.2, baseline=None, alpha=0.85)
                warm = r.config.get("warmup_epochs") or 0
                ends = [b["global_step"] + 1 for b in recs if b["epoch"] < warm]
                warm_end = max([warm_end, *ends])
                schedule = schedule or _lr_schedule(r)
        if warm_end:
            ax.axvspan(0, warm_end, color="0.9", lw=0, zorder=0)
        if schedule is not None:
            twin = ax.twinx()
            twin.plot(*schedule, color="0.45", ls="--", lw=1)
            twins.append((ax, twin, max(schedule[1])))
        ax.set_title(f"LR {short_lr(lr)}" if lr is not None else "")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3, axis="y")
    top = max((m for _, _, m in twins), default=0.0) * 1.05 or 1.0
    for ax, twin, _ in twins:  # one LR scale for every panel, labelled once on the right
        twin.set_ylim(0, top)
        if ax is axes[-1]:
            twin.set_ylabel("learning rate (dashed)")
        else:
            twin.tick_params(right=False, labelright=False)
    for ax in axes:
        k_axis(ax, all_ks or [1])
    axes[0].set_ylabel("K in force (sync period)")

    def seeds(key: str) -> str:
        ns = sorted({len(groups[lb]) for lb in adaptive if keys[lb] == key})
        n = "/".join(map(str, ns))
        return f"{n} seed{'s' * (ns != [1])}{', one line each' * (ns != [1])}"

    handles: list[Any] = [
        Line2D([], [], color=colors[key], lw=1.4, label=f"{key} ({seeds(key)})") for key in order
    ]
    handles.append(Patch(color="0.9", label="warmup: K held at 1"))
    handles.append(Line2D([], [], color="0.45", ls="--", lw=1, label="LR schedule"))
    fig.legend(handles=handles, loc="outside right upper")
    fig.suptitle("K paths of the adaptive policies: how did each move K during training?")
    return save(fig, out)


def _time_split(groups: dict[str, list[RunResult]], rows: list[Row], out: Path) -> Path:
    """exposed_vs_compute.png. The question: where does each method's wall-clock go? Per row
    (mean over ranks and seeds): compute (forward, backward, optimizer), exposed sync (time
    spent waiting on the network, or on peers when no link was emulated) and the rest
    (evaluation, data, checkpoints), stacked so a bar is the row's wall-clock, the frontier's
    x; the share of exposed sync written beside."""
    plt = pyplot()
    labels = [row.label for row in rows]
    comp = [statistics.fmean(r.summary["compute_seconds"] for r in groups[lb]) for lb in labels]
    exposed = [row.exposed[0] for row in rows]
    wall = [row.wall[0] for row in rows]
    rest = [max(0.0, w - c - e) for w, c, e in zip(wall, comp, exposed, strict=True)]
    ys = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(9, max(2.8, 0.3 * len(rows) + 1.6)), layout="constrained")
    ax.barh(ys, comp, color="tab:blue", label="compute (forward, backward, optimizer)")
    left = list(comp)
    waits = exposed_waits([r for rs in groups.values() for r in rs])
    ax.barh(ys, exposed, left=left, color="tab:red", label=f"exposed sync (waiting on {waits})")
    left = [a + b for a, b in zip(left, exposed, strict=True)]
    ax.barh(ys, rest, left=left, color="0.8", label="the rest (evaluation, data, checkpoints)")
    spread = [row.wall[1] if row.n > 1 else 0.0 for row in rows]
    if any(spread):
        ax.errorbar(
            wall, ys, xerr=spread, fmt="none", ecolor="black", elinewidth=0.8, capsize=2,
            label="wall-clock ± 1 std over seeds",
        )  # fmt: skip
    tip = max(w + s for w, s in zip(wall, spread, strict=True)) or 1.0
    for y, w, s, e in zip(ys, wall, spread, exposed, strict=True):
        ax.text(w + s + 0.01 * tip, y, f"{e / w:.0%} sync" if w > 0 else "", va="center",
                fontsize=8)  # fmt: skip
    ax.set_yticks(ys, labels)
    names = set(labels)
    blocks = [baseline_label(names, variant_of(lb)) or lb for lb in labels]
    for y, (a, b) in enumerate(zip(blocks, blocks[1:], strict=False)):
        if a != b:  # a new block (e.g. the next LR) opens with its own DDP row
            ax.axhline(y + 0.5, color="0.3", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlim(0, tip * 1.14)
    ax.set_xlabel("seconds, mean over ranks and seeds (a whole bar: the wall-clock of the table)")
    ax.set_title("Where does each method's wall-clock go?")
    ax.grid(alpha=0.3, axis="x")
    fig.legend(loc="outside lower center", ncols=2)
    return save(fig, out)


RUN_FILES = ("summary.json", "epochs.csv", "boundaries.jsonl", "k_lr.png", "train.log")


def one_run(d: Path) -> str | None:
    """What `autok report` says of a directory that is itself one finished run (`autok train
    --out d`: summary.json, no experiment.json), None for anything else. There is nothing to
    compare, so nothing is written: the summary the run printed at its end, and one line naming
    the run's own files (docs/design.md §7) and what `autok report` is for."""
    if not (d / "summary.json").is_file() or (d / "experiment.json").exists():
        return None
    if (d / ".autok-experiment.json").exists():  # an experiment's own directory: a panel's
        return None  # summary.json is its judgement, not a run's (autok/experiment.py, STATE)
    summary = read_summary(d / "summary.json")  # malformed: a ReportError naming the field
    from autok.trainer.loop.sinks import summary_table

    try:
        table = summary_table(summary) + "\n"
    except (KeyError, TypeError, ValueError):  # a run from before a field existed
        table = ""
    files = ", ".join(n for n in RUN_FILES if (d / n).is_file())
    return (
        f"{table}autok: {d} is one finished run, not an experiment: its results are {files}; "
        "`autok report` compares the runs of an `autok experiment` directory"
    )


def installations(runs: list[RunResult]) -> str | None:
    """One line where the runs record more than one installation (summary.json's
    `environment`, trainer/loop/environment.py), or some record one and some none: the same
    settings and seed give other numbers in another, so the tables compare unlike runs. None
    where they record one, or none at all (runs made before autok recorded it: nothing to tell)."""
    seen = {json.dumps(r.summary.get("environment"), sort_keys=True, default=str): r for r in runs}
    if len(seen) < 2:
        return None
    known = [e for r in seen.values() if isinstance(e := r.summary.get("environment"), dict)]
    why = "some record none"
    if len(known) > 1:
        a, b = known[0], known[1]
        name = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), "a field")
        why = f"{name} {str(a.get(name))[:40]} and {str(b.get(name))[:40]}, for one"
    return (
        f"**Not comparable as they stand:** these runs were made in {len(seen)} installations "
        f"(summary.json's `environment`: {why}); the same settings and seed give other numbers "
        "in another. Compare the runs of one installation (a new `--out` reruns them here)."
    )


def rules(runs: list[RunResult]) -> str | None:
    """One line where the runs of one K policy record more than one revision of its rule
    (config.json's `policy_revision`, none counting as 0: docs/design.md §6, "the rule's
    revision"): the same settings and seed may take other K paths under each. None where every
    policy's runs record one."""
    seen: dict[str, set[str]] = {}
    for r in runs:
        policy = str(r.config.get("policy", "fixed"))
        was = r.config.get("policy_revision")
        shown = "0" if was is None else str(was) if type(was) is int else repr(was)[:40]
        seen.setdefault(policy, set()).add(shown)
    mixed = next(((p, sorted(v)) for p, v in seen.items() if len(v) > 1), None)
    if mixed is None:
        return None
    policy, revisions = mixed
    return (
        f"**Not comparable as they stand:** these runs of {policy} were made by "
        f"{len(revisions)} revisions of its rule (config.json's `policy_revision`: "
        f"{', '.join(revisions)}; none recorded counts as 0); the same settings and "
        "seed may take another K path under each. Compare the runs of one revision (a new "
        "`--out` reruns them here)."
    )


def say_installations(text: str, runs: list[RunResult]) -> str:
    """The report's text with the `installations` and `rules` lines under its title, where
    there are any."""
    said = [line for line in (installations(runs), rules(runs)) if line is not None]
    if not said:
        return text
    title, _, rest = text.partition("\n\n")
    return "\n\n".join([title, *said, rest])


def report(root: Path) -> str:
    runs = collect(root)
    if not runs:
        raise FileNotFoundError(f"no finished runs (experiment.json + summary.json) under {root}")
    from autok import panel
    from autok.pilot import read_plan

    try:
        plan = read_plan(root)
    except ValueError as exc:  # a plan.json that is not autok's plan: named, in one line
        raise ReportError(str(exc)) from None
    # a regime grid is judged apart (its metrics differ): where a policy ran, or the pilot
    # planned a regime whose main seeds ran (a pilot alone is a plain grid of fixed K)
    planned = any(r.stage == "main" and r.variant in plan for r in runs)
    if panel.is_panel(runs, planned):
        text = panel.report(root, runs, collect_stopped(root), plan)
        write_csv(runs, root / "report.csv")
        return text
    rows = table_rows(runs)
    quality = quality_of(runs)
    text = say_installations(
        render(rows, f"autok report: {root}", quality, exposed_waits(runs)), runs
    )
    if resolution := render_resolution(rows, quality):
        text += "\n" + resolution
    stopped = collect_stopped(root, quality)
    if stopped:
        text += f"\n{len(stopped)} run(s) of the grid did not finish: see the last section.\n"
    text += "\n" + render_profile(sync_profile(runs))
    if stopped:
        text += "\n" + render_stopped(stopped, quality)
    images = plots(runs, root, stopped)  # only the plots written: none is linked that is not there
    write_text(
        root / "report.md",
        text + "\n" + "\n".join(f"![{PLOT_TITLES[p.stem]}]({p.name})" for p in images) + "\n",
    )
    write_csv(runs, root / "report.csv")
    return text
