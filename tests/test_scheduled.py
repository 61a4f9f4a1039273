"""`scheduled`: K set in advance by step (controllers/scheduled.py)."""

from __future__ import annotations

import pytest

from autok.controllers import PolicyOptions, build_controller
from autok.controllers.scheduled import (
    ScheduledController,
    k_at,
    never_applies,
    parse_k_schedule,
)
from autok.trainer.engine.options import SyncOptions
from tests.test_controllers import stats


def test_a_schedule_parses_to_first_steps_and_ks():
    assert parse_k_schedule("16") == ((0, 16),)
    assert parse_k_schedule(" 16, 32@step=160 ,16@step=352") == ((0, 16), (160, 32), (352, 16))


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "give K,K@step=N"),
        ("4,,8@step=3", "give K,K@step=N"),
        ("0", "K must be a whole number >= 1"),
        ("4,x@step=3", "K must be a whole number >= 1"),
        ("4@step=3", "the first K applies from step 0"),
        ("4,8@epoch=2", "counts steps"),
        ("4,8@steps=3", "give K@step=N"),
        ("4,8@step=٣", "give K@step=N"),  # not ASCII: int() would read it as 3
        ("4,8@step=9999999999999", "give K@step=N"),  # past any run: not parsed
        ("4,8@step=0", "steps must increase"),
        ("4,8@step=9,2@step=9", "steps must increase"),
        (",".join(["4"] + [f"8@step={i}" for i in range(1, 65)]), "at most 64 segments"),
    ],
)
def test_a_bad_schedule_says_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        parse_k_schedule(text)


def test_a_segment_from_a_step_past_the_run_is_named():
    schedule = parse_k_schedule("4,8@step=10,16@step=64,32@step=99")
    assert never_applies(schedule, 65) == "K 32 from step 99 never applies: the run has 65 steps"
    assert never_applies(schedule, 64) == (
        "K 16 from step 64, K 32 from step 99 never apply: the run has 64 steps"
    )
    assert never_applies(schedule, 100) is None


def test_k_is_cut_short_so_a_boundary_falls_where_the_next_segment_starts():
    s = parse_k_schedule("16,32@step=160,16@step=352")
    assert k_at(s, 0) == (16, 0)
    assert k_at(s, 144) == (16, 0)  # 144 + 16 = 160: not cut
    assert k_at(s, 150) == (10, 0)  # 150 + 10 = 160
    assert k_at(s, 160) == (32, 160)
    assert k_at(s, 350) == (2, 160)
    assert k_at(s, 352) == (16, 352)
    assert k_at(s, 10**9) == (16, 352)


def test_the_boundary_closing_step_g_decides_the_interval_from_g_plus_1():
    c = ScheduledController(parse_k_schedule("4,8@step=10"))
    assert c.sync_period == 4
    decisions = []
    for last_step in (3, 7, 9, 17):
        s = stats(c.sync_period, i=0)
        s = type(s)(**{**s.as_dict(), "global_step": last_step})
        decisions.append(c.observe(s).next_sync_period)
    assert decisions == [4, 2, 8, 8]


def test_max_sync_period_and_a_rollback_bound_k_and_the_reason_says_so():
    def at(last_step):
        s = stats(4, i=0)
        return type(s)(**{**s.as_dict(), "global_step": last_step})

    c = ScheduledController(parse_k_schedule("4,32@step=8"), max_sync_period=16)
    d = c.observe(at(7))
    assert (d.next_sync_period, d.reason) == (16, "scheduled: K 32 from step 8, capped at 16")
    c.rollback(8)  # the trainer halved 16
    assert c.sync_period == 8 and c.observe(at(23)).next_sync_period == 8
    # a rollback from a K cut short to end its segment halves the segment's K, not the cut's:
    # K 2 (8 cut to end before step 10) halved to 1 would hold every later segment at 1
    c = ScheduledController(parse_k_schedule("8,32@step=10"))
    d = c.observe(at(7))
    assert (d.next_sync_period, d.reason) == (
        2,
        "scheduled: K 8 from step 0, 2 to end before step 10",
    )
    c.rollback(1)
    assert c.sync_period == 1  # the trainer's halved K, for the interval it restarts with
    d = c.observe(at(9))
    assert (d.next_sync_period, d.reason) == (4, "scheduled: K 32 from step 10, capped at 4")


def test_the_factory_reads_the_schedule_and_without_one_keeps_k():
    c = build_controller("scheduled", 4, PolicyOptions(k_schedule="2,8@step=4"))
    assert c.sync_period == 2
    assert build_controller("scheduled", 4, PolicyOptions()).sync_period == 4


def test_a_run_starts_at_the_schedules_first_k_and_a_different_one_is_refused():
    o = SyncOptions(strategy="cpdp", policy="scheduled", k_schedule="16,32@step=160")
    assert o.sync_period == 16
    # a saved config (every default written out) validates again unchanged
    again = SyncOptions(**o.model_dump())
    assert again.sync_period == 16 and again.k_schedule == o.k_schedule
    with pytest.raises(ValueError, match="--sync-period: 4 differs from --k-schedule's first K"):
        SyncOptions(strategy="cpdp", policy="scheduled", k_schedule="16", sync_period=4)
    with pytest.raises(ValueError, match="--k-schedule: --policy scheduled needs one"):
        SyncOptions(strategy="cpdp", policy="scheduled")
    with pytest.raises(ValueError, match="--k-schedule: K 128 is above --max-sync-period 64"):
        SyncOptions(strategy="cpdp", policy="scheduled", k_schedule="4,128@step=8")


def _user_loop_worker(rank, world):
    """A user's loop with autok.Sync: seven steps, a sync_now() between steps, then more."""
    import torch

    import autok
    from tests.test_api import _batches, _model, _train

    seen: list[tuple[int, int, int]] = []

    class Log:
        def on_boundary(self, stats, decision):
            seen.append((stats.global_step, stats.sync_period, stats.interval_steps))

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(
        model, opt, strategy="localsgd", link="none", policy="scheduled",
        k_schedule="4,8@step=10", observers=[Log()],
    )  # fmt: skip
    batches = _batches(rank, 18)
    _train(sync, opt, batches[:7])
    sync.sync_now()  # after steps 0-6: its interval is steps 4-6
    _train(sync, opt, batches[7:])
    sync.close()
    return seen


@pytest.mark.dist
def test_a_sync_now_between_steps_records_its_last_step_and_keeps_the_schedule_exact():
    # The record of a sync between steps names the interval's last step (6), as a boundary at a
    # step does; the schedule then counts from step 7: K 4 cut to 3 to end at step 9, and 8
    # from step 10, a boundary at 17 (counted from step 8, it made a boundary more: K 2, then 1)
    from tests.dist import run_dist

    a, b = run_dist(_user_loop_worker, 2)
    assert a == b
    assert a == [(3, 4, 4), (6, 4, 3), (9, 3, 3), (17, 8, 8)], a
