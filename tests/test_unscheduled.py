"""Unscheduled syncs inject no outer momentum (docs/design.md §2, "Unscheduled syncs"): a
`sync_now()`, or an epoch end the schedule did not make due, sets the replicas to their average
and leaves θ_ref, the velocity and a torch optimizer's state as they were; at an epoch end where
a fragment is due, that fragment alone takes its outer step. Real gloo, world 2."""

from __future__ import annotations

import pytest
import torch

from tests.dist import run_dist

pytestmark = pytest.mark.dist


def _sgd_nesterov(params):
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


# (name, Sync options, steps before the syncs): mid-interval (K = 3, 5 steps), and with fragments
# right after a fragment sync (K = 4, F = 2: fragment 1 at steps 2 and 6) and mid-round
_CASES = {
    "slowmo": ({"slowmo_beta": 0.5, "sync_period": 3}, 5),
    "nesterov": ({"outer_optimizer": "nesterov", "sync_period": 3}, 5),
    "sgd": ({"outer_optimizer": "sgd", "outer_momentum": 0.9, "sync_period": 3}, 5),
    "factory": ({"outer_optimizer": _sgd_nesterov, "sync_period": 3}, 5),
    "nesterov-fragments": ({"outer_optimizer": "nesterov", "sync_period": 4, "fragments": 2}, 6),
    "slowmo-fragments-mid": ({"slowmo_beta": 0.5, "sync_period": 4, "fragments": 2}, 7),
}


def _outer_state(sync) -> list[torch.Tensor]:
    """θ_ref, the velocity and a torch outer optimizer's tensors, as copies."""
    state = sync.averager.state_dict()
    out = [state["ref"].clone()]
    if state["velocity"] is not None:
        out.append(state["velocity"].clone())
    for per_param in state.get("outer", {}).get("state", {}).values():
        out += [t.clone() for t in per_param.values() if isinstance(t, torch.Tensor)]
    return out


def _sync_now_worker(rank, world):
    """Every rank trains on the same batches, so the replicas stay identical: an unscheduled
    sync then has nothing to do, and must do nothing."""
    import autok
    from tests.test_api import _batches, _flat, _model, _train

    out = {}
    for name, (options, steps) in _CASES.items():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sync = autok.Sync(model, opt, strategy="localsgd", link="none", **options)
        _train(sync, opt, _batches(0, steps))  # rank 0's data on every rank
        before, state = _flat(model).clone(), _outer_state(sync)
        sync.sync_now()
        once = _flat(model).clone()
        sync.sync_now()
        out[name] = {
            "moved_velocity": state[1:] and any(t.abs().sum() > 0 for t in state[1:]),
            "once": torch.equal(once, before),
            "twice": torch.equal(_flat(model), before),
            "state": all(torch.equal(a, b) for a, b in zip(state, _outer_state(sync), strict=True)),
        }
        sync.close()
    return out


def test_sync_now_twice_leaves_the_parameters_and_the_outer_state_unchanged():
    """`sync_now(); sync_now()` on identical replicas changes no parameter, bit for bit, for
    SlowMo β > 0, nesterov, sgd with momentum, a torch optimizer factory and with fragments,
    and leaves θ_ref and the outer optimizer's state untouched. Before, each sync_now applied
    a full outer step: a velocity v moved every parameter by α·μ²·v (nesterov) even where
    nothing had drifted."""
    for res in run_dist(_sync_now_worker, 2):
        for name, got in res.items():
            assert got["moved_velocity"], name  # there was momentum to inject
            assert got["once"] and got["twice"], (name, got)
            assert got["state"], (name, got)


def _epoch_end_worker(rank, world, epoch_steps):
    """localsgd, outer nesterov, K = 4, F = 2 (fragment 1 syncs at steps 2 and 6, fragment 0 at
    4 and 8), each rank its own data; the last step of the epoch is the loop's forced boundary,
    taken at LR 0 so that it moves nothing itself. Returns the parameters before and after it,
    the fragments' bounds, and whether θ_ref and the velocity moved outside the due fragment."""
    import torch.distributed as dist

    import autok
    from tests.test_api import _batches, _flat, _model

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(
        model,
        opt,
        strategy="localsgd",
        link="none",
        outer_optimizer="nesterov",
        sync_period=4,
        fragments=2,
    )
    batches = _batches(rank, epoch_steps)
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1
        if last:
            for g in opt.param_groups:
                g["lr"] = 0.0
            before = _flat(model).clone()
            state = _outer_state(sync)
        with sync.step(boundary=last) as s:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(sync.model(x), y)
            loss.backward()
            opt.step()
            s.loss = loss
    both = [torch.empty_like(before) for _ in range(world)]
    dist.all_gather(both, before)  # test-only collective: what the replicas held
    return {
        "before": before,
        "after": _flat(model),
        "mean": (both[0] + both[1]) / 2,  # gloo's sum of two, then / 2: the engine's arithmetic
        "bounds": sync.averager.bounds,
        "state_before": state,
        "state_after": _outer_state(sync),
    }


def test_an_epoch_end_does_not_move_a_fragment_synced_the_step_before():
    """An epoch of 7 steps: fragment 1 synced at step 6, and the epoch end at step 7 is due for
    nothing. Fragment 1 stays bit for bit where step 6 left it (before: it moved by α·μ²·v),
    fragment 0 becomes the replicas' mean exactly, and θ_ref and the velocity are untouched."""
    for res in run_dist(_epoch_end_worker, 2, 7):
        (a0, b0), (a1, b1) = res["bounds"]
        assert torch.equal(res["after"][a1:b1], res["before"][a1:b1])
        assert torch.equal(res["after"][a0:b0], res["mean"][a0:b0])
        assert not torch.equal(res["before"][a0:b0], res["mean"][a0:b0])  # fragment 0 drifted
        for was, now in zip(res["state_before"], res["state_after"], strict=True):
            assert torch.equal(was, now)


def test_an_epoch_end_where_a_fragment_is_due_steps_that_fragment_only():
    """An epoch of 8 steps: step 8 is fragment 0's scheduled sync, and the forced whole-model
    sync there takes fragment 0's outer step (its θ_ref and velocity move, and it ends away
    from the plain mean) while fragment 1, synced at step 6, is only averaged."""
    for res in run_dist(_epoch_end_worker, 2, 8):
        (a0, b0), (a1, b1) = res["bounds"]
        assert torch.equal(res["after"][a1:b1], res["mean"][a1:b1])
        assert not torch.allclose(res["after"][a0:b0], res["mean"][a0:b0])  # the outer step
        ref_was, vel_was = res["state_before"]
        ref_now, vel_now = res["state_after"]
        assert torch.equal(ref_now[a1:b1], ref_was[a1:b1])
        assert torch.equal(vel_now[a1:b1], vel_was[a1:b1])
        assert torch.equal(ref_now[a0:b0], res["after"][a0:b0])  # θ_ref ← θ_new: stepped
        assert not torch.equal(vel_now[a0:b0], vel_was[a0:b0])
