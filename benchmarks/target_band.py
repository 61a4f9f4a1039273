"""How much of a panel's per-seed spread is where a run crosses one target? The panel judges a
policy by its time to one target, interpolated between evaluations (autok/panel.py); a run's
accuracy wobbles from one evaluation to the next, so two runs that train alike can cross it an
evaluation apart. This reads the same runs on a band of targets below it and compares the spread.

    python -m benchmarks.target_band DIR [--width 0.04] [--points 9]

For every regime of a panel directory (the pilot's target and best fixed K, as the report reads
them), and every method against the best fixed K, seeds paired: the ratio of times to the target
(the panel's measure) and the ratio of band times, a run's band time being the geometric mean of
its times to `--points` targets evenly spaced from the target down by `--width` (accuracy; up,
for a validation loss). A run that reaches the target has crossed every target of the band before
it, so both read the same seeds. Printed: each ratio with its 95% CI, the sd of the per-seed log
ratios, and the seeds that would bound the ratio under 1.05 at that spread (80% power).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from autok import panel, panel_stats
from autok.panel import Regime
from autok.report import RunResult


@dataclass(frozen=True)
class Band:
    width: float
    points: int

    def targets(self, target: float, accuracy: bool) -> list[float]:
        """The band's targets, easiest first, the panel's own last."""
        step = self.width / (self.points - 1)
        sign = -1.0 if accuracy else 1.0
        return [target + sign * (self.width - i * step) for i in range(self.points)]


def band_time(r: RunResult, g: Regime, band: Band) -> float | None:
    """The geometric mean of the run's times to the band's targets; None where it missed one."""
    times = [panel.time_to_target(r, g.judge, t) for t in band.targets(g.target, g.judge.accuracy)]
    if any(t is None or t <= 0 for t in times):
        return None
    return math.exp(sum(math.log(t) for t in times if t is not None) / len(times))


@dataclass(frozen=True)
class Row:
    regime: str
    method: str
    single: panel_stats.PairedRatio
    band: panel_stats.PairedRatio


def rows(g: Regime, band: Band) -> list[Row]:
    """Every method of the regime against its best fixed K, on the seeds where both reached the
    target (at least two)."""
    out = []
    # the times to the target, as build_regimes read them (Method.ttt, one per run)
    best = {r.seed: (r, t) for r, t in zip(g.best_fixed.runs, g.best_fixed.ttt, strict=True)}
    for m in g.methods:
        if m is g.best_fixed:
            continue
        pairs = []
        for r, t1 in zip(m.runs, m.ttt, strict=True):
            if r.seed not in best:
                continue
            b, t0 = best[r.seed]
            s1, s0 = band_time(r, g, band), band_time(b, g, band)
            if None not in (t1, t0, s1, s0):
                pairs.append((t1, t0, s1, s0))
        if len(pairs) >= 2:
            single = panel_stats.paired_log_ratio([p[0] for p in pairs], [p[1] for p in pairs])
            banded = panel_stats.paired_log_ratio([p[2] for p in pairs], [p[3] for p in pairs])
            out.append(Row(g.name, m.name, single, banded))
    return out


def _cell(p: panel_stats.PairedRatio) -> str:
    seeds = panel_stats.seeds_for_bound(p.ratio, p.sd_log, panel_stats.GOAL_WITHIN)
    need = "—" if seeds is None else str(seeds)
    return f"{p.ratio:.3f} ({p.ci_low:.3f}–{p.ci_high:.3f}) | {p.sd_log:.3f} | {need}"


def table(all_rows: list[Row], band: Band) -> list[str]:
    lines = [
        f"band: {band.points} targets over {band.width:g} below each regime's target",
        "| regime | method | seeds | one target: ratio (95% CI) | sd | seeds for ≤ 1.05 "
        "| band: ratio (95% CI) | sd | seeds for ≤ 1.05 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in all_rows:
        lines.append(
            f"| {r.regime} | {r.method} | {r.single.n} | {_cell(r.single)} | {_cell(r.band)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    from autok.pilot import read_plan
    from autok.report import collect

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="a panel's experiment directory")
    p.add_argument("--width", type=float, default=0.04, help="the band's width (accuracy: 0.04)")
    p.add_argument("--points", type=int, default=9, help="targets in the band, at least 2")
    args = p.parse_args(argv)
    if not args.dir.is_dir():
        p.error(f"{args.dir}: not a directory")
    if not 0 < args.width < 1:
        p.error("--width: give a width in (0, 1)")
    if not 2 <= args.points <= 101:
        p.error("--points: give 2 to 101")
    band = Band(args.width, args.points)
    regimes = panel.build_regimes(collect(args.dir), read_plan(args.dir))
    found = [row for g in regimes for row in rows(g, band)]
    if not found:
        print(f"{args.dir}: no regime with a method and its best fixed K on two seeds")
        return 1
    print("\n".join(table(found, band)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
