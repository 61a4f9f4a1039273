"""`autok sweep`: Optuna on sqlite (and PostgreSQL), pruning, robustness, Ray Tune."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autok.config import ConfigError
from autok.pareto import dominates, pareto_front
from tests.test_cli import TINY, autok

# beta 0: trials this small at K=2 and beta 0.3 can blow up, which the guard rightly fails
FIXED = [a for a in TINY if a != "--no-progress"] + ["--slowmo-beta", "0"]


def write(path: Path, obj) -> Path:
    path.write_text(yaml.safe_dump(obj))
    return path


def trials(out: Path) -> list[dict]:
    return list(csv.DictReader((out / "trials.csv").open()))


@pytest.fixture
def small_space(tmp_path):
    return write(
        tmp_path / "space.yaml",
        {
            "sync_period": {"type": "int", "low": 1, "high": 8, "log": True},
            "lr": {"type": "float", "low": 0.05, "high": 0.2, "log": True},
        },
    )


# ----- the Pareto front ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.1, 0.2, 0.5, 0.9, 0.91]), st.sampled_from([1.0, 2.0, 3.5, 10.0])
        ),
        max_size=25,
    )
)
def test_pareto_front_is_exactly_the_non_dominated_set(points):
    front = pareto_front(points)
    brute = [
        i
        for i, p in enumerate(points)
        if not any(dominates(q, p) for j, q in enumerate(points) if j != i)
    ]
    assert sorted(front) == brute


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.1, 0.2, 0.5, 0.9, 0.91]), st.sampled_from([1.0, 2.0, 3.5, 10.0])
        ),
        min_size=1,
        max_size=25,
    )
)
def test_the_pareto_staircase_is_the_best_quality_within_each_time_budget(points):
    from autok.trainer.loop.plots import staircase

    front = pareto_front(points)
    xs, ys = staircase([(points[i][1], points[i][0]) for i in front], right=11.0)
    steps = list(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in zip(steps, steps[1:], strict=False):
        assert x0 == x1 or y0 == y1  # flat or straight up: never a diagonal
        assert x1 >= x0 and y1 >= y0
    assert xs[-1] == 11.0
    for _, budget in points:  # at any trial's time: the best quality reached by then
        shown = max(y for x, y in steps if x <= budget)
        assert shown == max(q for q, s in points if s <= budget)


def test_pareto_png_draws_the_staircase_and_names_the_front(tmp_path, monkeypatch):
    import matplotlib.colors
    import matplotlib.text

    import autok.trainer.loop.plots
    from autok.pareto import plot_front

    def row(n, k, lr, acc, wall):
        done = {"number": n, "state": "COMPLETE", "run_dir": "x", "reason": ""}
        return done | {"sync_period": k, "lr": lr, "policy": "qsr"} | {
            "peak_test_metric": acc, "wall_seconds": wall,
        }  # fmt: skip

    rows = [row(0, 1, 0.1, 0.90, 20.0), row(1, 4, 0.05, 0.85, 8.0), row(2, 8, 0.2, 0.6, 12.0)]
    front = pareto_front([(r["peak_test_metric"], r["wall_seconds"]) for r in rows])
    assert front == [1, 0]
    drawn = {}

    def keep(fig, path):
        fig.canvas.draw()
        drawn["fig"] = fig
        return autok.trainer.loop.plots.DPI

    monkeypatch.setattr(autok.trainer.loop.plots, "save", keep)
    plot_front(rows, front, tmp_path / "pareto.png")
    fig = drawn["fig"]
    texts = {t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_visible()}
    assert "#1  K=4, LR=0.05, policy=qsr: 85% in 8.0 s" in texts
    assert "#0  K=1, LR=0.1, policy=qsr: 90% in 20.0 s" in texts
    assert {"#0", "#1"} <= texts and "#2" not in texts  # the front is numbered, the rest not
    (ax,) = [a for a in fig.axes if a.get_xlabel().startswith("training wall-clock (s)")]
    red = matplotlib.colors.to_rgba("crimson")
    (stairs,) = [ln for ln in ax.get_lines() if matplotlib.colors.to_rgba(ln.get_color()) == red]
    xy = list(zip(*stairs.get_data(), strict=True))
    assert xy[:3] == [(8.0, 85.0), (20.0, 85.0), (20.0, 90.0)]  # flat, then up: a staircase
    cbar = [a for a in fig.axes if a.get_ylabel() == "K (sync period)"][0]
    assert [t.get_text() for t in cbar.get_yticklabels()] == ["1", "2", "4", "8"]


# ----- Optuna on sqlite ------------------------------------------------------------------------


def test_optuna_sweep_on_sqlite_resume_and_outputs(tmp_path, small_space):
    out = tmp_path / "sweep"
    res = autok(
        "sweep",
        "--trials",
        "2",
        "--jobs",
        "2",
        "--space",
        str(small_space),
        "--out",
        str(out),
        *FIXED,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = trials(out)
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"]
    assert {
        "number",
        "state",
        "sync_period",
        "lr",
        "peak_test_metric",
        "wall_seconds",
        "run_dir",
    } <= set(rows[0])
    for name in ("pareto.csv", "pareto.png", "best.yaml", "study.db"):
        assert (out / name).exists(), name
    # each trial is a full run with its own directory
    for r in rows:
        assert json.loads((Path(r["run_dir"]) / "summary.json").read_text())["world_size"] == 2

    again = autok("sweep", "--trials", "1", "--space", str(small_space), "--out", str(out), *FIXED)
    assert again.returncode == 2 and "--resume" in again.stderr
    res = autok(
        "sweep",
        "--trials",
        "1",
        "--resume",
        "--space",
        str(small_space),
        "--out",
        str(out),
        *FIXED,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(trials(out)) == 3  # the same study, one more trial
    more = ["--trials", "1", "--resume", "--space", str(small_space), "--out", str(out)]
    res = autok("sweep", *more, *FIXED, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = trials(out)
    assert len(rows) == 4
    # each resume draws new points: a sampler seeded as the first was would replay its draws
    # (two resumes of one trial each would try the same parameters)
    assert len({r["lr"] for r in rows}) == 4, [r["lr"] for r in rows]
    # Optuna would keep the study's directions (maximize, minimize) under another objective
    other = ["--objective", "time-to-target", "--space", str(small_space), "--out", str(out)]
    res = autok("sweep", "--trials", "1", "--resume", *other, *FIXED)
    assert res.returncode == 2 and res.stderr.startswith(
        "autok: error: --resume: the study 'autok' was made to maximize and minimize"
    )
    assert len(trials(out)) == 4
    # nor under another fixed part: its trials would read as comparable in one table
    res = autok("sweep", *more, *FIXED, "--momentum", "0.5")
    assert res.returncode == 2 and res.stderr.startswith(
        "autok: error: --resume: the study 'autok' was made with no --momentum, this sweep "
        "gives --momentum 0.5"
    ), res.stderr
    assert len(trials(out)) == 4
    # nor in another installation: its trials' numbers depend on it (the study records it)
    import optuna

    study = optuna.load_study(study_name="autok", storage=f"sqlite:///{out / 'study.db'}")
    from autok.sweep import REVISIONS_ATTR, revision_attr

    assert study.user_attrs[REVISIONS_ATTR] == revision_attr()  # recorded when it was made
    study.set_user_attr("environment", study.user_attrs["environment"] | {"numpy": "1.0.0"})
    res = autok("sweep", *more, *FIXED)
    assert res.returncode == 2 and res.stderr.startswith(
        "autok: error: --resume: the study 'autok' ran its trials with numpy 1.0.0, this "
        "environment has "
    ), res.stderr
    assert len(trials(out)) == 4

    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["workers"] == 2 and "sync_period" in best and "lr" in best
    run = autok(
        "train",
        "--config",
        str(out / "best.yaml"),
        "--epochs",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path / "best-run"),
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_pruning_stops_a_clearly_worse_trial_early(tmp_path):
    space = write(
        tmp_path / "space.yaml", {"lr": {"type": "float", "low": 1e-6, "high": 0.3, "log": True}}
    )
    first = write(tmp_path / "enqueue.yaml", [{"lr": 0.2}, {"lr": 0.2}, {"lr": 1e-6}])
    out = tmp_path / "prune"
    args = ["--trials", "3", "--objective", "accuracy", "--space", str(space)]
    args += ["--enqueue", str(first), "--out", str(out), *FIXED]
    args += ["--epochs", "10", "--mnist1d-samples", "2000", "--warmup-epochs", "0"]
    res = autok("sweep", *args, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = trials(out)
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE", "PRUNED"], rows
    assert rows[2]["reason"].startswith("pruned at epoch ")
    assert int(rows[2]["reason"].split()[3]) <= 3  # an early epoch
    # The verdict came at an early epoch (above), from the epochs the run had written. Whether
    # the kill then lands before the run's own end depends on the machine's load (a starved
    # sweep process reads the epochs late: a CI run under load saw all 10 written), so how many
    # epochs the pruned run wrote is not asserted: nothing here may depend on timing.
    pruned = Path(rows[2]["run_dir"])
    assert 1 <= len(list(csv.DictReader((pruned / "epochs.csv").open()))) <= 10


def test_failing_and_diverging_trials_are_recorded_and_the_sweep_goes_on(tmp_path):
    space = write(
        tmp_path / "space.yaml",
        {
            # ddp runs with K = 1 only: a space whose every draw of it failed would be refused
            # up front (check_space), so K is drawn too
            "strategy": {"type": "categorical", "choices": ["cpdp", "ddp"]},
            "sync_period": {"type": "categorical", "choices": [1, 2]},
            "lr": {"type": "float", "low": 0.05, "high": 1e6, "log": True},
        },
    )
    first = write(
        tmp_path / "enqueue.yaml",
        [
            {"strategy": "ddp", "sync_period": 2, "lr": 0.1},  # refused at config time
            {"strategy": "cpdp", "sync_period": 2, "lr": 1e6},  # diverges
            {"strategy": "cpdp", "sync_period": 2, "lr": 0.1},
        ],
    )
    out = tmp_path / "robust"
    res = autok(
        "sweep",
        "--trials",
        "3",
        "--space",
        str(space),
        "--enqueue",
        str(first),
        "--out",
        str(out),
        *FIXED,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = trials(out)
    assert [r["state"] for r in rows] == ["FAIL", "FAIL", "COMPLETE"], rows
    assert "invalid settings: --sync-period" in rows[0]["reason"]
    # stopped by the trainer's divergence guard (or, failing that, by the sweep's own check)
    assert "diverged" in rows[1]["reason"], rows[1]["reason"]
    # a failed trial is said in a line with its reason, not with a traceback of the sweep
    assert "Trial 0 failed with parameters" in res.stderr and "TrialFailed(" in res.stderr
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    # each trial is said as it ends (number, state, K, beta, LR, metric, time), on stdout; into
    # a pipe there is no progress bar
    said = [ln for ln in res.stdout.splitlines() if ln.startswith("autok: trial ")]
    assert len(said) == 3, res.stdout
    assert re.fullmatch(
        r"autok: trial 0 \(1/3\) FAIL: K=2 beta=0 LR=0\.1 strategy=ddp \| invalid settings: "
        r"--sync-period.* \| \d+ s",
        said[0],
    ), said[0]
    assert re.fullmatch(
        r"autok: trial 1 \(2/3\) FAIL: K=2 beta=0 LR=1e\+06 strategy=cpdp \| .*diverged.* \| \d+ s",
        said[1],
    ), said[1]
    assert re.fullmatch(
        r"autok: trial 2 \(3/3\) COMPLETE: K=2 beta=0 LR=0\.1 strategy=cpdp \| peak accuracy "
        r"0\.\d+, \d+\.\d s of training \| \d+ s",
        said[2],
    ), said[2]
    assert res.stdout.index(said[2]) < res.stdout.index("peak accuracy  ")  # before the table
    assert "\r" not in res.stderr and "trial/s" not in res.stderr and "s/trial" not in res.stderr


def test_trial_lines_show_the_trial_as_it_ran_and_a_bar_only_on_a_terminal(monkeypatch, capsys):
    import io

    from autok.sweep import SweepOptions, TrialLines

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for err in (io.StringIO(), Terminal()):
        monkeypatch.setattr(sys, "stderr", err)
        lines = TrialLines(SweepOptions(trials=2), {"workers": 2, "slowmo_beta": 0.0})
        res = {"peak_test_metric": 0.91, "wall_seconds": 12.34, "reason": ""}
        lines.trial_ended(0, "COMPLETE", {"sync_period": 4, "lr": 0.05}, res, 20.2)
        # the strategy drawn, K and beta not: as the trial resolved them (ddp: K=1, beta 0)
        res = {"peak_test_metric": 0.5, "reason": "pruned at epoch 1"}
        lines.trial_ended(3, "PRUNED", {"strategy": "ddp"}, res, 5.0)
        lines.close()
        assert capsys.readouterr().out.splitlines() == [
            "autok: trial 0 (1/2) COMPLETE: K=4 beta=0 LR=0.05 | peak accuracy 0.91, 12.3 s of "
            "training | 20 s",
            "autok: trial 3 (2/2) PRUNED: K=1 beta=0 LR=0.1 strategy=ddp | peak accuracy 0.5, "
            "pruned at epoch 1 | 5 s",
        ]
        assert ("2/2" in err.getvalue()) == isinstance(err, Terminal)  # the bar's count


@pytest.mark.parametrize(
    "space, needle",
    [
        ({"sync_period": {"type": "int", "low": 8, "high": 1}}, "low <= high"),
        ({"lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}, "log scale"),
        ({"not_a_flag": {"type": "int", "low": 1, "high": 2}}, "not an `autok train` setting"),
        ({"policy": {"type": "categorical"}}, "choices"),
        ({"k_lowering": {"type": "float", "low": 0, "high": 1}}, "a true/false setting"),
        ({"lr": {"type": "normal"}}, "type"),
    ],
)
def test_invalid_space_is_refused(tmp_path, space, needle):
    res = autok(
        "sweep",
        "--space",
        str(write(tmp_path / "bad.yaml", space)),
        "--out",
        str(tmp_path / "s"),
        *FIXED,
    )
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("autok: error: --space:") and needle in line


def test_a_conditional_setting_is_drawn_only_where_the_trial_reads_it():
    """A conditional space: with `policy` drawn, `target_sync_share` is drawn in the trials of
    exposed-sync and composite only (and SGD's momentum in the trials of sgd only), so the
    others are runs, not refusals; the space is accepted as it is (check_space tries the
    setting under each drawn choice that reads it)."""
    import optuna

    from autok.space import Dim, check_fixed, suggest_all, trial_settings
    from autok.sweep import check_settings, check_space

    space = [
        Dim("target_sync_share", "float", 0.1, 0.4),
        Dim("momentum", "float", 0.5, 0.95),
        Dim("policy", "categorical", choices=("fixed", "exposed-sync", "composite")),
        Dim("optimizer", "categorical", choices=("sgd", "adamw")),
    ]
    fixed = {"strategy": "cpdp", "epochs": 2}
    check_space(fixed, space)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    cases = [("fixed", "adamw"), ("exposed-sync", "sgd"), ("composite", "adamw"), ("fixed", "sgd")]
    for policy, optimizer in cases:
        study.enqueue_trial({"policy": policy, "optimizer": optimizer})
    for policy, optimizer in cases:
        trial = study.ask()
        params = suggest_all(space, trial, fixed)
        assert (params["policy"], params["optimizer"]) == (policy, optimizer)
        assert ("target_sync_share" in params) == (policy != "fixed"), params
        assert ("momentum" in params) == (optimizer == "sgd"), params
        assert check_settings(fixed, params) is None, params
        study.tell(trial, 0.0)
    # the choice fixed by the sweep rather than drawn: the same rule
    trial = study.ask()
    assert "target_sync_share" in suggest_all(space[:1], trial, {"policy": "exposed-sync"})
    with pytest.raises(ConfigError, match="makes a valid run: --policy fixed does not read it"):
        check_space(fixed, space[:1])  # with no policy drawn, the default `fixed` never reads it
    with pytest.raises(ConfigError, match="makes a valid run: --optimizer adamw does not read it"):
        check_space(fixed | {"optimizer": "adamw"}, space[1:2])
    # a choice that makes no run with any draw fails every trial that draws it: refused up
    # front; with the setting it needs fixed, accepted
    scheduled = [Dim("policy", "categorical", choices=("fixed", "scheduled"))]
    with pytest.raises(ConfigError, match="choice 'scheduled' makes no valid run: --k-schedule"):
        check_space(fixed, scheduled)
    check_space(fixed | {"k_schedule": "4,8@step=10"}, scheduled)
    # a schedule choice is tried where it is read: one that never makes a run under
    # `scheduled` (it starts at 16, and K is fixed at 8) is refused, not excused by `fixed`
    drawn = scheduled + [Dim("k_schedule", "categorical", choices=("16,32@step=9", "8,32@step=9"))]
    with pytest.raises(ConfigError, match="choice '16,32@step=9' makes no valid run: --sync-pe"):
        check_space(fixed | {"sync_period": 8}, drawn)
    check_space(
        fixed | {"sync_period": 8},
        drawn[:1] + [Dim("k_schedule", "categorical", choices=("8,32@step=9",))],
    )
    # a fixed setting some trials read is dropped from the others; one none reads is refused
    searched = fixed | {"target_sync_share": 0.3}
    check_fixed(searched, space)
    assert "target_sync_share" not in trial_settings(searched, {"policy": "fixed"})
    assert trial_settings(searched, {"policy": "composite"})["target_sync_share"] == 0.3
    with pytest.raises(ConfigError, match="--target-sync-share: --policy fixed does not read"):
        check_fixed(searched, space[:2])
    with pytest.raises(ConfigError, match="read only with --policy exposed-sync, composite, wh"):
        check_fixed(searched | {"strategy": "ddp"}, space)  # no reader of it runs under ddp
    with pytest.raises(ConfigError, match="--target-sync-share: input should be less than 1"):
        check_fixed(fixed | {"target_sync_share": 3.0}, space)  # its bounds, checked by itself


def test_a_fixed_or_enqueued_conditional_setting_is_judged_by_the_trials_that_read_it(tmp_path):
    """check_fixed accepts a fixed setting whose readers are valid only with another searched
    setting off its default (K 100 needs a cap above 64: the space draws one); load_enqueue
    takes an entry without the choosing setting when every choice reads it; a choosing value
    that is not a name (a list from --config) is left to TrainConfig, which names it."""
    from autok.space import Dim, applies, check_fixed, load_enqueue

    space = [
        Dim("policy", "categorical", choices=("fixed", "exposed-sync")),
        Dim("max_sync_period", "int", 128, 256),
    ]
    fixed = {"sync_period": 100, "target_sync_share": 0.3}
    check_fixed(fixed, space)
    with pytest.raises(ConfigError, match="makes no valid run with the fixed settings"):
        check_fixed(fixed, space[:1])  # no trial's cap is above 64: none runs
    readers = [Dim("policy", "categorical", choices=("exposed-sync", "composite"))]
    readers.append(Dim("target_sync_share", "float", 0.1, 0.4))
    path = write(tmp_path / "enqueue.yaml", [{"target_sync_share": 0.3}])
    assert load_enqueue(path, readers, {}) == ({"target_sync_share": 0.3},)
    with pytest.raises(ConfigError, match="give policy in the entry too"):
        load_enqueue(
            path, [Dim("policy", "categorical", choices=("fixed", "composite"))] + readers[1:], {}
        )
    assert applies("target_sync_share", {"policy": ["fixed"]})
    twice = write(tmp_path / "twice.yaml", [{"target-sync-share": 0.3, "target_sync_share": 0.4}])
    with pytest.raises(ConfigError, match="entry 1 sets a setting twice"):
        load_enqueue(twice, readers, {})


def test_a_space_that_turns_the_skew_rule_off_beside_a_fixed_skew_cap_is_refused_up_front():
    """--skew-cap (and --skew-power, --skew-clear) shape the soft skew cap, which --skew-drift 0
    turns off, so one of them fixed beside a drawn --skew-drift of 0 is refused by every trial that
    draws 0:
    check_space refuses that choice before any trial, naming both flags; a range that starts at
    0 has other values that run, and is accepted, as is the choice with the cap left unset."""
    from autok.space import Dim
    from autok.sweep import check_space

    fixed = {"strategy": "cpdp", "policy": "exposed-sync", "epochs": 2}
    choices = [Dim("skew_drift", "categorical", choices=(0, 1.4))]
    for name, value in (("skew_cap", 8), ("skew_power", 0.6667), ("skew_clear", 0.4)):
        with pytest.raises(ConfigError, match=r"choice 0 makes no valid run: --skew-") as err:
            check_space(fixed | {name: value}, choices)
        assert "--skew-drift" in str(err.value), err.value
        check_space(fixed | {name: value}, [Dim("skew_drift", "float", 0.0, 2.0)])
    check_space(fixed, choices)


def test_a_setting_only_some_strategies_read_is_conditional_on_the_strategy():
    """READ_ONLY_UNDER's settings are conditional in sweeps as the policies' options are: a
    fixed --sync-optimizer-state with a searched strategy is dropped from the ddp trials (which
    refuse it), --boundary is drawn only in cpdp trials, and one no trial reads is refused."""
    import optuna

    from autok.space import Dim, check_fixed, suggest_all, trial_settings
    from autok.sweep import check_settings

    strategies = Dim("strategy", "categorical", choices=("ddp", "cpdp"))
    fixed = {"epochs": 2, "sync_period": 1, "sync_optimizer_state": True}
    check_fixed(fixed, [strategies])
    assert "sync_optimizer_state" not in trial_settings(fixed, {"strategy": "ddp"})
    assert trial_settings(fixed, {"strategy": "cpdp"})["sync_optimizer_state"] is True
    assert [check_settings(fixed, {"strategy": s}) for s in ("ddp", "cpdp")] == [None, None]
    space = [strategies, Dim("boundary", "categorical", choices=("two-phase", "fused"))]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for strategy in ("ddp", "cpdp"):
        study.enqueue_trial({"strategy": strategy})
        params = suggest_all(space, study.ask(), fixed)
        assert ("boundary" in params) == (strategy == "cpdp"), params
    with pytest.raises(ConfigError, match="--sync-optimizer-state: --strategy ddp does not read"):
        check_fixed(fixed | {"strategy": "ddp"}, [Dim("lr", "float", 0.01, 0.1)])


def test_the_sweep_table_names_its_metric_whole_and_keeps_its_columns_aligned():
    from autok.space import Dim
    from autok.sweep import SweepOptions, table

    row = {"number": 0, "state": "COMPLETE", "lr": 0.1, "peak_test_metric": 0.9512}
    row |= {"wall_seconds": 7.25, "total_seconds": 9.5}
    for metric in ("accuracy", "perplexity"):
        lines = table([row], [Dim("lr", "float", 0.01, 0.1)], opts=SweepOptions(metric_name=metric))
        lines = lines.splitlines()
        assert lines[0].split()[-6:-4] == ["peak", metric], lines[0]
        assert len(lines[0]) == len(lines[1]), lines  # every column right-aligned to its header
        assert lines[1].split()[-3:] == ["0.9512", "7.2", "9.5"], lines[1]


def test_a_study_made_with_a_setting_its_trials_never_read_resumes_without_it():
    """A study stored before autok refused a fixed setting no trial reads (the refusal now asks
    to drop it) compares as if made without it; one that some trials read stays."""
    from autok.space import Dim
    from autok.sweep import _as_ran

    def read(was, space):
        return _as_ran(was, space)[0]

    was = {"epochs": 2, "target_sync_share": 0.3}
    assert _as_ran(was, [Dim("lr", "float", 0.01, 0.1)]) == (
        {"epochs": 2},
        [
            "--target-sync-share 0.3, which it never read (--policy fixed does not read it); "
            "resuming without it"
        ],
    )
    policies = [Dim("policy", "categorical", choices=("fixed", "exposed-sync"))]
    assert _as_ran(was, policies) == (was, [])
    assert read({"optimizer": "adamw", "momentum": 0.5}, []) == {"optimizer": "adamw"}
    assert read({"nesterov": True, "momentum": 0.0}, []) == {"momentum": 0.0}
    optimizers = [Dim("optimizer", "categorical", choices=("sgd", "adamw"))]
    no_look_ahead = {"nesterov": True, "momentum": 0.0}  # read by no choice: sgd refuses it
    assert read(no_look_ahead, optimizers) == {"momentum": 0.0}
    assert read({"nesterov": True}, optimizers) == {"nesterov": True}  # sgd's trials read it
    qsr = {"policy": "qsr", "qsr_base": 100}  # K ran past the default cap 64
    assert read(qsr, []) == qsr | {"max_sync_period": 100}


def test_a_study_made_when_exposed_sync_started_at_4_is_not_resumed_with_trials_at_1():
    from autok.space import Dim
    from autok.sweep import EXPOSED_SYNC_START, K_START_ATTR, k_start_problem

    old: dict = {"fixed": {}}  # a study made before the start was recorded
    policies = [Dim("policy", "categorical", choices=("fixed", "exposed-sync"))]
    assert "started at K = 4" in (k_start_problem(old, {}, policies) or "")
    assert "started at K = 4" in (k_start_problem(old, {"policy": "exposed-sync"}, []) or "")
    assert k_start_problem(old, {}, []) is None  # fixed: K = 4 then and now
    assert k_start_problem(old, {"policy": "exposed-sync", "sync_period": 4}, []) is None
    assert k_start_problem(old, {"policy": "exposed-sync", "k_rule": "double"}, []) is None
    ks = [Dim("sync_period", "int", 1, 8)]
    assert k_start_problem(old, {"policy": "exposed-sync"}, ks) is None
    new = {K_START_ATTR: EXPOSED_SYNC_START}
    assert k_start_problem(new, {}, policies) is None


def test_a_study_made_when_the_floor_was_1_is_not_resumed_with_adamw_trials_at_2():
    from autok.space import Dim
    from autok.sweep import FLOOR_ATTR, k_floor_problem

    old: dict = {"fixed": {}}  # a study made before the floor followed the optimizer
    adamw = {"policy": "exposed-sync", "optimizer": "adamw"}
    optimizers = [Dim("optimizer", "categorical", choices=("sgd", "adamw"))]
    policies = [Dim("policy", "categorical", choices=("fixed", "composite"))]
    assert "K floor was 1" in (k_floor_problem(old, adamw, []) or "")
    assert "K floor was 1" in (k_floor_problem(old, {"policy": "exposed-sync"}, optimizers) or "")
    assert "K floor was 1" in (k_floor_problem(old, {"optimizer": "adamw"}, policies) or "")
    assert k_floor_problem(old, {"policy": "exposed-sync"}, []) is None  # SGD: 1 then and now
    assert k_floor_problem(old, {"optimizer": "adamw"}, []) is None  # fixed reads no floor
    assert k_floor_problem(old, adamw | {"k_floor": 1}, []) is None
    assert k_floor_problem(old, adamw, [Dim("k_floor", "int", 1, 4)]) is None
    assert k_floor_problem({FLOOR_ATTR: True}, adamw, []) is None


@pytest.mark.timeout(900)
def test_a_sweep_over_policies_runs_every_trial_and_its_best_yaml_runs(tmp_path):
    """End to end: a space over the policy and exposed-sync's share, with a fixed share the
    `fixed` trials drop. Every trial completes; the fixed trial records no share; best.yaml
    holds only what its trial read, and validates as an `autok train --config`."""
    from autok.config import load_config

    space = write(
        tmp_path / "space.yaml",
        {
            "policy": {"type": "categorical", "choices": ["fixed", "exposed-sync"]},
            "k_growth": {"type": "int", "low": 2, "high": 4},
        },
    )
    enqueue = write(tmp_path / "e.yaml", [{"policy": "fixed"}, {"policy": "exposed-sync"}])
    out = tmp_path / "sweep"
    res = autok(
        "sweep", "--trials", "2", "--space", str(space), "--enqueue", str(enqueue),
        "--out", str(out), *FIXED, "--target-sync-share", "0.3", timeout=800,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = trials(out)
    assert [(r["state"], r["policy"]) for r in rows] == [
        ("COMPLETE", "fixed"),
        ("COMPLETE", "exposed-sync"),
    ], rows
    assert rows[0]["k_growth"] == "" and rows[1]["k_growth"] in ("2", "3", "4")
    configs = [json.loads((Path(r["run_dir"]) / "config.json").read_text()) for r in rows]
    assert configs[0]["target_sync_share"] == 0.2 and configs[1]["target_sync_share"] == 0.3
    text = (out / "best.yaml").read_text()
    best = yaml.safe_load(text)
    ran = configs[int(re.search(r"# best trial (\d+) ", text).group(1))]
    assert best == {k: ran[k] for k in best} and {"policy", "workers"} <= set(best), best
    assert ("k_growth" in best) == (best["policy"] == "exposed-sync"), best
    assert best["sync_period"] == ran["sync_period"]  # pinned: the K its trial started at
    # and the faster-link check it ran with, where its policy read one
    assert ("link_drop" in best) == (best["policy"] == "exposed-sync"), best
    assert best.get("link_drop", ran["link_drop"]) == ran["link_drop"] == 3.0
    load_config({}, {**best, "out": None})  # a run: raises if not


# Python leaves SIGINT ignored in a process started with it ignored (a background job of a
# non-interactive shell: how some CI runners and agents start pytest), and so would the sweep
# under test: its children get Python's own handler back explicitly.
WITH_SIGINT = [
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from autok.cli import main; sys.exit(main(sys.argv[1:]))",
]


@pytest.mark.timeout(1500)
def test_ctrl_c_leaves_a_study_that_resume_continues(tmp_path, small_space):
    out = tmp_path / "intr"
    proc = subprocess.Popen(
        [
            *WITH_SIGINT,
            "sweep",
            "--trials",
            "10",
            "--space",
            str(small_space),
            "--out",
            str(out),
            *FIXED,
            "--epochs",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The marker that trial 0 really runs: its trainer has created epochs.csv (the trial is a
    # child of the sweep's run_trial, which is polling it). A bound, not a timing assumption.
    deadline = time.time() + 600
    while not (out / "trials" / "trial-0000" / "epochs.csv").exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.time() < deadline, "trial 0 did not start within 600 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err
    before = trials(out)
    assert len(before) == 1 and before[0]["state"] == "FAIL", before
    assert before[0]["reason"].startswith("interrupted"), before
    # with the same fixed part (its --epochs 30 too: another would be refused)
    more = ["--trials", "1", "--resume", "--space", str(small_space), "--out", str(out)]
    res = autok("sweep", *more, *FIXED, "--epochs", "30", timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r["state"] for r in trials(out)] == ["FAIL", "COMPLETE"]


# Ctrl-C at each phase of a sweep, in-process: run_trial is replaced by a stand-in that sends
# SIGINT to the main thread at a chosen moment; the sweep must stop at a safe point, write its
# outputs, leave no trial RUNNING, and raise KeyboardInterrupt (the CLI's exit 130).

SMALL_FIXED = {"workers": 2, "epochs": 2, "mnist1d_samples": 500, "link": "none"}


@pytest.fixture
def python_sigint():
    """SIGINT handled by Python in this (main) thread for the test, whatever pytest inherited."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def interrupt_main() -> None:
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def stand_in(phase: str):
    from autok.trials import COMPLETE, FAIL, INTERRUPTED, TrialResult

    once = threading.Event()  # ONE Ctrl-C: with --jobs 2 a second would take the other path

    def interrupt_once() -> None:
        if not once.is_set():
            once.set()
            interrupt_main()

    def run_trial(settings, run_dir, report=None, target=0.9, should_stop=None, **kw):
        run_dir.mkdir(parents=True, exist_ok=True)
        if phase == "after":  # the run has finished; Ctrl-C comes before the sweep records it
            interrupt_once()
            return TrialResult(COMPLETE, str(run_dir), peak_test_metric=0.5, wall_seconds=1.0)
        if phase == "during":
            interrupt_once()
        deadline = time.monotonic() + 120  # "running" until told to stop, as the real one polls
        while not should_stop():
            assert time.monotonic() < deadline, "the sweep never asked the trial to stop"
            time.sleep(0.01)
        return TrialResult(FAIL, str(run_dir), INTERRUPTED)

    return run_trial


def in_process_sweep(tmp_path, small_space, monkeypatch, phase: str, jobs: int = 1):
    import optuna

    import autok.sweep as sw
    from autok.space import load_space

    monkeypatch.setattr(sw, "run_trial", stand_in(phase))
    if phase == "setup":  # Ctrl-C while the study is being created
        real = sw._storage

        def storage(opts):
            interrupt_main()
            return real(opts)

        monkeypatch.setattr(sw, "_storage", storage)
    opts = sw.SweepOptions(out=tmp_path / phase, trials=6, jobs=jobs)
    opts.out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        sw.sweep_optuna(opts, dict(SMALL_FIXED), load_space(small_space))
    url = f"sqlite:///{opts.out / 'study.db'}"
    states = [t.state.name for t in optuna.load_study(study_name="autok", storage=url).trials]
    assert [r["state"] for r in trials(opts.out)] == states  # outputs written, and current
    assert "RUNNING" not in states
    return trials(opts.out)


def test_ctrl_c_while_the_study_is_created_leaves_an_empty_study(
    tmp_path, small_space, monkeypatch, python_sigint
):
    assert in_process_sweep(tmp_path, small_space, monkeypatch, "setup") == []


def test_ctrl_c_during_a_trial_stops_it_and_starts_no_other(
    tmp_path, small_space, monkeypatch, python_sigint
):
    rows = in_process_sweep(tmp_path, small_space, monkeypatch, "during")
    assert [(r["state"], r["reason"].split()[0]) for r in rows] == [("FAIL", "interrupted")]


def test_ctrl_c_as_a_trial_ends_records_it_and_starts_no_other(
    tmp_path, small_space, monkeypatch, python_sigint
):
    rows = in_process_sweep(tmp_path, small_space, monkeypatch, "after")
    assert [r["state"] for r in rows] == ["COMPLETE"]


def test_ctrl_c_with_two_jobs_stops_both_running_trials(
    tmp_path, small_space, monkeypatch, python_sigint
):
    # both trials wait in the stand-in until told to stop; the Ctrl-C comes from the first
    rows = in_process_sweep(tmp_path, small_space, monkeypatch, "during", jobs=2)
    assert 1 <= len(rows) <= 2 and {r["state"] for r in rows} == {"FAIL"}, rows
    assert all(r["reason"].startswith("interrupted") for r in rows)


# ----- trial processes -------------------------------------------------------------------------


def test_trial_processes_start_without_preexec_fn_and_die_with_their_parent(tmp_path, monkeypatch):
    import autok.procs

    seen = {}
    real_popen = subprocess.Popen

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(autok.procs.subprocess, "Popen", spy)
    with open(tmp_path / "log", "w") as log:
        autok.procs.start_logged([sys.executable, "-c", "print('ran')"], log).wait(timeout=60)
    assert (tmp_path / "log").read_text().strip() == "ran"
    assert seen.get("preexec_fn") is None  # no Python between fork and exec in a threaded parent

    # A parent that starts a child in its own session, then is SIGKILLed: the child must go too.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from autok.procs import start_logged; "
            "p = start_logged(['sleep', '600'], open(sys.argv[1], 'w'), new_session=True); "
            "print(p.pid, flush=True); time.sleep(600)",
            str(tmp_path / "child.log"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 120
        while "sleep" not in Path(f"/proc/{child}/cmdline").read_text():  # exec'd: asked to die
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.05)
        assert os.getsid(child) == child  # its own session: a terminal's Ctrl-C skips it
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 120
    while Path(f"/proc/{child}").exists() and "Z" not in proc_state(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


# ----- secrets ---------------------------------------------------------------------------------

SECRET = "S3cr3t-PW"


def test_redact_hides_passwords_in_urls_and_in_library_text():
    from autok.sweep import hiding_passwords, redact, redact_url

    assert redact_url("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("postgresql://u:p@ss@h/db") == "postgresql://u:***@h/db"
    for plain in ("ray://h:10001", "sqlite:////tmp/s.db", "postgresql://u@h/db", "auto"):
        assert redact_url(plain) == plain
    raw = "postgresql://u:p@ss@h/db"  # parsers disagree on where its host starts
    text = f"bad {raw}: could not translate host name 'ss@h'"
    assert redact(text, raw) == "bad postgresql://u:***@h/db: could not translate host name '***@h'"
    encoded = "postgresql://u:p%40ss%2Fw@h/db"
    assert "p@ss/w" not in redact("password 'p@ss/w' was refused", encoded)
    assert redact("from ray://admin:hunter22@head:10001 and x") == (
        "from ray://admin:***@head:10001 and x"
    )
    with pytest.raises(RuntimeError) as e, hiding_passwords(raw):
        raise OSError(f"cannot reach {raw}")
    assert "ss" not in str(e.value).replace("***", "")
    # a password in the query string (libpq's ?password=), and one a parser cuts at its ':'
    query = "postgresql://alice@127.0.0.1:1/db?sslmode=off&password=hunter2secret"
    assert redact_url(query) == "postgresql://alice@127.0.0.1:1/db?sslmode=off&password=***"
    assert "hunter2secret" not in redact(f"cannot connect to {query}", query)
    # what is no secret stays: a key file's path, an @ in the query, the port and database
    sslkey = "postgresql://u@h/db?sslkey=/home/alice/client.key"
    assert redact(f"no file /home/alice/client.key for {sslkey}", sslkey) == (
        f"no file /home/alice/client.key for {sslkey}"
    )
    at_in_query = "postgresql://h:5432/db?user=a@b"
    assert redact_url(at_in_query) == at_in_query
    assert redact("db at h:5432 refused", at_in_query) == "db at h:5432 refused"
    colon = "postgresql://alice:p@ss:w0rdX@127.0.0.1:1/db"
    said = "invalid literal for int() with base 10: 'w0rdX@127.0.0.1:1'"
    assert redact(said, colon) == "invalid literal for int() with base 10: '***@127.0.0.1:1'"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://autok:{SECRET}@/autok?host=/nonexistent-autok-dir",  # no server there
        f"postgresql://autok:{SECRET}@127.0.0.1:notaport/autok",  # no parser takes it
        f"mysql+nosuchdriver://autok:{SECRET}@127.0.0.1/autok",  # no such driver
        f"postgresql://autok@127.0.0.1:1/autok?password={SECRET}",  # libpq's query form
        f"postgresql://autok:p@ss:{SECRET}@127.0.0.1:1/autok",  # cut at the wrong ':'
        f"autok:{SECRET}@127.0.0.1/autok",  # no scheme at all
        f"postgresql//autok:{SECRET}@127.0.0.1/autok",  # a mistyped scheme: no "://"
        f"postgresql:/autok:{SECRET}@127.0.0.1/autok",
        f"autok:{SECRET}@127.0.0.1/autok?next=http://x",  # a "://" in the query only
    ],
)
def test_storage_password_is_never_printed_or_written(tmp_path, small_space, url):
    out = tmp_path / "s"
    res = autok(
        "sweep", "--storage", url, "--trials", "1", "--space", str(small_space), "--out", str(out)
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith("autok: error: --storage: ") and res.stderr.count("\n") == 1
    assert "autok:***@" in res.stderr or "password=***: " in res.stderr
    assert SECRET not in res.stdout + res.stderr
    for f in tmp_path.rglob("*"):
        assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f


# ----- PostgreSQL ------------------------------------------------------------------------------


def test_optuna_sweep_against_a_real_postgresql(tmp_path, small_space):
    url = os.environ.get("AUTOK_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("AUTOK_REQUIRE_POSTGRES") == "1":
            pytest.fail("AUTOK_TEST_POSTGRES_URL is not set, and AUTOK_REQUIRE_POSTGRES=1")
        pytest.skip("no PostgreSQL (.ci/run starts one and sets AUTOK_TEST_POSTGRES_URL)")
    name = f"autok-test-{os.getpid()}-{int(time.time())}"
    args = ["--space", str(small_space), "--storage", url, "--study-name", name, *FIXED]
    res = autok(
        "sweep", "--trials", "2", "--jobs", "2", "--out", str(tmp_path / "a"), *args, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    # a second machine (here: another directory) joins the same study through the database
    res = autok(
        "sweep", "--trials", "1", "--resume", "--out", str(tmp_path / "b"), *args, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(trials(tmp_path / "b")) == 3


# ----- Ray Tune --------------------------------------------------------------------------------


@pytest.mark.dist
def test_ray_backend_runs_tiny_trials_end_to_end(tmp_path, small_space):
    # On a --task judged by a lower-is-better metric: Ray moves each trial into its own
    # directory, and the task's module must still be found (from the sweep's directory).
    out = tmp_path / "ray"
    task = ["--task", "tests.task_fixtures:regression", "--workers", "2", "--epochs", "2"]
    res = autok(
        "sweep", "--backend", "ray", "--trials", "2", "--space", str(small_space),
        "--out", str(out), *task, "--link", "none", "--slowmo-beta", "0", timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = trials(out)
    # ASHA may stop the weaker trial after its first epoch (grace period 1)
    assert len(rows) == 2 and {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}, rows
    # each trial said as it ended, as on the Optuna backend
    said = [ln for ln in res.stdout.splitlines() if ln.startswith("autok: trial ")]
    assert len(said) == 2, res.stdout[-3000:]
    for ln in said:
        assert re.fullmatch(
            r"autok: trial [01] \([12]/2\) (COMPLETE|PRUNED): K=\d+ beta=0 LR=[\d.e+-]+ \| "
            r"peak mse \S+(, .*)? \| \d+ s",
            ln,
        ), ln
    done = [r for r in rows if r["state"] == "COMPLETE"]
    assert done
    for r in done:
        summary = json.loads((Path(r["run_dir"]) / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["metric"]["name"] == "mse"
        assert float(r["peak_test_metric"]) == summary["peak_test_metric"]
    assert (out / "pareto.png").exists()
    best = min(done, key=lambda r: float(r["peak_test_metric"]))  # lower is better
    assert (out / "best.yaml").read_text().startswith(f"# best trial {best['number']} of ")


# Starts the sweep's local Ray, runs one task (so a worker listens too), says "up" and holds
# Ray until its stdin closes.
RAY_UP = """
import sys
from autok.sweep_ray import start_ray
assert start_ray(None)
import ray
assert ray.get(ray.remote(lambda: 1).remote()) == 1
print("up", flush=True)
sys.stdin.read()
ray.shutdown()
"""


def process_tree(root: int) -> set[int]:
    """`root` and every process below it, from /proc (Linux)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, ppid in parent.items() if ppid in tree} - tree
        tree |= below
        grew = bool(below)
    return tree


def listening_sockets(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket these processes listen on, from /proc."""
    import ipaddress

    owner = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                owner[target[8:-1]] = pid
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            (host, port), state, inode = fields[1].split(":"), fields[3], fields[9]
            if state != "0A" or inode not in owner:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(host)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((owner[inode], str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, an IPv6 socket's IPv4 form
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.dist
def test_a_local_ray_listens_on_loopback_only_with_no_dashboard(tmp_path):
    """Without --address the sweep's own Ray must not be reachable from the network: its GCS,
    raylet, agents, workers and driver all listen on loopback, and no dashboard (port 8265)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ENABLE_")}
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", RAY_UP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=err, text=True, env=env, cwd=Path(__file__).parent.parent,
        )  # fmt: skip
        try:
            up = proc.stdout.readline().strip()  # "" when the process ended without Ray
            sockets = listening_sockets(process_tree(proc.pid)) if up == "up" else []
        finally:
            proc.stdin.close()
            proc.wait(timeout=300)
    assert up == "up", (tmp_path / "stderr").read_text()[-3000:]
    # at least the driver, the GCS, the raylet and the worker: the check saw Ray's servers
    assert len({pid for pid, _, _ in sockets}) >= 4, sockets
    assert all(is_loopback(address) for _, address, _ in sockets), sockets
    assert 8265 not in {port for _, _, port in sockets}, sockets


RAY_IMPORTED_FIRST = """
import ray
from autok.sweep_ray import start_ray
print(ray.util.get_node_ip_address())  # what Ray takes for this machine's IP
try:
    start_ray(None)
except RuntimeError as exc:
    print(exc)
print("still up" if ray.is_initialized() else "shut down")
"""


@pytest.mark.dist
def test_a_local_ray_that_came_up_on_every_interface_is_shut_down_and_refused():
    """The switch is read when ray is first imported: a caller that imported it before gets a
    Ray on the machine's IP, which start_ray shuts down and refuses in one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ENABLE_")}
    res = subprocess.run(
        [sys.executable, "-c", RAY_IMPORTED_FIRST], capture_output=True, text=True, env=env,
        cwd=Path(__file__).parent.parent, timeout=300,
    )  # fmt: skip
    lines = res.stdout.strip().splitlines()
    if lines and is_loopback(lines[0]):
        pytest.skip("this machine has only loopback: Ray comes up there whatever the switch")
    assert res.returncode == 0 and len(lines) == 3, res.stdout + res.stderr[-3000:]
    assert "not only on loopback" in lines[1] and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in lines[1]
    assert lines[2] == "shut down"


def test_dist_backend_reaches_the_trials_and_backend_stays_the_sweeps(tmp_path, monkeypatch):
    """`--dist-backend` is the trials' --backend; the sweep's own --backend is another flag
    (they once shared one argparse dest: the one overwrote the other)."""
    import autok.sweep
    from autok.cli import main

    seen = {}

    def capture(opts, fixed, space):
        seen.update(backend=opts.backend, fixed=fixed)
        raise KeyboardInterrupt  # stop here: nothing to run

    monkeypatch.setattr(autok.sweep, "sweep_optuna", capture)
    argv = ["sweep", "--dist-backend", "gloo", "--workers", "2", "--out", str(tmp_path / "s")]
    assert main(argv) == 130
    assert seen["backend"] == "optuna" and seen["fixed"]["backend"] == "gloo"
