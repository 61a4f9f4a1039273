"""Where a run's time goes, link phase by link phase: on a changing link (`--link-schedule`) the
time each arm of a panel spent in each phase, the steps it took there and how many of them a
round held, averaged over seeds, and the epoch where it crossed the target. It separates an
online policy's levels from its following: an arm scheduled at the policy's own K per phase
(`--k-schedule`) spends the time those levels cost, so the policy's excess over it, phase by
phase, is what learning of each change costs it (docs/design.md §6, "what following costs").

    python -m benchmarks.phase_time DIR [--regime NAME] [--against ARM]

A phase is a run of boundary records naming one link in a row (the record's `link`): its time is
the sum of their compute and exposed-sync seconds, and its steps per round (/rd) its steps over
its records, the sync count that costs time (a round also ends at an epoch's end). A record holds
the previous boundary's averaging (docs/design.md §6, "the first boundary"), so a phase's first
record holds the last averaging on the link before, and its own last averaging is booked to the
next phase: a phase's time is its own to within one round's sync.

Runs are grouped by their directory's arm and regime (`ARM_regime=NAME/seed-S`, as `autok
experiment run` writes them). Arms on seeds of their own (a pilot's) are left out, and only the
seeds every other arm of the regime finished are counted, so each mean is over the same seeds.
With `--against ARM`, each arm's time per phase is also given as a difference from ARM's: its
mean and range over those seeds. Where DIR's plan.json holds the regime's target, each arm's
epoch of crossing it is given too, its mean and range over the runs that crossed it and how many
did (interpolated between evaluations as the report's time to target is, on the epoch count
instead of the clock): two arms that spend the same time per phase can cross the target epochs
apart where a larger K costs steps.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from autok.panel_stats import crossing_time
from autok.report import ReportError, read_boundaries, read_epochs

RUN_DIR = re.compile(r"^(?P<arm>.+?)_regime=(?P<regime>[^/]+)$")
SEED_DIR = re.compile(r"^seed-(?P<seed>\d+)$")


@dataclass
class Phase:
    link: str
    seconds: float = 0.0
    steps: int = 0
    rounds: int = 0


@dataclass
class Run:
    phases: list[Phase]
    judged: bool = False  # the plan names the regime's target
    crossed: float | None = None  # the epochs it took to cross it; None where it never did


def phases(records: list[dict]) -> list[Phase]:
    """The run's link phases in order. Steps per round, not the K set, is what a phase's sync
    costs: a round also ends at an epoch's end, so on 32 steps an epoch K = 18 syncs twice an
    epoch, as K = 16 does."""
    out: list[Phase] = []
    for rec in records:
        link = str(rec.get("link", "?"))
        if not out or out[-1].link != link:
            out.append(Phase(link))
        out[-1].seconds += float(rec["compute_seconds"]) + float(rec["exposed_sync_seconds"])
        out[-1].steps += int(rec["interval_steps"])
        out[-1].rounds += 1
    return out


def crossing_epoch(run: Path, target: float, accuracy: bool) -> float | None:
    """The epochs the run took to cross the target (an evaluation at the end of each epoch, the
    epoch column counted from 0), interpolated between evaluations; None where it never did."""
    column = "test_accuracy" if accuracy else "test_loss"
    rows = read_epochs(run / "epochs.csv", numbers=(column,), counts=("epoch",))
    values = [float(r[column]) for r in rows]
    epochs = [float(r["epoch"]) + 1 for r in rows]
    return crossing_time(epochs, values, target, higher_is_better=accuracy)


def targets(root: Path) -> dict[str, tuple[float, bool]]:
    """{regime: (target, higher is better)} from the directory's plan.json, where it has one."""
    try:
        plan = json.loads((root / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    for key, entry in plan.items() if isinstance(plan, dict) else ():
        if key.startswith("regime=") and isinstance(entry, dict) and "target" in entry:
            target = entry["target"]
            if isinstance(target, bool) or not isinstance(target, (int, float)):
                raise ReportError(f"{root / 'plan.json'}: {key}: target {target!r} is not a number")
            out[key.removeprefix("regime=")] = (float(target), entry.get("metric") == "accuracy")
    return out


def collect(root: Path) -> dict[str, dict[str, dict[int, Run]]]:
    """{regime: {arm: {seed: Run}}} for every finished run under `root`."""
    goal = targets(root)
    found: dict[str, dict[str, dict[int, Run]]] = defaultdict(dict)
    for run_dir in sorted(root.iterdir()):
        m = RUN_DIR.match(run_dir.name)
        if m is None or not run_dir.is_dir():
            continue
        for seed_dir in sorted(run_dir.iterdir()):
            s = SEED_DIR.match(seed_dir.name)
            if s is None or not (seed_dir / "summary.json").is_file():
                continue  # not finished (a diverged run has no summary)
            try:
                run = Run(phases(read_boundaries(seed_dir / "boundaries.jsonl")))
                if m["regime"] in goal:
                    run.judged = True
                    run.crossed = crossing_epoch(seed_dir, *goal[m["regime"]])
            except ReportError:
                raise
            except (KeyError, ValueError, OSError) as exc:  # a field missing or not a number
                raise ReportError(f"{seed_dir}: {type(exc).__name__}: {exc}") from None
            found[m["regime"]].setdefault(m["arm"], {})[int(s["seed"])] = run
    return found


def main_arms(arms: dict[str, dict[int, Run]]) -> tuple[dict[str, dict[int, Run]], list[str]]:
    """The arms that ran on the regime's main seeds (any seed in common with the arm that ran
    the most), and the names of those left out (a pilot's runs on seeds of their own)."""
    most = set(max(arms.values(), key=len))
    kept = {a: by_seed for a, by_seed in arms.items() if most & set(by_seed)}
    return kept, sorted(set(arms) - set(kept))


def crossed(runs: list[Run]) -> str:
    """The mean epoch of crossing the target over the runs that crossed it, and how many did."""
    if not all(r.judged for r in runs):
        return ""
    at = [r.crossed for r in runs if r.crossed is not None]
    if not at:
        return f"— (0/{len(runs)})"
    return f"{statistics.fmean(at):.2f} ({min(at):.2f}–{max(at):.2f}; {len(at)}/{len(runs)})"


def table(arms: dict[str, dict[int, Run]], against: str | None) -> list[str]:
    """One regime's lines: per arm and phase, mean seconds, steps and steps per round over the
    seeds every arm on the main seeds finished, and the mean epoch of crossing the target."""
    arms, apart = main_arms(arms)
    seeds = sorted(set.intersection(*(set(by_seed) for by_seed in arms.values())))
    if not seeds:
        return ["  no seed that every arm finished"]
    shapes = {tuple(p.link for p in arms[a][s].phases) for a in arms for s in seeds}
    if len(shapes) != 1:
        return ["  the arms' runs do not share one sequence of links: not comparable"]
    links = next(iter(shapes))
    lines = [f"  {len(seeds)} seeds ({seeds[0]}-{seeds[-1]}); phases: {' -> '.join(links)}"]
    if apart:
        lines.append(f"  left out, on seeds of their own: {', '.join(apart)}")
    header = "  arm".ljust(26) + "".join(f"{f'{i + 1}: {ln}':>28}" for i, ln in enumerate(links))
    judged = all(arms[a][s].judged for a in arms for s in seeds)
    crossing = "   target at epoch (range; crossed)" if judged else ""
    lines += [header + f"{'total (s)':>12}{crossing}"]
    for arm in sorted(arms):
        runs = [arms[arm][s] for s in seeds]
        cells = []
        for i in range(len(links)):
            sec = statistics.fmean(r.phases[i].seconds for r in runs)
            steps = statistics.fmean(r.phases[i].steps for r in runs)
            rounds = statistics.fmean(r.phases[i].rounds for r in runs)
            cells.append(f"{sec:7.2f} s {steps:4.0f} st {steps / rounds:5.1f}/rd")
        total = statistics.fmean(sum(p.seconds for p in r.phases) for r in runs)
        row = f"  {arm}".ljust(26) + "".join(f"{c:>28}" for c in cells)
        lines.append(row + f"{total:12.2f}   {crossed(runs)}")
    if against is not None and against not in arms:
        lines.append(f"  no arm {against} in this regime: no differences")
    elif against is not None:
        lines.append(f"  seconds over {against}'s, per phase: mean (range over seeds)")
        for arm in sorted(a for a in arms if a != against):
            cells = []
            for i in range(len(links)):
                d = [
                    arms[arm][s].phases[i].seconds - arms[against][s].phases[i].seconds
                    for s in seeds
                ]
                cells.append(f"{statistics.fmean(d):+.2f} ({min(d):+.2f}..{max(d):+.2f})")
            lines.append(f"  {arm}".ljust(26) + "".join(f"{c:>28}" for c in cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.phase_time", description=__doc__)
    ap.add_argument("dir", type=Path, help="an `autok experiment run` directory")
    ap.add_argument("--regime", help="only this regime (default: every one)")
    ap.add_argument("--against", help="an arm to subtract, phase by phase, seed by seed")
    args = ap.parse_args(argv)
    if not args.dir.is_dir():
        print(f"phase_time: {args.dir}: not a directory", file=sys.stderr)
        return 2
    try:
        found = collect(args.dir)
    except (ReportError, OSError) as exc:
        print(f"phase_time: {exc}", file=sys.stderr)
        return 2
    if args.regime is not None and args.regime not in found:
        print(
            f"phase_time: no finished run of regime {args.regime!r} in {args.dir}", file=sys.stderr
        )
        return 2
    regimes = [args.regime] if args.regime else sorted(found)
    known = {a for r in regimes for a in main_arms(found[r])[0]}
    if args.against is not None and args.against not in known:
        print(
            f"phase_time: --against {args.against}: no such arm on the main seeds "
            f"(arms: {', '.join(sorted(known))})",
            file=sys.stderr,
        )
        return 2
    for regime in regimes:
        print(f"{regime}:")
        print("\n".join(table(found[regime], args.against)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
