"""A panel's pilot and its plan (docs/design.md §6, Judging a policy): each regime's target and
best fixed K are chosen on pilot seeds of their own and written to OUT/plan.json before that
regime's main seeds run. Choosing the best fixed K on the seeds it is then compared against
favours it (the winner's curse); fixing the target after seeing the results would let it be
moved.

An experiment declares (experiments/controller-panel.yaml):

    pilot:
      seeds: [101, 102]          # disjoint from `seeds`
      runs: [k1, k4, k16, k32]   # fixed-K runs: they run on the pilot seeds only
      target: {of: k1, at: 0.5}  # the mean quality of `of` at that fraction of its evaluations
    predictions:                 # per regime, stated before any result, judged by the report
      skew-wan: {says: "...", expect: interior-fixed}

and a main run `{name: best-fixed, sync_period: pilot}` takes, per regime, the settings of the
pilot run with the shortest time to target. `expect` is one of largest-fixed, interior-fixed,
none-faster (a negative control: no method resolvably faster than the best fixed K), or
{faster: [METHOD, ...]} (some named method resolvably faster).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autok.config import finite_number
from autok.panel import Judge, outcome
from autok.report import RunResult
from autok.trainer.loop.atomic_write import write_text  # never through a link (docs/design.md §7)

PLAN = "plan.json"
FROM_PILOT = "pilot"  # `sync_period: pilot`: the regime's best fixed K, from its pilot
EXPECTS = ("largest-fixed", "interior-fixed", "none-faster")
SAYS_MAX = 600  # characters of a prediction's text: a report line, not a file


@dataclass(frozen=True)
class PilotSpec:
    seeds: tuple[int, ...]
    runs: tuple[str, ...]
    target_of: str
    target_at: float


def spec(exp: dict[str, Any]) -> PilotSpec | None:
    p = exp.get("pilot")
    if p is None:
        return None
    return PilotSpec(
        tuple(p["seeds"]), tuple(p["runs"]), p["target"]["of"], float(p["target"]["at"])
    )


def problem(exp: dict[str, Any]) -> str | None:
    """What is wrong with an experiment's `pilot` and `predictions`, or None."""
    names = [r.get("name") for r in exp["runs"]]
    pilot = exp.get("pilot")
    wants = [r["name"] for r in exp["runs"] if r.get("sync_period") == FROM_PILOT]
    if pilot is None:
        if wants:
            return f"runs: {wants[0]!r} takes sync_period: pilot, but there is no `pilot`"
        return None if "predictions" not in exp else "predictions: need a `pilot`"
    if not isinstance(pilot, dict) or set(pilot) != {"seeds", "runs", "target"}:
        return "pilot: needs exactly seeds, runs and target ({of: RUN, at: FRACTION})"
    seeds = pilot["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
        return "pilot.seeds: needs a non-empty list of integers"
    if set(seeds) & set(exp.get("seeds", [42])):
        return "pilot.seeds: must differ from `seeds` (the main seeds are judged apart)"
    runs = pilot["runs"]
    if not isinstance(runs, list) or not runs or not all(r in names for r in runs):
        return "pilot.runs: needs a non-empty list of names from `runs`"
    for r in exp["runs"]:
        if r["name"] in runs and (
            r.get("policy", "fixed") != "fixed" or r.get("sync_period") == FROM_PILOT
        ):
            return f"pilot.runs: {r['name']!r} is not a fixed K"
    target = pilot["target"]
    if not (
        isinstance(target, dict)
        and set(target) == {"of", "at"}
        and target["of"] in runs
        and isinstance(target["at"], (int, float))
        and not isinstance(target["at"], bool)
        and 0 < target["at"] <= 1
    ):
        return "pilot.target: needs {of: a pilot run, at: a fraction of its evaluations in (0, 1]}"
    if not wants:
        return "pilot: no run takes its choice (add {name: best-fixed, sync_period: pilot})"
    if why := _choice_problem(exp["runs"], runs):
        return why
    return _predictions_problem(exp.get("predictions", {}))


def _choice_problem(entries: list[dict[str, Any]], pilot_runs: list[str]) -> str | None:
    """A run taking the pilot's choice keeps the settings its own entry gives over the chosen
    run's (`experiment.with_pilot_choice`); where a pilot run gives one of them otherwise, the
    run would not be the pilot's choice, so it is refused rather than either side dropped."""
    # every pilot run is a fixed K (`problem` checks it): its policy is fixed, given or not
    arms = [{"policy": "fixed", **r} for r in entries if r["name"] in pilot_runs]
    for r in entries:
        if r.get("sync_period") != FROM_PILOT:
            continue
        for key, value in r.items():
            if key in ("name", "only", "sync_period"):
                continue
            if key == "random_mean" and isinstance(value, dict):  # a random K, not a fixed one
                return (
                    f"runs: {r['name']!r} takes sync_period: pilot, a fixed K, and random_mean of "
                    f"another run; drop one of them"
                )
            for arm in arms:
                if key in arm and arm[key] != value:
                    return (
                        f"runs: {r['name']!r} takes sync_period: pilot and sets {key}: "
                        f"{repr(value)[:80]}, which pilot run {arm['name']!r} sets to "
                        f"{repr(arm[key])[:80]}; make them agree or drop {key} from {r['name']!r}"
                    )
    return None


def _predictions_problem(preds: Any) -> str | None:
    if not isinstance(preds, dict):
        return "predictions: needs a mapping of regime -> {says, expect}"
    for regime, p in preds.items():
        where = f"predictions.{regime}"
        if not isinstance(p, dict) or set(p) != {"says", "expect"}:
            return f"{where}: needs exactly says (text) and expect"
        if not (isinstance(p["says"], str) and 0 < len(p["says"]) <= SAYS_MAX):
            return f"{where}.says: needs text of at most {SAYS_MAX} characters"
        e = p["expect"]
        named = e.get("faster") if isinstance(e, dict) and set(e) == {"faster"} else None
        listed = isinstance(named, list) and named and all(isinstance(m, str) for m in named)
        if not (listed or (isinstance(e, str) and e in EXPECTS)):
            return f"{where}.expect: one of {', '.join(EXPECTS)} or {{faster: [METHOD, ...]}}"
    return None


# ----- the choice -------------------------------------------------------------------------------


def _judge(r: RunResult) -> Judge:
    """How the panel scores the run: accuracy, or a task's validation loss (autok/panel.py)."""
    return Judge(accuracy=r.summary["metric"]["name"] == "accuracy")


def target_of(runs: Sequence[RunResult], at: float) -> tuple[float, bool, int]:
    """(target, whether the arm's mean curve still rises after it, the evaluation's index): the
    mean over seeds of the quality at that fraction of the evaluations."""
    judge = _judge(runs[0])
    n = min(len(r.epochs) for r in runs)
    i = max(0, math.ceil(at * n) - 1)
    target = statistics.fmean(judge.value(r.epochs[i]) for r in runs)
    final = statistics.fmean(judge.value(r.epochs[n - 1]) for r in runs)
    return target, judge.better(final, target), i


def choose(pilot: dict[str, list[RunResult]], s: PilotSpec) -> dict[str, Any]:
    """The plan of one regime from its pilot runs (method -> runs, in `s.runs` order)."""
    target, rising, index = target_of(pilot[s.target_of], s.target_at)
    judge = _judge(pilot[s.target_of][0])
    arms: dict[str, dict[str, Any]] = {}
    for name in s.runs:
        outs = [outcome(r, judge, target) for r in pilot[name]]
        logs = [math.log(o.censored_time) for o in outs]
        arms[name] = {
            "sync_period": pilot[name][0].config.get("sync_period"),
            "times": [o.time for o in outs],
            "reached": sum(o.time is not None for o in outs),
            "geo_mean_time": math.exp(statistics.fmean(logs)),
            "sd_log": statistics.stdev(logs) if len(logs) > 1 else None,
            "final": statistics.fmean(judge.value(r.epochs[-1]) for r in pilot[name]),
        }
    n = len(s.seeds)
    whole = [a for a in s.runs if arms[a]["reached"] == n]
    accuracy = judge.accuracy
    best = (
        min(whole, key=lambda a: arms[a]["geo_mean_time"])  # ties: the first, the smaller K
        if whole
        else max(s.runs, key=lambda a: arms[a]["final"] * (1 if accuracy else -1))
    )
    return {
        "target": target,
        "metric": "accuracy" if accuracy else "validation loss",
        "target_of": s.target_of,
        "target_at": s.target_at,
        "target_evaluation": index,
        "rising": rising,
        "best_fixed": best,
        "best_reached_every_seed": bool(whole),
        "pilot_seeds": list(s.seeds),
        "arms": arms,
    }


def read_plan(out: Path) -> dict[str, Any]:
    """OUT/plan.json: regime -> its plan; {} before any pilot ran. A file that is not such a plan
    is a ValueError naming it (the experiment refuses it in one line before anything runs)."""
    path = out / PLAN
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"{path}: not readable JSON ({type(exc).__name__})") from None
    if not (isinstance(data, dict) and all(_is_entry(e) for e in data.values())):
        raise ValueError(f"{path}: not a plan (regime -> what `choose` writes: target, arms, ...)")
    return data


def _is_arm(a: Any) -> bool:
    return (
        isinstance(a, dict)
        and finite_number(a.get("sync_period"))
        and isinstance(a.get("times"), list)
        and isinstance(a.get("reached"), int)
        and finite_number(a.get("geo_mean_time"))
        and finite_number(a.get("final"))
    )


def _is_entry(e: Any) -> bool:
    """Every field of a regime's plan that the experiment and `autok report` read, with its
    type: a copied or hand-edited file fails here, in one line, not as a crash in the report."""
    return (
        isinstance(e, dict)
        and finite_number(e.get("target"))
        and isinstance(e.get("metric"), str)
        and isinstance(e.get("target_of"), str)
        and isinstance(e.get("target_evaluation"), int)
        and isinstance(e.get("rising"), bool)
        and isinstance(e.get("best_reached_every_seed"), bool)
        and isinstance(e.get("pilot_seeds"), list)
        and isinstance(e.get("arms"), dict)
        and all(_is_arm(a) for a in e["arms"].values())
        and isinstance(e.get("best_fixed"), str)
        and e["best_fixed"] in e["arms"]
        and ("prediction" not in e or _predictions_problem({"r": e["prediction"]}) is None)
    )


def write_entry(out: Path, regime: str, entry: dict[str, Any]) -> None:
    """Adds one regime's plan; an entry once written is kept (it was fixed before its main
    seeds ran: a rerun of the experiment continues under the same plan)."""
    plan = read_plan(out)
    plan.setdefault(regime, entry)
    write_text(out / PLAN, json.dumps(plan, indent=2, allow_nan=False) + "\n")
