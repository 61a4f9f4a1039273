"""One sweep trial = one full `autok train` run in its own processes, watched from outside.

The trial writes its run dir as any run does; the driver tails `epochs.csv` to report each
epoch's test metric (accuracy, or the task's own: for pruning) and to spot divergence, and
kills the run when told to stop.
The run has its own session, so a terminal's Ctrl-C reaches only the sweep, which stops its
trials through `should_stop` (and they die with it if it is killed).
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autok.procs import start_logged
from autok.trainer.engine.clock import training_seconds

COMPLETE, FAIL, PRUNED = "COMPLETE", "FAIL", "PRUNED"
INTERRUPTED = "interrupted (Ctrl-C): --resume continues the sweep"


@dataclass
class TrialResult:
    state: str
    run_dir: str
    reason: str = ""
    peak_test_metric: float = math.nan  # best in the metric's direction
    # the run's training time (summary.json), on the clock its records read: the modelled time
    # under --clock virtual, so a time objective never ranks machine noise (docs/design.md §4)
    wall_seconds: float = math.nan
    time_to_target: float = math.inf  # training seconds until the metric reached the target
    total_seconds: float = math.nan  # the trial's process, start to exit: what a user waits
    epochs: int = 0


def test_metric(row: dict[str, str]) -> float:
    """An epochs.csv row's test metric: a task's own, or a classification's accuracy."""
    return float(row["test_metric"] if "test_metric" in row else row["test_accuracy"])


def reached(value: float, target: float, higher_is_better: bool) -> bool:
    return value >= target if higher_is_better else value <= target


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("lr")]  # a half-written row has no lr


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("autok:"):
            return ln
    return lines[-1] if lines else "no output"


def run_trial(
    settings: dict[str, Any],
    run_dir: Path,
    report: Callable[[int, float], bool] | None = None,
    target: float = 0.9,
    poll_seconds: float = 0.2,
    should_stop: Callable[[], bool] | None = None,
    higher_is_better: bool = True,
    workdir: str | None = None,
) -> TrialResult:
    """Train with `settings` into `run_dir`. `report(epoch, test_metric)` is called once per
    finished epoch; returning True stops the run (pruned). `should_stop()` returning True stops
    it too (FAIL, reason INTERRUPTED). `target` is the metric value time_to_target measures
    the time to (reached at or above it, or at or below it when lower is better). `workdir`:
    the directory the run starts in (the sweep's: a --task module is found from there, even
    when Ray has moved this process into a trial directory)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_file = run_dir / "trial.yaml"
    cfg_file.write_text(yaml.safe_dump({k: v for k, v in settings.items() if k != "out"}))
    log = run_dir / "console.log"  # what the run printed; its own log is train.log
    cmd = [
        sys.executable,
        "-m",
        "autok.cli",
        "train",
        "--config",
        str(cfg_file),
        "--out",
        str(run_dir),
        "--no-progress",
    ]
    t0 = time.monotonic()
    with open(log, "w") as log_f:
        proc = start_logged(cmd, log_f, new_session=True, cwd=workdir)
        seen, stop = 0, None
        try:
            while True:
                done = proc.poll() is not None
                if not done and should_stop is not None and should_stop():
                    stop = (FAIL, INTERRUPTED)
                    break
                rows = _rows(run_dir / "epochs.csv")
                for row in rows[seen:]:
                    epoch, value = int(row["epoch"]), test_metric(row)
                    if not math.isfinite(float(row["train_loss"])):
                        stop = (FAIL, f"diverged: non-finite training loss at epoch {epoch}")
                    elif report is not None and report(epoch, value):
                        stop = (PRUNED, f"pruned at epoch {epoch} (test metric {value:.4g})")
                    if stop:
                        break
                seen = len(rows)
                if stop or done:
                    break
                time.sleep(poll_seconds)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    rows = _rows(run_dir / "epochs.csv")
    result = TrialResult(state=COMPLETE, run_dir=str(run_dir), epochs=len(rows))
    result.total_seconds = time.monotonic() - t0
    if rows:
        values = [test_metric(r) for r in rows]
        result.peak_test_metric = max(values) if higher_is_better else min(values)
        elapsed = 0.0
        for r, value in zip(rows, values, strict=True):
            elapsed += float(r["epoch_seconds"])
            if reached(value, target, higher_is_better):
                result.time_to_target = elapsed
                break
    if stop:
        result.state, result.reason = stop
    elif proc.returncode != 0:
        result.state, result.reason = FAIL, _last_error(log)
    else:
        summary = json.loads((run_dir / "summary.json").read_text())
        peak = summary.get("peak_test_metric", summary.get("peak_test_accuracy"))
        # null where the metric has no value (summary.json is strict JSON, docs/design.md §7)
        result.peak_test_metric = math.nan if peak is None else peak
        result.wall_seconds = training_seconds(summary)
    return result
