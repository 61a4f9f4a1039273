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


class _NanTimes(_NanOnce):
    """Rank 1's batch at global step `step` is all NaN the first `times` times it comes (a
    rollback trains its epoch again, so the step comes again)."""

    def __init__(self, loader, trainer, rank, step, times):
        super().__init__(loader, trainer, rank, step)
        self.left = times

    def __iter__(self):
        for x, y in self.loader:
            if self.rank == 1 and self.left and self.tr.global_step == self.step:
                self.left -= 1
                x = torch.full_like(x, float("nan"))
            yield x, y


def _worker(rank, world, out_dir, clock, nan, epochs=3, resume=False):
    from pathlib import Path

    from autok.trainer.loop.run import Trainer

    timing = {"clock": "virtual", "compute_ms": 10.0} if clock == "virtual" else {}
    cfg = tiny_cfg(
        strategy="ddp",
        workers=world,
        epochs=epochs,
        link="wan",
        checkpoint_every=1,
        on_divergence="rollback",
        max_rollbacks=2,
        **timing,
    )
    tr = Trainer(cfg, rank, world, Path(out_dir), resume=resume)
    if nan:  # rank 1's fourth step of epoch 1 is all NaN (`nan` times): back to epoch 0's end
        tr.train_loader = _NanTimes(tr.train_loader, tr, rank, tr.steps_per_epoch + 3, nan)
    summary = tr.run()
    rows = []
    if rank == 0:
        with open(Path(out_dir) / "epochs.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    return {"rollbacks": tr.rollbacks, "summary": summary, "rows": rows}


def _run(tmp_path, name, clock, nan, epochs=3, resume=False):
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    return run_dist(_worker, 2, str(out), clock, nan, epochs, resume)[0]


def test_a_rollbacks_attempt_is_booked_on_the_virtual_clock(tmp_path):
    clean = _run(tmp_path, "clean", "virtual", nan=0)
    rolled = _run(tmp_path, "rolled", "virtual", nan=1)
    assert clean["rollbacks"] == 0 and clean["summary"]["rolled_back_seconds"] == 0.0
    assert rolled["rollbacks"] == 1
    lost = rolled["summary"]["rolled_back_seconds"]
    # the attempt: from epoch 1's start to the check that caught the NaN (ddp's: at the epoch's
    # end), at least the four steps up to it, each 10 ms of compute
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
    rolled = _run(tmp_path, "rolled", "wall", nan=1)
    s = rolled["summary"]
    lost = s["rolled_back_seconds"]
    assert rolled["rollbacks"] == 1 and lost > 0.0
    secs = [float(r["epoch_seconds"]) for r in rolled["rows"]]
    # epoch 1's row holds its attempt and its second training; the run's wall time holds all
    assert secs[1] > lost
    assert s["wall_seconds"] >= sum(secs)


def test_two_rollbacks_to_one_checkpoint_book_the_time_once(tmp_path):
    """The same epoch diverges twice: the second rollback's time, measured from the checkpoint,
    holds the first attempt's, and each second is booked once."""
    clean = _run(tmp_path, "clean", "virtual", nan=0)
    twice = _run(tmp_path, "twice", "virtual", nan=2)
    assert twice["rollbacks"] == 2
    lost = twice["summary"]["rolled_back_seconds"]
    vs = twice["summary"]["virtual_seconds"]
    assert math.isclose(vs, clean["summary"]["virtual_seconds"] + lost, rel_tol=1e-12)
    secs = [float(r["epoch_seconds"]) for r in twice["rows"]]
    assert sum(secs) == pytest.approx(vs, rel=1e-12)
    assert secs[1] == pytest.approx(float(clean["rows"][1]["epoch_seconds"]) + lost, rel=1e-12)
    once = _run(tmp_path, "once", "virtual", nan=1)["summary"]["rolled_back_seconds"]
    assert lost == pytest.approx(2 * once, rel=1e-9)  # two attempts alike, each counted once


def test_the_total_is_in_the_checkpoint_and_a_resume_keeps_it(tmp_path):
    """A resume after a rollback keeps the total: each checkpoint carries it."""
    rolled = _run(tmp_path, "rolled", "virtual", nan=1)
    part = tmp_path / "rolled" / "checkpoints" / "epoch-0002" / "rank0.pt"
    state = torch.load(part, weights_only=True)
    assert state["trainer"]["rolled_back_seconds"] == rolled["summary"]["rolled_back_seconds"]
    assert state["trainer"]["rolled_back_seconds"] > 0.0
    more = _run(tmp_path, "rolled", "virtual", nan=0, epochs=4, resume=True)
    assert more["summary"]["rolled_back_seconds"] == rolled["summary"]["rolled_back_seconds"]


def test_keep_time_carries_both_clocks_on_from_the_attempt():
    """The wall runs on from the attempt's end, not the checkpoint's; the virtual clock moves
    on by its latest rank's lost time, on every rank alike, and that is what is booked."""
    from types import SimpleNamespace

    from autok.trainer.engine.clock import VirtualClock
    from autok.trainer.engine.link import parse_schedule
    from autok.trainer.loop.run import Trainer

    booked: list[float] = []
    records = SimpleNamespace(book_rollback=booked.append)
    wall = SimpleNamespace(wall_before=4.0, wall0=0.0, virtual=None, records=records)
    Trainer._keep_time(wall, 10.0, 123.0, None)  # type: ignore[arg-type]
    assert (wall.wall_before, wall.wall0, booked) == (10.0, 123.0, [6.0])
    clocks = [VirtualClock(parse_schedule("wan"), 2, r, 0, 10.0) for r in (0, 1)]
    for c in clocks:
        c._t = [3.0, 5.0]  # the checkpoint's, ranks apart
    booked.clear()
    for c in clocks:
        v = SimpleNamespace(wall_before=4.0, wall0=0.0, virtual=c, records=records)
        Trainer._keep_time(v, 10.0, 123.0, 9.0)  # type: ignore[arg-type]
    assert booked == [4.0, 4.0] and clocks[0]._t == clocks[1]._t == [7.0, 9.0]
