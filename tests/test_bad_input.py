"""Every bad input is refused before anything is written (docs/design.md §9, Bad input).

One table: argv (and a setup that lays out files) -> exit code 2, ONE line on stderr that names the
flag (or the file and field) to change, no traceback, and the whole temporary tree, the output
directory included, exactly as it was (contents and mtimes; not created if it did not exist).
Rows run in-process through `autok.cli.main` with every launcher replaced by a tripwire, so a
row that is not refused fails at once instead of training; a few rows run as real subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from autok.config import TrainConfig, flag
from tests.test_data import write_cifar100, write_imagefolder, write_tinyimagenet

MAX_LINE = 300

# ----- setups: each lays out files under the test's temporary directory -------------------------


def file(name: str, content: str | bytes):
    def setup(tmp: Path) -> None:
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())

    return setup


# descriptors of run locks held for the rows below, as a training process holds them
_LOCKS_HELD: list[int] = []


def held_run(name: str):
    """A directory whose run lock (autok/runlock.py) another holder has: this process, through
    its own open file, which conflicts with autok's as another process's does."""

    def setup(tmp: Path) -> None:
        import fcntl

        (tmp / name).mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp / name / ".autok.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _LOCKS_HELD.append(fd)

    return setup


def both(*setups):
    def setup(tmp: Path) -> None:
        for s in setups:
            s(tmp)

    return setup


BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
DEEP = "[" * 20_000 + "]" * 20_000
TINY = ["--workers", "2", "--epochs", "2", "--mnist1d-samples", "500", "--link", "none"]


def localsgd(*flags: str) -> list[str]:
    """`autok train --strategy localsgd FLAGS --out {out}` (fragments stream localsgd only)."""
    return ["train", "--strategy", "localsgd", *flags, "--out", "{out}"]


class Marker:
    """A pickle whose loading creates a directory: what a crafted CIFAR file could do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (str(self.path),))


def crafted_cifar(tmp: Path) -> None:
    base = tmp / "cifar" / "cifar-100-python"
    base.mkdir(parents=True)
    for name in ("train", "test", "meta"):
        (base / name).write_bytes(pickle.dumps({"data": Marker(tmp / "PWNED")}))


def generated_cifar(tmp: Path) -> None:
    write_cifar100(tmp / "cifar")


def cifar_without_meta(tmp: Path) -> None:
    write_cifar100(tmp / "cifar")
    (tmp / "cifar" / "cifar-100-python" / "meta").unlink()


def tiny(edit=None):
    def setup(tmp: Path) -> None:
        root = write_tinyimagenet(tmp / "tin")
        if edit:
            edit(root)

    return setup


def folder(edit=None):
    def setup(tmp: Path) -> None:
        root = write_imagefolder(tmp / "imf", per_class=1)
        if edit:
            edit(root)

    return setup


def _rm_tree(p: Path) -> None:
    for q in sorted(p.rglob("*"), reverse=True):
        q.rmdir() if q.is_dir() else q.unlink()
    p.rmdir()


def run_dir(epochs_csv: str | None = None, jsonl: str | None = None, config: str | None = None):
    """A run as `autok train` leaves it (config.json, epochs.csv, boundaries.jsonl)."""

    def setup(tmp: Path) -> None:
        from autok.cli import write_config
        from autok.trainer.loop.sinks import EPOCH_COLUMNS

        run = tmp / "run"
        write_config(TrainConfig(workers=2, epochs=3, mnist1d_samples=500, link="none"), run)
        if config is not None:
            (run / "config.json").write_text(config)
        header = ",".join(EPOCH_COLUMNS) + "\r\n"
        good = "0," + ",".join(["1"] * (len(EPOCH_COLUMNS) - 1)) + "\r\n"
        (run / "epochs.csv").write_text(header + good + (epochs_csv or ""))
        rec = {"epoch": 0, "global_step": 3, "interval_steps": 1, "sync_period": 1, "lr": 0.1}
        (run / "boundaries.jsonl").write_text(json.dumps(rec) + "\n" + (jsonl or ""))

    return setup


def experiment(text: str):
    return file("exp.yaml", text)


GOOD_EXP = (
    "name: tiny\nquick:\n  base: {dataset: mnist1d, workers: 2, epochs: 1, link: none, "
    "mnist1d_samples: 500}\nruns:\n  - {name: a, strategy: cpdp}\n"
)


PILOT_EXP = (
    "name: tiny\nseeds: [1]\npilot: {seeds: [7], runs: [k1], target: {of: k1, at: 0.5}}\n"
    "quick:\n  base: {dataset: mnist1d, workers: 2, epochs: 1, link: none, mnist1d_samples: 500}\n"
    "runs:\n  - {name: k1, strategy: cpdp, sync_period: 1}\n"
    "  - {name: best, strategy: cpdp, sync_period: pilot}\n"
)


def link(name: str, target: str):
    """`name` a symbolic link to the directory `target` (made if missing)."""

    def setup(tmp: Path) -> None:
        (tmp / target).mkdir(parents=True, exist_ok=True)
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).symlink_to(tmp / target, target_is_directory=True)

    return setup


def marked_run(out: str, rel: str):
    """A run directory `out/rel` as autok made it: the experiment's state, the run's marker."""

    def setup(tmp: Path) -> None:
        from autok.experiment import ensure_secret, mark

        (tmp / out / rel).mkdir(parents=True, exist_ok=True)
        mark(tmp / out / rel, rel, ensure_secret(tmp / out))

    return setup


def copy(src: str, dst: str):
    def setup(tmp: Path) -> None:
        (tmp / dst).parent.mkdir(parents=True, exist_ok=True)
        (tmp / dst).write_bytes((tmp / src).read_bytes())

    return setup


def finished_run(edit=None):
    """An experiment directory with one finished run (the files `autok report` reads)."""

    def setup(tmp: Path) -> None:
        from tests.test_report import fake_run

        fake_run(tmp / "exp", "ddp", 42, 0.9, 10.0)
        if edit:
            edit(tmp / "exp" / "ddp" / "seed-42")

    return setup


DEEP = "[" * 100_000 + "]" * 100_000  # JSON nested 100 000 deep

GOOD_BOUNDARY = {
    "epoch": 0,
    "global_step": 1,
    "sync_period": 1,
    "exposed_sync_seconds": 0.1,
    "compute_seconds": 0.1,
}


def write(name: str, text: str):
    return lambda d: (d / name).write_text(text)


def edit_json(name: str, **changes):
    def go(d: Path) -> None:
        obj = json.loads((d / name).read_text())
        for k, v in changes.items():
            if v is KeyError:
                obj.pop(k)
            else:
                obj[k] = v
        (d / name).write_text(json.dumps(obj))

    return go


# ----- the table ---------------------------------------------------------------------------------


def _float_fields() -> list[str]:
    out = []
    for name, field in TrainConfig.model_fields.items():
        args = typing.get_args(field.annotation) or (field.annotation,)
        if float in args:
            out.append(name)
    return out


def R(argv, expect, setup=None, id=None):  # noqa: A002
    return pytest.param(argv, (expect,) if isinstance(expect, str) else expect, setup, id=id)


# The regimes' knobs (tests/test_regimes.py): an option its mode does not read, a bad value.
# fmt: off
REGIMES = [
    R(["train", "--partition-alpha", "0.1", "--out", "{out}"], "--partition-alpha"),
    R(["train", "--partition", "dirichlet", "--out", "{out}"], "--partition", id="no-alpha"),
    R(["train", "--partition", "dirichlet", "--partition-alpha", "0", "--out", "{out}"],
      "--partition-alpha", id="alpha-0"),
    R(["train", "--partition", "dirichlet", "--partition-alpha", "-1", "--out", "{out}"],
      "--partition-alpha", id="alpha-negative"),
    R(["train", "--partition", "shards", "--out", "{out}"], "--partition", id="partition-unknown"),
    R(["train", "--task", "tests.task_fixtures:regression", "--partition", "dirichlet",
       "--partition-alpha", "0.1", "--out", "{out}"], "--partition", id="dirichlet-no-labels"),
    R(["train", "--straggler-ms", "20", "--out", "{out}"], "--straggler-ms", id="ms-no-mode"),
    R(["train", "--straggler", "slow-rank", "--out", "{out}"], "--straggler", id="mode-no-ms"),
    R(["train", "--straggler", "random", "--straggler-ms", "-5", "--out", "{out}"],
      "--straggler-ms", id="ms-negative"),
    R(["train", "--straggler", "random", "--straggler-ms", "1e9", "--out", "{out}"],
      "--straggler-ms", id="ms-huge"),
    R(["train", "--straggler", "slow-rank", "--straggler-ms", "5", "--straggler-prob", "0.5",
       "--out", "{out}"], "--straggler-prob", id="prob-not-random"),
    R(["train", "--straggler", "random", "--straggler-ms", "5", "--straggler-prob", "0",
       "--out", "{out}"], "--straggler-prob", id="prob-0"),
    # the clock (trainer/engine/clock.py): what the wall clock does not read, what virtual needs
    R(["train", "--compute-ms", "5", "--out", "{out}"],
      "--compute-ms: --clock wall does not read it", id="compute-ms-wall"),
    R(["train", "--model-bytes", "1000", "--out", "{out}"],
      "--model-bytes: --clock wall does not read it", id="bytes-wall"),
    R(["train", "--clock", "virtual", "--out", "{out}"], "--clock: virtual models",
      id="virtual-no-compute"),
    R(["train", "--clock", "virtual", "--compute-ms", "0", "--out", "{out}"], "--compute-ms",
      id="compute-ms-0"),
    R(["train", "--clock", "virtual", "--compute-ms", "5", "--model-bytes", str(2**50), "--out",
       "{out}"], "--model-bytes", id="bytes-huge"),
    R(["train", "--clock", "sundial", "--out", "{out}"], "--clock", id="clock-unknown"),
    R(["train", "--lr-schedule", "step", "--out", "{out}"], "--lr-schedule", id="no-milestones"),
    R(["train", "--lr-milestones", "0.5", "--out", "{out}"], "--lr-milestones", id="not-step"),
    R(["train", "--lr-gamma", "0.5", "--out", "{out}"], "--lr-gamma", id="gamma-not-step"),
    *[
        R(["train", "--lr-schedule", "step", "--lr-milestones", m, "--out", "{out}"],
          "--lr-milestones", id=f"milestones-{m[:12]}")
        for m in ("0.75,0.5", "0.5,0.5", "1.5", "0", "x", "", ",".join(["0.9"] * 17))
    ],
    R(["train", "--lr-schedule", "step", "--lr-milestones", "0.01", "--epochs", "10", "--out",
       "{out}"], "--lr-milestones", id="milestone-in-warmup"),
    R(["train", "--lr-schedule", "step", "--lr-milestones", "0.5", "--lr-gamma", "1", "--out",
       "{out}"], "--lr-gamma", id="gamma-1"),
]
# fmt: on

TRAIN = [
    R(["train", "--metrics-host", "example.com", "--out", "{out}"], ("--metrics-host",)),
    R(["train", "--metrics-host", "", "--out", "{out}"], ("--metrics-host",)),
    # non-finite floats: every float setting of `autok train`
    *[
        R(["train", f"{flag(f)}={v}", "--out", "{out}"], flag(f), id=f"{flag(f)}={v}")
        for f in _float_fields()
        for v in ("inf", "nan", "-inf")
    ],
    # bounds where a run would crash, hang or take the machine
    R(["train", "--workers", "10000", "--out", "{out}"], "--workers"),
    R(["train", "--loader-workers", "10000", "--out", "{out}"], "--loader-workers"),
    R(["train", "--mnist1d-samples", "1000000000", "--out", "{out}"], "--mnist1d-samples"),
    R(
        ["train", "--mnist1d-test-samples", "1000000000", "--out", "{out}"],
        "--mnist1d-test-samples",
        id="test-samples-huge",
    ),
    R(
        ["train", "--mnist1d-test-samples", "10", "--out", "{out}"],
        "--mnist1d-test-samples",
        id="test-samples-few",
    ),
    R(["train", "--seed", str(10**23), "--out", "{out}"], "--seed"),
    R(["train", "--seed", "-1", "--out", "{out}"], "--seed"),
    R(["train", "--seed", str(2**32), "--out", "{out}"], "--seed"),
    R(["train", "--lr", "1e308", "--out", "{out}"], "--lr"),
    R(["train", "--lr", "1e-300", "--out", "{out}"], "--lr"),
    R(["train", "--qsr-alpha", "1e200", "--policy", "qsr", "--out", "{out}"], "--qsr-alpha"),
    R(["train", "--link-bandwidth-gbps", "1e-300", "--out", "{out}"], "--link-bandwidth-gbps"),
    R(["train", "--link-rtt-ms", "1e300", "--out", "{out}"], "--link-rtt-ms"),
    R(["train", "--link-jitter-ms", "1e300", "--out", "{out}"], "--link-jitter-ms"),
    R(["train", "--link-schedule", "lan,moon@epoch=2", "--out", "{out}"], "--link-schedule"),
    R(["train", "--link-schedule", "lan,wan@epoch=0", "--out", "{out}"], "--link-schedule"),
    R(
        ["train", "--link-schedule", "lan,wan@epoch=3,lan@epoch=2", "--out", "{out}"],
        "--link-schedule",
        id="schedule-decreasing",
    ),
    R(
        ["train", "--link-schedule", "lan,wan@epoch=2,lan@step=900", "--out", "{out}"],
        "--link-schedule",
        id="schedule-two-units",
    ),
    R(
        ["train", "--link-schedule", "lan@epoch=1", "--out", "{out}"],
        "--link-schedule",
        id="schedule-first-at",
    ),
    R(["train", "--link-schedule", "", "--out", "{out}"], "--link-schedule", id="schedule-empty"),
    R(
        ["train", "--link-schedule", ",".join(["lan"] * 100), "--out", "{out}"],
        "--link-schedule",
        id="schedule-long",
    ),
    R(
        ["train", "--link-schedule", "lan,wan@step=99999999999", "--out", "{out}"],
        "--link-schedule",
        id="schedule-huge-step",
    ),
    R(
        ["train", "--link", "wan", "--link-schedule", "lan,wan@epoch=1", "--out", "{out}"],
        "--link",
        id="link-and-schedule",
    ),
    R(
        ["train", "--link-rtt-ms", "5", "--link-schedule", "lan,wan@epoch=1", "--out", "{out}"],
        "--link-rtt-ms",
        id="rtt-and-schedule",
    ),
    R(["train", "--random-mean", "4", "--out", "{out}"], "--random-mean", id="mean-not-random"),
    R(["train", "--policy", "scheduled", "--out", "{out}"], "--k-schedule", id="no-k-schedule"),
    R(["train", "--k-schedule", "4", "--out", "{out}"], "--k-schedule", id="k-schedule-fixed"),
    R(
        ["train", "--policy", "scheduled", "--k-schedule", "4,8@epoch=2", "--out", "{out}"],
        "--k-schedule",
        id="k-schedule-epochs",
    ),
    R(
        ["train", "--policy", "scheduled", "--k-schedule", "4,8@step=0", "--out", "{out}"],
        "--k-schedule",
        id="k-schedule-step-0",
    ),
    R(
        ["train", "--policy", "scheduled", "--k-schedule", "4,8@step=9999999999999"]
        + ["--out", "{out}"],
        "--k-schedule",
        id="k-schedule-huge-step",
    ),
    R(
        ["train", "--policy", "scheduled", "--k-schedule", "4,128@step=9", "--out", "{out}"],
        "--k-schedule",
        id="k-schedule-above-max",
    ),
    R(
        ["train", "--policy", "scheduled", "--k-schedule", "8,4@step=9", "--sync-period", "4"]
        + ["--out", "{out}"],
        "--sync-period",
        id="k-schedule-and-sync-period",
    ),
    # a boundary that syncs one fragment, or decides K steps late, cannot change K on time
    R(
        ["train", "--policy", "scheduled", "--k-schedule", "8,16@step=20", "--fragments", "2"]
        + ["--strategy", "localsgd", "--out", "{out}"],
        "--fragments",
        id="k-schedule-fragments",
    ),
    R(
        ["train", "--policy", "scheduled", "--k-schedule", "8", "--overlap-boundary"]
        + ["--strategy", "localsgd", "--out", "{out}"],
        "--overlap-boundary",
        id="k-schedule-overlap",
    ),
    *REGIMES,
    R(["train", "--policy", "random", "--random-mean", "0.5", "--out", "{out}"], "--random-mean"),
    R(
        ["train", "--policy", "random", "--random-mean", "100", "--out", "{out}"],
        "--random-mean",
        id="mean-above-max",
    ),
    R(
        ["train", "--policy", "random", "--random-mean", "nan", "--out", "{out}"],
        "--random-mean",
        id="mean-nan",
    ),
    R(["train", "--k-rule", "triple", "--out", "{out}"], "--k-rule"),
    # a K-policy option the chosen policy does not read is refused, not ignored
    R(
        ["train", "--target-sync-share", "0.1", "--out", "{out}"],
        ("--target-sync-share", "--policy fixed does not read it", "exposed-sync, composite"),
        id="share-unread-by-fixed",
    ),
    R(
        ["train", "--policy", "qsr", "--k-growth", "4", "--out", "{out}"],
        ("--k-growth", "--policy qsr does not read it"),
        id="growth-unread-by-qsr",
    ),
    R(
        ["train", "--policy", "exposed-sync", "--qsr-base", "2", "--out", "{out}"],
        ("--qsr-base", "--policy exposed-sync"),
        id="qsr-base-unread-by-share",
    ),
    R(
        ["train", "--policy", "adacomm", "--drift-limit", "2", "--out", "{out}"],
        ("--drift-limit", "--policy adacomm"),
        id="drift-limit-unread-by-adacomm",
    ),
    # the skew cap (controllers/exposed_sync.py): its bounds, and unread under fixed
    R(["train", "--policy", "composite", "--skew-drift", "-1", "--out", "{out}"], "--skew-drift"),
    R(["train", "--policy", "exposed-sync", "--skew-cap", "0", "--out", "{out}"], "--skew-cap"),
    R(
        ["train", "--skew-cap", "2", "--out", "{out}"],
        ("--skew-cap", "--policy fixed does not read it", "exposed-sync"),
        id="skew-cap-unread-by-fixed",
    ),
    # a changed link: a ratio above 1, or 0 (off)
    R(
        ["train", "--policy", "exposed-sync", "--link-shift", "0.5", "--out", "{out}"],
        ("--link-shift: 0.5 would read every round as a changed link",),
        id="link-shift-at-most-one",
    ),
    R(["train", "--policy", "composite", "--link-shift", "-1", "--out", "{out}"], "--link-shift"),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--link-shift",
            "5",
            "--sync-window",
            "2",
            "--out",
            "{out}",
        ],
        ("--link-shift: a window of --sync-window 2 rounds closes no later than the check",),
        id="link-shift-with-a-short-window",
    ),
    R(
        ["train", "--link-shift", "2", "--out", "{out}"],
        ("--link-shift", "--policy fixed does not read it"),
        id="link-shift-unread-by-fixed",
    ),
    # a faster link's check: a ratio above 1, or 0 (off)
    R(
        ["train", "--policy", "exposed-sync", "--link-drop", "1", "--out", "{out}"],
        ("--link-drop: 1 would read every round as a faster link",),
        id="link-drop-at-most-one",
    ),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--link-drop",
            "5",
            "--sync-window",
            "2",
            "--out",
            "{out}",
        ],
        ("--link-drop: a window of --sync-window 2 rounds closes no later than the check",),
        id="link-drop-with-a-short-window",
    ),
    R(["train", "--policy", "composite", "--link-drop", "-1", "--out", "{out}"], "--link-drop"),
    # epoch rounds meet the direct rule's K*: the doubling rule reads none
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--k-rule",
            "double",
            "--epoch-rounds",
            "--out",
            "{out}",
        ],
        ("--epoch-rounds: meets the direct rule's K*, and --k-rule is double",),
        id="epoch-rounds-under-the-doubling-rule",
    ),
    R(
        ["train", "--epoch-rounds", "--out", "{out}"],
        ("--epoch-rounds", "--policy fixed does not read it"),
        id="epoch-rounds-unread-by-fixed",
    ),
    R(
        ["train", "--link-drop", "2", "--out", "{out}"],
        ("--link-drop", "--policy fixed does not read it"),
        id="link-drop-unread-by-fixed",
    ),
    # the policy's floor: a K the run may start at and reach
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--k-floor",
            "2",
            "--sync-period",
            "1",
            "--out",
            "{out}",
        ],
        ("--k-floor: 2 is above --sync-period 1",),
        id="k-floor-above-start",
    ),
    R(
        ["train", "--policy", "composite", "--k-floor", "80", "--out", "{out}"],
        ("--k-floor: 80 is above --max-sync-period 64",),
        id="k-floor-above-cap",
    ),
    R(
        [
            "train",
            "--strategy",
            "ddp",
            "--policy",
            "exposed-sync",
            "--k-floor",
            "2",
            "--out",
            "{out}",
        ],
        ("--policy: ddp keeps K=1",),
        id="k-floor-on-ddp-names-the-policy",
    ),
    R(
        ["train", "--k-floor", "2", "--out", "{out}"],
        ("--k-floor", "--policy fixed does not read it"),
        id="k-floor-unread-by-fixed",
    ),
    # strong skew grades the cap: above --skew-drift, with the skew rule on and a cap to halve
    R(
        ["train", "--policy", "exposed-sync", "--skew-strong", "1.2", "--out", "{out}"],
        ("--skew-strong: 1.2 is not above --skew-drift 1.4",),
        id="skew-strong-under-skew-drift",
    ),
    R(
        ["train", "--policy", "composite", "--skew-strong", "1.4", "--out", "{out}"],
        ("--skew-strong: 1.4 is not above --skew-drift 1.4",),
        id="skew-strong-at-skew-drift-composite",
    ),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--skew-strong",
            "2",
            "--skew-drift",
            "0",
            "--out",
            "{out}",
        ],
        ("--skew-strong", "--skew-drift is 0 (off)"),
        id="skew-strong-with-skew-off",
    ),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--skew-strong",
            "2",
            "--skew-cap",
            "1",
            "--out",
            "{out}",
        ],
        ("--skew-strong", "--skew-cap 1 has no smaller half"),
        id="skew-strong-with-cap-1",
    ),
    R(
        ["train", "--skew-strong", "2", "--out", "{out}"],
        ("--skew-strong", "--policy fixed does not read it"),
        id="skew-strong-unread-by-fixed",
    ),
    # the grade's scale scales a grade: refused without one, and out of its bounds
    R(
        ["train", "--policy", "exposed-sync", "--skew-grade-gamma", "0.28", "--out", "{out}"],
        ("--skew-grade-gamma", "--skew-strong is 0 (no grade)"),
        id="skew-grade-gamma-without-a-grade",
    ),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--skew-strong",
            "2.5",
            "--skew-grade-gamma",
            "3",
            "--out",
            "{out}",
        ],
        ("--skew-grade-gamma", "less than or equal to 2"),
        id="skew-grade-gamma-above-two",
    ),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--skew-power",
            "0.6",
            "--skew-drift",
            "0",
            "--out",
            "{out}",
        ],
        ("--skew-power: shapes the soft skew cap, and --skew-drift is 0 (off)",),
        id="skew-power-with-skew-off",
    ),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--skew-clear",
            "0.4",
            "--skew-drift",
            "0",
            "--out",
            "{out}",
        ],
        ("--skew-clear: judges skew early, and --skew-drift is 0 (off)",),
        id="skew-clear-with-skew-off",
    ),
    R(
        ["train", "--policy", "composite", "--skew-clear", "1", "--out", "{out}"],
        ("--skew-clear", "less than 1"),
        id="skew-clear-at-skew-drift",
    ),
    R(
        [
            "train",
            "--policy",
            "exposed-sync",
            "--skew-cap",
            "8",
            "--skew-drift",
            "0",
            "--out",
            "{out}",
        ],
        ("--skew-cap: shapes the soft skew cap, and --skew-drift is 0 (off)",),
        id="skew-cap-with-skew-off",
    ),
    R(
        ["train", "--policy", "exposed-sync", "--skew-power", "0", "--out", "{out}"],
        ("--skew-power", "greater than 0"),
        id="skew-power-zero",
    ),
    R(
        ["train", "--policy", "exposed-sync", "--skew-power", "1.5", "--out", "{out}"],
        ("--skew-power", "less than or equal to 1"),
        id="skew-power-above-one",
    ),
    R(
        ["train", "--sync-period", "100", "--max-sync-period", "8", "--out", "{out}"],
        "--max-sync-period: 8 is below --sync-period 100",
        id="fixed-k-above-a-given-cap",
    ),
    # SGD's options with AdamW
    R(["train", "--optimizer", "adamw", "--momentum", "0.5", "--out", "{out}"], "--momentum"),
    R(["train", "--optimizer", "adamw", "--nesterov", "--out", "{out}"], "--nesterov"),
    R(
        ["train", "--policy", "qsr", "--qsr-base", "100", "--out", "{out}"],
        "--qsr-base: 100 is above --max-sync-period 64",
        id="qsr-base-above-the-cap",
    ),
    R(
        ["train", "--nesterov", "--momentum", "0", "--out", "{out}"],
        "--nesterov: looks ahead along the momentum, and --momentum is 0",
        id="nesterov-without-momentum",
    ),
    R(["train", "--collective-timeout", "1e-9", "--out", "{out}"], "--collective-timeout"),
    R(["train", "--collective-timeout", "1e308", "--out", "{out}"], "--collective-timeout"),
    R(["train", "--weight-decay", "1e308", "--out", "{out}"], "--weight-decay"),
    R(["train", "--epochs", str(10**9), "--out", "{out}"], "--epochs"),
    R(["train", "--batch-size", str(10**12), "--out", "{out}"], "--batch-size"),
    R(["train", "--sync-period", str(10**20), "--out", "{out}"], "--sync-period"),
    R(["train", "--max-sync-period", str(10**20), "--out", "{out}"], "--max-sync-period"),
    R(["train", "--sync-window", str(10**12), "--out", "{out}"], "--sync-window"),
    R(["train", "--k-growth", str(10**12), "--out", "{out}"], "--k-growth"),
    R(["train", "--qsr-base", str(10**12), "--out", "{out}"], "--qsr-base"),
    R(["train", "--guard-cooldown", str(10**12), "--out", "{out}"], "--guard-cooldown"),
    R(["train", "--image-size", "100000", "--out", "{out}"], "--image-size"),
    R(["train", "--checkpoint-every", str(10**12), "--out", "{out}"], "--checkpoint-every"),
    R(["train", "--stop-after-epochs", str(10**12), "--out", "{out}"], "--stop-after-epochs"),
    R(["train", "--max-restarts", str(10**9), "--out", "{out}"], "--max-restarts"),
    R(["train", "--max-rollbacks", str(10**9), "--out", "{out}"], "--max-rollbacks"),
    R(["train", "--workers", "two", "--out", "{out}"], "--workers"),
    R(["train", "--workers", "64", "--loader-workers", "63", "--out", "{out}"], "--loader-workers"),
    R(["train", "--lr", "x" * 5000, "--out", "{out}"], "--lr", id="--lr=5000-chars"),
    # outer optimizers, compression, fragments (docs/design.md §2)
    R(
        ["train", "--outer-optimizer", "sgd", "--slowmo-beta", "0.3", "--out", "{out}"],
        "--slowmo-beta",
        id="outer+slowmo-beta",
    ),
    R(["train", "--outer-lr", "0.7", "--out", "{out}"], "--outer-lr", id="outer-lr-alone"),
    R(["train", "--outer-momentum", "0.9", "--out", "{out}"], "--outer-momentum"),
    R(
        ["train", "--outer-optimizer", "average", "--outer-lr", "0.5", "--out", "{out}"],
        "--outer-lr",
        id="average+outer-lr",
    ),
    R(
        ["train", "--outer-optimizer", "nesterov", "--slowmo-lr-aware", "--out", "{out}"],
        "--slowmo-lr-aware",
    ),
    R(
        ["train", "--strategy", "ddp", "--outer-optimizer", "nesterov", "--out", "{out}"],
        "--outer-optimizer",
        id="ddp+outer",
    ),
    # flags the run never reads (trainer/engine/options.py READ_ONLY_UNDER): one line, the flag, why
    *[
        R(
            ["train", "--strategy", "ddp", *given, "--out", "{out}"],
            f"{given[0]}: --strategy ddp",
            id=f"ddp+{given[0][2:]}",
        )
        for given in (
            ["--sync-optimizer-state"],
            ["--slowmo-lr-aware"],
            ["--boundary", "two-phase"],
            ["--max-sync-period", "128"],
        )
    ],
    R(
        ["train", "--strategy", "localsgd", "--boundary", "two-phase", "--out", "{out}"],
        "--boundary: --strategy localsgd does not read it",
        id="localsgd+two-phase",
    ),
    R(
        ["train", "--strategy", "localsgd", "--slowmo-lr-aware", "--out", "{out}"],
        ("--slowmo-lr-aware:", "--slowmo-beta is 0"),
        id="localsgd+lr-aware-at-beta-0",
    ),
    R(
        ["train", "--outer-optimizer", "slowmo", "--slowmo-lr-aware", "--out", "{out}"],
        ("--slowmo-lr-aware:", "--outer-momentum is 0"),
        id="slowmo+lr-aware-at-momentum-0",
    ),
    R(
        ["train", "--on-divergence", "stop", "--max-rollbacks", "5", "--out", "{out}"],
        "--max-rollbacks: --on-divergence stop does not read it",
        id="stop+max-rollbacks",
    ),
    R(
        ["train", "--dataset", "digits", "--mnist1d-samples", "900", "--out", "{out}"],
        "--mnist1d-samples: --dataset digits does not read it",
        id="digits+mnist1d-samples",
    ),
    R(
        ["train", "--dataset", "digits", "--mnist1d-test-samples", "900", "--out", "{out}"],
        "--mnist1d-test-samples: --dataset digits does not read it",
        id="digits+mnist1d-test-samples",
    ),
    R(
        ["train", "--image-size", "64", "--out", "{out}"],
        "--image-size: --dataset mnist1d does not read it",
        id="image-size-on-1d-data",
    ),
    R(
        ["train", "--link-schedule", "lan,wan@epoch=50", "--epochs", "2", "--out", "{out}"],
        "--link-schedule: wan@epoch=50 is past the run (--epochs 2",
        id="schedule-past-the-run",
    ),
    R(
        ["train", "--link-schedule", "lan,wan@epoch=\u0663", "--out", "{out}"],
        "--link-schedule",
        id="schedule-arabic-indic-digit",
    ),
    R(
        ["train", "--outer-optimizer", "sgd", "--outer-momentum", "1", "--out", "{out}"],
        "--outer-momentum",
        id="outer-momentum=1",
    ),
    R(["train", "--outer-optimizer", "sgd", "--outer-lr", "100", "--out", "{out}"], "--outer-lr"),
    R(["train", "--outer-optimizer", "adam", "--out", "{out}"], "--outer-optimizer"),
    R(
        ["train", "--strategy", "ddp", "--compress", "int8", "--out", "{out}"],
        "--compress",
        id="ddp+compress",
    ),
    R(["train", "--compress", "int4", "--out", "{out}"], "--compress"),
    R(["train", "--fragments", "0", "--out", "{out}"], "--fragments", id="fragments=0"),
    R(["train", "--fragments", "-3", "--out", "{out}"], "--fragments", id="fragments<0"),
    R(["train", "--fragments", "2.5", "--out", "{out}"], "--fragments", id="fragments=2.5"),
    R(["train", "--fragments", str(10**9), "--out", "{out}"], "--fragments", id="fragments=1e9"),
    R(["train", "--fragment-delay", "-1", "--out", "{out}"], "--fragment-delay", id="tau<0"),
    R(
        localsgd("--sync-period", "8", "--fragments", "4", "--fragment-delay", "3"),
        "--fragment-delay: τ = 3 is above K/F = 8/4",
        id="tau>K/F",
    ),
    R(localsgd("--sync-period", "4", "--fragment-delay", "5"), "--fragment-delay", id="tau>K"),
    R(
        localsgd("--sync-period", "4", "--fragments", "8"),
        "--fragments: 8 fragments need K >= 8",
        id="K<F",
    ),
    R(
        localsgd(
            "--task", "tests.task_fixtures:linear", "--sync-period", "16", "--fragments", "16"
        ),
        "--fragments: 16 fragments of tests.task_fixtures:linear's model with 9 parameters",
        id="fragments>parameters",
    ),
    R(["train", "--fragments", "2", "--out", "{out}"], "--fragments: streams", id="cpdp+fragments"),
    R(
        ["train", "--strategy", "ddp", "--fragments", "2", "--out", "{out}"],
        "--fragments",
        id="ddp+fragments",
    ),
    R(
        localsgd("--fragments", "2", "--sync-optimizer-state"),
        "--sync-optimizer-state",
        id="fragments+sync-optimizer-state",
    ),
    R(
        ["train", "--overlap-boundary", "--fragment-delay", "1", "--out", "{out}"],
        "--overlap-boundary",
        id="overlap+fragment-delay",
    ),
    R(localsgd("--fragment-merge", "lerp"), "--fragment-merge: lerp mixes", id="lerp-no-delay"),
    R(
        localsgd("--fragment-delay", "1", "--fragment-alpha", "0.5"),
        "--fragment-alpha: --fragment-merge keep does not read it",
        id="alpha+keep",
    ),
    R(
        localsgd("--overlap-boundary", "--fragment-merge", "lerp", "--fragment-alpha", "2"),
        "--fragment-alpha: input should be less than 1",
        id="alpha>1",
    ),
    R(
        localsgd("--overlap-boundary", "--fragment-merge", "lerp", "--fragment-alpha", "1"),
        "--fragment-alpha: input should be less than 1 (got 1.0): α = 1 keeps θ_local whole",
        id="alpha=1",
    ),
    R(localsgd("--fragment-by", "module"), "--fragment-by: module cuts", id="fragment-by+F1"),
    R(
        localsgd("--task", "tests.task_fixtures:linear", "--sync-period", "8", "--fragments", "3")
        + ["--fragment-by", "strided"],
        "--fragments: 3 fragments by strided of a model with 2 parameter tensors",
        id="fragments>tensors",
    ),
    R(
        ["train", "--strategy", "ddp", "--outer-state-device", "cpu", "--out", "{out}"],
        "--outer-state-device: cpu: ddp keeps no outer state",
        id="ddp+outer-state-cpu",
    ),
    R(
        ["train", "--outer-state-device", "cpu", "--overlap-boundary", "--out", "{out}"],
        "--outer-state-device: cpu: a delayed average",
        id="overlap+outer-state-cpu",
    ),
    R(
        ["train", "--outer-state-device", "cpu", "--compress", "int8", "--out", "{out}"],
        "--outer-state-device: cpu: --compress",
        id="compress+outer-state-cpu",
    ),
    R(
        ["train", "--config", "{tmp}/c.yaml", "--out", "{out}"],
        "--accumulation-steps: autok train's loop takes one",
        file("c.yaml", "accumulation_steps: 4\n"),
        id="accumulation-steps-library-only",
    ),
    R(
        ["train", "--accumulation-steps", "4", "--out", "{out}"],
        "--accumulation-steps",
        id="accumulation-steps-no-flag",
    ),
    R(
        ["train", "--strategy", "ddp", "--fragment-delay", "1", "--out", "{out}"],
        "--fragment-delay",
        id="ddp+fragment-delay",
    ),
    R(
        ["train", "--boundary", "fused", "--fragment-delay", "1", "--out", "{out}"],
        "--fragment-delay",
        id="fused+fragment-delay",
    ),
    # --out
    R(["train", *TINY, "--out", ""], "--out", id="--out=empty"),
    R(["train", *TINY, "--out", "  "], "--out", id="--out=blank"),
    R(["train", *TINY, "--out", "/proc/autok-run"], "--out", id="--out=/proc"),
    R(["train", *TINY, "--out", "{tmp}/f"], "--out", file("f", "mine"), id="--out=a-file"),
    R(["train", *TINY, "--out", "{tmp}/f/run"], "--out", file("f", "mine"), id="--out=under-file"),
    R(["train", *TINY, "--out", "{tmp}/a\0b"], "--out", id="--out=NUL"),
    R(["train", *TINY, "--out", "{tmp}/run"], "--out", run_dir(), id="--out=holds-a-run"),
    # --config files
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", "a: [1,\n"), id="yaml"),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", "a:\tb\n c"), id="tab"),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", b"lr: \xff\xfe\n")),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", BILLION_LAUGHS)),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", "&a [*a]\n"), id="rec"),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", DEEP), id="deep"),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", "#" * (2 << 20))),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", "a: 1\n---\nb: 2\n")),
    R(["train", "--config", "{tmp}/c.yaml"], "--config", file("c.yaml", "- 1\n- 2\n"), id="list"),
    R(["train", "--config", "{tmp}"], "--config", id="config=dir"),
    R(["train", "--config", ""], "--config", id="config=empty"),
    R(["train", "--config", "{tmp}/c.yaml"], "--lr", file("c.yaml", "lr: .inf\n"), id="yaml-inf"),
    R(["train", "--config", "{tmp}/c.yaml"], "--seed", file("c.yaml", "seed: 1.0e+23\n")),
    R(["train", "--config", "{tmp}/c.yaml"], "--out", file("c.yaml", "out: ''\n"), id="yaml-out"),
    R(["train", "--config", "{tmp}/c.yaml"], "--workers", file("c.yaml", "workers: [1, 2]\n")),
    R(["train", "--config", "{tmp}/c.yaml"], "--link-rtt-ms", file("c.yaml", "link_rtt_ms: nan")),
    R(
        ["train", "--config", "{tmp}/c.yaml"],
        "--config",
        file("c.yaml", "x" * 100_000 + ": 1\n"),
        id="long-key",
    ),
    # --data-dir
    R(["train", "--dataset", "cifar100", "--data-dir", ""], "--data-dir", id="data-dir=empty"),
    R(
        ["train", "--dataset", "cifar100", "--model", "mlp", "--data-dir", "{tmp}/cifar"],
        "--data-dir",
        crafted_cifar,
        id="cifar-crafted-pickle",
    ),
    R(
        ["train", "--dataset", "cifar100", "--model", "mlp", "--data-dir", "{tmp}/cifar"],
        "--data-dir",
        generated_cifar,
        id="cifar-not-official",
    ),
    R(
        ["train", "--dataset", "cifar100", "--model", "mlp", "--data-dir", "{tmp}/cifar"],
        "--data-dir",
        cifar_without_meta,
        id="cifar-no-meta",
    ),
    *[
        R(
            ["train", "--dataset", "tinyimagenet", "--model", "mlp", "--data-dir", "{tmp}/tin"],
            "--data-dir",
            tiny(edit),
            id=f"tinyimagenet-{name}",
        )
        for name, edit in [
            ("no-wnids", lambda r: (r / "wnids.txt").unlink()),
            ("empty-wnids", lambda r: (r / "wnids.txt").write_text("\n")),
            ("unknown-wnid", lambda r: (r / "wnids.txt").write_text("n01443537\nn99999999\n")),
            ("extra-class", lambda r: (r / "train" / "n00000001" / "images").mkdir(parents=True)),
            ("no-images", lambda r: _rm_tree(r / "train" / "n01629819" / "images")),
            ("val-missing", lambda r: (r / "val" / "images" / "val_0.JPEG").unlink()),
            ("val-class", lambda r: write("val_annotations.txt", "val_0.JPEG\tn123\n")(r / "val")),
            (
                "val-no-tab",
                lambda r: write("val_annotations.txt", "val_0.JPEG n01443537\n")(r / "val"),
            ),
            (
                "val-escape",
                lambda r: write("val_annotations.txt", "../wnids.txt\tn01443537\n")(r / "val"),
            ),
            ("val-empty", lambda r: write("val_annotations.txt", "\n")(r / "val")),
        ]
    ],
    *[
        R(
            ["train", "--dataset", "imagefolder", "--model", "mlp", "--data-dir", "{tmp}/imf"],
            "--data-dir",
            folder(edit),
            id=f"imagefolder-{name}",
        )
        for name, edit in [
            ("no-val", lambda r: _rm_tree(r / "val")),
            ("other-classes", lambda r: (r / "val" / "dog").rename(r / "val" / "wolf")),
            ("class-no-image", lambda r: (r / "val" / "eel" / "0.png").rename(r / "val" / "x")),
            ("text-only", lambda r: (r / "train" / "cat" / "0.png").rename(r / "train/cat/a.txt")),
            ("no-classes", lambda r: [_rm_tree(r / s) for s in ("train", "val")] and None),
            ("train-is-file", lambda r: (_rm_tree(r / "train"), (r / "train").write_text("x"))),
            # found by the probe of two samples, before launch (the workers would find it)
            ("not-images", lambda r: [p.write_bytes(b"junk") for p in r.rglob("*.png")] and None),
        ]
    ],
    # --resume: what it would rewind and append to must be autok's rows
    R(["train", "--resume", "{tmp}/run"], "--resume", run_dir("garbage,row\r\n"), id="csv-row"),
    R(["train", "--resume", "{tmp}/run"], ("--resume", "epoch"), run_dir("x" + "," * 13 + "\r\n")),
    R(["train", "--resume", "{tmp}/run"], ("--resume", "boundaries.jsonl"), run_dir(jsonl="{]\n")),
    R(["train", "--resume", "{tmp}/run"], "--resume", run_dir(jsonl='{"epoch": "a"}\n')),
    R(["train", "--resume", "{tmp}/run"], "--resume", run_dir(config="{not json"), id="cfg-json"),
    R(["train", "--resume", "{tmp}/run"], "--resume", run_dir(config="[1, 2]"), id="cfg-list"),
    # deeper than Python's stack (json's RecursionError), and larger than any config.json
    R(["train", "--resume", "{tmp}/run"], "--resume", run_dir(config="[" * 100_000), id="cfg-deep"),
    R(
        ["train", "--resume", "{tmp}/run"],
        "--resume",
        run_dir(config='{"a": "' + "x" * (1 << 20) + '"}'),
        id="cfg-huge",
    ),
    R(["train", "--resume", ""], "--resume", id="resume=empty"),
    # config.json is data: the task a resume runs is the command line's, never the run's
    R(
        ["train", "--resume", "{tmp}/run"],
        ("--task", "was trained with --task 'builtins:input'"),
        run_dir(
            config=json.dumps(
                {**TrainConfig(link="none").model_dump(mode="json"), "task": "builtins:input"}
            )
        ),
        id="resume-config-names-a-task",
    ),
    R(
        ["train", "--resume", "{tmp}/run", "--task", "tests.task_fixtures:regression"],
        ("--task", "is not the task", "the built-in task"),
        run_dir(),
        id="resume-another-task",
    ),
    # one process trains a run: another holds its lock
    R(
        ["train", *TINY, "--out", "{out}"],
        ("--out", "is being written by another autok process"),
        held_run("out"),
        id="out-being-written",
    ),
]

SWEEP_SPACE = ["sweep", *TINY, "--space", "{tmp}/s.yaml", "--out", "{out}"]
SWEEP = [
    R(["sweep", "--trials", "0", "--out", "{out}"], "--trials"),
    R(  # a choosing setting that is not a name: the conditional space leaves it to TrainConfig
        ["sweep", "--config", "{tmp}/c.yaml", "--space", "{tmp}/s.yaml", "--out", "{out}"],
        "--policy: input should be a valid string",
        both(
            file("c.yaml", "policy: [fixed]\ntarget_sync_share: 0.3\n"),
            file("s.yaml", "lr: {type: float, low: 0.01, high: 0.1}\n"),
        ),
        id="sweep-policy-a-list",
    ),
    R(["sweep", "--trials", str(10**8), "--out", "{out}"], "--trials"),
    R(["sweep", "--jobs", "0", "--out", "{out}"], "--jobs"),
    R(["sweep", "--jobs", "10000", "--out", "{out}"], "--jobs"),
    R(["sweep", "--sampler-seed", "-1", "--out", "{out}"], "--sampler-seed"),
    R(["sweep", "--sampler-seed", str(2**40), "--out", "{out}"], "--sampler-seed"),
    # a local Ray has this machine's CPUs; a trial needing more would wait forever
    R(
        [
            "sweep",
            "--backend",
            "ray",
            *TINY[2:],
            "--workers",
            str((os.cpu_count() or 1) + 1),
            "--out",
            "{out}/s1",
        ],
        ("--workers", "each trial reserves"),
        id="sweep-ray-workers-above-cpus",
    ),
    *[
        R(["sweep", name, v, "--out", "{out}"], "--target")
        for name in ("--target", "--target-accuracy")  # the older name of the same flag
        for v in ("nan", "inf", "0", "2", "-0.5")
    ],
    R(
        [
            "sweep",
            "--target",
            "0.5",
            "--task",
            "tests.task_fixtures:regression",
            "--target",
            "nan",
            "--out",
            "{out}",
        ],
        "--target: nan is not a finite",
    ),
    R(
        [
            "sweep",
            "--task",
            "tests.task_fixtures:regression",
            "--objective",
            "time-to-target",
            "--out",
            "{out}",
        ],
        "--target: the task's metric is mse; give the value to reach",
    ),
    R(["sweep", "--task", "tests.task_fixtures:raises", "--out", "{out}"], "--task: "),
    R(
        ["sweep", "--task", "tests.task_fixtures:regression", "--model", "mlp", "--out", "{out}"],
        "--model: the task builds",
    ),
    R(["train", "--task", "tests.task_fixtures:not_a_task", "--out", "{out}"], "--task: "),
    R(["train", "--task", "tests.no_such_module:x", "--out", "{out}"], "--task: cannot import"),
    R(["train", "--task", "tests.task_fixtures:missing", "--out", "{out}"], "--task: "),
    # tasks that passed --task's checks and crashed after launch (files written, exit 1)
    *[
        R(
            ["train", "--task", f"tests.task_fixtures:{fn}", "--out", "{out}"],
            f"--task: {says}",
            id=f"task-{fn}",
        )
        for fn, says in (
            ("detached_loss", "tests.task_fixtures:detached_loss returned a loss_fn whose loss"),
            ("huge_train_set", "tests.task_fixtures:huge_train_set returned a train_dataset of"),
            ("complex_parameter", "tests.task_fixtures:complex_parameter returned a model whose"),
        )
    ],
    R(["train", "--task", "a:b:c", "--out", "{out}"], "--task: 'a:b:c' is not MODULE:FUNCTION"),
    R(["train", "--tensorboard", "", "--out", "{out}"], "--tensorboard"),
    R(
        ["train", "--tensorboard", "{tmp}/afile/tb", "--out", "{out}"],
        "--tensorboard",
        lambda t: (t / "afile").write_text("x"),
    ),
    R(["train", "--task", "../evil:x", "--out", "{out}"], "--task: "),
    R(["train", "--task", "x" * 300 + ":y", "--out", "{out}"], "--task"),
    R(["sweep", "--study-name", " ", "--out", "{out}"], "--study-name"),
    R(["sweep", "--out", "{tmp}/f"], "--out", file("f", "mine"), id="sweep-out=file"),
    R(["sweep", "--out", ""], "--out", id="sweep-out=empty"),
    R(["sweep", "--out", "/proc/autok-sweep"], "--out", id="sweep-out=/proc"),
    R(["sweep", "--resume", "--out", "{out}"], "--resume", id="sweep-resume-nothing"),
    R(["sweep", "--address", "auto", "--out", "{out}"], "--address: a Ray cluster's address"),
    *[  # nothing listens on port 1: refused at once, not after minutes of Ray's retries
        R(
            ["sweep", "--backend", "ray", "--address", address, "--out", "{out}"],
            ("--address: nothing answers at 127.0.0.1:1 (", "ray start --head"),
            id=f"sweep-ray-address-{i}",
        )
        for i, address in enumerate(["127.0.0.1:1", "ray://user:s3cr3t@127.0.0.1:1"])
    ],
    R(["train", "--data-dir", "{tmp}", "--out", "{out}"], "--data-dir: mnist1d is built in"),
    R(
        ["train", "--config", "{tmp}/c.yaml", "--out", "{out}"],
        ("--config", "sets sync_period twice ('sync-period' and 'sync_period')"),
        file("c.yaml", "sync-period: 8\nsync_period: 2\n"),
        id="config-key-twice",
    ),
    *[  # nccl where there is no GPU (on a machine with one, these would start: not run there)
        pytest.param(
            *R(argv, expect, id=f"{argv[0]}-nccl-without-gpu").values,
            id=f"{argv[0]}-nccl-without-gpu",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here"),
        )
        for argv, expect in [
            (["train", "--backend", "nccl", "--out", "{out}"], "--backend: nccl needs NVIDIA"),
            (["sweep", "--dist-backend", "nccl", "--out", "{out}"], "--dist-backend: nccl"),
        ]
    ],
    R(
        ["sweep", "--metrics-port", "9471", "--jobs", "2", "--out", "{out}"],
        ("--metrics-port", "--jobs 1"),
        id="sweep-metrics-port-jobs",
    ),
    *[
        R(
            ["sweep", "--resume", "--out", "{tmp}/sw"],
            ("--resume", "is not a SQLite database"),
            file("sw/study.db", content),
            id=f"sweep-resume-{name}-db",
        )
        for name, content in [("empty", b""), ("text", b"not a database\n" * 10)]
    ],
    R(  # Ray's restore would unpickle what --out holds: never resumed
        ["sweep", "--backend", "ray", "--resume", "--out", "{tmp}/sw"],
        ("--resume", "Ray's restore unpickles", "--backend optuna"),
        file("sw/ray/autok/tuner.pkl", b"\x80\x04N."),
        id="sweep-ray-resume",
    ),
    *[  # a new study (any --study-name) over another sweep's results
        R(
            ["sweep", "--study-name", "other", "--out", "{tmp}/sw"],
            ("--out", f"already holds a sweep ({name})", "--resume"),
            file(f"sw/{name}" if name != "trials" else "sw/trials/trial-0000/config.json", "{}"),
            id=f"sweep-over-{name}",
        )
        for name in ("trials.csv", "best.yaml", "trials", "study.db")
    ],
    R(["sweep", "--lr", "inf", "--out", "{out}"], "--lr", id="sweep-fixed-lr-inf"),
    *[
        R(SWEEP_SPACE, "--space", file("s.yaml", text), id=f"space-{name}")
        for name, text in [
            ("nan", "lr: {type: float, low: .nan, high: 0.5}\n"),
            ("inf", "lr: {type: float, low: 0.01, high: .inf}\n"),
            ("low>high", "lr: {type: float, low: 0.5, high: 0.1}\n"),
            # every value past the fixed --epochs 2: every trial would fail on it
            ("no-valid-value", "warmup_epochs: {type: int, low: 5, high: 6}\n"),
            ("no-valid-choice", "strategy: {type: categorical, choices: [fedavg, gossip]}\n"),
            ("bool", "lr: {type: float, low: true, high: 0.5}\n"),
            ("string", "lr: {type: float, low: '0.1', high: 0.5}\n"),
            ("unknown", "frobnicate: {type: int, low: 1, high: 2}\n"),
            ("out", "out: {type: categorical, choices: [a, b]}\n"),
            # each trial's objective would be read on another test set
            ("test-set", "mnist1d_test_samples: {type: int, low: 1000, high: 2000}\n"),
            ("no-type", "lr: {low: 0.1, high: 0.5}\n"),
            ("bound-invalid", "lr: {type: float, low: -1.0, high: 0.5}\n"),
            ("bound-too-big", "sync_period: {type: int, low: 1, high: 100000000}\n"),
            ("float-on-int", "sync_period: {type: float, low: 1, high: 8}\n"),
            ("int-fraction", "sync_period: {type: int, low: 1.5, high: 8}\n"),
            ("log-zero", "lr: {type: float, low: 0.0, high: 0.5, log: true}\n"),
            ("log-string", "lr: {type: float, low: 0.1, high: 0.5, log: maybe}\n"),
            ("choice-policy", "policy: {type: categorical, choices: [fixed, warp-drive]}\n"),
            # the fixed --policy (fixed, the default) never reads it: a dimension with no effect
            ("unread-by-policy", "target_sync_share: {type: float, low: 0.1, high: 0.4}\n"),
            ("choice-nested", "strategy: {type: categorical, choices: [[cpdp], ddp]}\n"),
            ("choice-inf", "slowmo_beta: {type: categorical, choices: [0.1, .inf]}\n"),
            ("no-choices", "policy: {type: categorical, choices: []}\n"),
            (
                "twice",
                "sync-period: {type: int, low: 1, high: 4}\n"
                "sync_period: {type: int, low: 1, high: 8}\n",
            ),
            ("empty", ""),
            ("list", "- lr\n"),
            ("malformed", "lr: {type: float\n"),
            ("bomb", BILLION_LAUGHS),
            ("utf8", b"lr: \xff\n"),
        ]
    ],
    R(SWEEP_SPACE, "--space", id="space-missing"),
    R(
        [*SWEEP_SPACE, "--target-sync-share", "0.3"],
        ("--target-sync-share: --policy fixed does not read it", "composite, exposed-sync"),
        file("s.yaml", "lr: {type: float, low: 0.05, high: 0.2}\n"),
        id="sweep-fixed-share-no-trial-reads",
    ),
    *[
        R(
            [*SWEEP_SPACE, "--enqueue", "{tmp}/e.yaml"],
            ("--enqueue", "entry 1: target_sync_share", said),
            both(
                file(
                    "s.yaml",
                    "policy: {type: categorical, choices: [fixed, exposed-sync]}\n"
                    "target_sync_share: {type: float, low: 0.1, high: 0.4}\n",
                ),
                file("e.yaml", entry),
            ),
            id=f"enqueue-{name}",
        )
        for name, entry, said in [
            ("share-unread", "[{policy: fixed, target_sync_share: 0.3}]", "does not read it"),
            ("share-no-policy", "[{target_sync_share: 0.3}]", "give policy in the entry too"),
        ]
    ],
    *[
        R(
            [*SWEEP_SPACE, "--enqueue", "{tmp}/e.yaml"],
            "--enqueue",
            both(file("s.yaml", "lr: {type: float, low: 0.01, high: 0.5}\n"), file("e.yaml", t)),
            id=f"enqueue-{name}",
        )
        for name, t in [
            ("mapping", "lr: 0.1\n"),
            ("unknown", "- {momentum: 0.5}\n"),
            ("outside", "- {lr: 5.0}\n"),
            ("nan", "- {lr: .nan}\n"),
            ("string", "- {lr: fast}\n"),
            ("bomb", BILLION_LAUGHS),
        ]
    ],
]

EXP = ["experiment", "run", "{tmp}/exp.yaml", "--out", "{out}"]
K_SWEEP = ["experiment", "run", "k-sweep", "--out", "{out}"]
EXPERIMENT = [
    R(["experiment", "run", "k-sweep", "--seeds", "-1", "--out", "{out}"], "--seeds"),
    R(["experiment", "run", "k-sweep", "--seeds", str(2**40), "--out", "{out}"], "--seeds"),
    R(["experiment", "run", "k-sweep", "--seeds", "1", "1", "--out", "{out}"], "--seeds"),
    R(  # counted, not expanded: 20,000 seeds are refused at once
        ["experiment", "run", "k-sweep", "--seeds", *map(str, range(20_000)), "--out", "{out}"],
        ("--seeds: experiment k-sweep", "at most 10,000"),
        id="experiment-seeds-20000",
    ),
    R(
        EXP,
        ("experiment long", "at most 255"),
        experiment(f"name: long\nquick:\n  base: {{}}\nruns:\n  - {{name: {'a' * 300}}}\n"),
        id="experiment-run-name-too-long",
    ),
    R(["train", "--out", "{tmp}/" + "x" * 300], ("--out", "300 bytes long; at most 255")),
    R(["train", "--resume", "{tmp}/" + "x" * 300], ("--resume", "300 bytes")),
    R(["train", "--config", "{tmp}/" + "x" * 300 + ".yaml"], ("--config", "bytes long")),
    R(["report", "{tmp}/" + "x" * 300], ("300 bytes long",)),
    R(  # 10^8 runs from a few lines: refused before one is built
        EXP,
        ("experiment huge", "100,000,000 runs", "at most 10,000"),
        experiment(
            "name: huge\nquick:\n  base: {workers: 2, epochs: 1}\n  vary:\n"
            + "".join(
                f"    {k}: [{', '.join(str(i) for i in range(100))}]\n"
                for k in ("seed", "epochs", "sync_period", "mnist1d_samples")
            )
            + "runs:\n  - {name: a, strategy: cpdp}\n"
        ),
        id="experiment-grid-1e8",
    ),
    R(["experiment", "run", "k-sweep", "--seeds", "x", "--out", "{out}"], "--seeds"),
    R(["experiment", "run", "k-sweep", "--jobs", "0", "--out", "{out}"], "--jobs"),
    # every run on the virtual clock: checked with each run's settings, before any starts
    R(
        [*K_SWEEP, "--clock", "virtual"],
        ("--clock: virtual", "needs --compute-ms"),
        id="experiment-virtual-no-compute",
    ),
    R(
        [*K_SWEEP, "--compute-ms", "5"],
        ("--compute-ms: --clock wall does not read it",),
        id="experiment-compute-ms-wall",
    ),
    R(
        [*K_SWEEP, "--clock", "virtual", "--compute-ms", "nan"],
        "--compute-ms",
        id="experiment-compute-ms-nan",
    ),
    R(["experiment", "run", "k-sweep", "--jobs", "100000", "--out", "{out}"], "--jobs"),
    R(["experiment", "run", "k-sweep", "--out", ""], "--out", id="exp-out=empty"),
    R(["experiment", "run", "k-sweep", "--out", "{tmp}/f"], "--out", file("f", "x"), id="exp-f"),
    R(["experiment", "run", "k-sweep", "--out", "{tmp}/f/x"], "--out", file("f", "x"), id="ex-f2"),
    R(
        ["experiment", "run", "k-sweep", "--full", "--out", "{out}"],
        "--data-dir",
        id="full-no-data",
    ),
    R(["experiment", "run", "k-sweep", "--data-dir", "", "--out", "{out}"], "--data-dir"),
    R(["experiment", "run", "no-such", "--out", "{out}"], "experiment", id="exp-unknown"),
    *[
        R(EXP, expect, experiment(text), id=f"exp-{name}")
        for name, expect, text in [
            ("malformed", "experiment", "name: [\n"),
            ("bomb", "experiment", BILLION_LAUGHS),
            ("utf8", "experiment", b"name: \xff\n"),
            ("list", "experiment", "- a\n"),
            ("no-name", "name", "quick: {}\nruns: [{name: a}]\n"),
            ("no-runs", "runs", "name: t\nquick: {}\n"),
            ("run-no-name", "runs[0]", "name: t\nquick: {}\nruns: [{strategy: ddp}]\n"),
            ("run-dotdot", "runs[0]", "name: t\nquick: {}\nruns: [{name: '..'}]\n"),
            ("no-form", "quick", "name: t\nruns: [{name: a}]\n"),
            ("vary", "vary", "name: t\nquick: {vary: {lr: 0.1}}\nruns: [{name: a}]\n"),
            (
                "bundle-no-name",
                "vary.regime",
                "name: t\nquick: {vary: {regime: [{link: lan}]}}\nruns: [{name: a}]\n",
            ),
            (
                "mean-k-of-later",
                "runs[0].random_mean",
                "name: t\nquick: {}\nruns: [{name: r, policy: random, random_mean: "
                "{mean_k_of: e}}, {name: e, policy: exposed-sync}]\n",
            ),
            (
                "mean-k-of-key",
                "runs[1].random_mean",
                "name: t\nquick: {}\nruns: [{name: e}, {name: r, policy: random, random_mean: "
                "{mean_of: e}}]\n",
            ),
            ("base", "base", "name: t\nquick: {base: [1]}\nruns: [{name: a}]\n"),
            ("scale", "scale_lr", "name: t\nquick: {scale_lr: {base_lr: x}}\nruns: [{name: a}]\n"),
            ("seeds", "seeds", "name: t\nseeds: [a]\nquick: {}\nruns: [{name: a}]\n"),
            ("setting-inf", "--lr", "name: t\nquick: {base: {lr: .inf}}\nruns: [{name: a}]\n"),
            ("setting-seed", "--seed", "name: t\nseeds: [-5]\nquick: {}\nruns: [{name: a}]\n"),
            ("dup-runs", "distinct names", "name: t\nquick: {}\nruns: [{name: a}, {name: a}]\n"),
            (
                "measured-runs",
                "measured.quick: needs runs",
                "name: t\nmeasured: {quick: {runs: 0, minutes: 5, machine: x, source: y}}\n"
                "quick: {}\nruns: [{name: a}]\n",
            ),
            (
                "measured-form",
                "measured.full: names no form",
                "name: t\nmeasured: {full: {runs: 1, minutes: 5, machine: x, source: y}}\n"
                "quick: {}\nruns: [{name: a}]\n",
            ),
        ]
    ],
    R(
        EXP,
        "--out",
        both(experiment(GOOD_EXP), file("out/a/seed-42/notes.txt", "the user's own notes")),
        id="exp-user-file-in-run-dir",
    ),
    R(
        EXP,
        "--out",
        both(
            experiment(GOOD_EXP), file("out/a/seed-42/run.yaml", "x"), file("out/a/seed-42/x", "")
        ),
        id="exp-user-file-beside-autok-files",
    ),
    R(EXP, "--out", both(experiment(GOOD_EXP), file("out/a", "mine")), id="exp-label-is-a-file"),
    R(
        EXP,
        "--out",
        both(experiment(GOOD_EXP), file("out/a/seed-42/checkpoints/.staging-epoch-0001/x", "")),
        id="exp-user-file-in-staging",
    ),
    # A name autok writes proves nothing: a directory autok did not make (no marker of this
    # experiment) is the user's, whatever its files are called.
    *[
        R(
            EXP,
            ("--out", f"seed-42/{name}", "cannot prove"),
            both(experiment(GOOD_EXP), file(f"out/a/seed-42/{name}", "the user's own")),
            id=f"exp-users-own-{name}",
        )
        for name in ("model.pt", "config.json", "run.yaml")
    ],
    R(
        EXP,
        ("--out", "seed-42/model.pt"),
        both(
            experiment(GOOD_EXP),
            marked_run("other", "a/seed-42"),
            copy("other/a/seed-42/.autok-run.json", "out/a/seed-42/.autok-run.json"),
            file("out/.autok-experiment.json", '{"secret": "' + "ab" * 32 + '"}'),
            file("out/a/seed-42/model.pt", "the user's own"),
        ),
        id="exp-marker-copied-from-another-experiment",
    ),
    R(
        EXP,
        ("--out", "seed-42/model.pt"),
        both(
            experiment(GOOD_EXP),
            marked_run("out", "b/seed-42"),
            copy("out/b/seed-42/.autok-run.json", "out/a/seed-42/.autok-run.json"),
            file("out/a/seed-42/model.pt", "the user's own"),
        ),
        id="exp-marker-copied-from-another-run",
    ),
    R(
        EXP,
        ("--out", "seed-42/notes.txt", "not written by autok"),
        both(
            experiment(GOOD_EXP),
            marked_run("out", "a/seed-42"),
            file("out/a/seed-42/config.json", "{}"),
            file("out/a/seed-42/notes.txt", "the user's own, in autok's run directory"),
        ),
        id="exp-user-file-in-autoks-run-dir",
    ),
    R(
        EXP,
        ("--out", "seed-42/console.log"),
        both(
            experiment(GOOD_EXP),
            marked_run("out", "a/seed-42"),
            link("out/a/seed-42/console.log", "logs"),
        ),
        id="exp-link-in-autoks-run-dir",
    ),
    R(
        EXP,
        ("--out", ".autok-experiment.json"),
        both(experiment(GOOD_EXP), file("out/.autok-experiment.json", "not json")),
        id="exp-state-not-autoks",
    ),
    # A symbolic link under --out is never written or deleted through, whatever lies behind it.
    *[
        R(EXP, ("--out", f"{where} is a symbolic link"), both(experiment(GOOD_EXP), *setups), id=i)
        for i, where, setups in [
            ("exp-label-dir-is-a-link", "out/a", [link("out/a", "elsewhere")]),
            (
                "exp-label-dir-links-to-autok-named-files",
                "out/a",
                [link("out/a", "elsewhere"), file("elsewhere/seed-42/config.json", "mine")],
            ),
            (
                "exp-label-dir-links-to-a-finished-run",
                "out/a",
                [link("out/a", "elsewhere"), file("elsewhere/seed-42/summary.json", "{}")],
            ),
            ("exp-run-dir-is-a-link", "out/a/seed-42", [link("out/a/seed-42", "elsewhere")]),
        ]
    ],
    # A panel's pilot (autok/pilot.py): its seeds apart from the main ones, its plan a plan.
    R(
        EXP,
        "pilot.seeds",
        experiment(PILOT_EXP.replace("seeds: [7]", "seeds: [1]")),
        id="exp-pilot-seed-is-a-main-seed",
    ),
    R([*EXP, "--seeds", "7"], "--seeds", experiment(PILOT_EXP), id="exp-seeds-are-pilot-seeds"),
    R(
        EXP,
        "pilot.runs",
        experiment(PILOT_EXP.replace("runs: [k1]", "runs: [best]")),
        id="exp-pilot-runs-a-policy",
    ),
    R(
        EXP,
        ("runs: 'best' takes sync_period: pilot and sets strategy: 'ddp'", "pilot run 'k1'"),
        experiment(PILOT_EXP.replace("best, strategy: cpdp", "best, strategy: ddp")),
        id="exp-pilot-choice-set-otherwise",
    ),
    R(
        EXP,
        ("--out", "plan.json", "not a plan"),
        both(experiment(PILOT_EXP), file("out/plan.json", '{"regime=r": {"target": 0.5}}')),
        id="exp-plan-json-not-a-plan",
    ),
    R(
        EXP,
        ("--out", "plan.json", "not readable JSON"),
        both(experiment(PILOT_EXP), file("out/plan.json", "{")),
        id="exp-plan-json-not-json",
    ),
]

REPORT = [
    R(["report", "{tmp}/nothing"], "report", id="report-missing-dir"),
    R(["report", "{tmp}/exp"], "report", lambda t: (t / "exp").mkdir(), id="report-empty"),
    *[
        R(["report", "{tmp}/exp"], expect, finished_run(edit), id=f"report-{name}")
        for name, expect, edit in [
            ("summary-json", ("summary.json",), write("summary.json", "{oops")),
            ("summary-list", ("summary.json",), write("summary.json", "[]")),
            (
                "summary-missing-field",
                ("summary.json", "peak_test_accuracy"),
                edit_json("summary.json", peak_test_accuracy=KeyError),
            ),
            (
                "summary-string",
                ("summary.json", "wall_seconds"),
                edit_json("summary.json", wall_seconds="fast"),
            ),
            # json.dumps writes Infinity, as a hand-edited or foreign file may hold
            *[
                (f"summary-{k}-{v}", ("summary.json", k), edit_json("summary.json", **{k: v}))
                for k, v in [
                    ("wall_seconds", math.inf),
                    ("wall_seconds", -1.0),
                    ("peak_test_accuracy", 5.0),
                    ("final_test_accuracy", -0.5),
                ]
            ],
            (
                "label-newline",
                ("experiment.json", "label"),
                edit_json("experiment.json", label="a\nb"),
            ),
            ("epochs-missing", ("epochs.csv",), lambda d: (d / "epochs.csv").unlink()),
            (
                "epochs-column",
                ("epochs.csv", "test_accuracy"),
                write("epochs.csv", "epoch,epoch_seconds,grad_syncs,param_syncs\n0,1,1,1\n"),
            ),
            (
                "epochs-row",
                ("epochs.csv", "test_accuracy"),
                write(
                    "epochs.csv",
                    "epoch,test_accuracy,epoch_seconds,grad_syncs,param_syncs\n0,high,1,1,1\n",
                ),
            ),
            (
                "epochs-epoch",
                ("epochs.csv", "epoch"),
                write(
                    "epochs.csv",
                    "epoch,test_accuracy,epoch_seconds,grad_syncs,param_syncs\n-1,0.5,1,1,1\n",
                ),
            ),
            ("epochs-utf8", ("epochs.csv",), lambda d: (d / "epochs.csv").write_bytes(b"\xff\xfe")),
            ("meta-json", ("experiment.json",), write("experiment.json", "nope")),
            # deeper than the JSON parser recurses: one line naming the file, not a crash
            *[
                (
                    f"{name}-nested-deep",
                    (f"{name}.json", "nested too deeply"),
                    write(f"{name}.json", DEEP),
                )
                for name in ("experiment", "summary", "config")
            ],
            (
                "boundaries-nested-deep",
                ("boundaries.jsonl", "line 1"),
                write("boundaries.jsonl", DEEP + "\n"),
            ),
            ("meta-seed", ("experiment.json", "seed"), edit_json("experiment.json", seed="x")),
            # the experiment's plan.json (autok/pilot.py), two levels above the run
            (
                "plan-not-a-plan",
                ("plan.json", "not a plan"),
                lambda d: (d.parent.parent / "plan.json").write_text('{"regime=r": {"target": 1}}'),
            ),
            (  # passes a look at its top fields, but an arm lacks what the report reads
                "plan-arm-field",
                ("plan.json", "not a plan"),
                lambda d: (d.parent.parent / "plan.json").write_text(
                    '{"regime=r": {"target": 1, "best_fixed": "k8", "arms": {"k8": {}}}}'
                ),
            ),
            (
                "plan-not-json",
                ("plan.json", "not readable JSON"),
                lambda d: (d.parent.parent / "plan.json").write_text("{"),
            ),
            ("config-json", ("config.json",), write("config.json", "")),
            (
                "config-k",
                ("config.json", "sync_period"),
                edit_json("config.json", sync_period="four"),
            ),
            (
                "boundaries-line",
                ("boundaries.jsonl", "line 2"),
                write("boundaries.jsonl", json.dumps(GOOD_BOUNDARY) + "\n[\n"),
            ),
            (
                "boundaries-empty-object",
                ("boundaries.jsonl", "line 1", "epoch"),
                write("boundaries.jsonl", "{}\n"),
            ),
            (
                "boundaries-field",
                ("boundaries.jsonl", "compute_seconds"),
                write(
                    "boundaries.jsonl",
                    '{"epoch": 0, "global_step": 1, "sync_period": 1, '
                    '"exposed_sync_seconds": 0.1}\n',
                ),
            ),
            (
                "boundaries-missing",
                ("boundaries.jsonl",),
                lambda d: (d / "boundaries.jsonl").unlink(),
            ),
        ]
    ],
]

BENCH = [
    R(["bench", "--rounds", "0"], ("--rounds",), id="bench-rounds-0"),
    R(["bench", "--rounds", "-5"], ("--rounds",), id="bench-rounds-negative"),
    R(["bench", "--rounds", "1000000000"], ("--rounds",), id="bench-rounds-huge"),
    R(["bench", "--rounds", "x"], ("--rounds",), id="bench-rounds-text"),
    R(["bench", "--only", "nosuch"], ("--only",), id="bench-only-unknown"),
    R(["bench", "--only", "a,,b"], ("--only",), id="bench-only-empty-part"),
]

ROWS = [*TRAIN, *SWEEP, *EXPERIMENT, *REPORT, *BENCH]


# ----- the checks --------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root: kind, content digest and mtime (directories: their mtime too)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = (
                "file",
                hashlib.sha256(p.read_bytes()).hexdigest(),
                st.st_mtime_ns,
            )
        else:
            out[str(p.relative_to(root))] = ("dir" if p.is_dir() else "other", st.st_mtime_ns)
    return out


def fill(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)).replace("{out}", str(tmp / "out")) for a in argv]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory inside tmp_path (so `--out ''` would show), a private data cache, and
    every launcher replaced by a tripwire."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("AUTOK_CACHE", str(tmp_path / "cache"))

    def tripwire(*args, **kwargs):
        raise AssertionError("launched: this input was not refused")

    import autok.experiment
    import autok.launch
    import autok.sweep

    monkeypatch.setattr(autok.launch, "launch", tripwire)
    monkeypatch.setattr(autok.experiment, "run_experiment", tripwire)
    monkeypatch.setattr(autok.sweep, "sweep_optuna", tripwire)
    return tmp_path


@pytest.mark.parametrize("argv, expect, setup", ROWS)
def test_bad_input_is_refused_before_anything_is_written(sandbox, capsys, argv, expect, setup):
    from autok.cli import main

    tmp = sandbox
    if setup:
        setup(tmp)
    out_existed = (tmp / "out").exists()
    before = snapshot(tmp)
    rc = main(fill(argv, tmp))
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2, captured.err
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert line.startswith("autok: error: ") and len(line) <= MAX_LINE, line
    assert all(e in line for e in expect), (expect, line)
    assert "Traceback" not in captured.err + captured.out
    assert snapshot(tmp) == before
    assert (tmp / "out").exists() == out_existed
    assert not (tmp / "PWNED").exists()  # a crafted CIFAR pickle was never loaded


# A few rows end to end: the installed entry point, a fresh process, its exit code and stderr.
END_TO_END = [
    R(["train", "--lr", "inf", "--out", "{out}"], "--lr"),
    R(["train", "--out", ""], "--out"),
    R(
        ["train", "--config", "{tmp}/c.yaml", "--out", "{out}"],
        "--config",
        file("c.yaml", BILLION_LAUGHS),
    ),
    R(
        ["train", "--dataset", "cifar100", "--model", "mlp", "--data-dir", "{tmp}/cifar"],
        "--data-dir",
        crafted_cifar,
    ),
    R(["sweep", "--sampler-seed", "-1", "--out", "{out}"], "--sampler-seed"),
    R(["report", "{tmp}/exp"], ("summary.json",), finished_run(write("summary.json", "{"))),
    R(
        ["report", "{tmp}/exp"],
        ("experiment.json", "nested too deeply"),
        finished_run(write("experiment.json", DEEP)),
    ),
]


@pytest.mark.parametrize("argv, expect, setup", END_TO_END)
def test_end_to_end_exit_code_and_one_line(tmp_path, argv, expect, setup):
    if setup:
        setup(tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = snapshot(tmp_path)
    exe = Path(sys.executable).parent / "autok"
    env = {**os.environ, "AUTOK_CACHE": str(tmp_path / "cache")}
    res = subprocess.run(
        [str(exe), *fill(argv, tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and all(e in lines[0] for e in expect), res.stderr
    assert "Traceback" not in res.stderr
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "PWNED").exists()


def test_the_table_is_large():
    """The audit's classes are all here: count them so a lost row shows."""
    assert len(ROWS) >= 150, len(ROWS)


def test_a_bad_storage_leaves_no_sweep_directory(sandbox, capsys, monkeypatch):
    """--storage is checked by the sweep itself (it opens the database): the directory made for
    the sweep a moment before goes again, and only that one."""
    import autok.sweep
    from autok.cli import main

    monkeypatch.undo()  # the real sweep_optuna: it refuses the URL before any trial
    monkeypatch.chdir(sandbox / "cwd")
    assert autok.sweep.sweep_optuna.__name__ == "sweep_optuna"
    before = snapshot(sandbox)
    out = sandbox / "new" / "sweep"
    rc = main(["sweep", "--storage", "nosuchdb://x", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--storage" in err[0], err
    assert snapshot(sandbox) == before and not (sandbox / "new").exists()


def test_rewind_drops_a_torn_last_row_and_refuses_garbage(tmp_path):
    """--resume and restarts rewind epochs.csv/boundaries.jsonl: a row a crash cut short (no
    newline) is dropped; a row that is not autok's is refused with its file, line and field."""
    from autok.trainer.loop.sinks import EPOCH_COLUMNS, check_outputs, rewind_outputs

    header = ",".join(EPOCH_COLUMNS) + "\r\n"
    row = lambda e: f"{e}," + ",".join(["0.5"] * (len(EPOCH_COLUMNS) - 1)) + "\r\n"  # noqa: E731
    rec = lambda e: json.dumps(  # noqa: E731
        {"epoch": e, "global_step": e, "interval_steps": 1, "sync_period": 1, "lr": 0.1}
    )
    (tmp_path / "epochs.csv").write_text(header + row(0) + row(1) + "2,0.5,0.")
    (tmp_path / "boundaries.jsonl").write_text(f"{rec(0)}\n{rec(1)}\n{rec(2)}\n" + '{"epo')
    assert check_outputs(tmp_path) is None
    rewind_outputs(tmp_path, 0)
    assert (tmp_path / "epochs.csv").read_bytes().decode() == header + row(0)
    assert (tmp_path / "boundaries.jsonl").read_bytes().decode() == rec(0) + "\n"

    (tmp_path / "epochs.csv").write_text(header + "zero,1\r\n" + row(1))
    before = (tmp_path / "epochs.csv").read_text()
    why = check_outputs(tmp_path)
    assert why and "epochs.csv line 2" in why
    with pytest.raises(ValueError, match="epochs.csv line 2"):
        rewind_outputs(tmp_path, 0)
    assert (tmp_path / "epochs.csv").read_text() == before  # refused, not rewritten


def test_an_unstarted_run_is_cleared_of_autok_files_only(tmp_path):
    """`experiment run` starts a run again when it left no checkpoint: in the directory it made
    (its marker) it removes what autok wrote there (keeping train.log's history and the marker)
    and refuses, never deletes, anything else."""
    from autok.config import ConfigError
    from autok.experiment import MARKER, clear_unstarted, ensure_secret, start_over

    secret = ensure_secret(tmp_path)
    run = tmp_path / "a" / "seed-1"
    start_over(run, "a/seed-1", secret)  # made and marked, as `_train` makes it
    assert [p.name for p in run.iterdir()] == [MARKER]
    staged = run / "checkpoints" / ".staging-epoch-0000"
    staged.mkdir(parents=True)
    (staged / "rank0.pt").write_bytes(b"x")
    for name in ("config.json", "epochs.csv", "run.yaml", "experiment.json", ".epochs.csv.tmp"):
        (run / name).write_text("x")
    (run / "train.log").write_text("the first attempt\n")
    clear_unstarted(run, "a/seed-1", secret)
    assert sorted(p.name for p in run.iterdir()) == sorted([MARKER, "train.log"])
    assert (run / "train.log").read_text() == "the first attempt\n"

    (run / "notes.md").write_text("mine")
    (run / "config.json").write_text("x")
    with pytest.raises(ConfigError, match="notes.md"):
        clear_unstarted(run, "a/seed-1", secret)
    assert (run / "notes.md").read_text() == "mine" and (run / "config.json").exists()


def test_files_under_autok_names_in_a_directory_autok_did_not_make_are_never_deleted(tmp_path):
    """A user's model.pt, config.json and run.yaml where a run of the grid goes: without the
    marker of this experiment for this run, nothing proves autok wrote them; a marker signed
    by another experiment's secret, or made for another run, proves nothing either."""
    from autok.config import ConfigError
    from autok.experiment import MARKER, clear_unstarted, ensure_secret, mark

    run = tmp_path / "out" / "a" / "seed-1"
    run.mkdir(parents=True)
    secret = ensure_secret(tmp_path / "out")
    names = ("model.pt", "config.json", "run.yaml")
    for name in names:
        (run / name).write_text("the user's own")
    with pytest.raises(ConfigError, match="^--out: .*config.json: autok cannot prove"):
        clear_unstarted(run, "a/seed-1", secret)
    mark(run, "a/seed-2", secret)  # another run's marker, moved here
    with pytest.raises(ConfigError, match="cannot prove"):
        clear_unstarted(run, "a/seed-1", secret)
    (run / MARKER).unlink()
    (tmp_path / "other").mkdir()
    mark(run, "a/seed-1", ensure_secret(tmp_path / "other"))  # another experiment's
    with pytest.raises(ConfigError, match="cannot prove"):
        clear_unstarted(run, "a/seed-1", secret)
    assert all((run / name).read_text() == "the user's own" for name in names)


def test_a_run_never_deletes_or_writes_through_a_link_under_out(tmp_path):
    """OUT/a -> ELSEWHERE: the run OUT/a/seed-1 would clear ELSEWHERE/seed-1. Refused where the
    run starts (a link made after the checks before launch), and nothing there is touched."""
    from autok.config import ConfigError
    from autok.experiment import Run, run_experiment

    elsewhere = tmp_path / "elsewhere" / "seed-1"
    elsewhere.mkdir(parents=True)
    for name in ("model.pt", "config.json"):
        (elsewhere / name).write_text("the user's own")
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").symlink_to(elsewhere.parent, target_is_directory=True)
    run = Run("a", 1, {"workers": 1, "epochs": 0})  # a run that would fail at once if launched
    with pytest.raises(ConfigError, match="^--out: .*/out/a is a symbolic link"):
        run_experiment([run], out)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["config.json", "model.pt"]
    assert all(p.read_text() == "the user's own" for p in elsewhere.iterdir())


def test_policy_and_optimizer_options_read_by_the_choice_are_accepted():
    """The counterparts of the refusals above: an option the chosen policy reads, a K above
    the (unread) --max-sync-period on the fixed policy, AdamW with SGD's defaults, and a
    saved config (every default written out) validating again unchanged."""
    from autok.config import TrainConfig

    ok = [
        dict(policy="exposed-sync", target_sync_share=0.1, k_rule="direct"),
        dict(policy="qsr", qsr_base=2, qsr_alpha=0.5, max_sync_period=16),
        dict(policy="composite", k_growth=4, qsr_base=2),
        dict(policy="adacomm", sync_window=8),
        dict(policy="post-local", sync_period=8, max_sync_period=16),
        dict(policy="inverse-lr", max_sync_period=32),
        dict(policy="random", random_mean=3.0, max_sync_period=8),
        dict(policy="fixed", sync_period=100),  # refused before: --max-sync-period 64 < 100
        dict(policy="fixed", sync_period=100, max_sync_period=100),  # as before: a cap
        dict(optimizer="adamw"),
        dict(nesterov=True),  # with the default momentum 0.9
        dict(momentum=0.0),
        # what the strategy, data set and divergence reaction read; a default given is no news
        dict(strategy="cpdp", boundary="two-phase", sync_optimizer_state=True),
        dict(strategy="localsgd", slowmo_beta=0.3, slowmo_lr_aware=True, max_sync_period=8),
        dict(strategy="ddp", max_sync_period=64, boundary="auto", sync_optimizer_state=False),
        dict(on_divergence="rollback", max_rollbacks=5),
        dict(on_divergence="stop", max_rollbacks=3),
        dict(dataset="digits", mnist1d_samples=5000, image_size=32),
        dict(link_schedule="lan,wan@epoch=1", epochs=2),
    ]
    for settings in ok:
        cfg = TrainConfig(**settings)
        again = TrainConfig.model_validate_json(cfg.model_dump_json())
        assert again == cfg, settings
