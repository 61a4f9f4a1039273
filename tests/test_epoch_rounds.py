"""Epoch rounds (`--epoch-rounds`): the direct rule's K* and the soft skew cap are periods, steps a
sync, met by the K whose mean round E/⌈E/K⌉ is nearest them where every E steps end with a
boundary (controllers/exposed_sync.py, "epoch rounds"; docs/design.md §6)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import autok
from autok.controllers import POLICIES, BoundaryStats, PolicyOptions
from autok.controllers.exposed_sync import (
    ExposedSyncController,
    direct_sync_period,
    epoch_k,
    rounds_of,
)
from tests.dist import run_dist


@pytest.mark.parametrize(
    "period, k",
    [
        (6.36, 7),  # the WAN's soft cap, sqrt(4 x 10.1): rounds of 7 (five syncs), not 6 (six)
        (15.8, 16),  # the slow WAN's, sqrt(4 x 62.5): two syncs an epoch, not 15's three
        (10.1, 11),  # iid data's K* on the WAN: three syncs (a mean of 10.7), not 10's four
        (22.36, 16),  # nearer 16 than 32 in ratio (1.40 against 1.43)
        (22.7, 32),
        (62.5, 32),
        (math.inf, 32),
        (32.0, 32),
        (1.0, 1),
        (0.4, 1),
        (8.0, 8),
    ],
)
def test_a_period_is_met_by_the_k_whose_mean_round_is_nearest(period, k):
    assert epoch_k(period, 32) == k


@pytest.mark.parametrize("cut", [1, 2, 7, 15, 32, 100])
def test_no_other_k_has_a_mean_round_nearer_the_period_and_none_smaller_as_near(cut):
    for i in range(1, 400):
        period = i / 8
        k = epoch_k(period, cut)
        assert 1 <= k <= cut
        off = abs(math.log(rounds_of(k, cut) / period))
        for other in range(1, cut + 1):
            other_off = abs(math.log(rounds_of(other, cut) / period))
            assert other_off >= off - 1e-12, (period, cut, k, other)
            if other < k:  # as near: the smaller K is the one chosen (the more syncs)
                assert other_off > off + 1e-12 or rounds_of(other, cut) != rounds_of(k, cut)
        # the smallest K of that mean round: its rounds balanced
        assert k == 1 or rounds_of(k - 1, cut) != rounds_of(k, cut), (period, cut, k)


def _share(k_star: float, k_bar: float) -> float:
    """The share a window of mean round `k_bar` measured where the link's K* is `k_star`."""
    r = 0.25 * k_star / k_bar  # r_t = 0.2 / 0.8
    return r / (1.0 + r)


def test_the_direct_rule_meets_k_star_as_whole_syncs_and_says_so():
    # K* 12.6 from a window at K = 1: rounded up it is 13 (rounds of 13, 13, 6: three syncs an
    # epoch of 32, a mean of 10.7), met as whole syncs 11 (11, 11, 10: the same three, balanced)
    plain, _ = direct_sync_period(1, _share(12.6, 1), target=0.2, max_k=32)
    rounds, why = direct_sync_period(1, _share(12.6, 1), target=0.2, max_k=32, cut=32)
    assert (plain, rounds) == (13, 11)
    assert "(K 11: 3 syncs per 32 steps)" in why, why
    # lowering from 32 to a K* of 20: 20 rounded down, or the K of two syncs an epoch
    low = _share(20, 32)
    assert direct_sync_period(32, low, target=0.2, max_k=32)[0] in (19, 20)
    assert direct_sync_period(32, low, target=0.2, max_k=32, cut=32)[0] == 16


def test_a_lowering_to_the_mean_round_k_already_gives_holds():
    # K = 31 of 32 runs rounds of 31 and 1 (its window's mean round 16); a K* of 23 is under the
    # margin below 31, and 32 is nearest it: no lower K to go to, K holds (the margin reads K,
    # not its mean round: docs/design.md §6, "epoch rounds")
    k, why = direct_sync_period(31, _share(23, 16), target=0.2, max_k=32, cut=32, steps=16)
    assert k == 31 and why.startswith("hold") and "as at K=31" in why, (k, why)
    # a K* of 11 is three syncs an epoch: lowered to 11
    k, why = direct_sync_period(31, _share(11, 16), target=0.2, max_k=32, cut=32, steps=16)
    assert k == 11 and why.startswith("lower"), (k, why)


def test_a_hold_stays_within_the_ceiling_and_an_infinite_k_star_goes_to_it():
    # K above a ceiling that fell (a soft cap from a new K*): held at the ceiling, as without
    for cut in (None, 32):
        k, why = direct_sync_period(32, 0.99, target=0.2, max_k=64, ceiling=16, cut=cut)
        assert k == 16 and "at its cap 16" in why, (cut, k, why)
    # a window all sync (K* infinite) raises to the top, with epoch rounds or without
    for cut in (None, 32):
        assert direct_sync_period(4, 1.0, target=0.2, max_k=32, cut=cut)[0] == 32


def test_a_back_off_halves_k_not_its_mean_round():
    # documented: only K* and the soft cap are met as whole syncs (docs/design.md §6)
    k, why = direct_sync_period(11, 0.5, target=0.2, max_k=32, guard_reason="loss", cut=32)
    assert k == 5 and why.startswith("back off"), (k, why)


def _controller(epoch_rounds: bool) -> ExposedSyncController:
    c = ExposedSyncController(sync_period=1, rule="direct", lower=True, epoch_rounds=epoch_rounds)
    c.set_cut(32)
    c.skewed, c.link_k = True, 62.5  # the slow WAN's K* on skewed data
    return c


def test_the_soft_cap_is_met_as_whole_syncs_only_with_epoch_rounds():
    assert _controller(False).skew_ceiling() == 15  # floor(sqrt(250)): three syncs an epoch
    assert _controller(True).skew_ceiling() == 16  # two
    c = _controller(True)
    c.set_cut(None)  # no cut told: the cap as without
    assert c.skew_ceiling() == 15
    c = ExposedSyncController(sync_period=1, rule="double", epoch_rounds=True)
    c.set_cut(32)
    assert c.cut_every() is None  # the doubling rule reads no K*


def test_the_policy_factory_passes_the_option():
    options = PolicyOptions(epoch_rounds=True)
    share = POLICIES["exposed-sync"].build(1, options)
    assert isinstance(share, ExposedSyncController) and share.epoch_rounds
    composite = POLICIES["composite"].build(4, options)
    composite.set_cut(12)  # type: ignore[attr-defined]
    assert composite.share.cut == 12  # type: ignore[attr-defined]


def _first_decision(epoch_rounds: bool) -> tuple[int, str]:
    """composite's decision at its first measured boundary: K = 1, the link's K* 10.1."""
    options = PolicyOptions(epoch_rounds=epoch_rounds, k_floor=1)
    composite = POLICIES["composite"].build(1, options)
    composite.set_cut(32)  # type: ignore[attr-defined]
    decision = None
    for b in range(2):
        decision = composite.observe(
            BoundaryStats(
                boundary=b, global_step=b + 1, epoch=0, sync_period=1, interval_steps=1,
                compute_seconds=0.02, exposed_sync_seconds=0.02 * _share(10.1, 1) /
                (1 - _share(10.1, 1)), drift_norm=0.0, update_norm=1.0, drift_ratio=0.0,
                train_loss=1.0, bytes_communicated=0, lr=0.1, warmup=False,
            )
        )  # fmt: skip
    assert decision is not None
    return decision.next_sync_period, decision.reason


def test_composite_meets_the_share_rules_cap_as_whole_syncs():
    # the soft cap until skew is judged, sqrt(4 x 10.1) = 6.36: 6 rounded, 7 as whole syncs
    # (five an epoch of 32); QSR's K at the peak LR is its base, 1
    assert _first_decision(False)[0] == 6
    k, why = _first_decision(True)
    assert k == 7 and "composite (share)" in why, why


def _epoch_loop_worker(rank, world, epoch_rounds, cap):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(
        model,
        opt,
        sync_period=1,
        policy="exposed-sync",
        sync_window=2,
        link="wan",
        clock="virtual",
        compute_ms=8.0,  # a WAN sync is a few such steps: K* between the whole syncs of 12
        slowmo_beta=0,
        loss_rise=100.0,  # this tiny regression's loss is noisy: the guard is not under test
        drift_limit=1e6,
        skew_drift=0.0,  # iid shards here: K follows the link
        epoch_rounds=epoch_rounds,
    )
    if cap:
        sync.period_cap = 12  # the loop's forced boundary every 12 steps (its epoch)
    decided: list[int] = []

    class Decisions:
        def on_boundary(self, stats, decision):
            decided.append(decision.next_sync_period)

    sync.observers.append(Decisions())
    g = torch.Generator().manual_seed(100 + rank)
    try:
        for _epoch in range(4):
            for i in range(12):
                x = torch.randn(16, 8, generator=g)
                with sync.step(boundary=i == 11) as s:
                    opt.zero_grad()
                    loss = nn.functional.mse_loss(sync.model(x), x.sum(1, keepdim=True).sin())
                    loss.backward()
                    opt.step()
                    s.loss = loss
    except autok.OptionError as exc:
        return str(exc)
    finally:
        sync.close()
    return decided


@pytest.mark.dist
def test_a_users_loop_with_forced_boundaries_gets_k_as_whole_syncs_of_its_period():
    with_rounds = run_dist(_epoch_loop_worker, 2, True, True)
    without = run_dist(_epoch_loop_worker, 2, False, True)
    assert with_rounds[0] == with_rounds[1] and without[0] == without[1]
    whole = {math.ceil(12 / n) for n in range(1, 13)}  # 1, 2, 3, 4, 6, 12
    assert with_rounds[0] and set(with_rounds[0]) <= whole, with_rounds[0]
    # the same loop without epoch rounds chose a K that cuts an epoch unevenly
    assert not set(without[0]) <= whole, without[0]


@pytest.mark.dist
def test_epoch_rounds_without_a_period_cap_is_refused_on_every_rank_at_the_first_step():
    said = run_dist(_epoch_loop_worker, 2, True, False)
    assert said[0] == said[1] and isinstance(said[0], str), said
    assert said[0].startswith("epoch_rounds:") and "period_cap" in said[0], said[0]


def test_a_raise_to_the_mean_round_k_already_gives_holds_and_says_why():
    # 32 steps at K = 1: a K* of 1.3 is nearer K = 1's mean round (1) than K = 2's (2)
    share = 0.2 * 1.3 / (0.8 + 0.2 * 1.3)
    k, why = direct_sync_period(1, share, target=0.2, max_k=32, cut=32)
    assert k == 1 and "as at K=1" in why and "cap" not in why, why
    assert direct_sync_period(1, share, target=0.2, max_k=32)[0] == 2  # rounded up without
