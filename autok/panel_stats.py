"""The controller panel's statistics (docs/design.md §6, Judging a policy): pure functions, no
files, no runs.

A policy is judged by its time to a target quality against the regime's best fixed K, seeds
paired across methods:

- crossing: the time at which a (time, quality) curve first meets the target, linearly
  interpolated between the evaluation before and the evaluation at the crossing (the first
  evaluation itself when it already meets it); None when the curve never meets it.
- paired ratio: per seed d = log(t_method / t_baseline); the ratio is exp(mean d), its 95% CI
  exp(mean d ± t(0.975, n−1) · sd(d)/√n), and p the paired t-test's two-sided p-value on d.
- Holm: the step-down correction of the p-values of the declared comparisons (all of a panel).
- resolvable ratio at 80% power, two-sided α = 0.05: paired,
  exp((t(0.975, n−1) + t(0.80, n−1)) · sd(d)/√n); unpaired from a pilot's spreads of both arms'
  log times, exp((t(0.975, ν) + t(0.80, ν)) · sqrt(s_a²/n_a + s_b²/n_b)) with ν = n_a + n_b − 2.
- seeds for a bound: the fewest seeds n at which, were the true ratio and sd(d) what this panel
  measured, the paired CI's upper bound falls to a bound (the within-5% goal's 1.05) with 80%
  power: log(bound) − log(ratio) ≥ (t(0.975, n−1) + t(0.80, n−1)) · sd(d)/√n. It plans the next
  panel's seed count; no use for this one's verdict (adding seeds after a look voids its CI).
- censoring: a run that never reaches the target counts at its end time (a lower bound on its
  time to target); its entry says which fraction of seeds reached it, and `censored` is true.
  A censored ratio is therefore optimistic for the censored arm: for a method, when the method
  is censored; pessimistic for it when the baseline is. A run that did not finish (diverged,
  failed) counts in `did_not_finish`. If the epochs it finished crossed the target, that first
  crossing is its time to target, as any run's (`reached_then_stopped` counts them); else it
  did not reach the target and has no end time to bound it (DID_NOT_FINISH): it counts in
  `reached` but drops out of the ratio, whose seeds `n` counts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ALPHA, POWER = 0.05, 0.80
# the within-5% goal: the default policy's upper 95% bound on its ratio to the best fixed K
GOAL_WITHIN = 1.05
# the 10%-faster goal: some policy's upper 95% bound, the target reached in every seed
GOAL_FASTER = 0.90


def crossing_time(
    times: Sequence[float], values: Sequence[float], target: float, *, higher_is_better: bool
) -> float | None:
    if len(times) != len(values):
        raise ValueError(f"{len(times)} times but {len(values)} values")
    sign = 1.0 if higher_is_better else -1.0
    prev: tuple[float, float] | None = None
    for t, v in zip(times, values, strict=True):
        if sign * v >= sign * target:
            if prev is None:
                return float(t)
            t0, v0 = prev
            # v0 missed the target and v meets it, so v != v0: the line crosses it in between
            return float(t0 + (target - v0) / (v - v0) * (t - t0))
        prev = (t, v)
    return None


def _t(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


@dataclass(frozen=True)
class PairedRatio:
    ratio: float
    ci_low: float
    ci_high: float
    p: float
    n: int
    sd_log: float  # sd of the per-seed log ratios: what the resolvable ratio is computed from


def paired_log_ratio(method: Sequence[float], baseline: Sequence[float]) -> PairedRatio:
    """exp of the mean per-seed log ratio, its 95% t-CI and the paired t-test p (nan below 2
    pairs; a zero spread gives a zero-width CI and p 0, or 1 for identical times)."""
    if len(method) != len(baseline) or not method:
        raise ValueError(f"{len(method)} method times but {len(baseline)} baseline times")
    if min(*method, *baseline) <= 0:
        raise ValueError("times to target must be positive")
    d = [math.log(a / b) for a, b in zip(method, baseline, strict=True)]
    n, mean = len(d), statistics.fmean(d)
    if n < 2:
        return PairedRatio(math.exp(mean), math.nan, math.nan, math.nan, n, math.nan)
    sd = statistics.stdev(d)
    se = sd / math.sqrt(n)
    if se == 0:  # every seed the same ratio: certain, so p is 0 unless that ratio is 1
        return PairedRatio(math.exp(mean), math.exp(mean), math.exp(mean), float(mean == 0), n, sd)
    from scipy import stats

    half = _t(1 - ALPHA / 2, n - 1) * se
    p = float(2 * stats.t.sf(abs(mean / se), n - 1))
    return PairedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), p, n, sd)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order; nan (no test) stays nan and
    does not count among the comparisons."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m, out, running = len(tested), [math.nan] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def _detectable_log(sd_log: float, n: int) -> float:
    """The log ratio a paired t-test of n seeds detects with 80% power at α = 0.05."""
    return (_t(1 - ALPHA / 2, n - 1) + _t(POWER, n - 1)) * sd_log / math.sqrt(n)


def resolvable_ratio(sd_log: float, n: int) -> float:
    """The smallest ratio a paired t-test of n seeds detects with 80% power at α = 0.05."""
    if n < 2 or math.isnan(sd_log):
        return math.nan
    return math.exp(_detectable_log(sd_log, n))


def resolvable_ratio_unpaired(log_a: Sequence[float], log_b: Sequence[float]) -> float:
    """The same from a pilot's two arms of log times (each arm's own spread)."""
    na, nb = len(log_a), len(log_b)
    if na < 2 or nb < 2:
        return math.nan
    se = math.sqrt(statistics.variance(log_a) / na + statistics.variance(log_b) / nb)
    df = na + nb - 2
    return math.exp((_t(1 - ALPHA / 2, df) + _t(POWER, df)) * se)


SEEDS_MAX = 1000  # beyond this a bound is out of any panel's reach: None


def seeds_for_bound(ratio: float, sd_log: float, bound: float) -> int | None:
    """The fewest seeds (≥ 2) whose paired CI has its upper bound at most `bound` with 80% power,
    for this true ratio and spread; None where the ratio is not under the bound, or no n up to
    SEEDS_MAX does."""
    if math.isnan(sd_log) or ratio >= bound:
        return None
    margin = math.log(bound) - math.log(ratio)
    for n in range(2, SEEDS_MAX + 1):
        if _detectable_log(sd_log, n) <= margin:
            return n
    return None


@dataclass(frozen=True)
class Outcome:
    """One run's time to target: the crossing, or None with the run's end time."""

    time: float | None
    end: float
    finished: bool = True  # False: the run stopped before its last epoch (diverged, failed)

    @property
    def censored_time(self) -> float:
        return self.end if self.time is None else self.time


# A main seed's run that did not finish and never crossed the target: no crossing, no end time
DID_NOT_FINISH = Outcome(None, math.inf, finished=False)


def is_within(ci_high: float | None, reached: float, baseline_reached: bool) -> bool:
    """The within-5% test, for the default policy (autok/panel.py, `Goal.within`) or any arm: the
    target reached in every seed, and the CI's upper bound at most GOAL_WITHIN or the best fixed
    K missing a seed."""
    if ci_high is not None and ci_high <= GOAL_WITHIN and reached == 1.0:
        return True
    return reached == 1.0 and not baseline_reached


def shown_faster(e: Mapping) -> bool:
    """Whether a summary entry shows its policy at least 10% faster: the CI's upper bound at most
    GOAL_FASTER, and the target reached in every seed. A seed whose run never reached it enters
    the paired ratio at the run's end (Outcome.censored_time), a bound that flatters a run
    ending early: a policy that missed the target is not shown faster."""
    high = e.get("ci_high")
    return high is not None and high <= GOAL_FASTER and e.get("reached") == 1.0


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def compare(
    method: Mapping[int, Outcome], baseline: Mapping[int, Outcome], within: float = GOAL_WITHIN
) -> dict:
    """One summary entry, seeds paired (those both arms ran); before Holm. `within`: the bound
    whose seed count it plans (seeds_for_bound)."""
    seeds = sorted(set(method) & set(baseline))
    timed = [s for s in seeds if math.isfinite(method[s].end) and math.isfinite(baseline[s].end)]
    entry: dict = {
        "ratio": None,
        "ci_low": None,
        "ci_high": None,
        "p": math.nan,
        "reached": sum(method[s].time is not None for s in seeds) / len(seeds) if seeds else 0.0,
        "censored": any(method[s].time is None or baseline[s].time is None for s in timed),
        "n": len(timed),
        "resolvable_ratio": None,
        "seeds_for_within": None,
        "did_not_finish": sum(not method[s].finished for s in seeds),
        "reached_then_stopped": sum(
            not method[s].finished and method[s].time is not None for s in seeds
        ),
    }
    if not timed:
        return entry
    r = paired_log_ratio(
        [method[s].censored_time for s in timed], [baseline[s].censored_time for s in timed]
    )
    return {
        **entry,
        "ratio": r.ratio,
        "ci_low": _finite(r.ci_low),
        "ci_high": _finite(r.ci_high),
        "p": r.p,
        "resolvable_ratio": _finite(resolvable_ratio(r.sd_log, r.n)),
        "seeds_for_within": seeds_for_bound(r.ratio, r.sd_log, within),
    }


def summary(
    default_policy: str,
    regimes: Mapping[str, tuple[str, Mapping[str, Mapping[int, Outcome]]]],
) -> dict:
    """docs/controller-panel/summary.json: per regime (name -> (best fixed K's name, methods)),
    each method's ratio to the best fixed K, Holm-corrected over every comparison of the panel
    (every method but the baseline itself, in every regime)."""
    out: dict[str, dict[str, dict]] = {}
    entries: list[dict] = []
    for name, (best, methods) in regimes.items():
        out[name] = {}
        for method, outcomes in methods.items():
            e = compare(outcomes, methods[best])
            if method == best:
                e["p"] = math.nan  # the baseline is not a comparison
            out[name][method] = e
            entries.append(e)
    for e, p in zip(entries, holm([e.pop("p") for e in entries]), strict=True):
        e["p_holm"] = _finite(p)
    return {
        "default_policy": default_policy,
        "baseline": {name: best for name, (best, _) in regimes.items()},
        "regimes": out,
    }
