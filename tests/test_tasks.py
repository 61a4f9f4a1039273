"""`--task MODULE:FUNCTION`: a user's model, data, loss and metric through `autok train`,
sweeps and the report (docs/design.md §7, §3)."""

from __future__ import annotations

import csv
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autok.config import TrainConfig
from autok.trainer.loop.sinks import TASK_EPOCH_COLUMNS
from autok.trainer.loop.tasks import ACCURACY, PERPLEXITY, Task, TaskError, load_task
from tests import task_fixtures
from tests.task_fixtures import regression_data, regression_model
from tests.test_cli import autok

TASK = "tests.task_fixtures:regression"
TINY = ["--workers", "2", "--link", "none", "--no-progress", "--optimizer", "sgd"]


# ----- the plug-in itself (no process group) ---------------------------------------------------


def test_the_builtin_classification_is_a_task_like_any_other():
    task = load_task(TrainConfig(dataset="digits"))
    assert isinstance(task, Task) and task.metric is ACCURACY and task.classifies
    assert len(task.train_dataset) + len(task.test_dataset) == 1797  # sklearn's digits


@pytest.mark.parametrize(
    "spec, says",
    [
        ("tests.task_fixtures:not_a_task", "returned a dict, not an autok.Task"),
        ("tests.task_fixtures:raises", "failed: RuntimeError: the data set is not where"),
        ("tests.task_fixtures:no_parameters", "a model with no trainable parameters"),
        ("tests.task_fixtures:empty_test_set", "an empty test_dataset"),
        ("tests.task_fixtures:NOT_CALLABLE", "has no function 'NOT_CALLABLE'"),
        ("tests.task_fixtures:missing", "has no function 'missing'"),
        ("tests.no_such_module:task", "cannot import tests.no_such_module: ModuleNotFoundError"),
        ("tests.task_fixture_exits:task", "cannot import tests.task_fixture_exits: SystemExit"),
        ("tests.task_fixtures:unpaired_samples", "samples are not (input, target) pairs"),
        ("tests.task_fixtures:wrong_shapes", "train_dataset fails in the model on 2 samples"),
        ("tests.task_fixtures:loss_not_scalar", "a loss_fn that does not return a scalar"),
        # each of these passed the checks and crashed after launch (files written, exit 1)
        ("tests.task_fixtures:detached_loss", "a loss_fn whose loss does not require grad"),
        ("tests.task_fixtures:huge_train_set", "a train_dataset of 1000000000000 samples"),
        ("tests.task_fixtures:complex_parameter", "parameter 'weight' is complex64"),
        ("tests.task_fixtures:integer_parameter", "parameter 'step' is int64"),
    ],
)
def test_an_unusable_task_is_one_line_naming_the_flag(spec, says):
    with pytest.raises(TaskError) as err:
        load_task(TrainConfig(task=spec))
    assert str(err.value).startswith("--task: ") and says in str(err.value)
    assert "\n" not in str(err.value)


def test_metrics_are_judged_from_sums_so_any_sharding_gives_the_same_value():
    logits = torch.randn(6, 5, 7)
    target = torch.randint(0, 7, (6, 5))
    whole = PERPLEXITY.batch(logits, target)
    parts = [PERPLEXITY.batch(logits[i : i + 2], target[i : i + 2]) for i in (0, 2, 4)]
    total = sum(float(p[0]) for p in parts)
    count = sum(p[1] for p in parts)
    assert total == pytest.approx(float(whole[0]), rel=1e-6) and count == whole[1] == 30
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), target.reshape(-1))
    assert PERPLEXITY.value(total / count) == pytest.approx(math.exp(float(nll)), rel=1e-5)
    # uniform logits: perplexity is the vocabulary size
    flat = PERPLEXITY.batch(torch.zeros(4, 3, 11), torch.zeros(4, 3, dtype=torch.long))
    assert PERPLEXITY.value(float(flat[0]) / flat[1]) == pytest.approx(11.0)
    correct, n = ACCURACY.batch(torch.eye(4), torch.tensor([0, 1, 0, 3]))
    assert (int(correct), n) == (3, 4)


def test_a_task_owns_its_data_and_model_flags():
    owned = [("model", "mlp"), ("dataset", "digits"), ("mnist1d_samples", 900)]
    for field, value in [*owned, ("mnist1d_test_samples", 900)]:
        with pytest.raises(ValueError, match=f"--{field.replace('_', '-')}: the task builds"):
            TrainConfig(task=TASK, **{field: value})


# ----- end to end: autok train, resume, sweep ------------------------------------------------


def _independent_mse(model_pt) -> float:
    """The test MSE of the saved model, computed here from scratch."""
    model = regression_model()
    model.load_state_dict(torch.load(model_pt, weights_only=True))
    _, test = regression_data()
    x, y = test.tensors
    with torch.no_grad():
        return float(((model(x).squeeze(-1) - y) ** 2).mean())


def test_train_with_a_task_reports_its_metric_in_every_file(tmp_path):
    # A user's module in the directory they run from, through the installed `autok` command
    # (which, unlike `python -m`, does not put that directory on sys.path itself).
    (tmp_path / "user_task.py").write_text(
        inspect.getsource(task_fixtures).replace("from __future__ import annotations", "")
    )
    out = tmp_path / "r"
    command = [
        str(Path(sys.executable).parent / "autok"),
        "train",
        "--task",
        "user_task:regression",
    ]
    res = subprocess.run(
        [*command, *TINY, "--epochs", "3", "--lr", "0.05", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((out / "epochs.csv").open()))
    assert list(rows[0]) == TASK_EPOCH_COLUMNS and len(rows) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == {"name": "mse", "higher_is_better": False}
    values = [float(r["test_metric"]) for r in rows]
    assert summary["peak_test_metric"] == min(values)  # the best is the lowest
    assert summary["final_test_metric"] == values[-1]
    assert "peak_test_accuracy" not in summary and "train_accuracy" not in rows[0]
    # The loop's metric (summed over two ranks' slices) is the whole test set's, exactly as an
    # independent evaluation of the final model finds it; the loss is the same MSE here.
    assert values[-1] == pytest.approx(_independent_mse(out / "model.pt"), rel=1e-5)
    assert float(rows[-1]["test_loss"]) == pytest.approx(values[-1], rel=1e-5)
    assert values[-1] < values[0]  # it learns
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "user_task:regression"


def test_a_task_run_stops_and_resumes_with_its_own_columns(tmp_path):
    out = tmp_path / "r"
    args = ["train", "--task", TASK, *TINY, "--epochs", "2", "--out", str(out)]
    res = autok(*args, "--stop-after-epochs", "1")
    assert res.returncode == 0, res.stderr
    assert len(list(csv.DictReader((out / "epochs.csv").open()))) == 1
    # the code a resume runs is its command line's: the same --task
    res = autok("train", "--resume", str(out), "--task", TASK, "--no-progress")
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((out / "epochs.csv").open()))
    assert list(rows[0]) == TASK_EPOCH_COLUMNS and [r["epoch"] for r in rows] == ["0", "1"]


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--task", "tests.task_fixtures:not_a_task"], "--task: "),
        (["--task", "tests.no_such_module:task"], "--task: cannot import"),
        (["--task", "not a spec"], "--task: 'not a spec' is not MODULE:FUNCTION"),
        (["--task", TASK, "--model", "cnn"], "--model: the task builds"),
    ],
)
def test_train_refuses_a_bad_task_before_writing_anything(tmp_path, extra, says):
    res = autok("train", *extra, *TINY, "--out", str(tmp_path / "r"))
    assert res.returncode == 2 and res.stderr.startswith(f"autok: error: {says}")
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # the default suite sweeps a task on Ray (test_sweep.py); this is Optuna's
def test_a_sweep_of_two_trials_on_a_task_minimizes_its_metric(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: float, low: 0.001, high: 0.05, log: true}\n")
    out = tmp_path / "s"
    res = autok(
        "sweep", "--task", TASK, *TINY, "--epochs", "2", "--trials", "2", "--objective", "metric",
        "--space", str(space), "--out", str(out), timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"]
    for r in rows:  # each trial's figure is its own run's summary
        trial_dir = out / "trials" / f"trial-{int(r['number']):04d}"
        summary = json.loads((trial_dir / "summary.json").read_text())
        assert float(r["peak_test_metric"]) == summary["peak_test_metric"]
    best = min(rows, key=lambda r: float(r["peak_test_metric"]))
    head = (out / "best.yaml").read_text().splitlines()[0]
    assert head.startswith(f"# best trial {best['number']} of ") and "best test mse" in head
    assert "peak mse" in res.stdout  # the sweep table names the task's metric


def test_time_to_target_on_a_task_needs_the_target_value(tmp_path):
    res = autok("sweep", "--task", TASK, "--objective", "time-to-target", "--out", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "autok: error: --target: the task's metric is mse; give the value to reach"
    )


def test_the_probe_leaves_no_trace_in_the_model():
    from torch import nn
    from torch.utils.data import TensorDataset

    from autok.trainer.loop.tasks import _probe

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    data = TensorDataset(torch.randn(6, 3) * 5 + 3, torch.tensor([0, 1, 0, 1, 0, 1]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert _probe(Task(model, data, data)) is None
    assert model.training  # the mode it had
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN stats too


# ----- the sweep's direction (pure functions) -----------------------------------------------


def test_a_lower_is_better_metric_is_minimized_ranked_and_pruned_that_way():
    from autok.pareto import pareto_front
    from autok.sweep import SweepOptions, best_row, directions, intermediate, oriented

    low = SweepOptions(metric_name="perplexity", higher_is_better=False)
    acc = SweepOptions()
    assert directions(low) == ["minimize", "minimize"] and directions(acc) == [
        "maximize",
        "minimize",
    ]
    metric = SweepOptions(objective="metric", metric_name="mse", higher_is_better=False)
    assert directions(metric) == ["minimize"] and intermediate(metric, 3.0) == 3.0
    ttt = SweepOptions(objective="time-to-target", metric_name="perplexity", higher_is_better=False)
    assert directions(ttt) == ["minimize"] and intermediate(ttt, 12.0) == 12.0
    ttt_acc = SweepOptions(objective="time-to-target")
    assert intermediate(ttt_acc, 0.8) == pytest.approx(0.2)  # the error
    rows = [
        {"number": i, "state": "COMPLETE", "peak_test_metric": m, "wall_seconds": w,
         "time_to_target": None}
        for i, (m, w) in enumerate([(12.0, 10.0), (9.0, 30.0), (15.0, 5.0), (9.5, 40.0)])
    ]  # fmt: skip
    assert best_row(low, rows)["number"] == 1  # the lowest perplexity
    assert best_row(acc, rows)["number"] == 2  # the same numbers as accuracies: the highest
    front = pareto_front([(oriented(low, r["peak_test_metric"]), r["wall_seconds"]) for r in rows])
    assert sorted(front) == [0, 1, 2]  # (9.5, 40 s) is dominated by (9.0, 30 s)


def test_a_run_saved_before_the_loop_moved_under_autok_still_names_the_builtin_task():
    from autok.trainer.loop.tasks import BUILTIN_TASK, resolve

    assert resolve("trainer.tasks:classification") is resolve(BUILTIN_TASK)
