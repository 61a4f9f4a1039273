"""`Sync.sync_now()`: a boundary between steps (the epoch's end, before evaluation or a checkpoint),
after which every rank holds identical parameters (docs/design.md §3, Public API). It is
unscheduled: it averages and takes no outer step (docs/design.md §2, "Unscheduled syncs"). A
function of the Sync, as ddp_path.py's and in_flight.py's are: the class keeps the step's state
machine and the boundary's order of work, which this calls (`Sync._boundary`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from autok.trainer.engine.averaging import reconcile_buffers
from autok.trainer.engine.fragments import WHOLE
from autok.trainer.engine.in_flight import finish_in_flight
from autok.trainer.engine.profiler import Interval
from autok.trainer.engine.step import CLOSED

if TYPE_CHECKING:
    from autok.trainer.engine.sync import Sync


def boundary_now(sync: Sync) -> float:
    """A boundary now, outside any step; returns this rank's seconds spent (`Sync.sync_now`)."""
    if sync._in_step is not None:
        if sync._in_step is CLOSED:
            raise RuntimeError("sync.sync_now() after sync.close(): the replicas agree")
        raise RuntimeError("sync.sync_now() inside sync.step(): call it between steps")
    # under --clock virtual the seconds spent are the booked ones (docs/design.md §4)
    now = time.perf_counter if sync.virtual is None else sync.virtual.now
    t0 = now()
    if sync.clock is not None:  # between steps: the position of the next one
        sync.link_name = sync.clock.move_to(sync.global_step, sync.epoch).name
    elif sync.virtual is not None:
        sync.link_name = sync.virtual.move_to(sync.global_step, sync.epoch).name
    if sync._pending is not None:
        # With no step closed since the boundary launched it, θ_i is θ_sent: θ_new is
        # written as is (settled); otherwise the steps taken meanwhile are kept.
        settle = sync._pending.age == 0
        sync._interval.exposed_sync_seconds += finish_in_flight(sync, settle)
    if sync.averager is None or (
        sync._interval.steps == 0 and sync.averager.last_fragment == WHOLE
    ):
        # Nothing open: replicas already agree (the last boundary moved the whole model).
        # ddp has no averaging collective to carry buffers, so they are reconciled here.
        if sync.averager is None and sync.float_buffers and sync.options.buffer_policy != "local":
            reconcile_buffers(
                sync.float_buffers,
                sync.options.buffer_policy,
                sync.rank,
                sync.world_size,
                sync.clock,
            )
            sync.collectives += 1
        return now() - t0
    k = sync.k_in_force
    lr = sync.optimizer.param_groups[0]["lr"]
    # unscheduled: averages, injects no outer momentum (docs/design.md §2)
    carried = sync._boundary(sync._interval, k, lr, boundary_step=False, due=None)
    sync._interval = Interval(exposed_sync_seconds=carried)
    return now() - t0
