"""The pilot's choice of the best fixed K, checked on the main seeds (docs/design.md §6, "the
pilot's choice, checked").

The pilot chooses each regime's best fixed K on seeds of its own (two in the panel) before the
main seeds run, so that the choice is not made on the seeds it is judged against; two seeds can
choose a K that is slower on the main seeds than another K that ran there, and every ratio to it
then flatters a policy. Where fixed arms at other K ran on the main seeds beside the pilot's, this
reads whether one was faster there (its CI's upper bound under 1, the target reached in every
seed) and, against the one most surely faster (the lowest upper bound), each other arm's paired
ratio, by the goals' own tests. The goals' verdicts stay the pilot's, the baseline stated before
the main seeds ran; this is the stricter reading beside them. Its CIs are the panel's paired
t-intervals, not Holm-corrected (no p is read from them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autok import panel_stats
from autok.panel_stats import Outcome, is_within, shown_faster

# a summary entry's fields this reading keeps (compare's p, before Holm, it does not read)
KEPT = ("ratio", "ci_low", "ci_high", "reached", "n")


def brief(entry: Mapping, mine: Mapping[int, Outcome], theirs: Mapping[int, Outcome]) -> dict:
    """The entry's KEPT fields, and the seeds the two arms share and of those the ones `mine`
    reached the target in (counts, which a share rounded to a percent would hide)."""
    seeds = set(mine) & set(theirs)
    return {k: entry.get(k) for k in KEPT} | {
        "seeds": len(seeds),
        "seeds_reached": sum(mine[s].time is not None for s in seeds),
    }


def reached_every_seed(outcomes: Mapping[int, Outcome]) -> bool:
    """Every main seed the arm ran, not only those it shares with another arm."""
    return bool(outcomes) and all(o.time is not None for o in outcomes.values())


def check(
    best: str,
    fixed: Sequence[str],
    entries: Mapping[str, Mapping],
    outcomes: Mapping[str, Mapping[int, Outcome]],
) -> dict | None:
    """For one regime whose best fixed K is the pilot's `best`: `fixed`, the fixed arms at other K
    that ran on its main seeds; `entries`, its summary entries (each arm against `best`);
    `outcomes`, each arm's per-seed outcome (runs that did not finish included). None where no
    such arm ran. Else {"fixed": each of them against `best`, "faster": the one most surely
    faster than it (lowest upper bound) or None, "against_it": every arm but `best` and it,
    against it}."""
    others = [n for n in fixed if n != best and n in entries and n in outcomes]
    if not others:
        return None
    faster = [
        n
        for n in others
        if entries[n].get("ci_high") is not None
        and entries[n]["ci_high"] < 1.0
        and reached_every_seed(outcomes[n])
    ]
    out: dict = {
        "fixed": {n: brief(entries[n], outcomes[n], outcomes[best]) for n in others},
        "faster": None,
        "against_it": {},
    }
    if faster:
        name = min(faster, key=lambda n: (entries[n]["ci_high"], n))
        out["faster"] = name
        out["against_it"] = {
            m: brief(panel_stats.compare(outcomes[m], outcomes[name]), outcomes[m], outcomes[name])
            for m in outcomes
            if m not in (best, name)
        }
    return out


def _ci(e: Mapping) -> str:
    lo, hi = e.get("ci_low"), e.get("ci_high")
    return "—" if lo is None or hi is None else f"{lo:.3f}–{hi:.3f}"


def _ratio(e: Mapping) -> str:
    return "—" if e.get("ratio") is None else f"{e['ratio']:.3f}×"


def _missed(e: Mapping) -> str:
    """', 9 of 10 reached' where the arm missed the target in a seed it shares (a fixed K faster
    by its bound that missed a seed is not faster: the goals' reach clause)."""
    got, of = e["seeds_reached"], e["seeds"]
    return "" if got == of else f", {got} of {of} reached"


def verdict(e: Mapping) -> str:
    """Against the faster fixed K, which reached the target in every seed, by the goals' own
    tests (panel_stats.shown_faster, is_within)."""
    if e["seeds_reached"] < e["seeds"]:
        return (
            f"the target reached in {e['seeds_reached']} seeds of {e['seeds']}: neither within "
            "5% nor 10% faster"
        )
    if shown_faster(e):
        return "at least 10% faster"
    if is_within(e.get("ci_high"), e["reached"], baseline_reached=True):
        return "within 5%"
    return "not within 5%" if e.get("ci_high") is not None else "no CI (a single paired seed)"


def render(
    checks: Mapping[str, dict],
    bests: Mapping[str, str],
    kinds: Mapping[str, Mapping[str, str]],
) -> str:
    """The report's section: per regime that ran fixed arms at other K on its main seeds,
    whether one was faster than the pilot's choice, and the other arms against it. `bests`: each
    regime's pilot choice, as the report names it ("best-fixed (K = 8)"); `kinds`: per regime,
    an arm's kind where it is no policy ("fixed", "set in hindsight"), which the goals do not
    count."""
    if not checks:
        return ""
    lines = [
        "## The pilot's choice, checked on the main seeds",
        "",
        "The pilot chose each regime's best fixed K on seeds of its own before the main seeds ran; "
        "fixed arms at other K that ran on the main seeds check that choice there (paired, 95% CI; "
        "an arm is faster where its upper bound is under 1 and it reached the target in every "
        "seed). The goals stay against the pilot's choice, the baseline stated before the run; "
        "where a fixed K was faster, the ratios to the pilot's choice flatter every policy, and "
        "the arms are read again against the one most surely faster (the lowest upper bound; "
        "CIs not Holm-corrected).",
        "",
    ]
    for regime, c in checks.items():
        best = bests[regime]
        ratios = ", ".join(f"{n} {_ratio(e)} ({_ci(e)}{_missed(e)})" for n, e in c["fixed"].items())
        if c["faster"] is None:
            lines.append(
                f"- {regime}: against the pilot's {best}: {ratios}; none was faster on the main "
                "seeds (an upper bound under 1, every seed reached)."
            )
            continue
        name = c["faster"]
        e = c["fixed"][name]
        rest = f" (each fixed K against the pilot's: {ratios})" if len(c["fixed"]) > 1 else ""
        lines.append(
            f"- {regime}: **{name} was faster than the pilot's {best}**, {_ratio(e)} "
            f"({_ci(e)}), reaching the target in every seed{rest}. Against {name}:"
        )
        for m, x in c["against_it"].items():
            kind = kinds.get(regime, {}).get(m)
            said = f"{kind}: " if kind else ""
            lines.append(f"  - {m}: {_ratio(x)} ({_ci(x)}), {said}{verdict(x)}")
    return "\n".join(lines) + "\n"
