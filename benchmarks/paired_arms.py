"""Two arms of an experiment, paired by seed: how their final quality and their time to the
target differ, per regime. `autok report` compares every arm with the best fixed K; this reads
two arms against each other (docs/controller-panel/warmup-check/: the epoch at K = 1 against the
LR warmup alone), or one arm against the same arm of another run of the panel (`--b-csv`: a
rerun against the committed panel.csv).

    python -m benchmarks.paired_arms PANEL_CSV ARM_A ARM_B [--b-csv OTHER_PANEL_CSV]

From panel.csv (autok/panel.py `write_csv`), for every regime where both arms ran a seed:
- the final quality, A − B per seed: its mean, range and paired t-test p, and in how many seeds
  A's is the higher (validation loss: lower is better; accuracy: higher is better);
- the seeds that reached the target under each arm;
- the time to the target, A over B, on the seeds both reached: the exp of the mean per-seed log
  ratio with its 95% t-CI (autok/panel_stats.py `paired_log_ratio`, as the report pairs);
- the mean K of each.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from autok.panel_stats import paired_log_ratio


@dataclass(frozen=True)
class Row:
    time: float | None  # time to the target; None where the run did not reach it
    final: float
    mean_k: float


def read(path: Path, arm: str) -> dict[tuple[str, int], Row]:
    """{(regime, seed): Row} of one arm (panel.csv's `method`)."""
    out: dict[tuple[str, int], Row] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["method"] != arm:
                continue
            t = r["time_to_target"]
            time = float(t) if t not in ("", "nan", "None") else None
            out[(r["regime"], int(r["seed"]))] = Row(time, float(r["final"]), float(r["mean_k"]))
    return out


def compare(a: dict[tuple[str, int], Row], b: dict[tuple[str, int], Row]) -> dict[str, dict]:
    """Per regime, the paired figures of the module's docstring."""
    from scipy import stats

    out: dict[str, dict] = {}
    for regime in sorted({g for g, _ in a} & {g for g, _ in b}):
        seeds = sorted(s for g, s in a if g == regime and (g, s) in b)
        ra, rb = [a[(regime, s)] for s in seeds], [b[(regime, s)] for s in seeds]
        diff = [x.final - y.final for x, y in zip(ra, rb, strict=True)]
        p = math.nan
        if len(seeds) > 1 and statistics.pstdev(diff) > 0:
            p = float(stats.ttest_rel([x.final for x in ra], [y.final for y in rb]).pvalue)
        both = [(x.time, y.time) for x, y in zip(ra, rb, strict=True) if x.time and y.time]
        ratio = paired_log_ratio([t for t, _ in both], [t for _, t in both]) if both else None
        out[regime] = {
            "seeds": len(seeds),
            "final_diff": statistics.fmean(diff),
            "final_diff_range": (min(diff), max(diff)),
            "a_higher": sum(d > 0 for d in diff),
            "p_final": p,
            "reached": (sum(x.time is not None for x in ra), sum(y.time is not None for y in rb)),
            "time_ratio": ratio,
            "mean_k": (
                statistics.fmean(x.mean_k for x in ra),
                statistics.fmean(y.mean_k for y in rb),
            ),
        }
    return out


def line(regime: str, arm_a: str, arm_b: str, c: dict) -> str:
    lo, hi = c["final_diff_range"]
    r = c["time_ratio"]
    time = "no seed reached by both"
    if r is not None:
        time = f"{r.ratio:.3f} ({r.ci_low:.3f}-{r.ci_high:.3f}) on {r.n} seeds both reached"
    return (
        f"{regime}: {arm_a} - {arm_b}, {c['seeds']} seeds: final {c['final_diff']:+.4f} "
        f"({lo:+.4f} to {hi:+.4f}; A higher in {c['a_higher']}), paired p {c['p_final']:.3g}; "
        f"reached {c['reached'][0]} against {c['reached'][1]}; time A/B {time}; "
        f"mean K {c['mean_k'][0]:.1f} against {c['mean_k'][1]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("panel_csv", type=Path)
    p.add_argument("arm_a")
    p.add_argument("arm_b")
    p.add_argument("--b-csv", type=Path, help="read ARM_B from this panel.csv (default: the same)")
    args = p.parse_args(argv)
    for path in (args.panel_csv, args.b_csv):
        if path is not None and not path.is_file():
            print(f"paired_arms: {path}: no such file", file=sys.stderr)
            return 2
    a = read(args.panel_csv, args.arm_a)
    b = read(args.b_csv or args.panel_csv, args.arm_b)
    found = compare(a, b)
    if not found:
        print(f"paired_arms: no regime where both {args.arm_a} and {args.arm_b} ran a seed")
        return 1
    for regime, c in found.items():
        print(line(regime, args.arm_a, args.arm_b, c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
