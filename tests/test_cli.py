"""`autok train` as a user runs it: a subprocess, real worker processes, files on disk."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autok.trainer.loop.sinks import EPOCH_COLUMNS, SUMMARY_KEYS

TINY = [
    "--workers",
    "2",
    "--epochs",
    "2",
    "--mnist1d-samples",
    "500",
    "--link",
    "none",
    "--no-progress",
]
BOUNDARY_FIELDS = {
    "compute_seconds",
    "exposed_sync_seconds",
    "drift_norm",
    "update_norm",
    "drift_ratio",
    "train_loss",
    "bytes_communicated",
    "lr",
    "sync_period",
    "boundary",
    "global_step",
    "epoch",
    "next_sync_period",
    "reason",
}


def autok(*args, cwd=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "autok.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    tb = out.parent / "tb"
    res = autok("train", *TINY, "--sync-period", "3", "--out", str(out), "--tensorboard", str(tb))
    assert res.returncode == 0, res.stderr
    (out.parent / "stdout.txt").write_text(res.stdout)
    return out


def test_no_progress_hides_only_the_bar_and_train_log_holds_the_same_lines(run_dir):
    stdout = (run_dir.parent / "stdout.txt").read_text()
    log = (run_dir / "train.log").read_text()
    assert stdout.startswith(f"autok: run directory {run_dir} ")
    epochs = [ln for ln in stdout.splitlines() if ln.startswith("epoch ")]
    # counted from 0, as epochs.csv and --link-schedule count them: "epoch 0 (1 of 2)"
    assert [e.split()[1:4] for e in epochs] == [["0", "(1", "of"], ["1", "(2", "of"]]
    assert all(" acc " in e and " K " in e and "exposed sync" in e for e in epochs)
    assert "autok summary" in stdout and "replicas agree" in stdout
    for line in epochs + ["autok summary"]:
        assert line in log  # the file has the terminal's lines (with a timestamp)
    assert "\r" not in stdout and "\r" not in log  # no progress-bar redraws in a pipe or file


def test_the_summary_reports_start_up_and_collectives_beside_training_time(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["startup_seconds"] > 0
    assert summary["total_seconds"] >= summary["startup_seconds"] + summary["wall_seconds"] * 0.99
    rows = list(csv.DictReader((run_dir / "epochs.csv").open()))
    # cpdp with SGD: fused boundaries, one collective for a gradient and a parameter sync, after
    # the first (auto: two-phase, its bucket and its average, until a boundary step has shown
    # that the loop leaves the gradients as backward gave them; trainer/engine/grad_watch.py)
    assert summary["param_syncs"] == summary["grad_syncs"]
    assert summary["collectives"] == summary["param_syncs"] + 1
    assert sum(int(r["collectives"]) for r in rows) == summary["collectives"]
    # what its numbers depend on besides settings and seed: this installation's versions
    from autok.trainer.loop.environment import environment

    assert summary["environment"] == environment() and summary["environment"]["torch"]


def test_tensorboard_gets_the_boundary_and_epoch_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir.parent / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"boundary/sync_period", "boundary/exposed_sync_seconds", "epoch/test_accuracy"} <= tags
    rows = list(csv.DictReader((run_dir / "epochs.csv").open()))
    accs = [e.value for e in events.Scalars("epoch/test_accuracy")]
    assert accs == pytest.approx([float(r["test_accuracy"]) for r in rows], rel=1e-6)
    records = [json.loads(line) for line in (run_dir / "boundaries.jsonl").open()]
    ks = [(e.step, e.value) for e in events.Scalars("boundary/sync_period")]
    assert ks == [(r["global_step"], r["sync_period"]) for r in records]


def _refuse(name):
    raise ValueError(f"not strict JSON: {name}")


def test_train_writes_the_five_files_with_every_field(run_dir):
    assert {p.name for p in run_dir.iterdir()} >= {
        "config.json",
        "epochs.csv",
        "boundaries.jsonl",
        "summary.json",
        "model.pt",
    }
    # strict JSON (no Infinity for link none's bandwidth), as jq and other parsers need it
    config = json.loads((run_dir / "config.json").read_text(), parse_constant=_refuse)
    assert config["link_profile"]["bandwidth_gbps"] is None
    assert config["sync_period"] == 3 and config["slowmo_beta"] == 0.3  # resolved defaults
    assert config["model"] == "cnn1d" and config["link_profile"]["name"] == "none"

    rows = list(csv.DictReader((run_dir / "epochs.csv").open()))
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert list(rows[0]) == EPOCH_COLUMNS
    for r in rows:
        assert 0.0 <= float(r["test_accuracy"]) <= 1.0
        parts = sum(
            float(r[k])
            for k in ("forward_seconds", "backward_seconds", "sync_seconds", "overhead_seconds")
        )
        assert parts == pytest.approx(float(r["epoch_seconds"]), rel=1e-6)
    assert rows[0]["sync_period"] == "1" and rows[1]["sync_period"] == "3"  # warmup at K=1

    records = [json.loads(line) for line in (run_dir / "boundaries.jsonl").open()]
    assert records and all(set(r) >= BOUNDARY_FIELDS for r in records)
    assert [r["boundary"] for r in records] == list(range(len(records)))

    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["boundaries"] == len(records)
    assert summary["peak_test_accuracy"] == max(float(r["test_accuracy"]) for r in rows)
    digests = summary["param_digest_per_rank"]
    assert len(digests) == 2 and digests[0] == digests[1]

    state = torch.load(run_dir / "model.pt")
    assert all(isinstance(v, torch.Tensor) for v in state.values())


def test_an_existing_run_is_never_overwritten(run_dir):
    def files():
        return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}

    before = files()
    res = autok("train", *TINY, "--out", str(run_dir))
    assert res.returncode == 2
    assert res.stderr.strip().startswith("autok: error: --out:")
    assert files() == before


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--sync-period", "0"], "--sync-period"),
        (["--sync-period", "two"], "--sync-period"),
        (["--slowmo-beta", "1.5"], "--slowmo-beta"),
        (["--lr", "-0.1"], "--lr"),
        (["--workers", "0"], "--workers"),
        (["--strategy", "gossip"], "--strategy"),
        (["--dataset", "imagenet"], "--dataset"),
        (["--model", "bert"], "--model"),
        (["--model", "resnet18"], "--model"),
        (["--link", "satellite"], "--link"),
        (["--dataset", "imagefolder", "--data-dir", "/no/such/dir"], "--data-dir"),
        (["--config", "/no/such.yaml"], "--config"),
        (["--frobnicate", "1"], "--frobnicate"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, argv, flag):
    out = tmp_path / "never"
    res = autok("train", *argv, "--out", str(out), "--no-progress")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()


def test_config_file_values_and_flag_overrides(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("strategy: localsgd\nsync-period: 5\nslowmo_beta: 0.2\nepochs: 1\n")
    res = autok(
        "train",
        "--config",
        str(cfg),
        *TINY,
        "--epochs",
        "1",
        "--sync-period",
        "2",
        "--out",
        str(tmp_path / "r"),
    )
    assert res.returncode == 0, res.stderr
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (config["strategy"], config["sync_period"], config["slowmo_beta"]) == (
        "localsgd",
        2,
        0.2,
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("sync_perod: 3\n")
    res = autok("train", "--config", str(bad), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "--sync-perod" in res.stderr


def test_help_lists_every_flag_with_its_default():
    res = autok("train", "--help")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for needle in (
        "--sync-period",
        "--slowmo-beta",
        "--link-rtt-ms",
        "--buffer-policy",
        "--sync-optimizer-state",
        "--slowmo-lr-aware",
        "(default: wan)",
        "(default: cpdp)",
    ):
        assert needle in text, needle


@pytest.mark.dist
def test_torchrun_joins_the_world(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    out = tmp_path / "tr"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "autok.cli",
            "train",
            *TINY,
            "--epochs",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2


def test_every_train_flag_is_documented_in_docs_flags():
    from autok.config import TrainConfig

    flags = (Path(__file__).resolve().parents[1] / "docs" / "flags.md").read_text()
    missing = [
        f"--{n.replace('_', '-')}"
        for n in TrainConfig.model_fields
        if f"--{n.replace('_', '-')}" not in flags
    ]
    assert not missing, missing


def test_a_reader_that_stops_early_ends_a_listing_quietly():
    """`autok experiment list | head -1`: the reader gone, the listing ends with 141 (as SIGPIPE
    would end it in a shell) and says nothing, not "experiment failed: Broken pipe"."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader has already gone: the first write breaks the pipe
    # stdout block-buffered, as a pipe's is unless PYTHONUNBUFFERED is set: the write then
    # fails at the flush, not at the print
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "autok.cli", "experiment", "list"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        os.close(write)
    assert res.returncode == 141, res.stderr
    assert res.stderr == ""
