"""The engine's state: what `Sync.state_dict()` saves and `Sync.load_state_dict()` checks whole,
then applies (docs/design.md §3, Public API; §5, resume). A refused state leaves the Sync as it
was: every check runs before anything is applied (trainer/engine/state_check.py). Functions of the
Sync rather than its methods, so that the class holds the step and the boundary alone; `Sync._kind`
and `Sync._check_state` stay methods, which autok.Sync extends."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from autok.controllers import RAN_BEFORE, reads, revision, revision_problem
from autok.trainer.engine.boundary_form import BOUNDARY_FORMS, boundary_form, restore_boundary_form
from autok.trainer.engine.in_flight import InFlight
from autok.trainer.engine.loss_sum import LossSum
from autok.trainer.engine.options import OptionError
from autok.trainer.engine.profiler import Interval
from autok.trainer.engine.state_check import (
    BadState,
    check_averager,
    check_counters,
    check_link,
    check_pending,
    k_values,
    loads_into_copy,
)

if TYPE_CHECKING:
    from autok.trainer.engine.sync import Sync


def engine_state(sync: Sync) -> dict[str, Any]:
    """Everything the engine needs to continue exactly (this rank's part): SlowMo reference
    and velocity, the controller, the divergence guard, the link's jitter stream, counters
    and the open interval. Plain tensors, numbers and lists (loads with weights_only)."""
    in_flight = None
    if sync._pending is not None:
        # A delayed average (--fragment-delay, --overlap-boundary) is saved with its reduced
        # buffer, and is applied after a resume at the step it would have been.
        in_flight = sync._pending.state_dict(sync._the_averager())
    return {
        "kind": sync._kind(),
        "pending": in_flight,
        "averager": sync.averager.state_dict() if sync.averager else None,
        "controller": sync.controller.state_dict(),
        "divergence": sync.divergence.state_dict(),
        "link": sync.clock.state_dict() if sync.clock else None,
        "virtual": sync.virtual.state_dict() if sync.virtual else None,
        "counters": {
            "sync_period": sync.sync_period,
            "fragment_position": sync._position,
            "global_step": sync.global_step,
            "boundary": sync.boundary,
            "grad_syncs": sync.grad_syncs,
            "param_syncs": sync.param_syncs,
            "collectives": sync.collectives,
            "k_path": sync.k_path,
            "interval": {f.name: getattr(sync._interval, f.name) for f in fields(Interval)},
            **sync._loss.state_dict(),  # loss_sum, loss_held
            "boundary_form": boundary_form(sync),
        },
    }


def load_engine_state(sync: Sync, state: dict[str, Any]) -> None:
    """Call after the model's own state is loaded. Saved at a boundary (an empty interval),
    the replica check's digest is taken from the loaded weights, so replicas resumed from
    differing files are caught at the first boundary; saved mid-interval, the replicas
    rightly differ, and the digest of the last boundary is restored instead. A state that
    is not this kind of engine's (another strategy, policy, world size, outer optimizer,
    compression or fragments) raises an OptionError naming what differs, and a state with
    any value of the wrong type, range or shape one naming its key
    (trainer/engine/state_check.py):
    checked whole before any of it is applied, so a refused state leaves the Sync as it
    was."""
    if why := foreign(sync, state):
        raise OptionError(f"load_state_dict: {why}")
    try:
        sync._check_state(state)
    except BadState as exc:
        raise OptionError(f"load_state_dict: {exc}") from None
    c = state["counters"]
    form = c.get("boundary_form")  # absent from states saved before auto's check
    if form is not None and form not in BOUNDARY_FORMS:
        raise OptionError(
            f"load_state_dict: counters.boundary_form: {str(form)[:20]!r}; one of "
            f"{', '.join(BOUNDARY_FORMS)}"
        )
    in_flight = state.get("pending")
    if sync.averager is not None:
        # (with an average in flight, the digest is the one it carries: not recomputed)
        at_boundary = c["interval"]["steps"] == 0 and in_flight is None
        sync.averager.load_state_dict(state["averager"], recompute_digest=at_boundary)
    sync._pending = None
    if in_flight is not None:
        sync._pending = InFlight.from_state(sync._the_averager(), in_flight)
    sync.controller.load_state_dict(state["controller"])
    sync.divergence.load_state_dict(state["divergence"])
    if sync.clock is not None and state["link"] is not None:
        sync.clock.load_state_dict(state["link"])
    if sync.virtual is not None and state.get("virtual") is not None:
        sync.virtual.load_state_dict(state["virtual"])
    sync.sync_period = c["sync_period"]
    sync._position = c.get("fragment_position", 1)  # absent before fragments existed
    sync.global_step, sync.boundary = c["global_step"], c["boundary"]
    sync.grad_syncs, sync.param_syncs = c["grad_syncs"], c["param_syncs"]
    sync.collectives = c.get("collectives", 0)  # absent from checkpoints before it existed
    sync.k_path = {int(k): dict(v) for k, v in c["k_path"].items()}
    sync._interval = Interval(**c["interval"])
    sync._last_boundary = sync._lazy_record = None  # the record before the load is not this
    sync._loss = LossSum()
    sync._loss.load_state_dict(c)  # loss_held: absent from states saved before it
    if form is not None and sync._auto:
        restore_boundary_form(sync, form)


def engine_kind(sync: Sync) -> dict[str, Any]:
    """What a saved state must match to load here (checked by load_state_dict)."""
    return {
        "strategy": sync.options.strategy,
        "policy": sync.options.policy,
        "world_size": sync.world_size,
        "numel": sync.averager.numel if sync.averager is not None else None,
        # the settings that shape the averager's state: its velocity, residual, fragments
        "outer_optimizer": sync.options.outer.kind,
        "compress": sync.options.compress,
        "fragments": sync.options.fragments,
        # strided lays θ_ref, the velocity and the residuals out fragment by fragment
        "fragment_by": sync.options.fragment_by,
        "clock": sync.options.clock,  # a virtual time line continues only a virtual one
        # the K floor (none: 1), which under Adam's family moved from 1 to 2 (k_floor.py)
        "k_floor": sync.options.k_floor or 1,
        # the faster-link check, moved from off to 3 (docs/design.md §6, "a faster link"); a
        # policy that does not read it records it off, as every state saved before it did
        "link_drop": sync.options.link_drop if reads(sync.options.policy, "link_drop") else 0.0,
        # skew cleared at the first decision, moved from off to 0.5 (docs/design.md §6, "skew
        # cleared early"); recorded as link_drop is
        "skew_clear": sync.options.skew_clear if reads(sync.options.policy, "skew_clear") else 0.0,
        # the revision of the policy's rule (docs/design.md §6, "the rule's revision"); a state
        # saved before it was recorded ran 0 (KIND_BEFORE)
        "policy_revision": revision(sync.options.policy),
    }


def check_engine_state(sync: Sync, state: dict[str, Any]) -> None:
    """Every part of a saved state against this engine (trainer/engine/state_check.py); raises
    BadState naming the first fault. Applies nothing."""
    check_counters(state["counters"], sync.options.strategy, sync.options.fragments)
    if sync.averager is not None:
        check_averager(state["averager"], sync.averager, sync.options)
    if state.get("pending") is not None:
        check_pending(state["pending"], sync.averager)
    k_values(state["controller"], "controller")
    loads_into_copy(sync.controller, state["controller"], "controller")
    loads_into_copy(sync.divergence, state["divergence"], "divergence", optional=("first",))
    if sync.clock is not None and state["link"] is not None:
        check_link(state["link"])
    if sync.virtual is not None and state.get("virtual") is not None:
        try:
            sync.virtual.check_state(state["virtual"])
        except ValueError as exc:
            raise BadState(str(exc)) from None


def foreign(sync: Sync, state: Any) -> str | None:
    """Why `state` is not a state this kind of engine saved (its shape, its strategy, the settings
    `Sync._kind` names), or None."""
    if not isinstance(state, dict):
        return f"expected the dict sync.state_dict() returns, got {type(state).__name__}"
    keys = ("counters", "averager", "controller", "divergence", "link")
    if missing := [k for k in keys if k not in state]:
        return f"not an autok.Sync state (no {missing[0]!r})"
    if (state["averager"] is None) != (sync.averager is None):
        saved = "ddp (no parameter averaging)" if state["averager"] is None else "averaging"
        return f"saved by {saved}; this Sync's strategy is {sync.options.strategy}"
    kind = state.get("kind")  # absent from states saved before it was recorded
    if isinstance(kind, dict):
        mine = sync._kind()
        for k, v in mine.items():
            saved = kind.get(k, KIND_BEFORE.get(k, v))
            if k in RAN_BEFORE and not _ratio(saved):
                return f"saved with {k} {saved!r}, not a number >= 0: not a state autok saved"
            if k == "policy_revision":  # judged as every recorded revision is: a count
                if saved is None or revision_problem(sync.options.policy, saved) is not None:
                    return (
                        f"saved with {k} {saved!r}; this Sync has {v!r} (another revision of "
                        "its K policy's rule: continue it with the autok that saved it)"
                    )
            elif saved != v:
                hint = f" (pass {k}={saved} to continue it)" if k in RAN_BEFORE else ""
                return f"saved with {k} {saved!r}; this Sync has {v!r}{hint}"
    return None


def _ratio(x: object) -> bool:
    """A finite number >= 0 (not a bool): what a K floor or a link ratio was saved as."""
    return isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < math.inf


# What a state saved before a key of `engine_kind` existed had: the only value there was then.
# A state saved before the rule's revision was recorded ran revision 0 (docs/design.md §6).
KIND_BEFORE = {"fragment_by": "element", "policy_revision": 0, **RAN_BEFORE}
