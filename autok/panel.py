"""The controller panel's report (`autok report` on `autok experiment run controller-panel`).

Does choosing K online pay off? Per regime (a workload on a link: the `regime=` of the labels),
every method against every fixed K:

- target: 97% of the best mean final accuracy of the fixed-K methods, or, for a task judged by a
  lower-is-better metric, 1.03x the best mean final validation loss (epochs.csv's test_loss);
- time to target: the wall-clock (report.epoch_clock) at the end of the first epoch whose
  validation meets the target; a run that never meets it has none (counted as not reached);
- final quality, bytes communicated (the boundary records), mean K after warmup, K path;
- Welch's p against the best fixed K (the fastest to the target among those that all reached
  it; else the best final quality), and the smallest difference the seeds can resolve.

summary.json holds the judgement in machine-readable form, with the crossing interpolated
between evaluations, seeds paired, CIs and Holm-corrected p-values (autok/panel_stats.py,
docs/design.md §9).

The goals of issue 15 for the default adaptive policy (exposed-sync) are checked per regime and
printed with the measured ratios. Regimes differ in their metric, so each is judged apart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from autok import panel_stats
from autok.report import RunResult, epoch_clock, mean_std, relative_dir, resolvable, welch_p
from trainer.atomic_write import replacing, write_text  # never through a link (design.md §9)
from trainer.clock import training_seconds
from trainer.plots import pyplot, save

DEFAULT_POLICY = "exposed-sync"
RANDOM = "random"
ACC_TARGET, LOSS_TARGET = 0.97, 1.03
ACC_SLACK, LOSS_SLACK = 0.01, 1.02  # the goal's "1 point (or 2% loss) below the best fixed K"
TIME_SLACK = 1.10  # "within 10% of the best fixed K's time-to-target"


def is_panel(runs: list[RunResult]) -> bool:
    """A panel: its varied setting is `regime`, and fixed and adaptive policies ran in it."""
    return (
        bool(runs)
        and all(r.variant.startswith("regime=") for r in runs)
        and any(_fixed(r) for r in runs)
        and any(not _fixed(r) for r in runs)
    )


def _fixed(r: RunResult) -> bool:
    return r.config.get("policy", "fixed") == "fixed"


@dataclass
class Judge:
    """How a regime's runs are scored: accuracy (higher is better, in pp) or validation loss."""

    accuracy: bool

    def value(self, row: dict[str, str]) -> float:
        return float(row["test_accuracy"] if self.accuracy else row["test_loss"])

    def better(self, a: float, b: float) -> bool:
        return a > b if self.accuracy else a < b

    def meets(self, v: float, target: float) -> bool:
        return v >= target if self.accuracy else v <= target

    def target(self, best_final: float) -> float:
        return best_final * (ACC_TARGET if self.accuracy else LOSS_TARGET)

    def show(self, v: float) -> str:
        return f"{100 * v:.2f}" if self.accuracy else f"{v:.4f}"

    @property
    def name(self) -> str:
        return "accuracy (%)" if self.accuracy else "validation loss (nats)"


@dataclass
class Method:
    name: str
    fixed: bool
    runs: list[RunResult]
    ttt: list[float | None] = field(default_factory=list)  # time to target per seed
    final: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    nbytes: list[float] = field(default_factory=list)
    mean_k: list[float] = field(default_factory=list)

    @property
    def reached(self) -> list[float]:
        return [t for t in self.ttt if t is not None]

    @property
    def all_reached(self) -> bool:
        return bool(self.ttt) and len(self.reached) == len(self.ttt)

    def ttt_mean(self) -> float:
        return statistics.fmean(self.reached) if self.all_reached else math.inf


def after_warmup(r: RunResult) -> list[dict]:
    """The boundary records after warmup (the records do not say; the config's epochs do)."""
    warmup = r.config.get("warmup_epochs", 0)
    warmup = warmup if type(warmup) is int else 0
    return [b for b in r.boundaries or [] if b["epoch"] >= warmup]


def mean_k_after_warmup(r: RunResult) -> float:
    ks = [b["sync_period"] for b in after_warmup(r)]
    return statistics.fmean(ks) if ks else 1.0


def k_path_text(r: RunResult, limit: int = 8) -> str:
    """The K in force over time (after warmup), each change once: '4 → 24 → 64'."""
    ks: list[int] = []
    for b in after_warmup(r):
        if not ks or ks[-1] != b["sync_period"]:
            ks.append(b["sync_period"])
    if len(ks) > limit:
        return f"{len(ks) - 1} changes, {min(ks)}..{max(ks)}"
    return " → ".join(map(str, ks)) or "1"


@dataclass
class Regime:
    name: str
    judge: Judge
    methods: list[Method]
    target: float
    best_fixed: Method
    changing: bool

    def method(self, name: str) -> Method | None:
        return next((m for m in self.methods if m.name == name), None)


def build_regimes(runs: list[RunResult]) -> list[Regime]:
    by_regime: dict[str, dict[str, list[RunResult]]] = {}
    for r in sorted(runs, key=lambda r: (r.order if r.order is not None else 0, r.seed)):
        by_regime.setdefault(r.variant.partition("=")[2], {}).setdefault(r.method, []).append(r)
    out = []
    for name, groups in by_regime.items():
        judge = Judge(
            accuracy=groups[next(iter(groups))][0].summary["metric"]["name"] == "accuracy"
        )
        methods = [Method(m, _fixed(rs[0]), rs) for m, rs in groups.items()]
        for m in methods:
            m.final = [judge.value(r.epochs[-1]) for r in m.runs]
            m.wall = [training_seconds(r.summary) for r in m.runs]  # (virtual: design.md §4)
            m.nbytes = [
                sum(b.get("bytes_communicated", 0) for b in r.boundaries or []) for r in m.runs
            ]
            m.mean_k = [mean_k_after_warmup(r) for r in m.runs]
        fixed = [m for m in methods if m.fixed]
        if not fixed:
            continue
        best_final = statistics.fmean(
            max(fixed, key=lambda m: _signed(judge, statistics.fmean(m.final))).final
        )
        target = judge.target(best_final)
        for m in methods:
            m.ttt = [time_to_target(r, judge, target) for r in m.runs]
        reaching = [m for m in fixed if m.all_reached]
        best = (
            min(reaching, key=Method.ttt_mean)
            if reaching
            else max(fixed, key=lambda m: _signed(judge, statistics.fmean(m.final)))
        )
        changing = any(r.config.get("link_schedule") for rs in groups.values() for r in rs)
        out.append(Regime(name, judge, methods, target, best, changing))
    return out


def _signed(judge: Judge, v: float) -> float:
    return v if judge.accuracy else -v


def time_to_target(r: RunResult, judge: Judge, target: float) -> float | None:
    for t, row in zip(epoch_clock(r), r.epochs, strict=True):
        if judge.meets(judge.value(row), target):
            return t
    return None


def _cell(ms: tuple[float, float], fmt: str, bold: bool) -> str:
    m, s = ms
    text = f"{m:{fmt}} ± {s:{fmt}}" if s == s else f"{m:{fmt}}"
    return f"**{text}**" if bold else text


def _p(a: list[float], b: list[float]) -> str:
    p = welch_p(a, b)
    return "—" if math.isnan(p) else f"{p:.3f}"


def render_regime(g: Regime) -> str:
    j = g.judge
    scale = 100.0 if j.accuracy else 1.0
    best_ttt = min((m.ttt_mean() for m in g.methods), default=math.inf)
    best_final = max(_signed(j, statistics.fmean(m.final)) for m in g.methods)
    best_wall = min(statistics.fmean(m.wall) for m in g.methods)
    best_bytes = min(statistics.fmean(m.nbytes) for m in g.methods)
    n = max(len(m.runs) for m in g.methods)
    lines = [
        f"### {g.name}" + (" (the link changes during the run)" if g.changing else ""),
        "",
        f"Target: {j.show(g.target)} {j.name} "
        f"({'97% of' if j.accuracy else '1.03 x'} the best fixed K's mean final). "
        f"p: Welch against the best fixed K, **{g.best_fixed.name}**. Best of each column in "
        "bold.",
        "",
        "| method | time to target (s) | reached | final " + j.name + " | Δ final | p (time) | "
        "p (final) | wall (s) | MB sent | mean K | K path (first seed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    bf = g.best_fixed
    for m in g.methods:
        reached = f"{len(m.reached)}/{len(m.ttt)}"
        ttt = (
            _cell(mean_std(m.reached), ".1f", m.ttt_mean() == best_ttt)
            if m.all_reached
            else (f"({_cell(mean_std(m.reached), '.1f', False)})" if m.reached else "—")
        )
        fm = statistics.fmean(m.final)
        final = _cell(
            (scale * fm, scale * mean_std(m.final)[1]),
            ".2f" if j.accuracy else ".4f",
            _signed(j, fm) == best_final,
        )
        delta = scale * (fm - statistics.fmean(bf.final))
        delta_s = "—" if m is bf else f"{delta:+.2f}" if j.accuracy else f"{delta:+.4f}"
        p_t = (
            "—" if m is bf or not (m.all_reached and bf.all_reached) else _p(m.reached, bf.reached)
        )
        p_f = "—" if m is bf else _p(m.final, bf.final)
        wall = _cell(mean_std(m.wall), ".1f", statistics.fmean(m.wall) == best_wall)
        mb = _cell(
            (statistics.fmean(m.nbytes) / 1e6, mean_std(m.nbytes)[1] / 1e6),
            ".2f",
            statistics.fmean(m.nbytes) == best_bytes,
        )
        mean_k = f"{statistics.fmean(m.mean_k):.1f}"
        lines.append(
            f"| {m.name} | {ttt} | {reached} | {final} | {delta_s} | {p_t} | {p_f} | {wall} | "
            f"{mb} | {mean_k} | {k_path_text(m.runs[0])} |"
        )
    unit = "pp" if j.accuracy else "nats"
    res_final = scale * resolvable(bf.final, n)
    res_time = resolvable(bf.reached, n) if bf.all_reached else math.nan
    lines += [
        "",
        f"With {n} seeds and the best fixed K's spread, a Welch test at p < 0.05 resolves "
        f"differences of about {res_final:.2f} {unit} in final quality and "
        f"{res_time:.1f} s in time to target; smaller ones are noise here. Time to target is "
        "measured at epoch ends (an epoch is a sixth of the run).",
        "",
    ]
    return "\n".join(lines)


@dataclass
class Goal:
    regime: str
    method: str
    time_ratio: float  # time to target / the best fixed K's
    ahead_of_all_fixed: bool
    quality_ok: bool
    ahead_of_random: bool | None
    met: bool
    reached: str = ""  # seeds that reached the target, "2/3"

    def show_ratio(self) -> str:
        if math.isinf(self.time_ratio):
            return f"not reached in every seed ({self.reached})"
        return "—" if math.isnan(self.time_ratio) else f"{self.time_ratio:.2f}x"


def goals(regimes: list[Regime], policy: str = DEFAULT_POLICY) -> list[Goal]:
    """Issue 15's goals for `policy`, per regime: static link, time to target within 10% of the
    best fixed K's; changing link, ahead of every fixed K; final quality never more than 1 pp
    below (2% loss above) the best fixed K's; ahead of random (matched mean K)."""
    out = []
    for g in regimes:
        m = g.method(policy)
        if m is None:
            continue
        j, bf = g.judge, g.best_fixed
        ratio = m.ttt_mean() / bf.ttt_mean() if bf.all_reached else math.nan
        fixed_ttts = [f.ttt_mean() for f in g.methods if f.fixed]
        ahead_all = m.ttt_mean() < min(fixed_ttts)
        fm, bfm = statistics.fmean(m.final), statistics.fmean(bf.final)
        quality_ok = fm >= bfm - ACC_SLACK if j.accuracy else fm <= bfm * LOSS_SLACK
        rnd = g.method(RANDOM)
        ahead_rnd = None if rnd is None else m.ttt_mean() < rnd.ttt_mean()
        time_ok = ahead_all if g.changing else ratio <= TIME_SLACK
        met = bool(time_ok and quality_ok and ahead_rnd is not False)
        reached = f"{len(m.reached)}/{len(m.ttt)}"
        out.append(Goal(g.name, policy, ratio, ahead_all, quality_ok, ahead_rnd, met, reached))
    return out


def render_goals(gs: list[Goal]) -> str:
    if not gs:
        return ""
    yes = {True: "yes", False: "**no**", None: "—"}
    who = "the default adaptive policy, " if gs[0].method == DEFAULT_POLICY else ""
    lines = [
        f"### The goals, for {who}{gs[0].method}",
        "",
        "Static links: time to target within 10% of the best fixed K's. Changing link: ahead of "
        "every fixed K. Always: final quality at most 1 pp (2% loss) from the best fixed K's, "
        "and ahead of random K of matched mean.",
        "",
        "| regime | time / best fixed | ahead of every fixed K | quality kept | ahead of random "
        "| met |",
        "|---|---|---|---|---|---|",
    ]
    for g in gs:
        lines.append(
            f"| {g.regime} | {g.show_ratio()} | {yes[g.ahead_of_all_fixed]} | "
            f"{yes[g.quality_ok]} | {yes[g.ahead_of_random]} | {yes[g.met]} |"
        )
    return "\n".join(lines) + "\n"


def render_summary(regimes: list[Regime]) -> str:
    """At a glance: each method's mean time to target over the best fixed K's, per regime (the
    best fixed K named in the header); 'n/r 2/3' when some seed never reached the target."""
    names = list(dict.fromkeys(m.name for g in regimes for m in g.methods if not m.fixed))
    head = " | ".join(f"{g.name} ({g.best_fixed.name})" for g in regimes)
    lines = [
        "Time to target over the best fixed K's (its name in brackets); below 1.00x is faster. "
        "n/r: not reached in every seed (how many did).",
        "",
        f"| method | {head} |",
        "|---|" + "---|" * len(regimes),
    ]
    for name in names:
        cells = []
        for g in regimes:
            m = g.method(name)
            if m is None:
                cells.append("")
            elif not m.all_reached:
                cells.append(f"n/r {len(m.reached)}/{len(m.ttt)}")
            elif not g.best_fixed.all_reached:
                cells.append("—")
            else:
                cells.append(f"{m.ttt_mean() / g.best_fixed.ttt_mean():.2f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(regimes: list[Regime]) -> str:
    parts = ["## Controller panel: every method against every fixed K, per regime", ""]
    parts += [render_summary(regimes)]
    parts += [render_regime(g) for g in regimes]
    parts.append("## The goals of issue 15, per adaptive policy\n")
    adaptive = [m.name for g in regimes for m in g.methods if not m.fixed and m.name != RANDOM]
    for policy in sorted(dict.fromkeys(adaptive), key=lambda n: n != DEFAULT_POLICY):
        parts.append(render_goals(goals(regimes, policy)))
    return "\n".join(parts)


def write_csv(regimes: list[Regime], path: Path) -> None:
    """panel.csv: one row per run, with what the tables are computed from (run_dir relative to
    the experiment directory)."""
    import csv

    cols = [
        "regime",
        "method",
        "seed",
        "target",
        "time_to_target",
        "final",
        "wall_seconds",
        "bytes",
        "mean_k",
        "run_dir",
    ]
    with replacing(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for g in regimes:
            for m in g.methods:
                for i, r in enumerate(m.runs):
                    t = m.ttt[i]
                    w.writerow(
                        [
                            g.name,
                            m.name,
                            r.seed,
                            g.target,
                            "" if t is None else t,
                            m.final[i],
                            m.wall[i],
                            int(m.nbytes[i]),
                            m.mean_k[i],
                            relative_dir(r.dir, path.parent),
                        ]
                    )


def report(root: Path, runs: list[RunResult], stopped: list[str]) -> str:
    """report.md (tables, goals, plots), panel.csv; returns the text."""
    regimes = build_regimes(runs)
    text = f"# autok report: {root}\n\n" + render(regimes)
    if stopped:
        text += "\n## Runs that did not finish\n\n" + "".join(f"- {s}\n" for s in stopped)
    images = [
        (plot_quality(regimes, root / "panel_quality_vs_time.png"), "quality against time"),
        (plot_k_paths(regimes, root / "panel_k_paths.png"), "K paths of the adaptive policies"),
    ]
    write_text(
        root / "report.md",
        text + "\n" + "\n".join(f"![{alt}]({p.name})" for p, alt in images) + "\n",
    )
    write_csv(regimes, root / "panel.csv")
    write_summary(regimes, root / "summary.json")
    return text


def outcome(r: RunResult, judge: Judge, target: float) -> panel_stats.Outcome:
    """The run's interpolated crossing of the target (autok/panel_stats.py), and its end."""
    clock = epoch_clock(r)
    values = [judge.value(row) for row in r.epochs]
    t = panel_stats.crossing_time(clock, values, target, higher_is_better=judge.accuracy)
    return panel_stats.Outcome(t, clock[-1] if clock else training_seconds(r.summary))


def summary_data(regimes: list[Regime], policy: str = DEFAULT_POLICY) -> dict:
    """summary.json: each method's paired time-to-target ratio to its regime's best fixed K
    (docs/design.md §9), crossings interpolated between evaluations."""
    data = {
        g.name: (
            g.best_fixed.name,
            {m.name: {r.seed: outcome(r, g.judge, g.target) for r in m.runs} for m in g.methods},
        )
        for g in regimes
    }
    return panel_stats.summary(policy, data)


def write_summary(regimes: list[Regime], path: Path) -> None:
    import json

    write_text(path, json.dumps(summary_data(regimes), indent=2, allow_nan=False) + "\n")


# ----- plots -------------------------------------------------------------------------------------


def _grid(plt, n: int):
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False, layout="constrained"
    )
    flat = [a for row in axes for a in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _colors(methods: list[Method]) -> dict[str, tuple]:
    from matplotlib import colormaps

    fixed = [m.name for m in methods if m.fixed]
    other = [m.name for m in methods if not m.fixed]
    blues = colormaps["Blues"]
    out = {n: blues(0.35 + 0.6 * i / max(1, len(fixed) - 1)) for i, n in enumerate(fixed)}
    tab = colormaps["tab10"]
    out |= {n: tab(i % 10) for i, n in enumerate(other)}
    return out


def plot_quality(regimes: list[Regime], out: Path) -> Path:
    """panel_quality_vs_time.png. The question: in each regime, how soon does each method reach
    the target? Mean over seeds at each epoch's end against the mean clock; fixed K in blues
    (darker = larger K), adaptive policies in colour; the target dashed."""
    plt = pyplot()
    fig, axes = _grid(plt, len(regimes))
    for ax, g in zip(axes, regimes, strict=True):
        colors = _colors(g.methods)
        scale = 100.0 if g.judge.accuracy else 1.0
        for m in g.methods:
            clocks = [epoch_clock(r) for r in m.runs]
            vals = [[g.judge.value(e) for e in r.epochs] for r in m.runs]
            n = min(len(c) for c in clocks)
            t = [statistics.fmean(c[i] for c in clocks) for i in range(n)]
            v = [scale * statistics.fmean(x[i] for x in vals) for i in range(n)]
            ax.plot(
                t,
                v,
                color=colors[m.name],
                lw=1.2 if m.fixed else 1.8,
                ls="-" if not m.fixed else "--",
                marker="o",
                ms=2.5,
                label=m.name,
            )
        ax.axhline(scale * g.target, color="k", lw=0.8, ls=":")
        ax.set_title(g.name + (" (link changes)" if g.changing else ""), fontsize=10)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.set_ylabel(g.judge.name, fontsize=8)
        if g.judge.accuracy:
            ax.set_ylim(max(0.0, scale * g.target - 15), None)
        else:
            ax.set_ylim(None, g.target * 1.25)
    axes[0].legend(fontsize=7, ncol=2)
    fig.supxlabel("wall-clock (s); dotted: the regime's target", fontsize=9)
    fig.suptitle("Quality against wall-clock, per regime (mean over seeds)")
    return save(fig, out)


def plot_k_paths(regimes: list[Regime], out: Path) -> Path:
    """panel_k_paths.png. The question: what K did each adaptive policy choose, and did it
    follow the link? K over training time (first seed; compute + exposed sync of the boundary
    records), with each change of the emulated link marked and named."""
    plt = pyplot()
    fig, axes = _grid(plt, len(regimes))
    for ax, g in zip(axes, regimes, strict=True):
        colors = _colors(g.methods)
        marked = False
        for m in g.methods:
            if m.fixed:
                continue
            recs = m.runs[0].boundaries or []
            t, ks, clock = [], [], 0.0
            for b in recs:
                clock += b["compute_seconds"] + b["exposed_sync_seconds"]
                t.append(clock)
                ks.append(b["sync_period"])
            ax.step(t, ks, where="post", color=colors[m.name], lw=1.4, label=m.name)
            if not marked and g.changing:  # the link's changes, on this run's clock
                marked = True
                last = None
                for ti, b in zip(t, recs, strict=True):
                    if last is not None and b.get("link") != last:
                        ax.axvline(ti, color="0.4", lw=0.8, ls=":")
                        ax.text(
                            ti,
                            1.02,
                            b.get("link", "?"),
                            transform=ax.get_xaxis_transform(),
                            fontsize=7,
                            ha="center",
                        )
                    last = b.get("link")
        ax.set_yscale("log", base=2)
        ax.set_title(g.name, fontsize=10, pad=12)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.supxlabel("training time (s) of the first seed; dotted: the link changes", fontsize=9)
    fig.supylabel("K in force")
    fig.suptitle("K paths of the adaptive policies")
    return save(fig, out)
