"""The pilot's choice of the best fixed K, checked on the main seeds (docs/design.md §6, "the
pilot's choice, checked").

The pilot chooses each regime's best fixed K on seeds of its own (two in the panel) before the
main seeds run, so that the choice is not made on the seeds it is judged against. Two seeds can
choose a slower K than the main seeds' best: on flip-link's eighty seeds 173-252 the pilot's
K = 16 took 1/0.912 the time of K = 8 (docs/controller-panel/flip-link-80/), and every ratio to
it then flattered a policy by about as much as goal 2's margin. Where other fixed K ran on the
main seeds beside the pilot's, this reads whether one was faster there (its CI's upper bound
under 1, the target reached in every seed) and, against the fastest such (the lowest upper
bound), each other arm's paired ratio. The goals' verdicts stay the pilot's, the baseline stated
before the main seeds ran; this is the stricter reading beside them, and says where they differ.
Its CIs are the panel's paired t-intervals, not Holm-corrected (no p is read from them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autok import panel_stats
from autok.panel_stats import GOAL_FASTER, GOAL_WITHIN, Outcome

# a summary entry's fields this reading keeps (compare's p, before Holm, it does not read)
KEPT = ("ratio", "ci_low", "ci_high", "reached", "n")


def brief(entry: Mapping) -> dict:
    return {k: entry.get(k) for k in KEPT}


def check(
    best: str,
    fixed: Sequence[str],
    entries: Mapping[str, Mapping],
    outcomes: Mapping[str, Mapping[int, Outcome]],
) -> dict | None:
    """For one regime whose best fixed K is the pilot's `best`: `fixed`, the other fixed K that ran
    on its main seeds; `entries`, its summary entries (each arm against `best`); `outcomes`, each
    arm's per-seed outcome. None where no other fixed K ran. Else {"fixed": each other fixed K's
    ratio to `best`, "faster": the fastest of those faster than it or None, "against_it": every
    arm but `best` and it, against it}."""
    others = [n for n in fixed if n != best and n in entries]
    if not others:
        return None
    faster = [
        n
        for n in others
        if entries[n].get("ci_high") is not None
        and entries[n]["ci_high"] < 1.0
        and entries[n].get("reached") == 1.0
    ]
    out: dict = {"fixed": {n: brief(entries[n]) for n in others}, "faster": None, "against_it": {}}
    if faster:
        name = min(faster, key=lambda n: (entries[n]["ci_high"], n))
        out["faster"] = name
        out["against_it"] = {
            m: brief(panel_stats.compare(outcomes[m], outcomes[name]))
            for m in outcomes
            if m not in (best, name)
        }
    return out


def _ci(e: Mapping) -> str:
    lo, hi = e.get("ci_low"), e.get("ci_high")
    return "—" if lo is None or hi is None else f"{lo:.3f}–{hi:.3f}"


def _ratio(e: Mapping) -> str:
    return "—" if e.get("ratio") is None else f"{e['ratio']:.3f}×"


def verdict(e: Mapping) -> str:
    """Against the faster fixed K, which reached the target in every seed, by the goals' own
    tests (autok/panel.py, `is_within` and `shown_faster`): at least 10% faster, within 5%, or
    neither (and why)."""
    high, reached = e.get("ci_high"), e.get("reached")
    if reached != 1.0:
        return f"the target reached in {reached:.0%} of seeds: neither within 5% nor 10% faster"
    if high is not None and high <= GOAL_FASTER:
        return "at least 10% faster"
    if high is not None and high <= GOAL_WITHIN:
        return "within 5%"
    return "not within 5%" if high is not None else "no CI"


def render(
    checks: Mapping[str, dict],
    bests: Mapping[str, str],
    kinds: Mapping[str, Mapping[str, str]],
) -> str:
    """The report's section: per regime that ran other fixed K on its main seeds, whether one was
    faster than the pilot's choice, and the other arms against it. `bests`: each regime's pilot
    choice, as said ("best-fixed (K = 8)"); `kinds`: per regime, an arm's kind where it is no
    policy ("fixed", "set in hindsight"), which the goals do not count."""
    if not checks:
        return ""
    lines = [
        "## The pilot's choice, checked on the main seeds",
        "",
        "The pilot chose each regime's best fixed K on seeds of its own before the main seeds ran; "
        "other fixed K that ran on the main seeds check that choice there (paired, 95% CI; an arm "
        "faster when its upper bound is under 1 and it reached the target in every seed). The "
        "goals stay against the pilot's choice, the baseline stated before the run; where "
        "a fixed K was faster, the ratios to the pilot's choice flatter every policy, and the "
        "arms are read again against the faster K (CIs not Holm-corrected).",
        "",
    ]
    for regime, c in checks.items():
        best = bests[regime]
        ratios = ", ".join(f"{n} {_ratio(e)} ({_ci(e)})" for n, e in c["fixed"].items())
        if c["faster"] is None:
            lines.append(
                f"- {regime}: against the pilot's {best}: {ratios}; none was faster on the main "
                "seeds."
            )
            continue
        name = c["faster"]
        e = c["fixed"][name]
        rest = f" (every fixed K against it: {ratios})" if len(c["fixed"]) > 1 else ""
        lines.append(
            f"- {regime}: **{name} was faster than the pilot's {best}**, {_ratio(e)} "
            f"({_ci(e)}), reaching the target in every seed{rest}. Against {name}:"
        )
        for m, x in c["against_it"].items():
            kind = kinds.get(regime, {}).get(m)
            said = f"{kind}: " if kind else ""
            lines.append(f"  - {m}: {_ratio(x)} ({_ci(x)}), {said}{verdict(x)}")
    return "\n".join(lines) + "\n"
