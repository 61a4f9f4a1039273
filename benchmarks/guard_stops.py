"""The divergence guard's stops on the controller panel's runs, replayed at two bars.

    python -m benchmarks.guard_stops     # nine runs, about 3 minutes -> results/guard_stops.md

Nine main-seed runs of the controller panel's checks that the guard stopped as diverged with
its first clause at a quarter of the start (`trainer/engine/divergence.py`, FROM_START 1/4
then). Each runs again here with the level check off (`--divergence-factor 1e6`: only a
non-finite value stops it) on the virtual clock, so its records are the same on any machine
with the same packages, and the guard is replayed on its boundaries at F = 4 with the first
clause at 1/4 and at 1 (today's): where each would stop it, and whether the run, run on,
reached its regime's target (the panel's pilot's), and in which epoch. The replay at 1/4 must
stop each run at the boundary where it was first stopped, or the rerun is not that run and the
script says so.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import yaml

from autok.controllers.base import BoundaryStats
from autok.pilot import read_plan
from autok.trainer.engine.divergence import DivergenceGuard

OUT = Path(__file__).parent / "results" / "guard_stops.md"
BARS = (0.25, 1.0)  # the first clause's share of the start: before, and today's
PANEL = dict(  # experiments/controller-panel.yaml's mnist1d regimes
    dataset="mnist1d", mnist1d_samples=5120, mnist1d_test_samples=16000, batch_size=32, lr=0.1,
    lr_schedule="constant", epochs=16, warmup_epochs=0, max_sync_period=32, clock="virtual",
    compute_ms=20, workers=4, strategy="cpdp", slowmo_beta=0.0,
)  # fmt: skip
SKEW_WAN = dict(link="wan", partition="dirichlet", partition_alpha=0.1)
FLIP_WAN = dict(
    link_schedule="wan,slow-wan@epoch=5,wan@epoch=11", partition="dirichlet", partition_alpha=1.0
)
FLIP_LINK = dict(
    link_schedule="lan,wan@epoch=5,lan@epoch=11", partition="dirichlet", partition_alpha=1.0
)
# the regimes' targets, the committed panel's pilot's (the same for its checks' runs below)
_PLAN = read_plan(Path(__file__).parent.parent / "docs" / "controller-panel")
TARGET = _PLAN["regime=skew-wan"]["target"]
TARGET_ALPHA1 = _PLAN["regime=flip-wan"]["target"]  # flip-link's is the same


@dataclasses.dataclass(frozen=True)
class Stopped:
    where: str  # the check's directory it came from (docs/controller-panel/)
    arm: str
    settings: dict
    target: float
    stopped_at: int  # the boundary the guard stopped it at


RUNS = [
    Stopped("epoch-rounds-check/new-seeds", "exposed-sync skew-wan 289",
            {**SKEW_WAN, "policy": "exposed-sync", "seed": 289}, TARGET, 65),
    Stopped("epoch-rounds-check/new-seeds", "exposed-sync flip-wan 284",
            {**FLIP_WAN, "policy": "exposed-sync", "seed": 284}, TARGET_ALPHA1, 50),
    Stopped("epoch-rounds-check/new-seeds", "epoch-rounds skew-wan 284",
            {**SKEW_WAN, "policy": "exposed-sync", "epoch_rounds": True, "seed": 284},
            TARGET, 67),
    Stopped("epoch-rounds-check/new-seeds", "best fixed K (4) skew-wan 289",
            {**SKEW_WAN, "sync_period": 4, "seed": 289}, TARGET, 52),
    Stopped("epoch-rounds-check/new-seeds", "best fixed K (4) skew-wan 292",
            {**SKEW_WAN, "sync_period": 4, "seed": 292}, TARGET, 85),
    Stopped("flip-link-80", "best fixed K (8) flip-link 219",
            {**FLIP_LINK, "sync_period": 8, "seed": 219}, TARGET_ALPHA1, 54),
    Stopped("flip-link-80/graded8", "graded8 flip-link 250",
            {**FLIP_LINK, "policy": "exposed-sync", "skew_cap": 8, "skew_strong": 2.3,
             "seed": 250}, TARGET_ALPHA1, 167),
    Stopped("ramp-oracle", "scheduled 2 then 8 skew-wan 77",
            {**SKEW_WAN, "policy": "scheduled", "k_schedule": "2,8@step=128", "seed": 77},
            TARGET, 101),
    Stopped("new-seeds-check", "exposed-sync flip-wan 255",
            {**FLIP_WAN, "policy": "exposed-sync", "seed": 255}, TARGET_ALPHA1, 42),
]  # fmt: skip


def run_on(s: Stopped, out: Path) -> tuple[list[dict], list[dict]]:
    """The run with the level check off: its boundary records and epoch rows."""
    out.mkdir(parents=True)
    cfg = out / "run.yaml"
    cfg.write_text(yaml.safe_dump({**PANEL, **s.settings}))
    subprocess.run(
        [sys.executable, "-m", "autok.cli", "train", "--config", str(cfg),
         "--divergence-factor", "1e6", "--no-progress", "--out", str(out / "run")],
        check=True, capture_output=True,
    )  # fmt: skip
    with open(out / "run" / "boundaries.jsonl") as f:
        records = [json.loads(line) for line in f]
    with open(out / "run" / "epochs.csv", newline="") as f:
        return records, list(csv.DictReader(f))


def replay(records: list[dict], from_start: float) -> tuple[int, int] | None:
    """(boundary, epoch) where the guard at F = 4 with this first clause stops the run."""
    guard = DivergenceGuard(factor=4.0, from_start=from_start)
    names = {f.name for f in dataclasses.fields(BoundaryStats)}
    for r in records:
        stats = BoundaryStats(**{**dict.fromkeys(names), **{k: r[k] for k in names & set(r)}})
        if guard.check(stats):
            return r["boundary"], r["epoch"]
    return None


def main() -> None:
    lines = [
        f"# The divergence guard's stops, replayed ({datetime.now():%Y-%m-%d %H:%M})",
        "",
        "`python -m benchmarks.guard_stops`: each run again with the level check off, the guard",
        "replayed on its records at F = 4 with its first clause at a quarter of the start (as",
        "first run) and at the start (today's). Epochs counted from 0; the target is the",
        "regime's pilot's.",
        "",
        "| run (check) | start loss | stopped at 1/4 (epoch) | at 1 (epoch) | run on: reached "
        "(epoch) | final accuracy |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(RUNS):
            records, rows = run_on(s, Path(tmp) / str(i))
            stops = [replay(records, b) for b in BARS]
            if stops[0] is None or stops[0][0] != s.stopped_at:
                raise SystemExit(f"{s.arm}: not the run first stopped at boundary {s.stopped_at}")
            accs = [float(r["test_accuracy"]) for r in rows]
            reached = next((e for e, a in enumerate(accs) if a >= s.target), None)
            start = sum(r["train_loss"] for r in records[:4]) / 4
            shown = ["runs on" if x is None else f"{x[0]} ({x[1]})" for x in stops]
            lines.append(
                f"| {s.arm} ({s.where}) | {start:.2f} | {shown[0]} | {shown[1]} | "
                f"{'no' if reached is None else f'yes ({reached})'} | {accs[-1]:.4f} |"
            )
            print(lines[-1], flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
