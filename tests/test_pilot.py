"""A panel's pilot (autok/pilot.py): the target and the best fixed K are chosen on seeds of their
own and written to plan.json before the main seeds run; the report states each regime's
prediction, then whether the main seeds confirm or refute it (docs/design.md §6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autok import panel, pilot
from autok.config import ConfigError
from autok.report import RunResult


def _run(method, seed, accs, secs, k=None, policy="fixed", stage="main", regime="r"):
    epochs = [
        {"test_accuracy": str(a), "epoch_seconds": str(secs), "test_loss": "1.0"} for a in accs
    ]
    return RunResult(
        f"{method} regime={regime}",
        seed,
        Path("."),
        {"policy": policy, "sync_period": k, "warmup_epochs": 0},
        {"wall_seconds": secs * len(accs), "metric": {"name": "accuracy"}},
        epochs,
        [],
        stage=stage,
    )


SPEC = pilot.PilotSpec(seeds=(101, 102), runs=("k1", "k4", "k16"), target_of="k1", target_at=0.5)


def _pilot_runs():
    return {
        # k1: 0.5, 0.7, 0.8, 0.9 at 4 s an evaluation: target = mean at evaluation 2 = 0.7
        "k1": [_run("k1", s, [0.5, 0.7, 0.8, 0.9], 4.0, 1, stage="pilot") for s in (101, 102)],
        # k4: crosses 0.7 half way between evaluations 1 and 2 (0.6 -> 0.8): at 1.5 s
        "k4": [_run("k4", s, [0.6, 0.8, 0.85, 0.86], 1.0, 4, stage="pilot") for s in (101, 102)],
        # k16: faster per evaluation but never reaches 0.7 on seed 102
        "k16": [
            _run("k16", 101, [0.5, 0.75, 0.75, 0.75], 0.5, 16, stage="pilot"),
            _run("k16", 102, [0.5, 0.6, 0.65, 0.69], 0.5, 16, stage="pilot"),
        ],
    }


def test_the_pilot_fixes_the_target_on_ddps_rising_curve_and_picks_the_fastest_fixed_k():
    plan = pilot.choose(_pilot_runs(), SPEC)
    assert plan["target"] == pytest.approx(0.7) and plan["target_evaluation"] == 1
    assert plan["rising"]  # k1 ends at 0.9 > 0.7
    assert plan["arms"]["k4"]["times"] == [pytest.approx(1.5), pytest.approx(1.5)]
    assert plan["arms"]["k16"]["reached"] == 1  # censored: not a candidate
    assert plan["best_fixed"] == "k4" and plan["best_reached_every_seed"]
    assert plan["arms"]["k4"]["sync_period"] == 4


def _entry(target: float, best: str) -> dict:
    """A regime's plan with every field `choose` writes."""
    arm = {"times": [1.0], "reached": 1, "geo_mean_time": 1.0, "sd_log": None, "final": 0.8}
    return {
        "target": target,
        "metric": "accuracy",
        "target_of": "k1",
        "target_at": 0.5,
        "target_evaluation": 0,
        "rising": True,
        "best_fixed": best,
        "best_reached_every_seed": True,
        "pilot_seeds": [7],
        "arms": {"k1": arm | {"sync_period": 1}, "k4": arm | {"sync_period": 4}},
    }


def test_a_plan_once_written_is_kept(tmp_path):
    pilot.write_entry(tmp_path, "regime=r", _entry(0.7, "k4"))
    pilot.write_entry(tmp_path, "regime=r", _entry(0.1, "k1"))
    assert pilot.read_plan(tmp_path)["regime=r"]["best_fixed"] == "k4"


@pytest.mark.parametrize(
    "spoil",
    [
        lambda e: e.pop("pilot_seeds"),
        lambda e: e.update(rising="yes"),
        lambda e: e["arms"]["k4"].pop("sync_period"),
        lambda e: e["arms"]["k1"].update(final=float("nan")),
        lambda e: e.update(best_fixed="k9"),
        lambda e: e.update(prediction={"says": "x"}),
    ],
)
def test_a_plan_missing_a_field_the_report_reads_is_refused_naming_the_file(tmp_path, spoil):
    entry = _entry(0.7, "k4")
    spoil(entry)
    (tmp_path / pilot.PLAN).write_text(json.dumps({"regime=r": entry}))
    with pytest.raises(ValueError, match=r"plan\.json: not a plan"):
        pilot.read_plan(tmp_path)
    good = _entry(0.7, "k4") | {"prediction": {"says": "x", "expect": "none-faster"}}
    (tmp_path / pilot.PLAN).write_text(json.dumps({"regime=r": good}))
    assert pilot.read_plan(tmp_path)["regime=r"]["target"] == 0.7


BASE = {
    "name": "p",
    "seeds": [1, 2],
    "quick": {"base": {}},
    "runs": [
        {"name": "k1", "sync_period": 1},
        {"name": "k4", "sync_period": 4},
        {"name": "best-fixed", "sync_period": "pilot"},
        {"name": "es", "policy": "exposed-sync"},
    ],
    "pilot": {"seeds": [7], "runs": ["k1", "k4"], "target": {"of": "k1", "at": 0.5}},
}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"pilot": {"seeds": [1], "runs": ["k1"], "target": {"of": "k1", "at": 0.5}}},
         "pilot.seeds: must differ"),
        ({"pilot": {"seeds": [7], "runs": ["es"], "target": {"of": "es", "at": 0.5}}},
         "'es' is not a fixed K"),
        ({"pilot": {"seeds": [7], "runs": ["k9"], "target": {"of": "k9", "at": 0.5}}},
         "pilot.runs: needs"),
        ({"pilot": {"seeds": [7], "runs": ["k1"], "target": {"of": "k4", "at": 0.5}}},
         "pilot.target"),
        ({"pilot": {"seeds": [7], "runs": ["k1"], "target": {"of": "k1", "at": 0}}},
         "pilot.target"),
        ({"pilot": None}, "no `pilot`"),
        ({"predictions": {"r": {"says": "x", "expect": "fastest"}}}, "predictions.r.expect"),
        ({"predictions": {"r": {"says": "", "expect": "none-faster"}}}, "predictions.r.says"),
    ],
)  # fmt: skip
def test_a_pilot_declared_wrong_is_refused_naming_the_key(change, says):
    from autok.experiment import experiment_problem

    exp = {**BASE, **change}
    if exp["pilot"] is None:
        del exp["pilot"]
    assert says in (experiment_problem(exp) or "")


def test_a_pilot_run_takes_the_pilot_seeds_and_best_fixed_the_main_ones():
    from autok.experiment import count_runs, expand

    exp = {**BASE, "quick": {"base": {"epochs": 2}}}
    runs = expand(exp, "quick")
    stages = {(r.label, r.seed): (r.stage, r.from_pilot) for r in runs}
    assert stages == {
        ("k1", 7): ("pilot", False),
        ("k4", 7): ("pilot", False),
        ("best-fixed", 1): ("main", True),
        ("best-fixed", 2): ("main", True),
        ("es", 1): ("main", False),
        ("es", 2): ("main", False),
    }
    assert count_runs(exp, "quick") == len(runs)


def test_a_run_taking_the_pilots_choice_keeps_the_settings_it_gives_itself():
    """`sync_period: pilot` takes the chosen run's settings, and over them what the run's own
    entry gives (an LR here): before, the chosen run's settings replaced the run's, and the LR
    was dropped unsaid. A setting a pilot run gives otherwise is refused up front."""
    from autok.experiment import expand, experiment_problem, with_pilot_choice

    runs = [
        {"name": "k1", "sync_period": 1, "strategy": "cpdp"},
        {"name": "k4", "sync_period": 4, "strategy": "cpdp"},
        {"name": "best-fixed", "sync_period": "pilot", "strategy": "cpdp"},
        {"name": "nudged", "sync_period": "pilot", "lr": 0.1000001},
    ]
    exp = {**BASE, "quick": {"base": {"epochs": 2, "lr": 0.1}}, "runs": runs}
    assert experiment_problem(exp) is None
    group = expand(exp, "quick")
    k4 = next(r for r in group if r.label == "k4")
    chosen = {
        r.label: with_pilot_choice(r, group, "k4") for r in group if r.from_pilot and r.seed == 1
    }
    assert chosen["best-fixed"].settings == {**k4.settings, "seed": 1}  # as it always ran
    assert chosen["nudged"].settings == {**k4.settings, "seed": 1, "lr": 0.1000001}
    clash = [*runs[:3], {"name": "ddp-best", "sync_period": "pilot", "strategy": "ddp"}]
    said = experiment_problem({**exp, "runs": clash}) or ""
    assert said == (
        "runs: 'ddp-best' takes sync_period: pilot and sets strategy: 'ddp', which pilot run "
        "'k1' sets to 'cpdp'; make them agree or drop strategy from 'ddp-best'"
    )
    # a pilot run is a fixed K whether or not its entry says so: a policy is not its choice
    policy = [*runs[:3], {"name": "es-best", "sync_period": "pilot", "policy": "exposed-sync"}]
    said = experiment_problem({**exp, "runs": policy}) or ""
    assert "sets policy: 'exposed-sync', which pilot run 'k1' sets to 'fixed'" in said
    mean_of = {"name": "r", "sync_period": "pilot", "random_mean": {"mean_k_of": "k4"}}
    said = experiment_problem({**exp, "runs": [*runs[:3], mean_of]}) or ""
    assert said == (
        "runs: 'r' takes sync_period: pilot, a fixed K, and random_mean of another run; drop one "
        "of them"
    )
    # settings that cannot train with some run the pilot could choose: refused before any run
    capped = [*runs[:3], {"name": "capped", "sync_period": "pilot", "max_sync_period": 2}]
    with pytest.raises(ConfigError, match=r"run 'capped' with the settings of pilot run 'k4': "):
        expand({**exp, "runs": capped}, "quick")


def test_only_restricts_a_run_to_the_regimes_it_names():
    from autok.experiment import count_runs, expand

    exp = {
        "name": "o",
        "seeds": [1],
        "quick": {"vary": {"regime": [{"name": "a", "lr": 0.1}, {"name": "b", "lr": 0.2}]}},
        "runs": [{"name": "x"}, {"name": "y", "only": {"regime": ["b"]}}],
    }
    labels = sorted(r.label for r in expand(exp, "quick"))
    assert labels == ["x regime=a", "x regime=b", "y regime=b"]
    assert count_runs(exp, "quick") == 3


def _entries(**ratios):
    return {
        m: {"ratio": r, "ci_low": lo, "ci_high": hi, "p_holm": p, "reached": 1.0}
        for m, (r, lo, hi, p) in ratios.items()
    }


def _regime(expect, best="k4"):
    runs = [_run("best-fixed", s, [0.5, 0.8], 1.0, 4) for s in (1, 2)]
    runs += [_run("es", s, [0.5, 0.8], 1.0, policy="exposed-sync") for s in (1, 2)]
    plan = {
        "regime=r": {
            "target": 0.7,
            "arms": {a: {"sync_period": int(a[1:])} for a in ("k1", "k4", "k16")},
            "best_fixed": best,
            "prediction": {"says": "…", "expect": expect},
        }
    }
    (g,) = panel.build_regimes(runs, plan)
    return g


def test_a_prediction_is_confirmed_refuted_or_left_unresolved_by_the_paired_cis():
    faster = {"faster": ["es"]}
    sure = _entries(es=(0.8, 0.7, 0.9, 0.01))
    unsure = _entries(es=(0.9, 0.7, 1.1, 0.3))
    slower = _entries(es=(1.3, 1.1, 1.5, 0.01))
    assert panel.resolve(_regime(faster), sure)[0] == "confirms"
    assert panel.resolve(_regime(faster), unsure)[0] == "unresolved"
    assert panel.resolve(_regime(faster), slower)[0] == "refutes"
    assert panel.resolve(_regime("none-faster"), sure)[0] == "refutes"
    assert panel.resolve(_regime("none-faster"), slower)[0] == "confirms"
    assert panel.resolve(_regime("none-faster"), unsure)[0] == "unresolved"
    assert panel.resolve(_regime("interior-fixed"), {})[0] == "confirms"
    assert panel.resolve(_regime("interior-fixed", best="k16"), {})[0] == "refutes"
    assert panel.resolve(_regime("largest-fixed", best="k16"), {})[0] == "confirms"
    g = _regime(faster)
    assert g.best_fixed.name == "best-fixed" and g.target == 0.7


def test_an_experiment_writes_its_plan_before_the_main_seeds_and_runs_the_pilots_choice(
    tmp_path,
):
    exp = {
        **BASE,
        "seeds": [1],
        "quick": {
            "base": {
                "workers": 2,
                "dataset": "mnist1d",
                "mnist1d_samples": 400,
                "batch_size": 16,
                "epochs": 4,
                "warmup_epochs": 0,
                "lr_schedule": "constant",
                "clock": "virtual",
                "compute_ms": 5,
                "link": "wan",
                "slowmo_beta": 0.0,
                "strategy": "cpdp",
            },
            "vary": {"regime": [{"name": "r"}]},
        },
        "predictions": {"r": {"says": "the largest K wins on iid data", "expect": "largest-fixed"}},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(exp))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "autok.cli", "experiment", "run", str(path), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = res.stdout.splitlines()
    planned = next(i for i, line in enumerate(lines) if "best fixed K on the pilot" in line)
    started = [i for i, line in enumerate(lines) if line.startswith("[") and "seed 1:" in line]
    pilots = [i for i, line in enumerate(lines) if line.startswith("[") and "seed 7:" in line]
    assert len(pilots) == 2 and len(started) == 2
    assert max(pilots) < planned < min(started)  # the plan is fixed before any main seed runs
    plan = json.loads((out / "plan.json").read_text())["regime=r"]
    k = plan["arms"][plan["best_fixed"]]["sync_period"]
    ran = yaml.safe_load((out / "best-fixed_regime=r" / "seed-1" / "run.yaml").read_text())
    assert ran["sync_period"] == k and ran["seed"] == 1
    assert plan["prediction"]["expect"] == "largest-fixed"
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    # run again: every run kept (the pilot's choice is compared as it ran), the plan unchanged
    assert again.returncode == 0 and again.stdout.count("skipped") == 4, again.stdout
    assert json.loads((out / "plan.json").read_text())["regime=r"] == plan

    rep = subprocess.run(
        [sys.executable, "-m", "autok.cli", "report", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-2000:]
    text = (out / "report.md").read_text()
    assert "**Prediction** (stated before the run): the largest K wins" in text
    assert text.index("### r") < text.index("**Prediction**")  # under its regime's heading
    assert "**Pilot** (seeds 7, run before the main seeds)" in text
    verdict = "confirms" if plan["best_fixed"] == "k4" else "refutes"
    assert f"**Result: {verdict}** the prediction" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline"] == {"r": "best-fixed"}
    # reported again: the panel's own summary.json at the top is no run's
    rep = subprocess.run(
        [sys.executable, "-m", "autok.cli", "report", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert set(summary["regimes"]["r"]) == {"best-fixed", "es"}  # the pilot is not compared


def test_a_run_killed_before_its_first_epoch_row_is_reported_as_stopped(tmp_path):
    """A worker stopped while a peer raised (a divergence at the first boundaries) may leave an
    empty epochs.csv, not even its header: the report lists the run with no epoch."""
    from autok.report import collect_stopped

    d = tmp_path / "diverges" / "seed-1"
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"label": "diverges", "seed": 1}))
    (d / "epochs.csv").write_text("")
    (d / "console.log").write_text(
        "autok: training failed: autok.trainer.engine.divergence.Diverged: training diverged: nan\n"
    )
    (stopped,) = collect_stopped(tmp_path)
    assert stopped.epochs_done == 0 and stopped.why == "training diverged: nan"


def test_an_experiment_directory_with_its_panels_summary_is_not_taken_for_one_run(tmp_path):
    from autok.report import one_run

    (tmp_path / "summary.json").write_text(json.dumps({"default_policy": "exposed-sync"}))
    (tmp_path / ".autok-experiment.json").write_text("{}")
    assert one_run(tmp_path) is None
