"""K policies on synthetic BoundaryStats streams: pure logic, no process group."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from autok.controllers import READS, REGISTRY, RUN_OPTIONS, PolicyOptions, build_controller
from autok.controllers.adacomm import AdaCommController
from autok.controllers.adacomm import next_sync_period as adacomm_k
from autok.controllers.base import BoundaryStats
from autok.controllers.composite import CompositeController
from autok.controllers.exposed_sync import (
    CLEAR_ROUNDS,
    GUARD_MIN_STEPS,
    ExposedSyncController,
    share_at,
    soft_cap,
)
from autok.controllers.exposed_sync import direct_sync_period as direct_rule
from autok.controllers.exposed_sync import next_sync_period as share_rule
from autok.controllers.qsr import QSRController, default_alpha
from autok.controllers.qsr import next_sync_period as qsr_k
from autok.controllers.window import network_share
from tests.optim_helpers import cosine_lr


def stats(k, *, step_compute=0.005, sync=0.1, drift_ratio=1.0, loss=1.0, lr=0.1, warmup=False, i=1):
    """One boundary after K steps: compute grows with K, the boundary's sync cost does not."""
    return BoundaryStats(
        boundary=i,
        global_step=i,
        epoch=0,
        sync_period=k,
        interval_steps=k,
        compute_seconds=k * step_compute,
        exposed_sync_seconds=sync,
        drift_norm=drift_ratio,
        update_norm=1.0,
        drift_ratio=drift_ratio,
        train_loss=loss,
        bytes_communicated=0,
        lr=lr,
        warmup=warmup,
    )


def drive(ctrl, n, **kw):
    """Feed n boundaries, each measured at the K the controller chose last; return the K path.
    Numbered from 1: these records each hold a whole boundary's sync, which the run's first
    (boundary 0, no averaging before it) does not (tests below)."""
    ks = []
    k = ctrl.sync_period
    for i in range(1, n + 1):
        k = ctrl.observe(stats(k, i=i, **kw)).next_sync_period
        ks.append(k)
    return ks


def changes(ks):
    return sum(a != b for a, b in zip(ks, ks[1:], strict=False))


# ----- exposed-sync ---------------------------------------------------------------------------


def test_rises_multiplicatively_under_a_high_share_up_to_the_cap():
    c = ExposedSyncController(sync_period=1, target=0.2, max_sync_period=64, window=4)
    ks = drive(c, 60)  # s/c = 20: the share stays above 0.2 until K >= 80 > cap
    seen = sorted(set(ks))
    assert seen == [1, 2, 4, 8, 16, 32, 64]
    assert ks == sorted(ks)  # never goes down
    assert ks[-1] == 64


def test_holds_once_the_share_is_under_target():
    # s/c = 2.5: f(8) = 0.1/(0.04+0.1)=0.71 ... f(16) = 0.238, f(32) = 0.135 <= 0.2
    c = ExposedSyncController(sync_period=4, target=0.2, max_sync_period=256, window=4)
    ks = drive(c, 80, step_compute=0.04 / 8 * 2.5 / 2.5, sync=0.1 * 0.04 / 0.1 / 4)
    assert ks[-1] == ks[-40]  # settled
    k = ks[-1]
    share = stats(k, step_compute=0.005, sync=0.01).sync_share
    assert share <= 0.2 < stats(k // 2, step_compute=0.005, sync=0.01).sync_share


def test_steady_noisy_stream_does_not_oscillate():
    rng = random.Random(0)
    c = ExposedSyncController(sync_period=2, target=0.2, max_sync_period=256, window=4, lower=True)
    ks, k = [], 2
    for i in range(400):
        noise = 1 + rng.uniform(-0.15, 0.15)
        s = stats(k, step_compute=0.005 * noise, sync=0.05, i=i)
        k = c.observe(s).next_sync_period
        ks.append(k)
    # f(32) = 0.05/(0.16+0.05) = 0.24 > 0.2, f(64) = 0.135: it must settle at 64 and stay,
    # even with lowering on (f(32) predicted from 64 is 0.24 > 0.15).
    assert ks[-1] == 64
    assert changes(ks[100:]) == 0


def test_hold_at_target_when_lowering_is_off_even_on_an_idle_link():
    c = ExposedSyncController(sync_period=8, target=0.2, window=4)
    assert set(drive(c, 40, sync=1e-5)) == {8}


def test_lowering_brings_k_down_when_the_link_gets_faster():
    c = ExposedSyncController(sync_period=32, target=0.2, window=4, lower=True)
    ks = drive(c, 60, sync=1e-5)
    assert ks[-1] == 1 and ks == sorted(ks, reverse=True)


def test_backs_off_on_a_drift_spike_and_stays_capped_for_the_cooldown():
    c = ExposedSyncController(sync_period=16, target=0.2, max_sync_period=64, window=4, cooldown=12)
    drive(c, 4, drift_ratio=1.0)  # first window calibrates the drift level (and raises K)
    assert c.sync_period == 32
    d = c.observe(stats(32, drift_ratio=5.0))
    for i in range(3):
        d = c.observe(stats(32, drift_ratio=5.0, i=i + 6))
    assert d.next_sync_period == 16 and d.reason.startswith("back off: drift")
    # share is still high, but K may not rise above the backed-off value during the cooldown
    ks = [c.observe(stats(16, i=i + 9)).next_sync_period for i in range(8)]
    assert set(ks) == {16}
    ks = [c.observe(stats(16, i=i + 17)).next_sync_period for i in range(4)]
    assert ks == [16, 16, 16, 32]  # cooldown over at the 12th boundary: the share rule raises


def test_skewed_data_caps_k_at_once_and_for_the_rest_of_the_run():
    """Until a window at K >= 2 judges the drift ratio, K is held under the soft cap,
    ⌊√(skew_cap · K*)⌋ of the link's K*; above skew_drift it stays there for the rest of the run,
    and at or under it (iid) K goes on to the link's K*."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True)
    skewed = ExposedSyncController(sync_period=4, **kw)
    iid = ExposedSyncController(sync_period=4, **kw)
    # a slow link: sync 0.1 s per boundary, 5 ms a step: the share at K = 4 is 5/6, so the
    # link's K* is 4 · 5 / 0.25 = 80, and the soft cap ⌊√(4 · 80)⌋ = 17
    ks_skewed = drive(skewed, 40, drift_ratio=2.0, step_compute=0.005, sync=0.1)
    ks_iid = drive(iid, 40, drift_ratio=0.8, step_compute=0.005, sync=0.1)
    assert skewed.skewed is True and iid.skewed is False
    assert skewed.link_k == pytest.approx(80.0) and skewed.skew_ceiling() == 17
    assert set(ks_skewed) == {17} and set(ks_iid[-10:]) == {64}
    # iid: the provisional cap until the guard's first window (4 rounds, 32 steps) judges it
    assert ks_iid[:4] == [17, 17, 17, 17] and iid.skew_ceiling() is None
    # a K already above the cap when skew is judged (a starting K of 32 under the doubling
    # rule, whose first window has not closed) falls to it there and then
    d = ExposedSyncController(sync_period=32, target=0.2, max_sync_period=64, window=4)
    reasons = [d.observe(stats(d.sync_period, drift_ratio=2.0, i=i)) for i in range(4)]
    assert [r.next_sync_period for r in reasons] == [32, 32, 32, 4]
    assert reasons[-1].reason == "skewed data: drift ratio 2 > 1.4: K capped at 4 (soft cap 4)"
    # it survives a resume, and skew_drift = 0 turns it off
    again = ExposedSyncController(sync_period=4, **kw)
    again.load_state_dict(skewed.state_dict())
    assert again.skewed is True and again.link_k == skewed.link_k
    assert set(drive(again, 20, drift_ratio=0.5, sync=0.1)) == {17}
    with pytest.raises(ValueError, match="skewed must be true, false or null"):
        again.load_state_dict({**skewed.state_dict(), "skewed": "false"})
    with pytest.raises(ValueError, match="link_k must be a number"):
        again.load_state_dict({**skewed.state_dict(), "link_k": "80"})
    old = {k: v for k, v in skewed.state_dict().items() if k != "link_k"}
    again.load_state_dict(old)  # saved before the soft cap: the cap itself until a window
    assert again.link_k is None and again.skew_ceiling() == 4
    off = ExposedSyncController(sync_period=4, skew_drift=0.0, **kw)
    assert off.skewed is False and max(drive(off, 40, drift_ratio=2.0, sync=0.1)) == 64


def test_strong_skew_is_read_over_a_longer_window_and_grades_the_soft_cap():
    """With skew_strong set, skew is judged as before (skew_cap's soft cap), then graded once over
    GRADE_WINDOWS judging windows at K >= 2: above skew_strong the cap scales with half of
    skew_cap. At or under skew_drift: no cap, nothing graded. The grade survives a resume."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True,
              skew_drift=1.8, skew_strong=2.2)  # fmt: skip
    # the slow link of the tests above: K* = 80; caps ⌊√(4 · 80)⌋ = 17 and ⌊√(2 · 80)⌋ = 12
    ends = {}
    for ratio in (1.5, 2.0, 2.5):
        c = ExposedSyncController(sync_period=4, **kw)
        assert c.skew_ceiling() == 4 and c.cap_scale() == 4  # unjudged: the milder cap
        ends[ratio] = (drive(c, 40, drift_ratio=ratio, step_compute=0.005, sync=0.1), c)
    assert {r: ks[-1] for r, (ks, _) in ends.items()} == {1.5: 64, 2.0: 17, 2.5: 12}
    assert ends[1.5][1].skew_ratio is None and ends[1.5][1]._grade_win.rounds == 0  # iid
    strong_ks, strong = ends[2.5]
    assert strong.skewed is True and strong.skew_ratio == pytest.approx(2.5)
    # judged at the 4th boundary (K 17), graded at the 12th: 4 + 11 · 17 steps >= 96
    assert strong_ks[:11] == [17] * 11 and strong_ks[11:] == [12] * 29
    assert ends[2.0][1].skew_ratio == pytest.approx(2.0)  # read, and mild: the cap stays
    # the reasons, where the grade cuts K and where it does not
    d = ExposedSyncController(sync_period=4, **kw)
    reasons = [d.observe(stats(d.sync_period, drift_ratio=2.5, i=i)).reason for i in range(12)]
    assert (
        reasons[-1] == "strong skew: drift ratio 2.5 > 2.2: K capped at 12 (soft cap 2, link K* 80)"
    )
    mild = ExposedSyncController(sync_period=4, **kw)
    reasons = [
        mild.observe(stats(mild.sync_period, drift_ratio=2.0, i=i)).reason for i in range(13)
    ]
    assert reasons[11].startswith("skew graded mild: drift ratio 2 <= 2.2; ")
    assert sum("graded" in r for r in reasons) == 1
    # mild is the default's path, decision by decision (K and the reason after the note)
    same = ExposedSyncController(sync_period=4, **kw)
    off = ExposedSyncController(sync_period=4, **{**kw, "skew_strong": 0.0})
    for i in range(30):
        a, b = (c.observe(stats(c.sync_period, drift_ratio=2.0, i=i)) for c in (same, off))
        assert a == b or (a.next_sync_period == b.next_sync_period and a.reason.endswith(b.reason))
    # a ratio that rises past the judgement: mild over the first window, strong over the longer
    rise = ExposedSyncController(sync_period=4, **kw)
    ks = [rise.observe(stats(rise.sync_period, drift_ratio=2.0 if i < 4 else 2.6, i=i))
          .next_sync_period for i in range(16)]  # fmt: skip
    assert rise.skewed and rise.skew_ratio == pytest.approx((4 * 2.0 + 8 * 2.6) / 12)
    assert ks[10] == 17 and ks[-1] == 12
    # 12 rounds are not enough below 96 steps: at K = 4 (a cap of 4: K* at or under it) the
    # grade waits for the 24th round
    slow = ExposedSyncController(sync_period=4, **{**kw, "rule": "double", "lower": False})
    for i in range(23):
        slow.observe(stats(4, drift_ratio=2.5, step_compute=0.05, sync=0.001, i=i))
    assert slow.skewed and slow.skew_ratio is None and slow._grade_win.rounds == 23
    slow.observe(stats(4, drift_ratio=2.5, step_compute=0.05, sync=0.001, i=23))
    assert slow.skew_ratio == pytest.approx(2.5)
    # a round at K = 1, and a rollback, start the grading window again
    again = ExposedSyncController(sync_period=4, **kw)
    drive(again, 8, drift_ratio=2.5, step_compute=0.005, sync=0.1)
    assert again._grade_win.rounds == 8
    again.observe(stats(1, drift_ratio=0.9, i=8))
    assert again.skew_ratio is None and again._grade_win.rounds == 0
    drive(again, 4, drift_ratio=2.5, step_compute=0.005, sync=0.1)
    again.rollback(4)
    assert again._grade_win.rounds == 0
    # a non-finite ratio reads nothing: read again from the next window
    nan = ExposedSyncController(sync_period=4, **kw)
    drive(nan, 4, drift_ratio=2.5, step_compute=0.005, sync=0.1)
    drive(nan, 8, drift_ratio=math.inf, step_compute=0.005, sync=0.1)
    assert nan.skewed and nan.skew_ratio is None and nan._grade_win.rounds == 0
    # resumed: graded, or saved before the grade was kept (read again, from a new window)
    resumed = ExposedSyncController(sync_period=4, **kw)
    resumed.load_state_dict(strong.state_dict())
    assert resumed.skew_ceiling() == 12
    old = {k: v for k, v in strong.state_dict().items() if k not in ("skew_ratio", "grade_window")}
    resumed.load_state_dict(old)
    assert resumed.skew_ratio is None and resumed.skew_ceiling() == 17
    for bad in ("2.5", math.nan, -1.0, True):
        with pytest.raises(ValueError, match="skew_ratio must be a number"):
            resumed.load_state_dict({**strong.state_dict(), "skew_ratio": bad})
    built = build_controller("exposed-sync", 1, PolicyOptions(skew_strong=2.2))
    assert built.skew_strong == 2.2
    comp = build_controller("composite", 4, PolicyOptions(skew_strong=2.2, qsr_base=4))
    ks = [comp.observe(stats(comp.sync_period, drift_ratio=2.5, i=i)).next_sync_period
          for i in range(20)]  # fmt: skip
    assert comp.share.strong() and set(ks[-5:]) == {12}
    # off (0, the default): never graded, skew_cap's cap
    plain = ExposedSyncController(sync_period=4, **{**kw, "skew_strong": 0.0})
    assert drive(plain, 40, drift_ratio=2.5, step_compute=0.005, sync=0.1)[-1] == 17
    assert plain.skew_ratio is None


def test_the_soft_cap_s_exponent_and_the_grade_on_one_scale():
    """skew_power sets the soft cap's law, ⌊scale^(1 − p) · K*^p⌋ (the square root's to the bit
    at 0.5, K* itself at 1); skew_grade_gamma reads the grading window's drift ratio on K = 4's
    scale, × (K/4)^gamma, so a window at K = 8 grades as one at K = 4 would."""
    assert soft_cap(4, 80.0) == 17 == math.floor(math.sqrt(320))
    assert soft_cap(4, 15.999999999999993) == 8  # a measured 16: its root floored is 8
    assert soft_cap(6, 10.1, 2 / 3) == 8 and soft_cap(6, 81.0, 2 / 3) == 34  # the panel's links
    assert soft_cap(6, 10.1) == 7 and soft_cap(6, 81.0) == 22  # the square root's
    assert soft_cap(4, 80.0, 1.0) == 80
    assert soft_cap(8, 27.0, 2 / 3) == 18  # 17.999999999999996 before the margin
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True)
    # the slow link of the tests above (K* = 80) on skewed data: the cap by its law
    for power, cap in ((0.5, 21), (2 / 3, 33), (1.0, 64)):
        c = ExposedSyncController(sync_period=4, skew_cap=6, skew_power=power, **kw)
        ks = drive(c, 40, drift_ratio=2.0, step_compute=0.005, sync=0.1)
        assert c.skewed and ks[-1] == cap, (power, ks[-5:])
    # K = 8 throughout (the share under target, no raise, no lowering): a ratio of 2.0 reads
    # 2.0 · 2^0.28 = 2.43 on K = 4's scale, strong above 2.2, where as measured it is mild
    held = dict(target=0.2, max_sync_period=64, window=4, rule="double", lower=False,
                skew_drift=1.8, skew_strong=2.2, skew_cap=8)  # fmt: skip
    graded = {}
    for gamma in (0.0, 0.28):
        c = ExposedSyncController(sync_period=8, skew_grade_gamma=gamma, **held)
        reasons = [
            c.observe(stats(8, drift_ratio=2.0, step_compute=0.05, sync=0.001, i=i)).reason
            for i in range(1, 13)
        ]
        graded[gamma] = (c.skew_ratio, c.strong(), reasons[-1])
    assert graded[0.0][:2] == (pytest.approx(2.0), False)
    assert graded[0.28][:2] == (pytest.approx(2.0 * 2**0.28), True)
    assert graded[0.0][2].startswith("skew graded mild: drift ratio 2 <= 2.2; ")
    assert graded[0.28][2].startswith(
        "strong skew: drift ratio 2.43 > 2.2 (on K = 4's scale): K capped at 4 (soft cap 4"
    )
    # K is the window's steps a round: an epoch's short round (4 steps at K = 8) counts as such,
    # so 13 rounds of 100 steps read at K = 100/13, not at the K in force
    short = ExposedSyncController(sync_period=8, skew_grade_gamma=0.28, **held)
    for i in range(1, 14):
        st = stats(8, drift_ratio=2.0, step_compute=0.05, sync=0.001, i=i)
        short.observe(dataclasses.replace(st, interval_steps=4) if i == 7 else st)
        assert (short.skew_ratio is None) == (i < 13)  # 92 steps after 12 rounds: not yet 96
    assert short.skew_ratio == pytest.approx(2.0 * (100 / 13 / 4) ** 0.28)
    built = build_controller(
        "exposed-sync", 1, PolicyOptions(skew_power=0.75, skew_strong=2.2, skew_grade_gamma=0.3)
    )
    assert (built.skew_power, built.skew_grade_gamma) == (0.75, 0.3)
    comp = build_controller("composite", 4, PolicyOptions(skew_power=0.75, qsr_base=4))
    assert comp.share.skew_power == 0.75


def test_a_window_at_k_1_leaves_skew_unjudged_and_the_soft_cap_holds_on_a_new_link():
    """On a fast link K falls to 1, where replicas start every step together and the drift
    ratio says nothing about skew: no judgement, so when the link turns slow K jumps only to
    the soft cap; the first window there judges, and on iid data K goes on to the link's K*."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True)
    c = ExposedSyncController(sync_period=4, **kw)
    drive(c, 60, drift_ratio=2.0, step_compute=0.005, sync=0.0001)  # K = 1 after a boundary
    assert c.sync_period == 1 and c.skewed is None
    seen = []  # (K, judged) after each boundary on a slower link: K* = 16, soft cap ⌊√64⌋ = 8
    for i in range(12):
        k = c.observe(stats(c.sync_period, drift_ratio=0.8, step_compute=0.005, sync=0.02, i=i))
        seen.append((k.next_sync_period, c.skewed))
    assert max(k for k, judged in seen if judged is None) == 8
    assert c.skewed is False and seen[-1][0] >= 16  # iid: on to the link's K*


def test_the_soft_skew_cap_follows_the_link_as_a_square_root():
    """On skewed data K follows a fast link's K* where it is at or under the cap, grows as
    √(cap · K*) above it, and falls with the link again: the cap is not a constant."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True)
    c = ExposedSyncController(sync_period=4, **kw)
    drive(c, 8, drift_ratio=2.0, step_compute=0.005, sync=0.1)
    assert c.skewed
    # a link four times faster: K* 20 at any K (sync 25 ms per boundary), cap ⌊√80⌋ = 8
    assert set(drive(c, 16, drift_ratio=2.0, step_compute=0.005, sync=0.025)[-8:]) == {8}
    # a fast link: K* = 2.5 under the cap, so K follows it (⌊2.5⌋ after the direct rule's floor)
    ks = drive(c, 16, drift_ratio=2.0, step_compute=0.005, sync=0.003125)
    assert c.link_k is not None and c.link_k < 4 and set(ks[-8:]) == {2}
    # all of the time in sync (no compute at all): no K* to scale, max K bounds it
    c.link_k = math.inf
    assert c.skew_ceiling() == 64
    # the doubling rule keeps the same soft cap
    d = ExposedSyncController(sync_period=4, target=0.2, max_sync_period=64, window=4, lower=True)
    ks = drive(d, 60, drift_ratio=2.0, step_compute=0.005, sync=0.1)
    assert d.skewed and max(ks) == ks[-1] == 17  # 4, 8, 16, then the cap, not 32


def test_a_back_off_and_composite_stay_within_the_skew_cap():
    """A guard that fires where the cap is due lands at or under it, and composite's larger
    K (QSR's) is capped by it too."""
    assert direct_rule(32, 0.5, target=0.2, max_k=64, guard_reason="loss", ceiling=4)[0] == 4
    assert share_rule(32, 0.5, target=0.2, growth=2, max_k=64, guard_reason="x", ceiling=4)[0] == 4
    share = ExposedSyncController(sync_period=4, target=0.2, window=4, rule="direct", lower=True)
    comp = CompositeController(share=share, qsr=QSRController(base=32, alpha=1.0))
    ks = [comp.observe(stats(comp.sync_period, drift_ratio=2.0, i=i)).next_sync_period
          for i in range(40)]  # fmt: skip
    assert share.skewed and share.skew_ceiling() == 17 and set(ks[-20:]) == {17}


def test_on_skewed_data_a_back_off_holds_for_the_rest_of_the_run():
    """On data judged skewed the soft cap, not the link, bounds K, and a back-off says the shards
    do not bear the K it left: its ceiling does not lift when the cooldown ends (on the panel,
    K going back to the cap's K three epochs after a back-off blew up two skew-wan runs of ten).
    On iid data the cooldown ends it as before, and the link's K comes back."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True, cooldown=12)
    skewed = ExposedSyncController(sync_period=4, **kw)
    iid = ExposedSyncController(sync_period=4, **kw)
    for c, drift in ((skewed, 2.0), (iid, 0.8)):
        drive(c, 40, drift_ratio=drift)  # the slow link of the tests above: K* 80
        drive(c, 8, drift_ratio=drift, loss=0.8)  # the best window
        k = c.sync_period
        fired = [c.observe(stats(k, drift_ratio=drift, loss=1.0, i=i)) for i in range(1, 5)]
        assert fired[-1].reason.startswith("back off: loss 1 rose"), fired[-1].reason
    assert skewed.skewed is True and iid.skewed is False
    assert (skewed.sync_period, iid.sync_period) == (8, 32)  # 17 // 2 and 64 // 2
    after = {name: drive(c, 40, drift_ratio=d, loss=0.8)
             for name, c, d in (("skewed", skewed, 2.0), ("iid", iid, 0.8))}  # fmt: skip
    assert set(after["skewed"]) == {8} and skewed.ceiling == 8
    assert after["iid"][:11] == [32] * 11 and after["iid"][-1] == 64 and iid.ceiling is None
    # it survives a resume
    again = ExposedSyncController(sync_period=4, **kw)
    again.load_state_dict(skewed.state_dict())
    assert set(drive(again, 40, drift_ratio=2.0, loss=0.8)) == {8}


def test_backs_off_when_the_loss_rises_over_a_window():
    c = ExposedSyncController(sync_period=8, target=0.2, max_sync_period=8, window=4)
    drive(c, 4, loss=1.0)
    drive(c, 4, loss=0.8)
    d = [c.observe(stats(8, loss=1.0, i=i)) for i in range(4)][-1]  # +25% over best window
    assert d.next_sync_period == 4 and "loss" in d.reason


def test_the_loss_guard_judges_a_rise_at_one_k_not_the_step_up_to_a_larger_one():
    """A larger K starts at a higher training loss (the replicas' first steps after a longer
    period): after a raise the best window is the new K's own, so the step up is not a back-off,
    and a rise at that K still is."""
    c = ExposedSyncController(
        sync_period=8, target=0.2, max_sync_period=16, window=4, skew_drift=0.0
    )  # the doubling rule: 8 -> 16 at the first window (sync 0.1 s, 5 ms a step)
    assert drive(c, 4, loss=0.8)[-1] == 16
    assert set(drive(c, 4, loss=0.95)) == {16}  # +19% over the window at K = 8: no back-off
    d = [c.observe(stats(16, loss=1.1, i=i)) for i in range(4)][-1]  # +16% at K = 16
    assert d.next_sync_period == 8 and "loss 1.1 rose over best window 0.95" in d.reason


def test_the_loss_guard_still_fires_when_k_swings_or_composite_steps_back_up():
    """Only a raise by more than the margin re-baselines the loss, once per judged window:
    a K that swings with the link every window, or composite's QSR K restored over a share
    rule that lowered it, leaves the loss guard on."""

    def backoffs(ctrl, windows, sync_of, rate=1.06):
        n = 0
        for w in range(windows):
            for _i in range(4):
                d = ctrl.observe(
                    stats(ctrl.sync_period, sync=sync_of(w), loss=rate**w, step_compute=0.005)
                )
                n += d.reason.startswith("back off") or "back off" in d.reason
        return n

    def swing(link_shift):
        return ExposedSyncController(
            sync_period=4, target=0.2, window=4, rule="direct", lower=True, skew_drift=0.0,
            link_shift=link_shift,
        )  # fmt: skip

    def link(w):
        return 0.04 if w % 2 == 0 else 0.005

    assert backoffs(swing(0.0), 16, link) > 0
    # followed within two rounds of each swing, K is raised in every other judged window, each
    # compared with the one before it: a loss rising by more than loss_rise (0.1) a window fires
    # it, 6% a window does not (the module's docstring)
    assert backoffs(swing(3.0), 16, link, rate=1.12) > 0
    assert backoffs(swing(3.0), 16, link) == 0
    o = PolicyOptions(peak_lr=0.1, sync_window=4, qsr_base=8, skew_drift=0.0)
    comp = build_controller("composite", 8, o)  # QSR holds 8; the share rule wants 1
    assert backoffs(comp, 16, lambda w: 1e-5) > 0
    one = ExposedSyncController(sync_period=16, target=0.2, window=4)
    one.set_sync_period(17)  # within the margin: the same level
    assert not one.rebaseline
    one.set_sync_period(32)
    assert one.rebaseline


def link_path(ctrl, syncs, *, step_compute=0.005, **kw):
    """Feed one boundary per sync time, each at the K chosen last; the decisions."""
    out = []
    for i, sync in enumerate(syncs, start=1):  # from 1, as `drive`
        s = stats(ctrl.sync_period, sync=sync, step_compute=step_compute, i=i, **kw)
        out.append(ctrl.observe(s))
    return out


def test_a_changed_link_is_met_two_rounds_after_it_changes_from_those_rounds():
    """A link 100 times slower (then faster again) closes the window at the second round on it,
    from those two rounds alone: K* = K·r/r_t at the new level, where the window of 8 rounds
    waits out its rounds and then decides on a mix of the two links."""
    kw = dict(target=0.2, max_sync_period=64, window=8, rule="direct", lower=True, skew_drift=0.0,
              link_shift=3.0)  # fmt: skip
    syncs = [0.001] * 20 + [0.1] * 28 + [0.001] * 8
    on = link_path(ExposedSyncController(sync_period=1, **kw), syncs)
    off = link_path(ExposedSyncController(sync_period=1, **{**kw, "link_shift": 0.0}), syncs)
    assert [d.next_sync_period for d in on[:20]] == [d.next_sync_period for d in off[:20]]
    assert {d.next_sync_period for d in on[:20]} == {1}
    # the second slow round decides: 2 rounds at K = 1, share 0.1/0.105, K* = 76 → the cap 64
    assert on[20].next_sync_period == 1 and "1 off its level" in on[20].reason
    assert on[21].reason.startswith("link changed: network 100 ms a round over 2 rounds, 1 ms")
    assert on[21].next_sync_period == 64
    # without the check: K = 1 until the window closes at round 24, on 4 fast and 4 slow rounds
    assert {d.next_sync_period for d in off[:24]} == {1} and off[24].next_sync_period < 64
    # back on the fast link: K falls at its second round, to K* = 64 · (0.001/0.32)/0.25 → 1
    assert [d.next_sync_period for d in on[21:49]] == [64] * 28
    assert on[49].reason.startswith("link changed") and on[49].next_sync_period == 1


def test_rounds_near_the_level_or_a_lone_spike_leave_the_windows_as_they_were():
    """Sync times within the shift of the window's level, and lone spikes or dips a round back at
    the level follows, never read as a changed link: with no spike the decisions are those of the
    check turned off, reasons and all; with them no window closes early."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True, skew_drift=0.0,
              link_shift=3.0)  # fmt: skip
    rng = random.Random(7)
    noisy = [0.02 * rng.uniform(1 / 1.7, 1.7) for _ in range(200)]  # any two within 2.9x
    on = link_path(ExposedSyncController(sync_period=1, **kw), noisy)
    off = link_path(ExposedSyncController(sync_period=1, **{**kw, "link_shift": 0.0}), noisy)
    assert [(d.next_sync_period, d.reason) for d in on] == [
        (d.next_sync_period, d.reason) for d in off
    ]
    # a spike (x10) or a dip (/10) in every third round, the other way each time
    spiky = [0.02 * (10.0 if i % 6 == 2 else 0.1 if i % 6 == 5 else 1.0) for i in range(200)]
    ds = link_path(ExposedSyncController(sync_period=1, **kw), spiky)
    assert not any("link changed" in d.reason for d in ds)
    assert 4 <= ds[-1].next_sync_period <= 64
    # up then down in a row: two rounds off the level, but not one way
    updown = [0.02] * 20 + [0.2, 0.002] + [0.02] * 8
    assert not any("link changed" in d.reason for d in link_path(
        ExposedSyncController(sync_period=4, **kw), updown))  # fmt: skip


def test_a_round_held_off_the_level_survives_a_resume():
    """The rounds held apart and their direction are in the state: a resumed controller meets the
    changed link at the same round as one that ran on; a state saved before the check loads."""
    kw = dict(target=0.2, max_sync_period=64, window=8, rule="direct", lower=True, skew_drift=0.0,
              link_shift=3.0)  # fmt: skip
    ran = ExposedSyncController(sync_period=1, **kw)
    link_path(ran, [0.001] * 6 + [0.1])
    resumed = ExposedSyncController(sync_period=1, **kw)
    resumed.load_state_dict(json.loads(json.dumps(ran.state_dict())))
    a, b = link_path(ran, [0.1]), link_path(resumed, [0.1])
    assert a == b and a[0].reason.startswith("link changed")
    old = {k: v for k, v in ran.state_dict().items() if k not in ("round", "shifted", "shift_up")}
    ExposedSyncController(sync_period=1, **kw).load_state_dict(old)
    with pytest.raises(ValueError, match="shift_up"):
        resumed.load_state_dict({**ran.state_dict(), "shift_up": "yes"})


def test_the_guard_does_not_hold_k_at_1_for_a_loss_k_did_not_raise():
    """A window all at K = 1 is synchronous SGD: a loss rise there (noise at a high LR) backs
    nothing off and sets no ceiling, so a slower link is followed at once; at K = 2 the same
    rise fires as before."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True, skew_drift=0.0)

    def run(k):
        c = ExposedSyncController(sync_period=k, floor=k, **kw)
        ds = []
        for i in range(96):  # a fast link; the loss jumps 50% after 48 rounds
            loss = 1.0 if i < 48 else 1.5
            ds.append(c.observe(stats(c.sync_period, sync=1e-5, loss=loss, i=i)))
        return c, ds

    one, ds = run(1)
    assert one.ceiling is None and not any("back off" in d.reason for d in ds)
    two, ds = run(2)
    assert any("back off: loss" in d.reason for d in ds)


def test_k_floor_bounds_every_choice_and_is_where_lowering_starts():
    """Under --k-floor 2 no decision goes below 2: not lowering on a fast link, not a guard's
    back-off, not the skew cap; the default (1) is the rule as it was."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True)
    fast = ExposedSyncController(sync_period=2, k_floor=2, skew_drift=0.0, **kw)
    assert set(drive(fast, 40, sync=1e-5)) == {2}
    backoff = ExposedSyncController(sync_period=4, k_floor=2, skew_drift=0.0, **kw)
    ds = [
        backoff.observe(stats(backoff.sync_period, sync=0.02, loss=1.0 + i, i=i)) for i in range(80)
    ]
    assert any("back off" in d.reason for d in ds)
    assert min(d.next_sync_period for d in ds) == 2 and backoff.ceiling in (
        None,
        2,
        4,
        8,
        16,
        32,
        64,
    )
    capped = ExposedSyncController(sync_period=2, k_floor=3, skew_cap=1, **kw)
    ks = drive(capped, 40, drift_ratio=2.5, sync=0.1)  # skewed: the soft cap's scale is 1
    assert min(ks) >= 3 and capped.skewed
    plain = ExposedSyncController(sync_period=2, skew_drift=0.0, **kw)
    assert drive(plain, 40, sync=1e-5)[-1] == 1
    assert build_controller("exposed-sync", 2, PolicyOptions(k_floor=2)).floor == 2
    assert build_controller("composite", 4, PolicyOptions(k_floor=2, qsr_base=4)).share.k_floor == 2


def test_at_its_floor_the_guard_does_not_pin_k_and_with_fragments_it_still_judges():
    """The guard is silent on a window all at K <= the floor (2 here: a LAN phase before a slow
    link) and the slow link is followed at once; with F = 4 fragments at K = 4 (a boundary one
    step apart) the same loss rise fires it as at F = 1."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True, skew_drift=0.0,
              link_shift=3.0)  # fmt: skip
    c = ExposedSyncController(sync_period=2, k_floor=2, **kw)
    for i in range(64):  # a fast link, the loss up 50% from round 32 on
        c.observe(stats(c.sync_period, sync=1e-5, loss=1.0 if i < 32 else 1.5, i=i + 1))
    assert c.ceiling is None and c.sync_period == 2
    ds = link_path(c, [0.2] * 4, loss=1.5)
    assert ds[1].reason.startswith("link changed") and ds[1].next_sync_period > 2

    def backoffs(frags):
        c = ExposedSyncController(sync_period=4, floor=4, **kw)
        n = 0
        for i in range(48):
            for s in round_stats(4, frags, i=i, sync=2**-7, loss=1.0 if i < 24 else 1.5):
                n += "back off" in c.observe(s).reason
        return n

    assert backoffs(4) == backoffs(1) > 0


def test_the_floor_holds_under_composite_caps_and_after_a_rollback():
    o = PolicyOptions(peak_lr=0.1, qsr_base=4, k_floor=3, skew_cap=1)
    comp = build_controller("composite", 4, o)
    ks = drive(comp, 40, drift_ratio=2.5, sync=0.1)  # skewed: the soft cap's scale is 1
    assert comp.share.skewed and min(ks) >= 3
    c = ExposedSyncController(sync_period=8, k_floor=2)
    c.rollback(1)
    assert c.sync_period == 2 and c.ceiling == 2
    warm = build_controller("composite", 4, PolicyOptions(qsr_base=4, k_floor=8))
    assert warm.observe(stats(4, warmup=True)).next_sync_period == 8  # QSR's 4 is under it


def test_rounds_off_the_level_both_ways_or_a_silent_link_still_let_windows_close():
    """Rounds that leave the level one way then the other never hold a window open for more
    than its rounds; a level of 0 (sync all hidden) reads no change; a held round in a state
    loaded where the check is off rejoins the window."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True, skew_drift=0.0,
              link_shift=3.0)  # fmt: skip
    swing = [0.02] * 8 + [0.2 if i % 2 else 0.002 for i in range(40)]
    ds = link_path(ExposedSyncController(sync_period=4, **kw), swing)
    decided = [i for i, d in enumerate(ds) if not d.reason.startswith("measuring")]
    assert max(b - a for a, b in zip(decided, decided[1:], strict=False)) <= 5
    assert decided[-1] >= 40
    hidden = link_path(ExposedSyncController(sync_period=4, **kw), [0.0] * 8 + [1e-6] * 8)
    assert not any("link changed" in d.reason for d in hidden)
    held = ExposedSyncController(sync_period=1, **kw)
    link_path(held, [0.001] * 6 + [0.1])
    off = ExposedSyncController(sync_period=1, **{**kw, "link_shift": 0.0})
    off.load_state_dict(held.state_dict())
    assert any(not d.reason.startswith("measuring") for d in link_path(off, [0.1] * 6))


def test_link_shift_is_an_option_above_1_or_off():
    assert build_controller("exposed-sync", 1, PolicyOptions()).link_shift == 0  # off
    assert build_controller("exposed-sync", 1, PolicyOptions(link_shift=0)).link_shift == 0
    comp = build_controller("composite", 4, PolicyOptions(link_shift=5, qsr_base=4))
    assert comp.share.link_shift == 5
    with pytest.raises(ValueError, match="--link-shift: 1 would read every round"):
        PolicyOptions(link_shift=1)


def test_skew_is_judged_on_rounds_at_k_2_or_more_and_only_on_a_finite_ratio():
    """K = 1 rounds (drift 0.9 on skewed shards) neither judge nor dilute the judging window;
    a non-finite drift ratio does not judge; a back-off due at the judgement is taken."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True)
    c = ExposedSyncController(sync_period=4, **kw)
    drive(c, 40, drift_ratio=0.9, step_compute=0.005, sync=0.0001)  # a fast link: K = 1
    assert c.sync_period == 1 and c.skewed is None
    drive(c, 12, drift_ratio=1.7, step_compute=0.005, sync=0.02)  # a slow one: K >= 2
    assert c.skewed is True and c.sync_period <= 8  # ⌊√(4 · 16)⌋
    nan = ExposedSyncController(sync_period=4, **kw)
    drive(nan, 12, drift_ratio=math.nan, step_compute=0.005, sync=0.1)
    assert nan.skewed is None
    # judged skewed at the boundary whose loss is not finite: the back-off (32 -> 16, under the
    # soft cap ⌊√(4 · 80)⌋ = 17 of the window's K*), with its cooldown
    g = ExposedSyncController(sync_period=32, target=0.2, max_sync_period=64, window=4)
    ds = [g.observe(stats(32, drift_ratio=2.0, i=i)) for i in range(3)]
    d = g.observe(stats(32, drift_ratio=2.0, loss=math.nan, i=3))
    assert g.skewed is True and d.reason.startswith("back off") and d.next_sync_period == 16
    assert g.ceiling == 16 and all(x.next_sync_period == 32 for x in ds)


def test_skew_cleared_early_where_the_first_rounds_read_far_under_the_threshold():
    """The first CLEAR_ROUNDS rounds at K >= 2 reading at or under skew_clear of skew_drift (0.5
    of 1.4 by default) at the first decision judge the data iid there: a run starting at K = 2
    (Adam's floor) goes to the link's K* rather than the provisional cap. A higher reading,
    rounds at K = 1, or rounds after the first decision leave the full window to judge, so the
    K path is the rule's without it (skew_clear 0)."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True, k_floor=2)

    def first(ctrl, drift, n=12):
        # boundary 0 (the run's first round, no averaging before it), then decisions; a slow
        # link: the share at K = 2 is 10/11, the link's K* 80, the provisional cap 17
        ds = [ctrl.observe(stats(ctrl.sync_period, drift_ratio=drift, sync=0.1, i=0))]
        for i in range(1, n):
            ds.append(ctrl.observe(stats(ctrl.sync_period, drift_ratio=drift, sync=0.1, i=i)))
        return ds

    clear = ExposedSyncController(sync_period=2, **kw)  # the default: 0.5 of skew_drift 1.4
    off = ExposedSyncController(sync_period=2, skew_clear=0.0, **kw)
    ds_clear, ds_off = first(clear, 0.4), first(off, 0.4)
    assert [d.next_sync_period for d in ds_clear[:2]] == [2, 64]
    assert ds_clear[1].reason.startswith(
        f"skew cleared: drift ratio 0.4 <= 0.7 (0.5 of 1.4) over {CLEAR_ROUNDS} rounds at "
        "K >= 2; raise"
    )
    assert clear.skewed is False and clear.cleared == pytest.approx(0.4)
    assert not any(d.reason.startswith("skew cleared") for d in ds_clear[2:])
    # without it: the provisional cap ⌊√(4 · 80)⌋ until the full window judges the data iid
    assert [d.next_sync_period for d in ds_off[:2]] == [2, 17] and off.cleared is None
    # over the threshold, or between it and skew_drift: judged by the full window as before
    for drift in (0.71, 1.0, 2.0):
        a = ExposedSyncController(sync_period=2, **kw)
        b = ExposedSyncController(sync_period=2, skew_clear=0.0, **kw)
        assert [d.next_sync_period for d in first(a, drift, 40)] == [
            d.next_sync_period for d in first(b, drift, 40)
        ]
        assert a.skewed is b.skewed is (drift > 1.4) and a.cleared is None
    # rounds at K = 1 do not clear: the replicas start every step together
    one = ExposedSyncController(sync_period=1, **{**kw, "k_floor": 1})
    drive(one, 12, drift_ratio=0.3, step_compute=0.005, sync=0.0001)  # a fast link: K = 1
    assert one.sync_period == 1 and one.skewed is None and one.cleared is None
    # read at the first decision only: a run starting at K = 1 jumps under the provisional cap
    # there, and its rounds at K = 17 after it wait for the full window, as without the option
    late = ExposedSyncController(sync_period=1, **{**kw, "k_floor": 1})
    base = ExposedSyncController(sync_period=1, skew_clear=0.0, **{**kw, "k_floor": 1})
    ks_late, ks_base = first(late, 0.4), first(base, 0.4)
    assert [d.next_sync_period for d in ks_late] == [d.next_sync_period for d in ks_base]
    assert [d.next_sync_period for d in ks_late[:3]] == [1, 17, 17]
    assert late.skewed is False and late.cleared is None


def test_skew_cleared_at_its_scaled_threshold_under_either_rule_and_not_after_a_warmup():
    """The threshold is skew_clear x skew_drift, inclusive; the two rounds are read once, as the
    second closes (under the doubling rule, before its first window's decision); a warmup's
    first decision follows one round at K >= 2, so nothing clears; `cleared` survives a resume."""
    kw = dict(target=0.2, max_sync_period=64, window=4, rule="direct", lower=True, k_floor=2)

    def run(ctrl, drift, n=3, warmup=0, sync=0.1):
        out = []
        for i in range(n + warmup):
            k = 1 if i < warmup else ctrl.sync_period
            s = stats(k, drift_ratio=drift, sync=sync, i=i, warmup=i < warmup)
            out.append(ctrl.observe(s))
        return out

    at = ExposedSyncController(sync_period=2, **kw)
    assert [d.next_sync_period for d in run(at, 0.7)][:2] == [2, 64] and at.cleared == 0.7
    over = ExposedSyncController(sync_period=2, **kw)
    run(over, 0.7000001)
    assert over.cleared is None and over.skewed is None
    # skew_drift 2: 0.9 clears (0.5 of 2 is 1.0), where at 1.4 it did not
    scaled = ExposedSyncController(sync_period=2, skew_drift=2.0, **kw)
    assert [d.next_sync_period for d in run(scaled, 0.9)][:2] == [2, 64]
    assert scaled.cleared == pytest.approx(0.9)
    # the doubling rule decides after a window of 4 rounds (20 steps at K = 4: too few for the
    # full window's judgement): cleared as the second closes, so its first decision doubles K past
    # the provisional cap (K* 10, ⌊√(4 · 10)⌋ = 6), which without clearing holds it
    dbl = ExposedSyncController(sync_period=4, target=0.2, max_sync_period=64, window=4)
    ds = run(dbl, 0.4, n=5, sync=0.0125)
    assert dbl.cleared == pytest.approx(0.4)
    assert ds[1].reason.startswith("skew cleared") and not ds[2].reason.startswith("skew cleared")
    assert [d.next_sync_period for d in ds] == [4, 4, 4, 4, 8]
    held = ExposedSyncController(sync_period=4, target=0.2, max_sync_period=64, window=4,
                                 skew_clear=0.0)  # fmt: skip
    assert [d.next_sync_period for d in run(held, 0.4, n=5, sync=0.0125)] == [4, 4, 4, 4, 6]
    # a warmup at K = 1, then K = 2: the first decision reads one round at K >= 2, and waits
    warm = ExposedSyncController(sync_period=2, **kw)
    ds = run(warm, 0.4, n=3, warmup=3)
    assert [d.next_sync_period for d in ds[3:]] == [17, 17, 17]  # the provisional cap
    assert warm.cleared is None and warm.skewed is None and warm.link_k is not None
    # the reading is saved and read back (a record of what cleared the data)
    again = ExposedSyncController(sync_period=2, **kw)
    again.load_state_dict(at.state_dict())
    assert again.cleared == 0.7 and again.skewed is False
    with pytest.raises(ValueError, match="skew_cleared must be a number"):
        again.load_state_dict({**at.state_dict(), "skew_cleared": "0.7"})


def test_the_doubling_rule_follows_a_soft_cap_that_falls():
    c = ExposedSyncController(sync_period=4, target=0.2, max_sync_period=64, window=4)
    drive(c, 40, drift_ratio=2.0, step_compute=0.005, sync=0.1)
    assert c.skewed is True and c.sync_period == 17  # ⌊√(4 · 80)⌋
    ks = drive(c, 16, drift_ratio=2.0, step_compute=0.005, sync=0.05)  # K* 40: cap 12
    assert c.skew_ceiling() == 12 and ks[-1] <= 12


def test_old_and_bad_exposed_sync_states():
    c = ExposedSyncController(sync_period=4, target=0.2, window=4)
    state = c.state_dict()
    with pytest.raises(ValueError, match="link_k must be a number"):
        c.load_state_dict({**state, "link_k": math.nan})
    with pytest.raises(ValueError, match="rebaseline must be true or false"):
        c.load_state_dict({**state, "rebaseline": 1})
    # saved before the soft cap, before its one judging window: not judged yet, not iid
    old = {k: v for k, v in state.items() if k not in ("link_k", "rebaseline", "skew_window")}
    c.load_state_dict({**old, "skewed": False})
    assert c.skewed is None and c.skew_ceiling() == 4


def test_non_finite_loss_backs_off():
    c = ExposedSyncController(sync_period=8, target=0.2, max_sync_period=8, window=2)
    drive(c, 2)
    d = [c.observe(stats(8, loss=math.nan, i=i)) for i in range(2)][-1]
    assert d.next_sync_period == 4


def test_warmup_boundaries_do_not_move_k():
    c = ExposedSyncController(sync_period=4, window=1)
    assert {c.observe(stats(1, warmup=True)).next_sync_period for _ in range(10)} == {4}


def peer_stats(k, *, peer, step_compute=0.02, network=0.001, i=0):
    """A boundary after K steps on a fast link where this rank also waited `peer` seconds per
    step for a slower one (the slow-rank regime): exposed = network + the peer wait."""
    return dataclasses.replace(
        stats(k, step_compute=step_compute, sync=network + peer * k, i=i),
        peer_wait_seconds=peer * k,
    )


def test_a_wait_for_a_slower_peer_does_not_raise_k():
    # exposed/(compute + exposed) = 0.5 at every K, all of it a wait for a slow rank that no K
    # hides: the share of network time is what the rule judges, and on this link it says K = 1
    c = build_controller("exposed-sync", 4, PolicyOptions(max_sync_period=32))
    ks = []
    for i in range(40):
        ks.append(c.observe(peer_stats(c.sync_period, peer=0.02, i=i)).next_sync_period)
    assert ks[-1] == 1 and max(ks) <= 4
    assert peer_stats(4, peer=0.02).sync_share > 0.5  # what the share without it says


def test_network_share_leaves_the_peer_wait_out_of_both_sides():
    assert network_share(0.8, 0.2, 0.0) == pytest.approx(0.2)
    assert network_share(0.8, 0.2, 0.2) == 0.0
    assert network_share(0.8, 0.7, 0.5) == pytest.approx(0.2)  # 0.2 / (0.8 + 0.2)
    assert network_share(0.0, 0.0, 0.0) == 0.0


def test_the_default_rule_jumps_to_the_link_models_k_at_the_first_measured_boundary():
    # s = 0.05 s per boundary, c = 0.02 s per step: f(4) = 0.05/0.13, K* = 4·r/r_t = 10,
    # decided at the first boundary rather than after a window at the starting K
    c = build_controller("exposed-sync", 4, PolicyOptions(max_sync_period=32, skew_drift=0.0))
    d = c.observe(stats(4, step_compute=0.02, sync=0.05))
    assert d.next_sync_period in (10, 11) and d.reason.startswith("raise")
    # with the skew check on (the default), to the soft cap ⌊√(4 · 10)⌋ until a window judges
    on = build_controller("exposed-sync", 4, PolicyOptions(max_sync_period=32))
    assert on.observe(stats(4, step_compute=0.02, sync=0.05)).next_sync_period == 6
    # then a window per decision: K* at 10 or 11 is within the margin, so K holds
    k = d.next_sync_period
    ks = [c.observe(stats(k, step_compute=0.02, sync=0.05, i=i)) for i in range(2, 10)]
    assert {x.next_sync_period for x in ks} == {d.next_sync_period}


def test_the_first_round_is_not_measured_the_second_decides():
    """Boundary 0's record holds no averaging (its own lands in boundary 1's): under localsgd
    or a fused boundary it reads no sync at all, so it must not set K*; the next record decides,
    as the first would have, had it held a whole boundary's sync. The guard and the skew
    judgement still read it (its loss and drift are whole)."""
    opts = PolicyOptions(max_sync_period=32, skew_drift=0.0)
    c = build_controller("exposed-sync", 4, opts)
    d = c.observe(stats(4, step_compute=0.02, sync=0.0, i=0))
    assert (d.next_sync_period, d.reason) == (
        4,
        "measuring (0/1: the run's first round, no averaging before it)",
    )
    assert c._guard_win.n == 1  # the guard's window has it
    d = c.observe(stats(4, step_compute=0.02, sync=0.05, i=1))  # K* = 10, as at i = 1 alone
    alone = build_controller("exposed-sync", 4, opts)
    assert d == alone.observe(stats(4, step_compute=0.02, sync=0.05))
    assert d.next_sync_period in (10, 11)
    # with F = 2 fragments the whole first round (boundaries 0 and 1) is left out, so that the
    # first estimate comes a round in at any F; the second round decides, as boundary 1 at F = 1
    f = build_controller("exposed-sync", 4, opts)
    first = round_stats(4, 2, i=0, b=0, step_compute=0.02, sync=0.0)
    assert [x.closes_round for x in first] == [False, True]
    assert f.observe(first[0]).reason.startswith("measuring (fragment")
    why = "measuring (0/1: the run's first round, no averaging before it)"
    assert f.observe(first[1]).reason == why
    second = round_stats(4, 2, i=1, b=2, step_compute=0.02, sync=0.05)
    assert [f.observe(x) for x in second][-1] == d


def test_the_default_rule_lowers_k_on_a_fast_link_and_raises_it_when_the_link_slows():
    c = build_controller("exposed-sync", 4, PolicyOptions(max_sync_period=32, skew_drift=0.0))
    assert c.observe(stats(4, step_compute=0.02, sync=1e-4)).next_sync_period == 1
    slow = [stats(1, step_compute=0.02, sync=0.05, i=i) for i in range(2, 6)]
    ks = [c.observe(s).next_sync_period for s in slow]
    assert ks[-1] >= 8  # a window of 4 boundaries at K = 1 on the slow link: K* = 10


def test_the_loss_guard_does_not_hold_k_at_1_on_the_noise_of_a_few_steps():
    # At K = 1 a window of 4 boundaries is 4 steps; their mean loss wobbles 20% (noise, as the
    # panel's es-lowering path showed). The guard judges windows of GUARD_MIN_STEPS steps, so
    # the wobble neither backs off nor caps K, and the link's slowing raises K at once.
    c = ExposedSyncController(sync_period=1, max_sync_period=32, window=4, rule="direct")
    assert GUARD_MIN_STEPS > 4
    for i in range(12):
        loss = 1.0 if (i // 4) % 2 == 0 else 1.2
        c.observe(stats(1, step_compute=0.02, sync=1e-4, loss=loss, i=i))
    k, ds = 1, []
    for i in range(12, 20):  # each boundary measured at the K chosen before it
        ds.append(c.observe(stats(k, step_compute=0.02, sync=0.05, i=i)))
        k = ds[-1].next_sync_period
    assert not any("back off" in d.reason for d in ds)
    # within two windows of the slowing K is at the link's K* (s/(c·r_t) = 10) as far as the soft
    # skew cap allows while skew is not yet judged: ⌊√(4 · 10)⌋ = 6
    assert c.link_k == pytest.approx(10.0) and k == 6


def test_k_star_is_read_at_the_rounds_mean_length_where_epoch_ends_cut_them():
    # Every epoch ends with a boundary: at K = 15 on 32-step epochs the rounds run 15, 15, 2
    # (15, 15, 1 in the first epoch, whose first step was a round of its own). K* is
    # s/(c·r_t) = 0.0725/(0.02 · 0.25) = 14.5 (the module's docstring), so K holds at 15; read as
    # if each round were K long, the first window (mean 31/3 steps) would read 15 · 14.5/(31/3) =
    # 21, over the 25% margin, and K would rise to 22 (as it did before the fix).
    c = ExposedSyncController(
        sync_period=1, max_sync_period=64, window=3, skew_drift=0, rule="direct"
    )
    i, seen = 1, []
    for _ in range(4):  # epochs of 32 steps, each round cut at the epoch's end, as autok's loop
        left = 32
        while left:
            k = c.sync_period
            st = stats(min(k, left), step_compute=0.02, sync=0.0725, i=i)
            c.observe(dataclasses.replace(st, sync_period=k))
            i, left = i + 1, left - min(k, left)
            seen.append(st.interval_steps)
    assert seen[-3:] == [15, 15, 2] and c.sync_period == 15
    assert c.link_k == pytest.approx(14.5)
    # the pure rules, at K = 28 over rounds averaging 17 steps (the panel's flip-wan): K* 62.5
    share = 0.3125 / (17 * 0.02 + 0.3125)
    assert direct_rule(28, share, target=0.2, max_k=128, steps=17)[0] == 63
    assert direct_rule(28, share, target=0.2, max_k=128)[0] == 103  # as if the rounds were 28
    # doubling's lowering predicts the share at K/2 from the rounds the share was measured over
    # (s = 3.5 steps' compute over rounds of 20 at K = 32: 17.9% at K/2 = 16, under 0.75 · 30%;
    # halving the measured rounds' length instead predicts 25.9% at 10 steps, and holds)
    low = 0.07 / (20 * 0.02 + 0.07)
    assert share_rule(32, low, target=0.3, growth=2, max_k=64, lower=True, steps=20)[0] == 16
    assert share_rule(32, low, target=0.3, growth=2, max_k=64, lower=True)[0] == 32


def test_share_prediction():
    # f = s/(Kc+s); at K/2 with s/(Kc) = r: f' = 2r/(1+2r)
    f = 0.1 / (0.4 + 0.1)
    assert share_at(f, 0.5) == pytest.approx(0.1 / (0.2 + 0.1))
    assert share_rule(8, 0.5, target=0.2, growth=2, max_k=64)[0] == 16
    assert share_rule(8, 0.1, target=0.2, growth=2, max_k=64)[0] == 8
    assert share_rule(8, 0.5, target=0.2, growth=2, max_k=64, ceiling=8)[0] == 8


# ----- windows count rounds with --fragments ---------------------------------------------------


def round_stats(k, frags, *, i, b=None, **kw):
    """One round at K as the engine reports it with F fragments: F boundaries of gaps
    ⌊jK/F⌋ − ⌊(j−1)K/F⌋ in the order 1, …, F−1, 0, that together time and drift as one F = 1
    boundary `stats(k, ...)`; the whole model in one boundary while K < F. `b`: the first
    boundary's number, the engine's count (default `i`, every boundary of the round numbered so)."""
    whole = stats(k, i=i, **kw)
    if k < frags:
        return [whole if b is None else dataclasses.replace(whole, boundary=b)]
    out = []
    for j in range(1, frags + 1):
        steps = (j * k) // frags - ((j - 1) * k) // frags
        out.append(
            dataclasses.replace(
                whole,
                boundary=whole.boundary if b is None else b + j - 1,
                interval_steps=steps,
                compute_seconds=whole.compute_seconds * steps / k,
                exposed_sync_seconds=whole.exposed_sync_seconds / frags,
                fragment=j % frags,
            )
        )
    return out


@pytest.mark.parametrize("name", ["exposed-sync", "adacomm"])
def test_windows_count_whole_rounds_not_fragment_boundaries(name):
    # The link slows after 8 rounds and the drift spikes after 24: with F = 4 the K path, read
    # where each round ends, is the F = 1 path, and K never changes inside a round.
    def path(frags):
        c = build_controller(name, 8, PolicyOptions(max_sync_period=32))
        k, ks, b = c.sync_period, [], 0  # b: the engine's boundary count, from 0
        for i in range(40):
            kw = {  # powers of 2: a round's parts sum to the F = 1 boundary exactly
                "step_compute": 2**-6,
                "sync": 2**-7 if i < 8 else 2**-3,
                "drift_ratio": 1.0 if i < 24 else 5.0,
                "loss": 2.0 / (1 + i),
            }
            ds = [c.observe(s) for s in round_stats(k, frags, i=i, b=b, **kw)]
            b += len(ds)
            assert {d.next_sync_period for d in ds[:-1]} <= {k}
            k = ds[-1].next_sync_period
            ks.append(k)
        return ks

    one = path(1)
    assert changes(one) >= 2
    assert path(4) == one


# ----- QSR -------------------------------------------------------------------------------------


def test_qsr_formula_on_exact_values():
    assert qsr_k(0.25, base=2, alpha=0.5, max_k=1000) == 4
    assert qsr_k(0.125, base=2, alpha=0.5, max_k=1000) == 16
    assert qsr_k(0.5, base=2, alpha=0.5, max_k=1000) == 2  # (α/η)² = 1 < K_base
    assert qsr_k(0.0625, base=2, alpha=0.5, max_k=32) == 32  # capped
    # an LR at a schedule's end (0), one so small that (α/η)² overflows, or NaN: the longest K,
    # not a ZeroDivisionError or OverflowError at a boundary
    assert qsr_k(0.0, base=2, alpha=0.5, max_k=32) == 32
    assert qsr_k(1e-200, base=2, alpha=0.5, max_k=32) == 32
    assert qsr_k(0.1, base=2, alpha=1e200, max_k=32) == 32
    assert qsr_k(math.nan, base=2, alpha=0.5, max_k=32) == 32
    assert default_alpha(0.1, 4) == pytest.approx(0.2)


@pytest.mark.parametrize("schedule", ["cosine", "step"])
def test_qsr_follows_the_lr_schedule(schedule):
    peak, base = 0.1, 2
    c = QSRController(base=base, alpha=default_alpha(peak, base), max_sync_period=10**9)
    total = 200
    for t in range(total):
        lr = cosine_lr(t, total, peak) if schedule == "cosine" else peak * 0.1 ** (t // 70)
        if lr <= 0:
            continue
        k = c.observe(stats(2, lr=lr)).next_sync_period
        alpha = peak * math.sqrt(base)  # QSR's default (docs/design.md §6)
        assert k == max(base, math.floor((alpha / lr) ** 2))
        assert k >= base
    assert c.observe(stats(2, lr=peak, warmup=True)).next_sync_period == base
    # a step schedule dropping the LR tenfold multiplies K by 100
    if schedule == "step":
        assert c.observe(stats(2, lr=peak / 10)).next_sync_period in (199, 200)  # 2·10², floored


# ----- AdaComm ---------------------------------------------------------------------------------


def test_adacomm_formula():
    assert adacomm_k(2.0, 2.0, 8, max_k=64) == 8
    assert adacomm_k(0.5, 2.0, 8, max_k=64) == 4  # sqrt(1/4) * 8
    assert adacomm_k(0.02, 2.0, 8, max_k=64) == 1  # ceil(0.8)
    assert adacomm_k(0.6, 2.0, 8, max_k=64) == math.ceil(math.sqrt(0.3) * 8)


@pytest.mark.parametrize("schedule", ["cosine", "step"])
def test_adacomm_shrinks_k_as_the_loss_falls(schedule):
    c = AdaCommController(k0=16, window=2)
    ks, f0 = [], None
    for t in range(40):
        loss = 2.3 * (0.93**t if schedule == "cosine" else 0.5 ** (t // 10))
        k = c.observe(stats(16, loss=loss, i=t)).next_sync_period
        if t % 2 == 1:
            window_loss = (
                loss + 2.3 * (0.93 ** (t - 1) if schedule == "cosine" else 0.5 ** ((t - 1) // 10))
            ) / 2
            f0 = f0 or window_loss
            assert k == max(1, math.ceil(math.sqrt(window_loss / f0) * 16))
        ks.append(k)
    assert ks[1] == 16 and ks[-1] < 16 and ks == sorted(ks, reverse=True)


def test_adacomm_lr_factor_follows_the_paper():
    # τ_l = ceil(sqrt(η_0 F_l / (η_l F_0)) · τ_0): the LR halved at the same loss lifts K by √2;
    # the loss quartered at the LR quartered leaves it where it started
    assert adacomm_k(2.0, 2.0, 8, max_k=64, lr=0.05, initial_lr=0.1) == math.ceil(8 * 2**0.5)
    assert adacomm_k(0.5, 2.0, 8, max_k=64, lr=0.025, initial_lr=0.1) == 8
    assert adacomm_k(0.5, 2.0, 8, max_k=64, lr=0.1, initial_lr=0.1) == 4
    assert adacomm_k(1.0, 2.0, 8, max_k=64, lr=0.0, initial_lr=0.1) == 1  # no period to compute
    assert adacomm_k(1.0, 2.0, 8, max_k=64, lr=1e-320, initial_lr=1e10) == 64  # capped


def test_adacomm_starts_large_at_the_cap_and_shrinks():
    # The published form starts at a large τ_0 (here --max-sync-period) and shrinks: not at
    # --sync-period, from which it could only fall further below it
    c = build_controller("adacomm", 4, PolicyOptions(max_sync_period=32, sync_window=1))
    assert c.sync_period == 32
    assert c.observe(stats(32, loss=2.0, lr=0.1)).next_sync_period == 32  # F_0 = 2
    assert c.observe(stats(32, loss=0.5, lr=0.1)).next_sync_period == 16  # sqrt(1/4) · 32
    assert c.observe(stats(16, loss=0.5, lr=0.025)).next_sync_period == 32  # LR / 4: x 2


def test_adacomm_reads_a_version_1_state():
    c = AdaCommController(k0=16, window=1)
    c.load_state_dict(
        {"sync_period": 8, "initial_loss": 2.0, "sum": 0.0, "n": 0, "max_sync_period": 64}
    )
    assert c.observe(stats(8, loss=0.5, lr=0.05)).next_sync_period == 8  # η_0 := this LR
    assert c.state_dict()["version"] == 2 and c.state_dict()["initial_lr"] == 0.05


# ----- post-local SGD -------------------------------------------------------------------------


def test_post_local_keeps_k_1_until_the_first_lr_decay_then_holds_k():
    c = build_controller("post-local", 8, PolicyOptions(max_sync_period=64))
    assert c.sync_period == 1
    lrs = [0.02, 0.06, 0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001]  # warmup ramp, then a step
    ks = [c.observe(stats(1, lr=x, warmup=i < 2, i=i)).next_sync_period for i, x in enumerate(lrs)]
    assert ks == [1, 1, 1, 1, 1, 8, 8, 8, 8]


def test_post_local_ignores_a_decay_inside_warmup_and_noise_under_one_percent():
    c = build_controller("post-local", 4, PolicyOptions())
    assert c.observe(stats(1, lr=0.1, warmup=True)).next_sync_period == 1
    assert c.observe(stats(1, lr=0.05, warmup=True)).next_sync_period == 1
    c = build_controller("post-local", 4, PolicyOptions())
    assert c.observe(stats(1, lr=0.1)).next_sync_period == 1
    assert c.observe(stats(1, lr=0.0995)).next_sync_period == 1  # 0.5% below the peak
    assert c.observe(stats(1, lr=0.0985)).next_sync_period == 4  # 1.5% below it


def test_post_local_k_is_capped():
    c = build_controller("post-local", 128, PolicyOptions(max_sync_period=16))
    c.observe(stats(1, lr=0.1))
    assert c.observe(stats(1, lr=0.01)).next_sync_period == 16


# ----- K ∝ 1/η ---------------------------------------------------------------------------------


def test_inverse_lr_is_linear_in_one_over_the_lr():
    c = build_controller("inverse-lr", 4, PolicyOptions(peak_lr=0.5, max_sync_period=64))
    ks = [c.observe(stats(4, lr=lr)).next_sync_period for lr in (0.5, 0.25, 0.125, 0.0625)]
    assert ks == [4, 8, 16, 32]  # QSR's 1/η² would give 4, 16, 64, 64
    assert c.observe(stats(32, lr=0.5 / 1024)).next_sync_period == 64  # capped
    assert c.observe(stats(64, lr=0.01, warmup=True)).next_sync_period == 4  # K_base in warmup


# ----- composite -------------------------------------------------------------------------------


def test_composite_takes_the_larger_and_the_guard_caps_it():
    o = PolicyOptions(
        peak_lr=0.1,
        target_sync_share=0.2,
        max_sync_period=64,
        sync_window=1,
        qsr_base=2,
        k_rule="double",  # the share rule steps K, so each step below is one doubling
        k_lowering=False,
        skew_drift=0.0,  # the skew check's soft cap is tested on its own (above)
    )
    c = build_controller("composite", 2, o)
    # Idle link: the share rule holds; QSR raises K as the LR decays.
    assert c.observe(stats(2, sync=1e-6, lr=0.05)).next_sync_period == 8
    # Busy link at high LR: the share rule wins.
    assert c.observe(stats(8, sync=1.0, lr=0.1)).next_sync_period == 16
    # The guard caps both: loss up by 50% over the best window (each window of at least
    # GUARD_MIN_STEPS steps: the first, of 2 + 8 + 16 + 16 steps at loss 1, calibrates it).
    assert all("back off" not in c.observe(stats(16, sync=1e-6)).reason for _ in "ab")  # K 16
    ds = [c.observe(stats(16, sync=1e-6, lr=0.02, loss=3.0)) for _ in range(2)]
    assert ds[0].next_sync_period == 50  # QSR's (0.1·√2 / 0.02)², the guard's window still open
    # a raise starts the loss guard's best window afresh: 3.0 is K = 50's level, not a back-off
    assert "back off" not in ds[1].reason and ds[1].next_sync_period == 50
    d = c.observe(stats(50, sync=1e-6, lr=0.02, loss=4.0))  # a rise at K = 50 is one
    assert "back off: loss 4 rose over best window 3" in d.reason and d.next_sync_period == 25


# ----- state -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_state_dict_round_trip_is_exact(name):
    o = PolicyOptions(sync_window=3)
    a = build_controller(name, 4, o)
    rng = random.Random(1)

    def stream(n, seed):
        r = random.Random(seed)
        return [
            stats(
                4,
                sync=r.uniform(0, 0.2),
                loss=r.uniform(0.5, 2),
                drift_ratio=r.uniform(0.5, 3),
                lr=r.uniform(0.01, 0.1),
                i=i,
            )
            for i in range(n)
        ]

    for s in stream(rng.randint(5, 11), 2):
        a.observe(s)
    b = build_controller(name, 4, o)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # survives JSON too
    rest = stream(30, 3)
    assert [a.observe(s) for s in rest] == [b.observe(s) for s in rest]
    assert a.state_dict() == b.state_dict()


class _Reads:
    """PolicyOptions that note which fields are read."""

    def __init__(self, options: PolicyOptions) -> None:
        self.__dict__.update(options=options, read=set())

    def __getattr__(self, name: str):
        self.read.add(name)
        return getattr(self.options, name)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_policy_reads_exactly_the_options_it_declares(name):
    # READS decides which options a run refuses as unread (trainer/engine/options.py): a policy that
    # read an option outside its set would have it refused; one inside it that it never read
    # would be accepted and ignored.
    for qsr in (None, 2.0):  # qsr's alpha default reads peak_lr: both branches
        options = _Reads(PolicyOptions(qsr_alpha=qsr))
        build_controller(name, 4, options)
        assert options.read - RUN_OPTIONS == READS[name]
    assert set(READS) == set(REGISTRY)


def test_controllers_do_not_import_torch_distributed():
    import ast
    import pathlib

    for path in pathlib.Path(__file__).parents[1].joinpath("controllers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] == "torch" for n in names), (path, names)


def test_a_config_json_saved_before_skew_clear_resumes_without_it(tmp_path):
    """A config.json without skew_clear (saved before it was a setting: the full window judged
    skew) resumes with 0 (RAN_BEFORE; written here at this revision, since resume refuses a run
    of another first, as the other RAN_BEFORE entries are tested); one with it keeps its own."""
    import json

    from autok.cli import build_parser, resume_config
    from autok.config import load_config
    from autok.controllers import revision

    run = tmp_path / "run"
    run.mkdir()
    saved = load_config({}, {"policy": "exposed-sync", "out": str(run)}).model_dump(mode="json")
    assert saved["skew_clear"] == 0.5
    saved = {k: v for k, v in saved.items() if k != "skew_clear"}
    saved["policy_revision"] = revision("exposed-sync")
    (run / "config.json").write_text(json.dumps(saved))
    args = build_parser().parse_args(["train", "--resume", str(run)])
    assert resume_config(args).skew_clear == 0
    (run / "config.json").write_text(json.dumps(saved | {"skew_clear": 0.25}))
    assert resume_config(args).skew_clear == 0.25
