"""`autok report DIR`: the study's table format over an experiment's runs.

report.md: per method (and varied setting) mean ± std over seeds of the best and final test
metric (accuracy in %, or a --task's own metric, e.g. perplexity), wall-clock and exposed sync;
Δ vs DDP (percentage points for accuracy); a Welch two-sided t-test p-value against DDP's seeds.
report.csv: one row per run. PNGs: the quality-time frontier over K, the test metric against
wall-clock per method, the K paths of the adaptive policies, exposed sync vs compute per method.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
EPOCH_NUMBERS = ("epoch_seconds",)
EPOCH_COUNTS = ("epoch", "grad_syncs", "param_syncs")
BOUNDARY_NUMBERS = ("exposed_sync_seconds", "compute_seconds")
BOUNDARY_COUNTS = ("epoch", "global_step", "sync_period")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_count(v: Any) -> bool:
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
    _need(path, meta, "label", lambda v: isinstance(v, str) and v.strip(), "a label")
    _need(path, meta, "seed", lambda v: type(v) is int, "an integer")
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
    `metric`, peak_test_metric and final_test_metric (DESIGN §5); a run written before tasks
    had only the accuracies, which are its metric."""
    summary = read_json_object(path)
    for key in SUMMARY_NUMBERS:
        _need(path, summary, key, _is_number, "a number")
    if "metric" in summary:
        _need(path, summary, "metric", _a_metric, "a {name, higher_is_better} object")
        for key in ("peak_test_metric", "final_test_metric"):
            _need(path, summary, key, _is_number, "a number")
    else:
        for key in ("peak_test_accuracy", "final_test_accuracy"):
            _need(path, summary, key, _is_number, "a number")
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
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise ReportError(f"{path}: line {i}: not a JSON object")
        for key in BOUNDARY_COUNTS:
            _need(f"{path}: line {i}", rec, key, _is_count, "a count")
        for key in BOUNDARY_NUMBERS:
            _need(f"{path}: line {i}", rec, key, _is_number, "a number")
        recs.append(rec)
    return recs


def boundary_records(r: RunResult) -> list[dict[str, Any]]:
    if r.boundaries is None:
        r.boundaries = read_boundaries(r.dir / "boundaries.jsonl")
    return r.boundaries


def collect(root: Path) -> list[RunResult]:
    """The finished runs under `root`, their files checked: a malformed one is a ReportError
    naming the file and the field (never a crash half-way through the plots)."""
    runs = []
    for tag in sorted(root.rglob("experiment.json")):
        d = tag.parent
        if not (d / "summary.json").exists():
            continue  # unfinished
        meta = read_meta(tag)
        run = RunResult(
            meta["label"],
            meta["seed"],
            d,
            read_config(d / "config.json"),
            read_summary(d / "summary.json"),
            read_epochs(d / "epochs.csv"),
        )
        run.boundaries = read_boundaries(d / "boundaries.jsonl")
        runs.append(run)
    return runs


@dataclass
class StoppedRun:
    """A run of the grid that did not finish: the divergence guard stopped it, it crashed, or it
    is still running. Reported, never silently dropped from the tables."""

    label: str
    seed: int
    epochs_done: int
    peak: float  # best test metric over the epochs it finished (nan if none)
    why: str


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
        if (d / "train.log").exists():
            log = (d / "train.log").read_text(encoding="utf-8", errors="replace")
            lines = [x for x in log.splitlines() if x.startswith("autok:")]
            if lines:
                # "autok: training failed: pkg.Error: what; advice" -> "what"
                why = lines[-1].removeprefix("autok: ").removeprefix("training failed: ")
                why = re.sub(r"^[\w.]+(Error|Exception|Diverged): ", "", why).split("; ")[0]
        values = [epoch_metric(e) for e in epochs]
        best = quality.better(values)
        out.append(StoppedRun(meta["label"], meta["seed"], len(epochs), best, why))
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


def label_key(label: str) -> list[tuple[int, float | str]]:
    """Natural order: 'cpdp sync_period=2' before 'cpdp sync_period=16'."""
    return [
        (0, float(t)) if re.fullmatch(r"-?\d+(\.\d+)?", t) else (1, t)
        for t in re.split(r"[ =]", label)
    ]


def group(runs: list[RunResult]) -> dict[str, list[RunResult]]:
    groups: dict[str, list[RunResult]] = {}
    for r in sorted(runs, key=lambda r: (label_key(r.label), r.seed)):
        groups.setdefault(r.label, []).append(r)
    return groups


def baseline_label(groups: dict[str, list[RunResult]], variant: str) -> str | None:
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
        walls = [r.summary["wall_seconds"] for r in rs]
        base_label = baseline_label(groups, rs[0].variant)
        base_runs = groups.get(base_label, []) if base_label != label else []
        base = [r.summary["peak_test_metric"] for r in base_runs]
        delta = scale * (statistics.fmean(peaks) - statistics.fmean(base)) if base else math.nan
        speedup = (
            statistics.fmean(r.summary["wall_seconds"] for r in base_runs) / statistics.fmean(walls)
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
    events: float  # gradient AllReduces + parameter averagings per epoch
    per_boundary_ms: float  # exposed sync per synchronization point
    exposed: float  # exposed sync, seconds per epoch
    compute: float  # compute, seconds per epoch: the floor with a free network


def _run_profile(r: RunResult) -> tuple[float, float, float, float, float]:
    warmup = int(r.config.get("warmup_epochs") or 0)
    recs = boundary_records(r)
    steady = [b for b in recs if b["epoch"] >= warmup] or recs
    if not steady:  # a run with no boundary at all: nothing to profile
        return (math.nan,) * 5
    epochs = {b["epoch"] for b in steady}
    rows = [e for e in r.epochs if int(e["epoch"]) in epochs]
    n = len(epochs)
    exposed = sum(b["exposed_sync_seconds"] for b in steady)
    events = sum(int(e["grad_syncs"]) + int(e["param_syncs"]) for e in rows)
    return (
        len(steady) / n,
        events / n,
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
        " sync events (gradient AllReduces + parameter averagings), exposed sync per point, "
        "exposed sync and compute per epoch (compute is the floor a free network would leave).",
        "",
        "| method | boundaries/epoch | sync events/epoch | exposed per boundary (ms) | "
        "exposed sync/epoch (s) | compute/epoch (s) |",
        "|---|---|---|---|---|---|",
    ]
    for p in profiles:
        lines.append(
            f"| {p.label} | {p.boundaries:.1f} | {p.events:.1f} | {p.per_boundary_ms:.1f} | "
            f"{p.exposed:.2f} | {p.compute:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _pm(ms: tuple[float, float], scale: float = 1.0, digits: int = 2) -> str:
    return f"{ms[0] * scale:.{digits}f} ± {ms[1] * scale:.{digits}f}"


def _digits(q: Quality) -> int:
    return 2 if q.is_accuracy else 4


def render(rows: list[Row], title: str, quality: Quality = Quality()) -> str:
    q = quality
    direction = (
        "" if q.is_accuracy else f" ({'higher' if q.higher_is_better else 'lower'} is better)"
    )
    lines = [
        f"# {title}",
        "",
        f"Mean ± standard deviation over seeds (n), judged by test {q.name}{direction}. Δ vs "
        f"DDP: difference of mean {q.best} {q.name} ({q.delta_unit}), with the two-sided Welch "
        "t-test p-value against DDP's seeds; speedup: DDP's mean wall-clock over the row's.",
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
            f"| {r.label} | {r.n} | {_pm(r.peak, q.scale, d)} | {_pm(r.final, q.scale, d)} | "
            f"{_pm(r.wall, digits=1)} | {_pm(r.exposed, digits=1)} | {delta} | {p} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def write_csv(runs: list[RunResult], path: Path) -> None:
    cols = [
        "label",
        "seed",
        "strategy",
        "policy",
        "sync_period",
        "slowmo_beta",
        "lr",
        "workers",
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
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in runs:
            w.writerow(
                {
                    "label": r.label,
                    "seed": r.seed,
                    "run_dir": str(r.dir),
                    **{k: r.config.get(k) for k in cols[2:8]},
                    **{k: r.summary.get(k) for k in cols[8:20]},
                    "metric": r.summary["metric"]["name"],
                }
            )


def plots(runs: list[RunResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    q = quality_of(runs)
    # 1. the quality-time frontier over K
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = [r.config.get("sync_period") or 1 for r in runs]
    sc = ax.scatter(
        [r.summary["wall_seconds"] for r in runs],
        [r.summary["peak_test_metric"] for r in runs],
        c=ks,
        cmap="viridis",
    )
    fig.colorbar(sc, ax=ax, label="K (starting sync period)")
    for r in runs:
        if r.seed == runs[0].seed:
            ax.annotate(
                r.label, (r.summary["wall_seconds"], r.summary["peak_test_metric"]), fontsize=6
            )
    ax.set(
        xlabel="wall-clock (s)",
        ylabel=f"{q.best} {q.column}",
        title=f"{q.name}-time frontier over K",
    )
    made.append(_save(fig, out / "frontier.png"))
    # 2. the test metric against wall-clock, per method (first seed of each)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    seen = set()
    for r in runs:
        if r.label in seen:
            continue
        seen.add(r.label)
        t, accs = 0.0, []
        for e in r.epochs:
            t += float(e["epoch_seconds"])
            accs.append((t, epoch_metric(e)))
        ax.plot(*zip(*accs, strict=True), label=r.label, lw=1)
    ax.set(xlabel="training time (s)", ylabel=q.column, title=f"{q.column} vs time")
    ax.legend(fontsize=6)
    made.append(_save(fig, out / f"{'accuracy' if q.is_accuracy else 'metric'}_vs_time.png"))
    # 3. the K paths of adaptive policies
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        if r.config.get("policy", "fixed") == "fixed" or r.seed != runs[0].seed:
            continue
        pts = boundary_records(r)
        ax.step(
            [p["global_step"] for p in pts],
            [p["sync_period"] for p in pts],
            where="post",
            label=r.label,
        )
    ax.set(xlabel="optimizer step", ylabel="K", yscale="log", title="K paths (adaptive)")
    if ax.lines:
        ax.legend(fontsize=6)
    made.append(_save(fig, out / "k_paths.png"))
    # 4. exposed sync vs compute per method
    rows = table_rows(runs)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(rows))
    comp = [
        statistics.fmean(r.summary["compute_seconds"] for r in runs if r.label == row.label)
        for row in rows
    ]
    ax.bar(xs, comp, label="compute")
    ax.bar(xs, [row.exposed[0] for row in rows], bottom=comp, label="exposed sync")
    ax.set_xticks(list(xs), [row.label for row in rows], rotation=45, ha="right", fontsize=6)
    ax.set(ylabel="seconds (mean rank, mean seed)", title="exposed sync vs compute")
    ax.legend()
    made.append(_save(fig, out / "exposed_vs_compute.png"))
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def report(root: Path) -> str:
    runs = collect(root)
    if not runs:
        raise FileNotFoundError(f"no finished runs (experiment.json + summary.json) under {root}")
    rows = table_rows(runs)
    quality = quality_of(runs)
    text = render(rows, f"autok report: {root}", quality)
    stopped = collect_stopped(root, quality)
    if stopped:
        text += f"\n{len(stopped)} run(s) of the grid did not finish: see the last section.\n"
    text += "\n" + render_profile(sync_profile(runs))
    if stopped:
        text += "\n" + render_stopped(stopped, quality)
    (root / "report.md").write_text(
        text + "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots(runs, root)) + "\n"
    )
    write_csv(runs, root / "report.csv")
    return text
