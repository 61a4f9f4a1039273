"""A divergence rollback's time counts (docs/design.md §7, "a rollback's time"): the attempt it
discards took time, so the run's training time and the epoch trained again carry it, on the virtual
clock and on the wall, and a time to a target crossed after it is not flattered."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from autok.trainer.loop.sinks import summary_table
from tests.dist import run_dist
from tests.helpers import tiny_cfg
from tests.test_correctness import _NanOnce

pytestmark = pytest.mark.dist


def _worker(rank, world, out_dir, clock, nan):
    from pathlib import Path

    from autok.trainer.loop.run import Trainer

    timing = {"clock": "virtual", "compute_ms": 10.0} if clock == "virtual" else {}
    cfg = tiny_cfg(
        strategy="ddp",
        workers=world,
        epochs=3,
        link="wan",
        checkpoint_every=1,
        on_divergence="rollback",
        max_rollbacks=2,
        **timing,
    )
    tr = Trainer(cfg, rank, world, Path(out_dir))
    if nan:  # rank 1's fourth step of epoch 1 is all NaN: back to the end of epoch 0
        tr.train_loader = _NanOnce(tr.train_loader, tr, rank, tr.steps_per_epoch + 3)
    summary = tr.run()
    rows = []
    if rank == 0:
        with open(Path(out_dir) / "epochs.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    return {"rollbacks": tr.rollbacks, "summary": summary, "rows": rows}


def _run(tmp_path, name, clock, nan):
    out = tmp_path / name
    out.mkdir()
    return run_dist(_worker, 2, str(out), clock, nan)[0]


def test_a_rollbacks_attempt_is_booked_on_the_virtual_clock(tmp_path):
    clean = _run(tmp_path, "clean", "virtual", nan=False)
    rolled = _run(tmp_path, "rolled", "virtual", nan=True)
    assert clean["rollbacks"] == 0 and clean["summary"]["rolled_back_seconds"] == 0.0
    assert rolled["rollbacks"] == 1
    lost = rolled["summary"]["rolled_back_seconds"]
    # the attempt: epoch 1's first four steps, each at least its 10 ms of compute
    assert lost >= 4 * 0.010
    # ddp trains epoch 1 again exactly as the clean run did: the same weights, and every time
    # the same but the attempt's, which the run's clock and epoch 1's row now carry
    assert rolled["summary"]["param_digest_per_rank"] == clean["summary"]["param_digest_per_rank"]
    vs = rolled["summary"]["virtual_seconds"]
    assert math.isclose(vs, clean["summary"]["virtual_seconds"] + lost, rel_tol=1e-12)
    secs = [float(r["epoch_seconds"]) for r in rolled["rows"]]
    clean_secs = [float(r["epoch_seconds"]) for r in clean["rows"]]
    assert secs[0] == clean_secs[0] and secs[2] == pytest.approx(clean_secs[2], rel=1e-12)
    assert secs[1] == pytest.approx(clean_secs[1] + lost, rel=1e-12)
    assert sum(secs) == pytest.approx(vs, rel=1e-12)  # the clock the report reads, epoch by epoch
    # the closing table says so where there was one
    assert "rolled back" in summary_table(rolled["summary"])
    assert "rolled back" not in summary_table(clean["summary"])


def test_a_rollbacks_attempt_is_booked_on_the_wall_clock(tmp_path):
    rolled = _run(tmp_path, "rolled", "wall", nan=True)
    s = rolled["summary"]
    lost = s["rolled_back_seconds"]
    assert rolled["rollbacks"] == 1 and lost > 0.0
    secs = [float(r["epoch_seconds"]) for r in rolled["rows"]]
    # epoch 1's row holds its attempt and its second training; the run's wall time holds all
    assert secs[1] > lost
    assert s["wall_seconds"] >= sum(secs)


def test_the_total_is_in_the_checkpoint_a_resume_reads(tmp_path):
    """A resume after a rollback keeps the total: each checkpoint carries it."""
    rolled = _run(tmp_path, "rolled", "virtual", nan=True)
    part = tmp_path / "rolled" / "checkpoints" / "epoch-0002" / "rank0.pt"
    state = torch.load(part, weights_only=True)
    assert state["trainer"]["rolled_back_seconds"] == rolled["summary"]["rolled_back_seconds"]
    assert state["trainer"]["rolled_back_seconds"] > 0.0
