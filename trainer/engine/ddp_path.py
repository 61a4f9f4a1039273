"""ddp's boundary, which comes at every step (docs/design.md §4, Per step): its record written out
rather than through the general path, and, where nobody reads the record now and the guard has
nothing to judge, kept as its values and built only if `Sync.last_boundary` is read. ddp's replicas
never drift and no averaging collective carries reduced scalars, so the record holds this rank's
own timing and loss. Functions of the Sync: the step state machine stays in sync.py, the speed
work beside it here, behind DdpKept's named fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from autok.controllers.base import BoundaryStats
from autok.trainer.engine.divergence import params_finite
from autok.trainer.engine.k_path import add_to_path
from autok.trainer.engine.loss_sum import LossSum, read_held
from autok.trainer.engine.observer import emit
from autok.trainer.engine.profiler import Interval

if TYPE_CHECKING:
    from autok.trainer.engine.step import Step
    from autok.trainer.engine.sync import Sync

# ddp has a boundary every step, and judging the parameters finite costs three ops and a host
# sync (params_finite: 72-130 µs on the cnn1d at the end of a step on this 2-core machine,
# against a 1.4-3 ms step; more on a large model): ddp judges them at every
# DDP_PARAM_CHECK_EVERY-th boundary and at every forced (epoch-end) one, so a divergence is
# caught at most that many steps late (64 steps, about 0.1-0.2 s of the cnn1d; at 16 the check
# cost 5-8 µs a step, docs/design.md §3). Its other checks (drift, update) are zero by construction.
DDP_PARAM_CHECK_EVERY = 64


class DdpKept(NamedTuple):
    """A ddp boundary's record as kept at its close, before its loss is read (`Sync._lazy_record`).
    A NamedTuple, not a slots dataclass: the fast close builds it at every step as a plain tuple in
    this order (tests/test_hot_path.py), which `ddp_stats` reads by these names."""

    steps: int  # the interval's optimizer steps
    loss: Any  # a LossSum (ddp_boundary) or the held (tensor, version) pairs (close_ddp_lazily)
    boundary: int
    global_step: int
    epoch: int
    sync_period: int
    compute_seconds: float
    exposed_sync_seconds: float
    grad_bytes: int
    lr: Any  # the step's LR as the group held it (a tensor LR too): a number once read
    warmup: bool
    samples: int  # this rank's
    grad_syncs: int
    link: str


def ddp_boundary(sync: Sync, interval: Interval, k: int, lr: float, forced: bool) -> None:
    """ddp's record, every step: written out rather than through the general path, whose
    dictionaries and checks ddp would pay at every step (docs/design.md §4, Per step). ddp's
    replicas never drift, and no averaging collective carries reduced scalars, so the record
    holds this rank's own timing and loss. The guard judges the parameters, which the averaged
    gradients keep identical on every rank, at every DDP_PARAM_CHECK_EVERY-th and every forced
    boundary; its other checks (drift, update, a rank-local loss) cannot fire on ddp. Where
    nobody reads the record now, its loss is read only if the record is (`last_boundary`)."""
    if sync.observers:
        emit(
            sync.observers,
            "on_local_interval",
            interval.compute_seconds,
            interval.exposed_sync_seconds,
        )
    kept = DdpKept(
        steps=interval.steps,
        loss=sync._loss,
        boundary=sync.boundary,
        global_step=sync.global_step,
        epoch=sync.epoch,
        sync_period=k,
        compute_seconds=interval.compute_seconds,
        exposed_sync_seconds=interval.exposed_sync_seconds,
        grad_bytes=interval.grad_bytes,
        lr=lr,
        warmup=sync.warmup,
        samples=interval.samples,
        grad_syncs=interval.grad_syncs,
        link=sync.link_name,
    )
    judge = forced or sync.boundary % DDP_PARAM_CHECK_EVERY == 0
    if judge or sync.observers or sync.last_decision is None:
        # the modelled wait for a slower rank (docs/design.md §4), since the last record built:
        # a lazily kept one below leaves it for the next
        peer = sync.virtual.take_peer_wait(own=True) if sync.virtual is not None else 0.0
        stats = ddp_stats(kept, sync._loss.take(), sync.world_size, peer)
        finite = not judge or params_finite(sync._params)
        sync._close_boundary(stats, k, interval.steps, params_finite=finite, judge=judge)
        return
    # Nobody reads this record now and the guard has nothing to judge; ddp's controller is
    # `fixed` (the options allow no other), so its decision stands. The record is kept as
    # its values, its loss unread, and built if `last_boundary` is read.
    sync._lazy_record, sync._loss = kept, LossSum()
    seconds = interval.compute_seconds + interval.exposed_sync_seconds
    add_to_path(sync.k_path, k, seconds, 1, interval.steps)
    sync.sync_period = sync.last_decision.next_sync_period
    sync.boundary += 1


def ddp_stats(
    values: tuple, loss_sum: float, world_size: int, peer_wait: float = 0.0
) -> BoundaryStats:
    """A ddp boundary's record from the values kept at its close (`ddp_boundary`,
    `close_ddp_lazily`: a DdpKept, or a plain tuple in its order), with the interval's loss sum
    read from what `kept.loss` held."""
    kept = DdpKept._make(values)  # (the fast close keeps a plain tuple in DdpKept's order)
    return BoundaryStats(
        boundary=kept.boundary,
        global_step=kept.global_step,
        epoch=kept.epoch,
        sync_period=kept.sync_period,
        interval_steps=kept.steps,
        compute_seconds=kept.compute_seconds,
        exposed_sync_seconds=kept.exposed_sync_seconds,
        drift_norm=0.0,  # ddp's replicas never drift
        update_norm=0.0,
        drift_ratio=0.0,
        train_loss=loss_sum / kept.steps,
        bytes_communicated=kept.grad_bytes,
        lr=float(kept.lr),  # (read per step as the group holds it, perhaps a tensor)
        warmup=kept.warmup,
        samples=kept.samples * world_size,  # DistributedSampler: equal samples per rank
        grad_syncs=kept.grad_syncs,
        param_syncs=0,
        link=kept.link,
        peer_wait_seconds=peer_wait,
    )


def close_ddp_lazily(
    sync: Sync, state: Step, interval: Interval, compute: float, wait: float, grad_synced: bool
) -> bool:
    """ddp's step (a boundary of one step) where nobody reads its record now and the guard has
    nothing to judge: `ddp_boundary`'s lazy branch, written out for the hot path (docs/design.md
    §4, Per step): the record kept as one plain tuple of its values in DdpKept's order (a named
    construction would cost a call and a frame at every step), the K path's sums kept as two
    numbers (`k_path` folds them in), the loss held as LossSum holds a CPU scalar but no LossSum
    made per step; LossSum's test of what it holds is inlined (each call is paid at every step;
    tests/test_hot_path.py counts the bytecodes). False, with nothing changed, where the general
    path must run: observers, no decision yet, a boundary the guard judges, an interval of more
    than this step, or a loss LossSum would not hold as it is. A boundary at an interval's first
    step has K = 1 in force (ddp's options allow no other K). `last_boundary` builds the record
    from what is kept."""
    acc = sync._loss  # anything added since the sum started: a restored state's
    if (
        sync.observers
        or sync.last_decision is None
        or not state.is_boundary  # (never on ddp, whose K is 1)
        or interval.steps  # (never on ddp either: K = 1 is this close's assumption)
        or state._last_of_epoch
        or sync.boundary % DDP_PARAM_CHECK_EVERY == 0
        or acc.held
        or acc.number
        or acc.device_sum is not None
    ):
        return False
    loss = state.loss
    if loss is None:
        held = []
    elif isinstance(loss, torch.Tensor) and loss.is_cpu and not loss.dim() and loss._base is None:
        t = loss.detach()  # as LossSum.add holds it: keep the two tests the same
        held = [(t, t._version)]
    else:
        return False
    gs = sync.grad_state
    compute += interval.compute_seconds
    exposed = interval.exposed_sync_seconds + wait
    sync._lazy_record = (  # DdpKept's fields, in its order
        1,  # the interval's steps
        held,
        sync.boundary,
        sync.global_step,
        sync.epoch,
        1,  # K
        compute,
        exposed,
        interval.grad_bytes + gs.nbytes,
        state._lr,
        sync.warmup,
        interval.samples,
        interval.grad_syncs + grad_synced,
        sync.link_name,
    )
    sync._k1_seconds += compute + exposed
    sync._k1_boundaries += 1  # each of one step
    sync.collectives += gs.buckets
    sync.boundary += 1
    sync.global_step += 1
    # the next interval: this one emptied in place, as Interval() makes it (its steps are 0
    # already), without that frame at every step; nothing else holds it
    interval.compute_seconds = interval.exposed_sync_seconds = interval.loss_sum = 0.0
    interval.grad_bytes = interval.samples = interval.grad_syncs = 0
    return True


def read_kept(values: tuple, world_size: int) -> BoundaryStats:
    """The record of a ddp boundary kept unread (`Sync.last_boundary`), its loss read now."""
    loss = DdpKept._make(values).loss
    total = loss.take() if isinstance(loss, LossSum) else read_held(loss)
    return ddp_stats(values, total, world_size)
