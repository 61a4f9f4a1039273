"""How skewed do a panel's shards read, on its fixed-K runs? The drift ratio (the replicas'
disagreement over the averaged update, `boundaries.jsonl`) is what `exposed-sync` judges skew by
(controllers/exposed_sync.py), and it falls as K grows; this fits that fall and puts every run on
one scale, to see whether one reading could tell mild skew from strong.

    python -m benchmarks.skew_signal DIR [--steps 64]

For every run at a fixed K ≥ 2 (its `run.yaml` names no policy: the pilot's runs and the best
fixed K's) it takes the mean drift ratio of the boundaries in the first `--steps` steps, fits
log ratio = a(regime, seed) − γ·log K by least squares over all of them, and prints per regime
and K the ratios' range over seeds and the index ratio·(K/4)^γ: the ratio each run would read at
K = 4. K = 1 is left out, as the rule leaves it out: the replicas start every step together, and
the ratio reads about 0.9 on any shards (docs/design.md §6).

Beside it, the window `exposed-sync` itself judges skew on: each of its runs' first 4 boundaries
and 32 steps in a row at K ≥ 2 (controllers/exposed_sync.py: a boundary at K = 1 starts it again),
its mean drift ratio, and the index at that window's mean K (`judged_windows`); with
`--judge-rounds R --judge-steps S` a longer window (12 and 96: the one `--skew-strong` grades
on), and with `--per-seed` each run's reading. A run labelled other than `exposed-sync` (an
arm with its own options) is a row of its own.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from autok.controllers.exposed_sync import GUARD_MIN_STEPS
from autok.controllers.options import PolicySettings
from autok.report import read_boundaries

REGIME = re.compile(r"(?:^|_)regime=([^_]+)")


def run_settings(run: Path) -> dict | None:
    """The run's run.yaml, or None where it has none readable."""
    try:
        settings = yaml.safe_load((run / "run.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return settings if isinstance(settings, dict) else None


def fixed_k(run: Path) -> int | None:
    """The run's K if it ran at one fixed K ≥ 2 (no policy), else None."""
    settings = run_settings(run)
    if settings is None or settings.get("policy", "fixed") != "fixed":
        return None
    k = settings.get("sync_period")
    return k if isinstance(k, int) and k >= 2 and settings.get("strategy") == "cpdp" else None


def early_ratios(root: Path, steps: int) -> dict[tuple[str, int, str], float]:
    """{(regime, K, seed): mean drift ratio over the boundaries before `steps`}, for the runs at
    a fixed K ≥ 2 with at least one finite ratio there; a seed run at one K under two labels
    (the pilot's kN and a best fixed K) counts once."""
    out = {}
    for run in sorted(root.glob("*/seed-*")):
        m, k = REGIME.search(run.parent.name), fixed_k(run)
        path = run / "boundaries.jsonl"
        if m is None or k is None or not path.is_file():
            continue
        ratios = [
            float(r["drift_ratio"])
            for r in read_boundaries(path)
            if r.get("global_step", math.inf) < steps and r.get("drift_ratio") is not None
        ]
        ratios = [x for x in ratios if math.isfinite(x) and x > 0]
        if ratios:
            out[(m.group(1), k, run.name)] = sum(ratios) / len(ratios)
    return out


def fall_with_k(ratios: dict[tuple[str, int, str], float]) -> float:
    """γ in log ratio = a(regime, seed) − γ·log K, least squares, each (regime, seed) its own a:
    the within-group slope of log ratio on log K, pooled. NaN when no group has two Ks."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for (regime, k, seed), r in ratios.items():
        groups[(regime, seed)].append((math.log(k), math.log(r)))
    sxy = sxx = 0.0
    for pts in groups.values():
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxy += sum((x - mx) * (y - my) for x, y in pts)
        sxx += sum((x - mx) ** 2 for x, _ in pts)
    return -sxy / sxx if sxx > 0 else math.nan


def table(ratios: dict[tuple[str, int, str], float], gamma: float) -> list[str]:
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (regime, k, _), r in ratios.items():
        by[(regime, k)].append(r)
    lines = [
        f"drift ratio falls as K^-{gamma:.2f} (fitted); index = ratio x (K/4)^{gamma:.2f}",
        "| regime | K | seeds | drift ratio | index |",
        "|---|---|---|---|---|",
    ]
    for (regime, k), rs in sorted(by.items()):
        scale = (k / 4) ** gamma
        lines.append(
            f"| {regime} | {k} | {len(rs)} | {min(rs):.2f}-{max(rs):.2f} "
            f"| {min(rs) * scale:.2f}-{max(rs) * scale:.2f} |"
        )
    return lines


# the window exposed-sync judges skew on, at its defaults (controllers/exposed_sync.py)
JUDGED_ROUNDS = PolicySettings.model_fields["sync_window"].default
JUDGED_STEPS = GUARD_MIN_STEPS


def judged_windows(
    root: Path, rounds: int = JUDGED_ROUNDS, steps: int = JUDGED_STEPS
) -> dict[str, list[tuple[float, float, str]]]:
    """{regime: [(mean drift ratio, mean K, seed)]}: each `exposed-sync` run's first window of
    `rounds` boundaries and `steps` steps in a row at K ≥ 2, by default the one its skew is
    judged on (whole-model boundaries: a run with --fragments counts rounds, not read here)."""
    out: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for run in sorted(root.glob("*/seed-*")):
        m, path = REGIME.search(run.parent.name), run / "boundaries.jsonl"
        settings = run_settings(run)
        if m is None or settings is None or settings.get("policy") != "exposed-sync":
            continue
        label = run.parent.name.split("_regime=")[0]
        row = m.group(1) if label == "exposed-sync" else f"{m.group(1)} ({label})"
        if not path.is_file():
            continue
        window: list[tuple[float, int, int]] = []
        for r in read_boundaries(path):
            k, ratio = int(r.get("sync_period", 1)), float(r.get("drift_ratio", math.nan))
            if k < 2:
                window = []
                continue
            window.append((ratio, k, int(r.get("interval_steps", k))))
            if len(window) >= rounds and sum(w[2] for w in window) >= steps:
                mean = sum(w[0] for w in window) / len(window)
                if math.isfinite(mean):
                    k_mean = sum(w[1] for w in window) / len(window)
                    out[row].append((mean, k_mean, run.name))
                break
    return out


def judged_table(
    judged: dict[str, list[tuple[float, float, str]]],
    gamma: float,
    rounds: int = JUDGED_ROUNDS,
    steps: int = JUDGED_STEPS,
    per_seed: bool = False,
) -> list[str]:
    lines = [
        f"exposed-sync's window of its first {rounds} boundaries and {steps} steps at K >= 2"
        + (
            " (the one it judges skew on)"
            if (rounds, steps) == (JUDGED_ROUNDS, JUDGED_STEPS)
            else ""
        ),
        "| regime | runs | mean K | drift ratio | index |" + (" per seed |" if per_seed else ""),
        "|---|---|---|---|---|" + ("---|" if per_seed else ""),
    ]
    for regime, rows in sorted(judged.items()):
        ks = [k for _, k, _ in rows]
        index = [r * (k / 4) ** gamma for r, k, _ in rows]
        seeds = ", ".join(f"{seed.removeprefix('seed-')} {r:.2f}" for r, _, seed in rows)
        lines.append(
            f"| {regime} | {len(rows)} | {min(ks):.1f}-{max(ks):.1f} "
            f"| {min(r for r, _, _ in rows):.2f}-{max(r for r, _, _ in rows):.2f} "
            f"| {min(index):.2f}-{max(index):.2f} |" + (f" {seeds} |" if per_seed else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="an experiment directory with fixed-K runs")
    p.add_argument("--steps", type=int, default=64, help="read the boundaries before this step")
    p.add_argument(
        "--judge-rounds", type=int, default=JUDGED_ROUNDS, help="exposed-sync's window: rounds"
    )
    p.add_argument(
        "--judge-steps", type=int, default=JUDGED_STEPS, help="exposed-sync's window: steps"
    )
    p.add_argument("--per-seed", action="store_true", help="each run's reading of that window")
    args = p.parse_args(argv)
    if not args.dir.is_dir():
        p.error(f"{args.dir}: not a directory")
    for name in ("steps", "judge_rounds", "judge_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: at least 1")
    ratios = early_ratios(args.dir, args.steps)
    if not ratios:
        print(f"{args.dir}: no fixed-K run (kN_regime=R/seed-S) with a drift ratio")
        return 1
    gamma = fall_with_k(ratios)
    print("\n".join(table(ratios, gamma)))
    if judged := judged_windows(args.dir, args.judge_rounds, args.judge_steps):
        lines = judged_table(judged, gamma, args.judge_rounds, args.judge_steps, args.per_seed)
        print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
