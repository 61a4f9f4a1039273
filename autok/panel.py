"""The controller panel's report (`autok report` on `autok experiment run controller-panel`).

Does choosing K online pay off? Per regime (a workload, a partition, a schedule and a link: the
`regime=` of the labels), every method against the regime's best fixed K (docs/design.md §6,
Judging a policy):

- target and best fixed K: those of the regime's pilot (OUT/plan.json, autok/pilot.py), fixed on
  seeds of their own before the main seeds ran; without a pilot, 97% of the best mean final
  accuracy of the fixed-K methods (1.03x the best final validation loss for a lower-is-better
  task) and the fixed K fastest to it, chosen on the same seeds (and favoured by that choice);
- time to target: the first crossing of the target on the run's clock (report.epoch_clock: the
  virtual clock under --clock virtual), interpolated between evaluations; a run that never meets
  it has none (counted as not reached);
- final quality, bytes communicated (the boundary records), mean K after warmup, K path;
- the prediction each regime states before its run, and whether the main seeds confirm it;
- where other fixed K ran on the main seeds, whether one was faster than the pilot's choice
  there, and every arm against it (autok/pilot_check.py).

summary.json holds the judgement in machine-readable form, seeds paired, with 95% CIs and
Holm-corrected p-values over every comparison of the panel (autok/panel_stats.py). The goals of
the default adaptive policy are checked per regime from it.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autok import panel_stats, pilot_check
from autok.panel_stats import is_within, shown_faster
from autok.report import (
    ReportError,
    RunResult,
    StoppedRun,
    epoch_clock,
    mean_std,
    relative_dir,
    resolvable,
    say_installations,
    welch_p,
)
from autok.trainer.engine.clock import training_seconds
from autok.trainer.loop.atomic_write import (  # never through a link (docs/design.md §7)
    replacing,
    write_text,
)
from autok.trainer.loop.plots import pyplot, save

DEFAULT_POLICY = "exposed-sync"
RANDOM = "random"
ACC_TARGET, LOSS_TARGET = 0.97, 1.03


def is_panel(runs: list[RunResult], planned: bool = False) -> bool:
    """A panel: its varied setting is `regime`, fixed policies ran in it, and adaptive ones too
    or a pilot's plan chose its targets and best fixed K (`planned`: an arm against the best
    fixed K is judged on the panel's statistics whatever its policy, fixed K's own included)."""
    return (
        bool(runs)
        and all(r.variant.startswith("regime=") for r in runs)
        and any(_fixed(r) for r in runs)
        and (planned or any(not _fixed(r) for r in runs))
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
    net_share: list[float] = field(default_factory=list)  # network_share_after_warmup, per seed
    drift: list[float] = field(default_factory=list)  # mean drift ratio after warmup, per seed

    @property
    def reached(self) -> list[float]:
        return [t for t in self.ttt if t is not None]

    @property
    def all_reached(self) -> bool:
        return bool(self.ttt) and len(self.reached) == len(self.ttt)

    def ttt_mean(self) -> float:
        return statistics.fmean(self.reached) if self.all_reached else math.inf


def arm_k(m: Method) -> int | None:
    """The K a fixed arm ran at, from its config (None for a policy, or where it ran no run)."""
    return m.runs[0].config.get("sync_period") if m.fixed and m.runs else None


def warmup_epochs(r: RunResult) -> int:
    """The run's warmup epochs, from its config (the records do not say)."""
    warmup = r.config.get("warmup_epochs", 0)
    return warmup if type(warmup) is int else 0


def after_warmup(r: RunResult) -> list[dict]:
    """The boundary records after warmup."""
    return [b for b in r.boundaries or [] if b["epoch"] >= warmup_epochs(r)]


def first_epoch_seconds(r: RunResult) -> float | None:
    """The seconds of the run's first epoch after warmup (epochs.csv, whose every row
    `read_epochs` checked), None where it ran none."""
    rows = r.epochs[warmup_epochs(r) :]
    return float(rows[0]["epoch_seconds"]) if rows else None


def mean_k_after_warmup(r: RunResult) -> float:
    ks = [b["sync_period"] for b in after_warmup(r)]
    return statistics.fmean(ks) if ks else 1.0


def network_share_after_warmup(r: RunResult) -> float:
    """The share of the run's time after warmup spent waiting for the network: exposed sync less
    the wait for a slower peer, over compute plus that (what `exposed-sync` steers,
    controllers/exposed_sync.py)."""
    bs = after_warmup(r)
    net = sum(max(0.0, b["exposed_sync_seconds"] - b.get("peer_wait_seconds", 0.0)) for b in bs)
    total = net + sum(b["compute_seconds"] for b in bs)
    return net / total if total > 0 else 0.0


def mean_drift_after_warmup(r: RunResult) -> float:
    """The mean drift ratio (replicas' disagreement over the averaged update, docs/design.md §4)
    of the boundaries after warmup; NaN where the records have none (ddp)."""
    ds = [b["drift_ratio"] for b in after_warmup(r) if b.get("drift_ratio") is not None]
    return statistics.fmean(ds) if ds else math.nan


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
    plan: dict | None = None  # the pilot's choice (autok/pilot.py), when the panel had a pilot
    pilot: list[Method] = field(default_factory=list)  # the fixed K on the pilot's seeds

    def method(self, name: str) -> Method | None:
        return next((m for m in self.methods if m.name == name), None)


def bytes_sent(r: RunResult) -> int:
    """What the run's boundaries moved over the network, in bytes (its records' sum)."""
    return int(sum(b.get("bytes_communicated", 0) for b in r.boundaries or []))


def _methods(groups: dict[str, list[RunResult]], judge: Judge) -> list[Method]:
    methods = [Method(m, _fixed(rs[0]), rs) for m, rs in groups.items()]
    for m in methods:
        m.final = [judge.value(r.epochs[-1]) for r in m.runs]
        m.wall = [training_seconds(r.summary) for r in m.runs]  # (virtual: docs/design.md §4)
        m.nbytes = [bytes_sent(r) for r in m.runs]
        m.mean_k = [mean_k_after_warmup(r) for r in m.runs]
        m.net_share = [network_share_after_warmup(r) for r in m.runs]
        m.drift = [mean_drift_after_warmup(r) for r in m.runs]
    return methods


def build_regimes(runs: list[RunResult], plan: dict | None = None) -> list[Regime]:
    """Per regime, its methods judged against its target and best fixed K: the pilot's (from
    `plan`, OUT/plan.json) where the panel had one, else chosen on the runs themselves."""
    by_regime: dict[str, dict[str, dict[str, list[RunResult]]]] = {}
    for r in sorted(runs, key=lambda r: (r.order if r.order is not None else 0, r.seed)):
        stages = by_regime.setdefault(r.variant, {"main": {}, "pilot": {}})
        stages[r.stage].setdefault(r.method, []).append(r)
    # in the plan's order, which is the experiment's (each regime's pilot writes its entry in
    # turn): runs kept from another directory carry that experiment's order (docs/experiments.md)
    listed = list(plan or {})
    variants = sorted(by_regime, key=lambda v: listed.index(v) if v in listed else len(listed))
    out = []
    for variant in variants:
        stages = by_regime[variant]
        groups = stages["main"]
        if not groups:
            continue
        judge = Judge(
            accuracy=groups[next(iter(groups))][0].summary["metric"]["name"] == "accuracy"
        )
        methods = _methods(groups, judge)
        fixed = [m for m in methods if m.fixed]
        entry = (plan or {}).get(variant)
        if not fixed:
            continue
        if entry is not None:
            target = float(entry["target"])
        else:
            best_final = statistics.fmean(
                max(fixed, key=lambda m: _signed(judge, statistics.fmean(m.final))).final
            )
            target = judge.target(best_final)
        pilot = _methods(stages["pilot"], judge)
        for m in methods + pilot:
            m.ttt = [time_to_target(r, judge, target) for r in m.runs]
        if entry is not None:  # the main seeds' arm that ran the pilot's choice
            k = entry["arms"][entry["best_fixed"]]["sync_period"]
            best = next((m for m in fixed if arm_k(m) == k), fixed[0])
        else:
            reaching = [m for m in fixed if m.all_reached]
            best = (
                min(reaching, key=Method.ttt_mean)
                if reaching
                else max(fixed, key=lambda m: _signed(judge, statistics.fmean(m.final)))
            )
        changing = any(r.config.get("link_schedule") for rs in groups.values() for r in rs)
        name = variant.partition("=")[2]
        out.append(Regime(name, judge, methods, target, best, changing, entry, pilot))
    return out


def _signed(judge: Judge, v: float) -> float:
    return v if judge.accuracy else -v


def time_to_target(r: RunResult, judge: Judge, target: float) -> float | None:
    """The run's first crossing of the target, interpolated between evaluations."""
    values = [judge.value(row) for row in r.epochs]
    return panel_stats.crossing_time(
        epoch_clock(r), values, target, higher_is_better=judge.accuracy
    )


# ----- a pilot's plan, the prediction and its resolution (autok/pilot.py) ----------------------


def render_plan(g: Regime) -> str:
    """What was fixed before the main seeds ran: the prediction, the target, the pilot's table
    of fixed K and its choice."""
    p = g.plan or {}
    lines = []
    if pred := p.get("prediction"):
        lines += [f"**Prediction** (stated before the run): {pred['says']}", ""]
    j = g.judge
    lines += [
        f"**Pilot** (seeds {', '.join(map(str, p['pilot_seeds']))}, run before the main seeds): "
        f"target {j.show(g.target)} {j.name}, the mean of {p['target_of']} at evaluation "
        f"{p['target_evaluation'] + 1}"
        + ("" if p["rising"] else " (its curve no longer rises after it: an easy target)")
        + f"; best fixed K: **{p['best_fixed']}**"
        + ("" if p["best_reached_every_seed"] else " (no fixed K reached it on every seed)"),
        "",
        "| fixed K on the pilot | time to target, geometric mean (s) | reached | final |",
        "|---|---|---|---|",
    ]
    scale = 100.0 if j.accuracy else 1.0
    for name, a in p["arms"].items():
        best = name == p["best_fixed"]
        t = f"{a['geo_mean_time']:.1f}" + ("" if a["reached"] == len(a["times"]) else " (cens.)")
        lines.append(
            f"| {'**' + name + '**' if best else name} | {t} | {a['reached']}/{len(a['times'])} "
            f"| {scale * a['final']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def resolve(g: Regime, entries: dict[str, dict]) -> tuple[str, str]:
    """(confirms | refutes | unresolved, why) for the regime's prediction, from the pilot's
    choice (which fixed K is best) or the main seeds' paired, Holm-corrected ratios."""
    p = (g.plan or {}).get("prediction")
    if p is None:
        return "", ""
    expect = p["expect"]
    arms = list(g.plan["arms"]) if g.plan else []
    best = g.plan["best_fixed"] if g.plan else g.best_fixed.name
    if expect in ("largest-fixed", "interior-fixed"):
        at_edge = best == arms[-1] if expect == "largest-fixed" else best not in (arms[0], arms[-1])
        why = f"the pilot's best fixed K is {best} of {', '.join(arms)}"
        return ("confirms" if at_edge else "refutes"), why
    faster = {
        m: e
        for m, e in entries.items()
        if e.get("ci_high") is not None
        and e["ci_high"] < 1
        and (p_holm := e.get("p_holm")) is not None
        and p_holm < 0.05
        and e.get("reached") == 1.0  # a seed it missed counts at its run's end: no crossing
    }
    if expect == "none-faster":
        if faster:
            return "refutes", "faster than the best fixed K: " + ", ".join(sorted(faster))
        lows = [e["ci_low"] for e in entries.values() if e.get("ci_low") is not None]
        if lows and min(lows) >= 0.90:
            return "confirms", "no method is 10% faster than the best fixed K (every CI ≥ 0.90)"
        return "unresolved", "no method resolvably faster, but some CI reaches below 0.90"
    named = [m for m in expect["faster"] if m in entries]
    hits = [m for m in named if m in faster]
    if hits:
        return "confirms", "resolvably faster than the best fixed K: " + ", ".join(hits)
    lows = [entries[m]["ci_low"] for m in named if entries[m].get("ci_low") is not None]
    if named and len(lows) == len(named) and min(lows) >= 1.0:
        return "refutes", f"none of {', '.join(named)} can be faster (every CI ≥ 1.00)"
    return "unresolved", f"none of {', '.join(expect['faster'])} resolvably faster"


def render_resolution(g: Regime, entries: dict[str, dict]) -> str:
    """The paired table, and the verdict on the regime's prediction where the plan states one."""
    verdict, why = resolve(g, entries)
    rows = [
        f"| {m} | {e['ratio']:.3f} | {_ci(e)} | {_num(e.get('p_holm'))} | {e['reached']:.0%} |"
        for m, e in entries.items()
        if e.get("ratio") is not None and m != g.best_fixed.name
    ]
    table = (
        "| method | time / best fixed K (paired) | 95% CI | p (Holm) | reached |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        if rows
        else ""
    )  # a verdict on the pilot's choice alone (largest-fixed, interior-fixed) needs no rows
    return table + (f"**Result: {verdict}** the prediction: {why}.\n" if verdict else "")


def _ci(e: dict) -> str:
    lo, hi = e.get("ci_low"), e.get("ci_high")
    return "—" if lo is None or hi is None else f"{lo:.3f}–{hi:.3f}"


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def _cell(ms: tuple[float, float], fmt: str, bold: bool) -> str:
    m, s = ms
    text = f"{m:{fmt}} ± {s:{fmt}}" if s == s else f"{m:{fmt}}"
    return f"**{text}**" if bold else text


def _p(a: list[float], b: list[float]) -> str:
    p = welch_p(a, b)
    return "—" if math.isnan(p) else f"{p:.3f}"


def render_regime(g: Regime, entries: Mapping[str, dict] | None = None) -> str:
    """The regime's table; `entries` (summary.json's, per method) adds the seeds whose run did
    not finish, which the runs behind the table do not hold."""
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
        + (
            "(the pilot's). "
            if g.plan
            else f"({'97% of' if j.accuracy else '1.03 x'} the best fixed K's mean final). "
        )
        + f"p: Welch against the best fixed K, **{g.best_fixed.name}**. Best of each column in "
        "bold.",
        "",
        "| method | time to target (s) | reached | final " + j.name + " | Δ final | p (time) | "
        "p (final) | wall (s) | MB sent | mean K | K path (first seed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    bf = g.best_fixed
    for m in g.methods:
        reached = f"{len(m.reached)}/{len(m.ttt)}"
        # summary.json counts a seed whose run did not finish as not reached
        entry = (entries or {}).get(m.name, {})
        if n_stopped := entry.get("did_not_finish", 0):
            after = entry.get("reached_then_stopped", 0)
            then = f", {after} after crossing the target" if after else ""
            reached += f" (+{n_stopped} did not finish{then})"
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
        + (
            "— (the best fixed K missed the target in some seed)"
            if math.isnan(res_time)
            else f"{res_time:.1f} s"
        )
        + " in time to target; smaller ones are noise here. Time to target is "
        f"interpolated between the run's {min(len(r.epochs) for m in g.methods for r in m.runs)} "
        "evaluations; the paired comparison below (or summary.json) is the judgement.",
        "",
    ]
    return "\n".join(lines)


GOAL_WITHIN = panel_stats.GOAL_WITHIN
GOAL_FASTER = panel_stats.GOAL_FASTER
GOAL_REGIMES = 2  # some policy shown at least 10% faster in at least this many regimes


@dataclass
class Goal:
    """The panel's goals for one regime (docs/design.md §6, Judging a policy), from the paired,
    Holm-corrected ratios to the best fixed K of summary.json: the default policy within 5% (its
    CI's upper bound at most 1.05, or it reached the target in every seed where the best fixed K
    did not), and which policies are at least 10% faster (upper bound at most 0.90, the target
    reached in every seed: shown_faster)."""

    regime: str
    ratio: float | None  # the default policy's time to target over the best fixed K's
    ci_high: float | None
    ci_low: float | None
    reached: float  # the share of seeds in which the default policy reached the target
    baseline_reached: bool
    faster: list[str]  # the policies shown_faster: upper bound at most GOAL_FASTER, all reached
    seeds_for_within: int | None  # seeds to bring the upper bound to GOAL_WITHIN (a plan)
    did_not_finish: int = 0  # the default policy's main-seed runs that stopped before the end
    reached_then_stopped: int = 0  # of those, the ones that had crossed the target first

    @property
    def within(self) -> bool:
        return is_within(self.ci_high, self.reached, self.baseline_reached)


# A policy whose K is set in advance (`scheduled`): in a panel it stands for K chosen per segment
# in hindsight (a link's phases, or on a static link the run's progress), a bound on what a
# policy could do (docs/design.md §6), not a policy that counts towards a goal
IN_HINDSIGHT = frozenset({"scheduled"})


def in_hindsight(g: Regime, name: str) -> bool:
    m = g.method(name)
    return m is not None and bool(m.runs) and m.runs[0].config.get("policy") in IN_HINDSIGHT


def goals(summary: dict, regimes: list[Regime], policy: str = DEFAULT_POLICY) -> list[Goal]:
    out = []
    for g in regimes:
        entries = summary["regimes"].get(g.name, {})
        e = entries.get(policy)
        if e is None:
            continue
        faster = sorted(
            m
            for m, x in entries.items()
            if m != g.best_fixed.name and not in_hindsight(g, m) and shown_faster(x)
        )
        out.append(
            Goal(
                g.name,
                e.get("ratio"),
                e.get("ci_high"),
                e.get("ci_low"),
                e["reached"],
                entries.get(g.best_fixed.name, {}).get("reached") == 1.0,  # stopped runs too
                faster,
                e.get("seeds_for_within"),
                e.get("did_not_finish", 0),
                e.get("reached_then_stopped", 0),
            )
        )
    return out


def render_goals(gs: list[Goal], policy: str = DEFAULT_POLICY) -> str:
    if not gs:
        return ""
    yes = {True: "yes", False: "**no**"}
    lines = [
        f"### The goals, for the default adaptive policy ({policy})",
        "",
        f"Within 5% of the best fixed K in every regime (the 95% CI's upper bound ≤ "
        f"{GOAL_WITHIN}, or the target reached in every seed where the best fixed K missed it in "
        f"some); some policy at least 10% faster (upper bound ≤ {GOAL_FASTER}, the target "
        f"reached in every seed) in at least {GOAL_REGIMES} regimes.",
        "",
        "| regime | ratio (paired) | CI upper bound | reached | within 5% "
        "| policies ≥ 10% faster | seeds for ≤ 1.05 |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in gs:
        ratio = "—" if g.ratio is None else f"{g.ratio:.3f}"
        high = "—" if g.ci_high is None else f"{g.ci_high:.3f}"
        lines.append(
            f"| {g.regime} | {ratio} | {high} | {g.reached:.0%} | {yes[g.within]} | "
            f"{', '.join(g.faster) or '—'} | {g.seeds_for_within or '—'} |"
        )
    fast = [g.regime for g in gs if g.faster]
    lines += [
        "",
        f"Within 5% everywhere: {yes[all(g.within for g in gs)]}. Some policy ≥ 10% faster in "
        f"{len(fast)} regime(s){': ' + ', '.join(fast) if fast else ''}: "
        f"{yes[len(fast) >= GOAL_REGIMES]}.",
        "",
        "A K set in advance (`scheduled`) stands for a choice made in hindsight and does not "
        "count as a policy that is 10% faster.",
        "",
        "Seeds for ≤ 1.05: how many seeds would bring the upper bound to 1.05 with 80% power, were "
        "the ratio and the per-seed spread what this panel measured (— where the ratio is not "
        "under 1.05); it plans the next panel, it does not change this one's verdict.",
    ]
    return "\n".join(lines) + "\n"


def decisions(m: Method) -> tuple[float, float]:
    """From the method's records after warmup: the share of its decisions that held K at a cap
    (the soft skew cap, the guard's ceiling, --max-sync-period: "K at its cap", "K capped at ...
    (soft cap"), and its back-offs per run (controllers/exposed_sync.py writes these reasons;
    the engine's own cap at an epoch's length, "capped at N, the steps between forced
    boundaries", is not the policy's and is not counted)."""
    held = total = backs = 0
    for r in m.runs:
        for b in after_warmup(r):
            why = str(b.get("reason", ""))
            total += 1
            held += "at its cap" in why or "(soft cap" in why
            backs += why.startswith("back off")
    return (held / total if total else 0.0), backs / max(1, len(m.runs))


@dataclass
class StartCost:
    """A method's first epoch after warmup against the best fixed K's, paired by seed
    (`start_cost`)."""

    seconds: float  # the mean seconds it took over the best fixed K's
    # over the seeds the best fixed K reached: those seconds as a share of its time to the
    # target, as goal 1 averages ratios (geometric: exp(mean log(1 + share)) - 1); NaN: none
    share: float
    timed: int  # the seeds the share is over
    paired: int  # the seeds the seconds are over
    same: bool  # every seed's first epoch took the best fixed K's seconds
    # every timed crossing came after the best fixed K's first epoch ended: were the rest of the
    # run the best fixed K's, each would cross the whole extra later
    past: bool


def start_cost(m: Method, best: Method) -> StartCost | None:
    """The method's first epoch after warmup against the best fixed K's, paired by seed; None
    where no seed pairs. An online policy measures the link before it raises K, and on a static
    link its first epoch holds that cost (docs/design.md §6, "why a goal was missed")."""
    base = {r.seed: (r, t) for r, t in zip(best.runs, best.ttt, strict=True)}
    extra: list[float] = []
    logs: list[float] = []
    past = True
    for r in m.runs:
        mine = first_epoch_seconds(r)
        theirs, t = base.get(r.seed, (None, None))
        if mine is None or theirs is None or (first := first_epoch_seconds(theirs)) is None:
            continue
        extra.append(mine - first)
        if t:
            logs.append(math.log1p((mine - first) / t))
            # on the clock its time to the target is read on
            past = past and t >= epoch_clock(theirs)[warmup_epochs(theirs)]
    if not extra:
        return None
    share = math.expm1(statistics.fmean(logs)) if logs else math.nan
    same = max(map(abs, extra)) < 1e-9  # the same K path through it, on the virtual clock
    return StartCost(statistics.fmean(extra), share, len(logs), len(extra), same, past)


def start_text(cost: StartCost | None, bounded: bool) -> str:
    """The clause the report's why-line ends with ("" where no seed paired). `bounded`: the best
    fixed K reached the target in every seed, so that goal 1 reads time and allows 5% (where it
    missed a seed, goal 1 reads reach instead)."""
    if cost is None:
        return ""
    if cost.same:
        return "; its first epoch took the best fixed K's seconds"
    more = "more" if cost.seconds > 0 else "less"
    of = ""
    if not math.isnan(cost.share):
        seeds = "" if cost.timed == cost.paired else f", on the {cost.timed} seeds it reached"
        of = f" ({abs(cost.share):.1%} of that K's time to the target{seeds})"
    alone = (
        f": that alone is over the {GOAL_WITHIN - 1:.0%} the goal allows, so were the rest of its "
        "run the best fixed K's it would not be within it"
        if bounded and cost.past and cost.share > GOAL_WITHIN - 1
        else ""
    )
    took = f"{abs(cost.seconds):.3g} s {more} than the best fixed K's"
    return f"; its first epoch took {took}{of}{alone}"


# A mean K this far from the best fixed K's counts as another K, not the same one reached by
# another path: the panel's K grid steps by 2x, so 25% is well inside a step
K_APART = 1.25


def why_missed(goal: Goal, g: Regime, policy: str = DEFAULT_POLICY) -> str | None:
    """Why the default policy missed "within 5%" in this regime, from the panel's own records
    (mean K, network share, drift ratio, its decisions), and what would change it; None where
    it met the goal. Three cases, in this order: it missed the target in some seed (quality,
    runs stopped before the end counted apart); it was resolvably slower (the CI's lower bound
    above 1: time); or the seeds cannot tell (the CI spans 1, or there is none)."""
    if goal.within:
        return None
    m = g.method(policy)
    if m is None or not m.runs:
        return f"**did not finish**: none of its {goal.did_not_finish} runs finished."
    b = g.best_fixed
    mk, bk = statistics.fmean(m.mean_k), statistics.fmean(b.mean_k)
    ms, bs = statistics.fmean(m.net_share), statistics.fmean(b.net_share)
    md, bd = statistics.fmean(m.drift), statistics.fmean(b.drift)
    held, backs = decisions(m)
    level = "above" if mk > bk * K_APART else "below" if mk * K_APART < bk else "near"
    drift = "" if math.isnan(md) or math.isnan(bd) else f", drift ratio {md:.2f} ({bd:.2f})"
    said = (
        f"{policy} ran at a mean K of {mk:.1f}, {level} the best fixed K's {bk:.0f}; "
        f"{ms:.0%} of its time waited for the network ({bs:.0%} at the best fixed K){drift}; "
        f"{held:.0%} of its decisions held K at a cap, {backs:.1f} back-offs a run"
        f"{start_text(start_cost(m, b), goal.baseline_reached)}"
    )
    if goal.reached < 1.0:
        if not goal.baseline_reached:
            change = (
                "the best fixed K missed the target in some seed too: it lies near the most any "
                "K reaches in this run, so the run's length decides it before K does"
            )
        else:
            change = {
                "above": "a K nearer the best fixed K's on these shards, where drift at its "
                "larger K cost the quality the target asks for",
                "below": "not a smaller K: the best fixed K reached it at a larger one; the "
                "path (a back-off's or the cap's moves) rather than the level",
                "near": "the path rather than the level: the same mean K, fixed, reached it",
            }[level]
        missed_stopped = goal.did_not_finish - goal.reached_then_stopped
        stopped = f" ({missed_stopped} of them stopped before the end)" if missed_stopped else ""
        return (
            f"**quality**: the target missed in {1 - goal.reached:.0%} of the seeds{stopped}"
            f"{'' if goal.baseline_reached else ', and by the best fixed K in some'}; "
            f"{said}. What would change it: {change}."
        )
    if goal.ci_low is not None and goal.ci_low > 1.0:
        if level == "below":
            change = "a larger K here: it synchronized more often than the best fixed K" + (
                f", whose K = {bk:.0f} reached the target in every seed"
                if goal.baseline_reached
                else ""
            )
        elif level == "above":
            change = "a smaller K here: the drift of its larger K cost more steps than it saved"
        else:
            change = "its K path, not its level: the same mean K, fixed, was faster"
        return (
            f"**time**: resolvably slower, {goal.ratio:.3f}× (CI from {goal.ci_low:.3f}); "
            f"{said}. What would change it: {change}."
        )
    ratio = "—" if goal.ratio is None else f"{goal.ratio:.3f}×"
    if goal.ci_low is None or goal.ci_high is None:
        return f"**not resolved**: {ratio} with no CI (fewer than 2 paired seeds); {said}."
    if goal.ratio is not None and goal.ratio >= GOAL_WITHIN:
        need = f"its ratio is above {GOAL_WITHIN}, so more seeds alone would not bound it there"
    elif goal.seeds_for_within:
        need = (
            f"about {goal.seeds_for_within} seeds would bound it at {GOAL_WITHIN} were the "
            "ratio and spread the same"
        )
    else:
        need = f"with this spread no panel of {panel_stats.SEEDS_MAX} seeds would bound it"
    span = f"{goal.ci_low:.3f}–{goal.ci_high:.3f}"
    return f"**not resolved**: {ratio} ({span}), the CI spans 1: {need}; {said}."


def lowest_bound(
    summary: dict, g: Regime, keep: Callable[[str], bool], unbounded: bool = False
) -> tuple[str, dict] | None:
    """Of the regime's summary entries whose method `keep` admits, the one whose CI's upper bound
    is lowest, with its entry; None where none has a bound. With `unbounded`, entries with no CI
    (a single paired seed) are ranked after every bounded one instead of left out."""
    entries = summary["regimes"].get(g.name, {})
    ranked = sorted(
        (e.get("ci_high") is None, e.get("ci_high") or 0.0, name)
        for name, e in entries.items()
        if keep(name) and (unbounded or e.get("ci_high") is not None)
    )
    return (ranked[0][2], entries[ranked[0][2]]) if ranked else None


def nearest_faster(summary: dict, g: Regime) -> tuple[str, dict] | None:
    """The adaptive policy (not a fixed K, nor one set in hindsight) whose CI's upper bound is
    lowest in this regime (the nearest to "10% faster"), with its summary entry; None where no
    policy has one."""

    def adaptive(name: str) -> bool:
        m = g.method(name)
        return m is not None and not m.fixed and not in_hindsight(g, name)

    return lowest_bound(summary, g, adaptive)


def best_in_hindsight(summary: dict, g: Regime) -> tuple[str, dict] | None:
    """The arm whose K was set in advance (`scheduled`: per segment, chosen after the run) with
    the lowest CI upper bound in this regime, with its summary entry; None where the regime has
    none. It bounds what a policy that follows its segments with these K could show."""
    return lowest_bound(summary, g, lambda name: in_hindsight(g, name))


def hindsight_clause(summary: dict, g: Regime) -> str:
    """Where the regime ran K set in hindsight: its best, and whether even it was shown 10% faster
    (if not, no policy that sets K per segment from those K could be shown so here)."""
    bound = best_in_hindsight(summary, g)
    if bound is None:
        return ""
    name, e = bound
    if shown_faster(e):
        verdict = "shown 10% faster, so a policy following its segments could be"
    elif e["ci_high"] <= GOAL_FASTER:  # the bound met, a seed lost: the reach clause fails
        verdict = (
            f"its bound is met but it reached the target in {e['reached']:.0%} of seeds, so not "
            "shown 10% faster either"
        )
    else:
        verdict = (
            "not shown 10% faster either, so no policy that sets K per segment from these K "
            "could be shown so here"
        )
    return f"; K set in hindsight, at best {name}, {e['ratio']:.3f}× ({_ci(e)}): {verdict}"


def hindsight_within(summary: dict, g: Regime, goal: Goal) -> str:
    """For a regime where the default policy missed "within 5%" and K set in hindsight ran:
    whether any such arm was within 5% by the goal's own test (`is_within`), so whether a
    policy that sets K per segment from those K could meet the goal here. It names one that was
    (the lowest upper bound among them), else the one with the lowest upper bound."""
    entries = summary["regimes"].get(g.name, {})

    def within(name: str) -> bool:
        e = entries[name]
        return in_hindsight(g, name) and is_within(
            e.get("ci_high"), e["reached"], goal.baseline_reached
        )

    # an arm within by the reach clause alone may have no CI (a single paired seed)
    met = lowest_bound(summary, g, within, unbounded=True)
    bound = met or best_in_hindsight(summary, g)
    if bound is None:
        return ""
    name, e = bound
    if met is None:
        verdict = "was not shown within 5% either"
    elif e.get("ci_high") is not None and e["ci_high"] <= GOAL_WITHIN:
        verdict = "was within 5%, so a policy following its segments with these K could be"
    else:  # within by the reach clause: the best fixed K missed a seed, this arm none
        verdict = (
            "reached the target in every seed where the best fixed K did not, so a policy "
            "following its segments with these K could meet the goal"
        )
    ratio = "—" if e.get("ratio") is None else f"{e['ratio']:.3f}×"
    return f" K set in hindsight, at best {name}, {ratio} ({_ci(e)}), {verdict}."


def render_why(
    gs: list[Goal], regimes: list[Regime], summary: dict, policy: str = DEFAULT_POLICY
) -> str:
    """Per regime where the default policy missed "within 5%", why and what would change it
    (why_missed) and, where K set in hindsight ran, whether any such arm was within 5%
    (hindsight_within); then, per regime where no policy was 10% faster, the nearest, and whether
    even the best K set in hindsight was (hindsight_clause)."""
    by_name = {g.name: g for g in regimes}
    lines = ["### Why the goals were missed, from the records", "", f"Within 5% ({policy}):", ""]
    for goal in gs:
        g = by_name.get(goal.regime)
        why = None if g is None else why_missed(goal, g, policy)
        if why is not None and g is not None:
            lines.append(f"- {goal.regime}: {why}{hindsight_within(summary, g, goal)}")
    if len(lines) == 4:
        lines.append(f"- {policy} met it in every regime.")
    head = (
        f"10% faster (upper bound ≤ {GOAL_FASTER:.2f}, the target reached in every seed): where "
        "no policy was, the nearest:"
    )
    lines += ["", head, ""]
    for goal in gs:
        g = by_name.get(goal.regime)
        near = None if g is None or goal.faster else nearest_faster(summary, g)
        if near is not None:
            name, e = near
            missed = (
                ""
                if e.get("reached") == 1.0
                else (
                    f", the target reached in {e['reached']:.0%} of seeds (a seed missed counts at "
                    "its run's end, no crossing: not counted as faster)"
                )
            )
            lines.append(
                f"- {goal.regime}: {name}, {e['ratio']:.3f}× ({_ci(e)}){missed}"
                + ("" if g is None else hindsight_clause(summary, g))
            )
    return "\n".join(lines) + "\n"


def render_evidence(regimes: list[Regime], policy: str = DEFAULT_POLICY) -> str:
    """Why a goal is met or missed, from the panel's own records: per regime, the default policy
    beside the best fixed K (main seeds' means): the K it held, the share of time it waited for
    the network, the replicas' drift ratio, its first epoch's seconds, how many seeds reached the
    target and the final quality."""
    lines = [
        f"### The evidence: {policy} beside the best fixed K",
        "",
        "Main seeds' means after warmup: mean K; network share (exposed sync less the wait for a "
        "slower rank, over compute plus that: what the policy steers toward its target share); "
        "drift ratio (the replicas' disagreement over the averaged update); the first epoch's "
        "seconds (where an online policy measures the link before raising K); reached; final "
        "quality.",
        "",
        "| regime | method | mean K | network share | drift ratio | first epoch | reached "
        "| final |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in regimes:
        for m in (g.method(policy), g.best_fixed):
            if m is None or not m.runs:
                continue
            drift = statistics.fmean(m.drift)
            firsts = [x for x in map(first_epoch_seconds, m.runs) if x is not None]
            first = f"{statistics.fmean(firsts):.3g} s" if firsts else "—"
            lines.append(
                f"| {g.name} | {m.name} | {statistics.fmean(m.mean_k):.1f} | "
                f"{statistics.fmean(m.net_share):.0%} | "
                f"{'—' if math.isnan(drift) else f'{drift:.2f}'} | {first} | "
                f"{len(m.reached)}/{len(m.ttt)} | {g.judge.show(statistics.fmean(m.final))} |"
            )
    return "\n".join(lines) + "\n"


def render_summary(regimes: list[Regime]) -> str:
    """At a glance: each method's mean time to target over the best fixed K's, per regime (the
    best fixed K named in the header); 'n/r 2/3' when some seed never reached the target."""

    # the policies, and where a pilot planned the regime, its main seeds' other fixed arms (the
    # pilot's sweep ran on seeds of its own, so a fixed K here is an arm, e.g. a null arm)
    def arm(g: Regime, m: Method) -> bool:
        return not m.fixed or (g.plan is not None and m is not g.best_fixed)

    names = list(dict.fromkeys(m.name for g in regimes for m in g.methods if arm(g, m)))
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
            if m is None or not arm(g, m):
                cells.append("")
            elif not m.all_reached:
                cells.append(f"n/r {len(m.reached)}/{len(m.ttt)}")
            elif not g.best_fixed.all_reached:
                cells.append("—")
            else:
                cells.append(f"{m.ttt_mean() / g.best_fixed.ttt_mean():.2f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def with_k(m: Method) -> str:
    """The arm's name and, for a fixed arm, its K: 'best-fixed (K = 8)'."""
    k = arm_k(m)
    return m.name if k is None else f"{m.name} (K = {k})"


def render(regimes: list[Regime], summary: dict | None = None) -> str:
    parts = ["## Controller panel: every method against every fixed K, per regime", ""]
    parts += [render_summary(regimes)]
    for g in regimes:
        entries = (summary or {}).get("regimes", {}).get(g.name, {})
        if g.plan is None:
            parts.append(render_regime(g, entries))
            continue
        # the regime's name comes first
        heading, _, table = render_regime(g, entries).partition("\n")
        parts += [heading + "\n", render_plan(g), table, render_resolution(g, entries)]
    if summary is not None and (checks := summary.get("pilot_check")):
        kinds = {
            g.name: {
                m.name: "fixed" if m.fixed else "set in hindsight"
                for m in g.methods
                if m.fixed or in_hindsight(g, m.name)
            }
            for g in regimes
        }
        bests = {g.name: with_k(g.best_fixed) for g in regimes}
        parts += [pilot_check.render(checks, bests, kinds)]
    if summary is not None and (gs := goals(summary, regimes)):  # the default ran somewhere
        parts += ["## The goals", "", render_goals(gs)]
        parts += [render_evidence(regimes), render_why(gs, regimes, summary)]
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


def report(
    root: Path, runs: list[RunResult], stopped: Sequence[StoppedRun] = (), plan: dict | None = None
) -> str:
    """report.md (tables, goals, plots), panel.csv; returns the text. A main-seed run that did
    not finish counts as not reaching the target (summary_data). `plan`: root's plan.json as
    the caller read it (read here where not given)."""
    from autok.pilot import read_plan

    regimes = build_regimes(runs, read_plan(root) if plan is None else plan)
    if not regimes:  # nothing to judge against: refused, not an empty report
        raise ReportError(
            f"{root}: no regime has a fixed K on its main seeds (the best fixed K) to judge its "
            "policies against"
        )
    summary = summary_data(regimes, stopped=stopped)
    text = say_installations(f"# autok report: {root}\n\n" + render(regimes, summary), runs)
    if stopped:
        text += "\n## Runs that did not finish\n\n" + "".join(
            f"- {s.label} seed {s.seed}: {s.epochs_done} epoch(s); {s.why}"
            f"{crossed_before(s, regimes)}\n"
            for s in stopped
        )
    images = [(plot_quality(regimes, root / "panel_quality_vs_time.png"), "quality against time")]
    if any(not m.fixed for g in regimes for m in g.methods):  # else nothing to draw
        images.append(
            (plot_k_paths(regimes, root / "panel_k_paths.png"), "K paths of the adaptive policies")
        )
    write_text(
        root / "report.md",
        text + "\n" + "\n".join(f"![{alt}]({p.name})" for p, alt in images) + "\n",
    )
    write_csv(regimes, root / "panel.csv")
    write_text(root / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return text


def outcome(r: RunResult, judge: Judge, target: float) -> panel_stats.Outcome:
    """The run's interpolated crossing of the target (autok/panel_stats.py), and its end."""
    clock = epoch_clock(r)
    end = clock[-1] if clock else training_seconds(r.summary)
    return panel_stats.Outcome(time_to_target(r, judge, target), end)


def stopped_outcome(s: StoppedRun, judge: Judge, target: float) -> panel_stats.Outcome:
    """A main seed's run that did not finish (diverged, failed). Its time to target is the first
    crossing, whatever came after, so where the epochs it finished crossed the target that is
    its time, on the clock of those epochs' seconds (no summary gives the rest: evaluation and
    checkpoints, which the virtual clock does not model, so on the wall clock it reads a little
    early, as `epoch_clock` would not). Else it is a seed that did not reach the target, with no
    end time to bound it (panel_stats.DID_NOT_FINISH): dropped, it would make the method that
    diverged look as if it always reached; counted as not reached after it had, the method that
    reached first and diverged later would look as if it never had. Rows are read up to the
    first that cannot be (a crashed run's last row may be cut short)."""
    secs: list[float] = []
    values: list[float] = []
    for e in s.epochs:
        try:
            secs.append(float(e["epoch_seconds"]))
            values.append(judge.value(e))
        except (KeyError, TypeError, ValueError):
            del secs[len(values) :]  # the row's seconds read, its value not
            break
    clock = list(itertools.accumulate(secs))
    if not clock or not all(math.isfinite(x) and x >= 0 for x in secs):
        return panel_stats.DID_NOT_FINISH
    t = panel_stats.crossing_time(clock, values, target, higher_is_better=judge.accuracy)
    if t is None or not math.isfinite(t):
        return panel_stats.DID_NOT_FINISH
    return panel_stats.Outcome(t, clock[-1], finished=False)


def crossed_before(s: StoppedRun, regimes: list[Regime]) -> str:
    """What a stopped main-seed run's line adds where it had crossed its regime's target."""
    g = next((g for g in regimes if s.label.partition(" ")[2] == f"regime={g.name}"), None)
    if g is None or s.stage != "main":
        return ""
    o = stopped_outcome(s, g.judge, g.target)
    return "" if o.time is None else f"; it had crossed the target at {o.time:.2f} s: its time"


def summary_data(
    regimes: list[Regime], policy: str = DEFAULT_POLICY, stopped: Sequence[StoppedRun] = ()
) -> dict:
    """summary.json: each method's paired time-to-target ratio to its regime's best fixed K
    (docs/design.md §6, Judging a policy), crossings interpolated between evaluations. A main
    seed's run that did not finish (diverged, failed) counts by `stopped_outcome`. Where the
    pilot chose the best fixed K and other fixed K ran on the main seeds, `pilot_check` checks
    that choice there (autok/pilot_check.py)."""
    data = {}
    for g in regimes:
        methods = {
            m.name: {r.seed: outcome(r, g.judge, g.target) for r in m.runs} for m in g.methods
        }
        for s in stopped:
            method, _, variant = s.label.partition(" ")
            if s.stage == "main" and variant == f"regime={g.name}":
                methods.setdefault(method, {})[s.seed] = stopped_outcome(s, g.judge, g.target)
        data[g.name] = (g.best_fixed.name, methods)
    out = panel_stats.summary(policy, data)
    checks = {}
    for g in regimes:  # the pilot's choice, checked where other fixed K ran on the main seeds
        # fixed arms at another K: one at the pilot's own K (a null arm) checks nothing
        others = [m.name for m in g.methods if m.fixed and arm_k(m) != arm_k(g.best_fixed)]
        if g.plan is not None and (
            c := pilot_check.check(
                g.best_fixed.name, others, out["regimes"][g.name], data[g.name][1]
            )
        ):
            checks[g.name] = c
    return out | ({"pilot_check": checks} if checks else {})


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


def _colors(regimes: list[Regime]) -> dict[str, tuple]:
    """One colour per method name across every regime's panel, so a colour means one method."""
    from matplotlib import colormaps

    methods = [m for g in regimes for m in g.methods]
    fixed = list(dict.fromkeys(m.name for m in methods if m.fixed))
    other = list(dict.fromkeys(m.name for m in methods if not m.fixed))
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
    colors = _colors(regimes)
    for ax, g in zip(axes, regimes, strict=True):
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
        finals = [scale * statistics.fmean(m.final) for m in g.methods]
        if g.judge.accuracy:  # the target and every method's end in view
            ax.set_ylim(max(0.0, min(scale * g.target - 15, min(finals) - 5)), None)
        else:
            ax.set_ylim(None, max(g.target * 1.25, max(finals) * 1.05))
        ax.legend(fontsize=6, ncol=2)
    virtual = any(
        r.summary.get("virtual_seconds") is not None
        for g in regimes
        for m in g.methods
        for r in m.runs
    )
    clock = "the virtual clock (modelled s)" if virtual else "wall-clock (s)"
    fig.supxlabel(f"training time on {clock}; dotted: the regime's target", fontsize=9)
    fig.suptitle("Quality against training time, per regime (mean over seeds)")
    return save(fig, out)


def plot_k_paths(regimes: list[Regime], out: Path) -> Path:
    """panel_k_paths.png. The question: what K did each adaptive policy choose, and did it
    follow the link? K over training time (first seed; compute + exposed sync of the boundary
    records), with each change of the emulated link marked and named."""
    plt = pyplot()
    fig, axes = _grid(plt, len(regimes))
    colors = _colors(regimes)
    for ax, g in zip(axes, regimes, strict=True):
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
        ax.legend(fontsize=6)
    fig.supxlabel("training time (s) of the first seed; dotted: the link changes", fontsize=9)
    fig.supylabel("K in force")
    fig.suptitle("K paths of the adaptive policies")
    return save(fig, out)
