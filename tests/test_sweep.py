"""`autok sweep`: Optuna on sqlite (and PostgreSQL), pruning, robustness, Ray Tune."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

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
        "peak_test_accuracy",
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
    # stopped early: far fewer than the 10 epochs it was configured for
    assert len(list(csv.DictReader((Path(rows[2]["run_dir"]) / "epochs.csv").open()))) <= 4


def test_failing_and_diverging_trials_are_recorded_and_the_sweep_goes_on(tmp_path):
    space = write(
        tmp_path / "space.yaml",
        {
            "strategy": {"type": "categorical", "choices": ["cpdp", "ddp"]},
            "lr": {"type": "float", "low": 0.05, "high": 1e6, "log": True},
        },
    )
    first = write(
        tmp_path / "enqueue.yaml",
        [
            {"strategy": "ddp", "lr": 0.1},  # ddp with the fixed K=2: refused at config time
            {"strategy": "cpdp", "lr": 1e6},  # diverges
            {"strategy": "cpdp", "lr": 0.1},
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
        "--sync-period",
        "2",
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = trials(out)
    assert [r["state"] for r in rows] == ["FAIL", "FAIL", "COMPLETE"], rows
    assert "invalid settings: --sync-period" in rows[0]["reason"]
    # stopped by the trainer's divergence guard (or, failing that, by the sweep's own check)
    assert "diverged" in rows[1]["reason"], rows[1]["reason"]


@pytest.mark.parametrize(
    "space, needle",
    [
        ({"sync_period": {"type": "int", "low": 8, "high": 1}}, "low <= high"),
        ({"lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}, "log scale"),
        ({"not_a_flag": {"type": "int", "low": 1, "high": 2}}, "not an `autok train` setting"),
        ({"policy": {"type": "categorical"}}, "choices"),
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


def test_ctrl_c_leaves_a_study_that_resume_continues(tmp_path, small_space):
    out = tmp_path / "intr"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autok.cli",
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
    deadline = time.time() + 120
    while not (out / "trials" / "trial-0000" / "epochs.csv").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err
    before = trials(out)
    assert len(before) == 1 and before[0]["state"] == "FAIL"
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
    assert [r["state"] for r in trials(out)] == ["FAIL", "COMPLETE"]


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
    out = tmp_path / "ray"
    res = autok(
        "sweep",
        "--backend",
        "ray",
        "--trials",
        "2",
        "--space",
        str(small_space),
        "--out",
        str(out),
        *FIXED,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = trials(out)
    # ASHA may stop the weaker trial after its first epoch (grace period 1)
    assert len(rows) == 2 and {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}, rows
    done = [r for r in rows if r["state"] == "COMPLETE"]
    assert done
    for r in done:
        assert json.loads((Path(r["run_dir"]) / "summary.json").read_text())["world_size"] == 2
    assert (out / "best.yaml").exists() and (out / "pareto.png").exists()
