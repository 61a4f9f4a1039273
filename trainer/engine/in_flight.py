"""An average in flight (docs/design.md §2): launched at a boundary and applied at once, or,
delayed (--fragment-delay, --overlap-boundary), `delay` closed steps later; saved with the engine's
state so that a resume applies it at the step it would have been. `fields_at_launch` gives the
boundary's record as known at launch; `finish_in_flight` applies the average and builds the record
with what the collective reduced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autok.controllers.base import BoundaryStats
from autok.trainer.engine.boundary_form import choose_boundary_form
from autok.trainer.engine.pending import Pending, pending_state, restore_pending

if TYPE_CHECKING:
    from autok.trainer.engine.averaging import ParameterAverager
    from autok.trainer.engine.profiler import Interval
    from autok.trainer.engine.sync import Sync


@dataclass(slots=True)
class InFlight:
    """A delayed averaging: launched at a boundary, applied `delay` closed steps later."""

    pending: Pending
    common: dict[str, Any]  # the boundary's BoundaryStats fields known at launch
    grad_bytes: int
    sync_period: int  # the K of the interval it closed
    steps: int
    delay: int
    age: int = 0  # steps closed since it was launched

    def state_dict(self, averager: ParameterAverager) -> dict[str, Any]:
        """Saved with its reduced buffer (the averager's part), in plain types."""
        return {
            "averager": pending_state(averager, self.pending),
            "common": self.common,
            "grad_bytes": self.grad_bytes,
            "sync_period": self.sync_period,
            "steps": self.steps,
            "delay": self.delay,
            "age": self.age,
        }

    @classmethod
    def from_state(cls, averager: ParameterAverager, saved: dict[str, Any]) -> InFlight:
        """The averaging `state_dict` saved, launched again (already checked:
        trainer/engine/state_check.py, check_pending)."""
        return cls(
            pending=restore_pending(averager, saved["averager"]),
            common=dict(saved["common"]),
            grad_bytes=saved["grad_bytes"],
            sync_period=saved["sync_period"],
            steps=saved["steps"],
            delay=saved["delay"],
            age=saved["age"],
        )


def fields_at_launch(
    sync: Sync, interval: Interval, k: int, lr: float, fragment: int, last_step: int
) -> dict[str, Any]:
    """The BoundaryStats fields of an averaging boundary known when it launches (`InFlight.common`;
    `finish_in_flight` adds what the collective reduced). A dict, not a record of its own: it is
    saved as it is with an average in flight (`InFlight.state_dict`)."""
    return {
        "boundary": sync.boundary,
        "global_step": last_step,  # the interval's last step (docs/design.md §7)
        "epoch": sync.epoch,
        "sync_period": k,
        "interval_steps": interval.steps,
        "lr": lr,
        "warmup": sync.warmup,
        "link": sync.link_name,
        # DistributedSampler gives every rank equally many samples per step.
        "samples": interval.samples * sync.world_size,
        "grad_syncs": interval.grad_syncs,
        "param_syncs": int(sync.averager is not None),
        "fragment": fragment,
        # the interval's peer wait: booked on the virtual clock, 0 on the wall clock
        "peer_wait_seconds": sync.virtual.take_peer_wait() if sync.virtual is not None else 0.0,
    }


def age_in_flight(sync: Sync, is_boundary: bool, interval: Interval, synced: float) -> float:
    """A step closed with an average in flight (`sync._pending`): it is applied `delay` local
    steps after its sync started, or earlier when the next boundary comes first (a K lowered
    below τ·F, an epoch's end). Returns the step's exposed sync `synced` with the seconds its
    finishing took added (the interval's, and the step's `last_step`, too)."""
    flight = sync._pending
    assert flight is not None  # (its caller checks)
    flight.age += 1
    if flight.age >= flight.delay or is_boundary:
        finish = finish_in_flight(sync)
        interval.exposed_sync_seconds += finish
        synced += finish
        last = sync._last_step  # the step's times, as `Sync._close_step` set them
        if isinstance(last, tuple):
            sync._last_step = (*last[:3], synced, *last[4:])
        else:  # an observer read `sync.last_step` while the average finished: already built
            last.sync_seconds = synced
    return synced


def finish_in_flight(sync: Sync, settle: bool = False) -> float:
    """Complete the launched averaging (`sync._pending`) and close its boundary with its record;
    return the seconds this rank spent waiting for it and applying it. `settle`: no step since it
    was launched (sync_now): θ_new exactly."""
    flight, sync._pending, averager = sync._pending, None, sync.averager
    # its callers check that an averaging, which only an averager launches, is in flight
    assert flight is not None and averager is not None
    pending = flight.pending
    rec = averager.finish(pending, settle=settle)
    if sync._probing and rec.grads_checked:
        choose_boundary_form(sync, rec)
    finish_seconds = rec.wall_seconds - pending.seconds
    if sync.virtual is not None:  # the wait for what _boundary booked (trainer/engine/clock.py)
        finish_seconds = sync.virtual.wait(sync.virtual.booked)
    stats = BoundaryStats(
        **flight.common,
        compute_seconds=rec.compute_seconds,
        exposed_sync_seconds=rec.exposed_sync_seconds,
        drift_norm=rec.drift_norm,
        update_norm=rec.update_norm,
        drift_ratio=rec.drift_norm / rec.update_norm if rec.update_norm > 0 else 0.0,
        train_loss=rec.train_loss,
        bytes_communicated=flight.grad_bytes + rec.nbytes,
    )
    sync._close_boundary(stats, flight.sync_period, flight.steps)
    return finish_seconds
