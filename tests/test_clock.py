"""The virtual clock (`--clock virtual`, trainer/engine/clock.py; docs/design.md §4): its model as
pure
arithmetic first, then `autok train` as a user runs it: the same seed gives the same records and
virtual time, and a WAN run does not sleep through the link's time."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from autok.trainer.engine.clock import VirtualClock
from autok.trainer.engine.link import PROFILES, static_schedule
from autok.trainer.engine.straggler import Straggler
from tests.dist import run_dist

WAN = PROFILES["wan"]


def _clock(world: int = 2, rank: int = 0, compute_ms: float = 30.0, scale: float = 1.0):
    return VirtualClock(static_schedule(WAN), world, rank, 7, compute_ms, scale)


# ----- the model: pure arithmetic --------------------------------------------------------------


def test_a_local_step_books_its_compute_and_an_averaging_its_ring_time():
    v = _clock()
    forward, backward, wait = v.step(0, 0, 0)  # no bucket: a local step
    assert (forward, backward, wait) == pytest.approx((0.010, 0.020, 0.0))
    assert v.now() == pytest.approx(0.030)
    end = v.book(10**6)
    assert v.wait(end) == pytest.approx(WAN.allreduce_seconds(10**6, 2))
    assert v.now() == pytest.approx(0.030 + WAN.allreduce_seconds(10**6, 2))


def test_ddp_buckets_overlap_backward_except_what_the_last_leaves_exposed():
    v = _clock()
    nbytes = 10**6  # two buckets, each T(S/2) = 2 (8.3 ms + 2 ms): the first is ready half way
    _, _, wait = v.step(0, nbytes, 2)  # through backward, the second when the link is free
    first = WAN.allreduce_seconds(nbytes // 2, 2)
    ready_first = 0.010 + 0.010  # forward, then half the backward
    link_free = ready_first + 2 * first  # the second waits for the link, not for backward
    assert wait == pytest.approx(link_free - 0.030)
    assert v.now() == pytest.approx(link_free)


def test_a_fast_rank_waits_for_the_straggler_at_the_next_collective():
    fast, slow = _clock(rank=0), _clock(rank=1)
    for v in (fast, slow):
        v.straggler = Straggler("slow-rank", 50.0, 1.0, 7, v.rank, 2)
        v.step(0, 0, 0)  # a local step: rank 1 is 50 ms behind
    assert slow.now() - fast.now() == pytest.approx(0.050)
    ring = WAN.allreduce_seconds(1000, 2)
    assert fast.wait(fast.book(1000)) == pytest.approx(0.050 + ring)
    assert slow.wait(slow.book(1000)) == pytest.approx(ring)
    assert fast.now() == slow.now()


def test_a_wait_for_a_slower_rank_is_booked_as_peer_wait_apart_from_the_link():
    fast, slow = _clock(rank=0), _clock(rank=1)
    for v in (fast, slow):
        v.straggler = Straggler("slow-rank", 50.0, 1.0, 7, v.rank, 2)
        v.step(0, 0, 0)  # a local step: rank 1 is 50 ms behind
    ring = WAN.allreduce_seconds(1000, 2)
    assert fast.wait(fast.book(1000)) == pytest.approx(0.050 + ring)
    # the mean over ranks, the same on each: rank 0 waited 50 ms for rank 1, rank 1 for no one;
    # the ring's time is the link's
    assert fast.take_peer_wait() == pytest.approx(0.025) and fast.take_peer_wait() == 0.0
    # a synchronized backward: rank 0's wait for rank 1's last bucket is a peer wait too
    assert fast.step(1, 1000, 1)[2] >= 0.050
    assert fast.take_peer_wait() == pytest.approx(0.025)
    none = _clock()
    none.step(0, 1000, 1)
    none.wait(none.book(1000))
    assert none.take_peer_wait() == 0.0  # equal ranks: every wait is the link's


def test_model_bytes_scale_every_booked_collective():
    small, large = _clock(), _clock(scale=1000.0)
    assert large.wait(large.book(10**6)) == pytest.approx(WAN.allreduce_seconds(10**9, 2))
    assert small.wait(small.book(10**6)) == pytest.approx(WAN.allreduce_seconds(10**6, 2))


def test_a_saved_virtual_clock_continues_exactly_and_a_bad_state_is_refused():
    v = _clock(world=2)
    v.step(0, 10**5, 1)
    state = v.state_dict()
    w = _clock(world=2)
    w.load_state_dict(state)
    assert w.state_dict() == state
    with pytest.raises(ValueError, match="virtual.t"):
        _clock(world=3).load_state_dict(state)
    with pytest.raises(ValueError, match="not a time"):
        w.load_state_dict({**state, "link_free": math.nan})


def _peer_wait_worker(rank, world, strategy="cpdp"):
    from autok.trainer.loop.run import Trainer
    from tests.helpers import tiny_cfg

    class Records:
        def __init__(self):
            self.rows = []

        def on_boundary(self, stats, decision):
            self.rows.append(stats)

    runs = {}
    for mode in ("none", "slow-rank"):
        slow = {"straggler": mode, "straggler_ms": 30.0} if mode != "none" else {}
        cfg = tiny_cfg(
            clock="virtual", compute_ms=20.0, link="wan", warmup_epochs=0, strategy=strategy,
            sync_period=2 if strategy == "cpdp" else 1, slowmo_beta=0.0, workers=world, **slow,
        )  # fmt: skip
        log = Records()
        Trainer(cfg, rank, world, None, observers=[log]).run()
        runs[mode] = [
            (s.interval_steps, s.exposed_sync_seconds, s.peer_wait_seconds) for s in log.rows
        ]
    return runs


@pytest.mark.dist
def test_the_engine_records_a_slow_ranks_wait_as_peer_wait_and_the_links_apart():
    """Real gloo workers on the virtual clock: with rank 1 30 ms slower at every step, rank 0
    waits 30 ms per step for it, 15 ms per step as the mean over the 2 ranks, all of it peer
    wait; what is left of each record's exposed time is exactly the same run's without the slow
    rank (the link's). An averaging's wait lands in the next record, as its exposed time does
    (controllers/base.py), so the last interval's is in no record."""
    for runs in run_dist(_peer_wait_worker, 2):
        even, slow = runs["none"], runs["slow-rank"]
        assert len(even) == len(slow) > 3
        assert all(peer == 0.0 for _, _, peer in even)
        for (_, exposed, peer), (_, even_exposed, _) in zip(slow, even, strict=True):
            assert exposed - peer == pytest.approx(even_exposed, abs=1e-6)
        steps = [n for n, _, _ in slow]
        total = sum(peer for _, _, peer in slow)
        assert total == pytest.approx(0.015 * (sum(steps) - steps[-1]), abs=1e-6)


@pytest.mark.dist
def test_ddp_records_carry_the_slow_ranks_wait_as_peer_wait_too():
    """ddp books its gradient all-reduce per step, and its records hold this rank's own times:
    rank 0 waits 30 ms a step for rank 1, rank 1 waits for no peer, and what is left of each
    record's exposed time is the even run's (the link's)."""
    for rank, runs in enumerate(run_dist(_peer_wait_worker, 2, "ddp")):
        even, slow = runs["none"], runs["slow-rank"]
        assert len(even) == len(slow) > 3
        for (n, exposed, peer), (_, even_exposed, _) in zip(slow, even, strict=True):
            assert peer == pytest.approx(0.030 * n if rank == 0 else 0.0, abs=1e-6)
            assert exposed - peer == pytest.approx(even_exposed, abs=1e-6)


# ----- autok train --clock virtual -------------------------------------------------------------

# A WAN run whose collectives are booked as if the model had 1 GB of parameters: about 8 s per
# collective on the modelled link, some 10 collectives, where sleeping would take minutes.
VIRTUAL = [
    "--workers", "2", "--epochs", "2", "--mnist1d-samples", "500", "--no-progress",
    "--clock", "virtual", "--compute-ms", "20", "--link", "wan", "--model-bytes", "1000000000",
    "--strategy", "cpdp", "--policy", "exposed-sync",
    "--straggler", "random", "--straggler-ms", "30", "--straggler-prob", "0.5",
]  # fmt: skip
# What a record holds that comes from the clock or the K it chose (not the loss's float noise)
TIMED = ("compute_seconds", "exposed_sync_seconds", "sync_period", "next_sync_period", "boundary")


def _train(out) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "autok.cli", "train", *VIRTUAL, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    records = [json.loads(line) for line in (out / "boundaries.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return {"records": records, "summary": summary, "epochs": (out / "epochs.csv").read_text()}


def _epoch_times(text: str) -> list[list[str]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    names = ("epoch_seconds", "forward_seconds", "backward_seconds", "sync_seconds")
    return [[row[n] for n in names] for row in rows]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("virtual")
    return _train(root / "a"), _train(root / "b")


def test_two_virtual_runs_of_one_seed_record_the_same_times_and_k_path(two_runs):
    a, b = two_runs
    assert len(a["records"]) > 2
    timed = [[{k: r[k] for k in TIMED} for r in run["records"]] for run in (a, b)]
    assert timed[0] == timed[1]  # exactly: nothing measured reaches a record
    keys = ("virtual_seconds", "compute_seconds", "exposed_sync_seconds", "k_path")
    assert {k: a["summary"][k] for k in keys} == {k: b["summary"][k] for k in keys}
    assert _epoch_times(a["epochs"]) == _epoch_times(b["epochs"])
    assert a["summary"]["virtual_seconds"] > 0


def test_a_virtual_wan_run_books_the_link_and_never_sleeps_through_it(two_runs):
    for run in two_runs:
        s = run["summary"]
        # the modelled link alone: at least one 1 GB collective (~8 s) per boundary
        assert s["exposed_sync_seconds"] > s["boundaries"] * 7.0
        # sleeping would make training take at least the booked time; a loaded machine
        # stretches compute, never by a factor that reaches minutes of modelled link time
        assert s["virtual_seconds"] > 5 * s["wall_seconds"], s


def test_reports_time_a_virtual_run_by_its_modelled_seconds_not_the_wall():
    from autok.report import RunResult, epoch_clock

    epochs = [{"epoch_seconds": "10"}] * 3  # modelled: 30 s, and 6 s of the rest (evaluation)
    run = RunResult("a", 1, Path("x"), {}, {"wall_seconds": 0.5, "virtual_seconds": 36.0}, epochs)
    assert epoch_clock(run) == pytest.approx([12.0, 24.0, 36.0])


def test_a_stopped_and_resumed_virtual_run_continues_the_same_time_line(two_runs, tmp_path):
    out = tmp_path / "stopped"
    cmd = [sys.executable, "-m", "autok.cli", "train"]
    for args in ([*VIRTUAL, "--stop-after-epochs", "1", "--out", str(out)], ["--resume", str(out)]):
        res = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
    records = [json.loads(line) for line in (out / "boundaries.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    whole = two_runs[0]
    assert [{k: r[k] for k in TIMED} for r in records] == [
        {k: r[k] for k in TIMED} for r in whole["records"]
    ]
    assert summary["virtual_seconds"] == whole["summary"]["virtual_seconds"]


def test_a_virtual_sweep_ranks_its_trials_by_their_modelled_seconds(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("sync_period: {type: int, low: 2, high: 4}\n")
    out = tmp_path / "sweep"
    args = [a for a in VIRTUAL if a not in ("--no-progress",)]
    res = subprocess.run(
        [sys.executable, "-m", "autok.cli", "sweep", "--trials", "1", "--space", str(space),
         "--out", str(out), *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    (row,) = list(csv.DictReader((out / "trials.csv").open()))
    summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
    # the Pareto objective's time: the modelled minutes, not the second it took here
    assert float(row["wall_seconds"]) == pytest.approx(summary["virtual_seconds"])
    assert summary["virtual_seconds"] > 5 * summary["wall_seconds"]
