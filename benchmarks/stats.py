"""Ratios over interleaved rounds: median, spread and a verdict against a goal (pure functions).

A benchmark ratio is taken once per round (each round runs both sides, one after the other), so
drift in machine load hits both alike; the figure reported is the median of the per-round
ratios (never the ratio of two medians) with its spread, the min and max of the per-round
ratios. A goal is met only when the whole spread is on its side: a spread that crosses the goal
is "not resolved", and so is a figure from fewer than MIN_ROUNDS rounds.

    >>> fmt(summarize([1.00, 1.01, 1.05, 0.98, 1.02, 1.03, 1.014], goal=1.02))
    '1.014× (0.980–1.050, 7 rounds; goal ≤ 1.02×): not resolved'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

MIN_ROUNDS = 7  # fewer rounds give no verdict ("at least 7 interleaved rounds")
DIRECTIONS = {"le": "≤", "ge": "≥"}  # the goal is an upper bound (le) or a lower bound (ge)
VERDICTS = ("met", "not met", "not resolved")


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-round ratios numerators[i] / denominators[i] (the two sides of one round)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators for {len(denominators)} denominators")
    out = []
    for n, d in zip(numerators, denominators, strict=True):
        if not (math.isfinite(n) and math.isfinite(d)) or d <= 0:
            raise ValueError(f"ratio {n!r} / {d!r}: both must be finite, the denominator > 0")
        out.append(n / d)
    return out


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-round values."""
    if not values:
        raise ValueError("no rounds")
    return statistics.median(values), min(values), max(values)


def verdict(
    values: Sequence[float], goal: float, direction: str = "le", min_rounds: int = MIN_ROUNDS
) -> str:
    """The verdict: "met" when every round is on the goal's side (≤ goal for "le", ≥ for
    "ge"), "not met" when every round misses it, else "not resolved" (the spread crosses the
    goal), as is a figure from fewer than `min_rounds` rounds."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: choose from {', '.join(DIRECTIONS)}")
    _, lo, hi = spread(values)
    if len(values) < min_rounds:
        return "not resolved"
    if direction == "ge":
        lo, hi, goal = -hi, -lo, -goal  # "≥ goal" is "≤ -goal" on the negated values
    if hi <= goal:
        return "met"
    if lo > goal:
        return "not met"
    return "not resolved"


def summarize(
    values: Sequence[float],
    goal: float | None = None,
    direction: str = "le",
    min_rounds: int = MIN_ROUNDS,
) -> dict:
    """The JSON form of one ratio: median, min, max, the rounds, and goal and verdict if any."""
    med, lo, hi = spread(values)
    out: dict = {"median": med, "min": lo, "max": hi, "rounds": list(values)}
    if goal is not None:
        out |= {
            "goal": goal,
            "direction": direction,
            "verdict": verdict(values, goal, direction, min_rounds),
        }
    return out


def fmt(summary: dict, digits: int = 3) -> str:
    """'1.014× (0.980–1.050, 7 rounds; goal ≤ 1.02×): not resolved' (no goal: no verdict)."""
    n = len(summary["rounds"])
    text = (
        f"{summary['median']:.{digits}f}× ({summary['min']:.{digits}f}–"
        f"{summary['max']:.{digits}f}, {n} round{'s' if n != 1 else ''}"
    )
    if "goal" not in summary:
        return text + ")"
    sign = DIRECTIONS[summary["direction"]]
    return text + f"; goal {sign} {summary['goal']:g}×): {summary['verdict']}"


TRIM = 0.01  # paired_round's trimmed mean drops this share of the differences at each end


def paired_round(ours: dict, plain: dict) -> dict:
    """One round of two sides timed step by step on the same keys (batches): `ours[k]` and
    `plain[k]` ran back to back on batch k, a pair. Returns the round's paired ratio
    1 + median(ours[k] − plain[k]) / median(plain), the excess (that median difference), each
    side's median, the pairs, and the mean difference with the TRIM share of pairs dropped at
    each end (which counts work that lands on a few steps, as the median does not). A slow
    stretch of a shared machine lasts many steps and so hits both steps of a pair: it drops out
    of their difference, where it moves the ratio of two medians that it hit unequally."""
    if not ours or ours.keys() != plain.keys():
        raise ValueError("the two sides timed different steps: no pairs")
    diffs = sorted(ours[k] - plain[k] for k in ours)
    cut = int(len(diffs) * TRIM)
    kept = diffs[cut : len(diffs) - cut]
    plain_median = statistics.median(plain.values())
    excess = statistics.median(diffs)
    return {
        "ratio": 1.0 + excess / plain_median,
        "excess": excess,
        "trimmed_excess": sum(kept) / len(kept),
        "ours": statistics.median(ours.values()),
        "plain": plain_median,
        "pairs": len(diffs),
    }
