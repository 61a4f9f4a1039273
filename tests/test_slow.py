"""Long runs, outside the default suite: `make test ARGS="-m slow"`."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import autok

pytestmark = pytest.mark.slow


def test_default_job_reaches_useful_accuracy(tmp_path):
    res = autok("train", "--no-progress", "--out", str(tmp_path / "r"), timeout=900)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["peak_test_accuracy"] >= 0.85
    assert len(set(summary["param_digest_per_rank"])) == 1


def test_tiny_gpt_trains_and_sweeps_as_a_task_under_exposed_sync(tmp_path):
    """The commands the README gives for examples/tiny_gpt: train under exposed-sync on wan, and
    a sweep of two trials on the same task, judged by validation perplexity."""
    import csv
    import math

    job = ["--task", "examples.tiny_gpt:task", "--workers", "2", "--epochs", "1"]
    job += ["--optimizer", "adamw", "--lr", "3e-3", "--warmup-epochs", "0", "--no-progress"]
    out = tmp_path / "gpt"
    # batch 8: a step's compute is short beside the 25 ms wan collective, so sync dominates
    wan = ["--policy", "exposed-sync", "--link", "wan", "--batch-size", "8"]
    res = autok("train", *job, *wan, "--out", str(out), timeout=900)
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == {"name": "perplexity", "higher_is_better": False}
    row = next(csv.DictReader((out / "epochs.csv").open()))
    # perplexity is exp(validation loss); one epoch takes it far below the 256 of a blind guess
    assert float(row["test_metric"]) == pytest.approx(math.exp(float(row["test_loss"])), rel=1e-6)
    assert float(row["test_metric"]) < 30
    assert summary["final_sync_period"] > 4  # the link dominates: exposed-sync raised K
    space = tmp_path / "space.yaml"
    space.write_text("sync_period: {type: int, low: 2, high: 16, log: true}\n")
    sweep = tmp_path / "sweep"
    res = autok(
        "sweep", *job, "--link", "none", "--trials", "2", "--space", str(space),
        "--out", str(sweep), timeout=1200,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = list(csv.DictReader((sweep / "trials.csv").open()))
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"]
    assert "best test perplexity" in (sweep / "best.yaml").read_text().splitlines()[0]
