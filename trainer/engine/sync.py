"""`Sync`: CPDP in any training loop (docs/design.md §3, Public API). The engine; the built-in loop
is one client.

    sync = Sync(model, optimizer, strategy="cpdp", sync_period=4, policy="exposed-sync")
    for x, y in loader:
        with sync.step() as s:        # local step or boundary; no_sync() on local steps
            loss = loss_fn(sync.model(x), y)
            loss.backward()
            optimizer.step()          # or scaler.step(optimizer)
            optimizer.zero_grad()
            s.loss = loss             # optional; a tensor is fine (no host sync per step)
    sync.sync_now()                   # a boundary now: replicas identical
    sync.close()

One `sync.step()` is one optimizer step for K, whatever happens inside it (GradScaler may skip
the update): every rank counts the same steps, so ranks always agree on where boundaries are
(pytorch#76282). The step's clock points come from `sync.model`'s forward (its end) and hooks,
so the loop stays the user's: an optimizer step pre-hook (end of backward: the exposed gradient
wait is measured there, and a fused boundary captures g_i) and post-hook.

Data flow is one way (docs/design.md §3): at a boundary the strategy's collective returns the
reduced statistics; the controller turns them into a SyncDecision; the engine applies it from the
next interval and hands stats + decision to the observers (sinks, exporters, user callbacks).

`Sync` holds the step's state machine and the boundary's order of work; its parts live beside it
(docs/design.md §3, the module table): the step object and the reports that time it (step.py),
ddp's boundary and fast close (ddp_path.py), an average in flight and its record (in_flight.py),
auto's boundary form (boundary_form.py), a boundary between steps (sync_now.py), the K path
(k_path.py), the saved state (resume.py), the arguments' checks and what the constructor builds
(build.py), and the observers (observer.py).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from autok.controllers.base import BoundaryStats, KnowsCuts, SyncDecision
from autok.trainer.engine.averaging import IntervalTotals, ParameterAverager
from autok.trainer.engine.build import build_parts, check_arguments
from autok.trainer.engine.ddp_path import close_ddp_lazily, ddp_boundary, read_kept
from autok.trainer.engine.divergence import Diverged, Rollback
from autok.trainer.engine.fragments import WHOLE, fragment_gap
from autok.trainer.engine.grad_watch import UNCHECKED
from autok.trainer.engine.in_flight import (
    InFlight,
    age_in_flight,
    fields_at_launch,
    finish_in_flight,
)
from autok.trainer.engine.k_path import KPath, add_to_path
from autok.trainer.engine.loss_sum import LossSum
from autok.trainer.engine.observer import emit
from autok.trainer.engine.options import OptionError, SyncOptions
from autok.trainer.engine.profiler import T1, T2, T3, Interval
from autok.trainer.engine.resume import (
    check_engine_state,
    engine_kind,
    engine_state,
    load_engine_state,
)
from autok.trainer.engine.step import (
    CLOSED,
    Step,
    StepTimes,
    device_times,
    install_reports,
    lr_now,
    micro_step,
    release_reports,
    virtual_times,
)
from autok.trainer.engine.sync_now import boundary_now


class Sync:
    """The engine in a user's loop. Needs an initialized process group."""

    # ddp's fast close's K = 1 sums, folded into k_path when it is read (set by its setter)
    _k1_seconds: float
    _k1_boundaries: int

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        device: torch.device | None = None,
        observers: list[Any] | None = None,
        peak_lr: float | None = None,
        options: SyncOptions | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """`kwargs` are the options (the sync flags of `autok train`, same names and defaults),
        validated here; or pass `options`, already validated (e.g. the CLI's TrainConfig).
        `ddp_kwargs`: DDP's own arguments a model may need (trainer/engine/options.py,
        DDP_KWARGS_TAKEN), e.g. find_unused_parameters for a model with unused parameters.
        Every argument is checked before anything is built (trainer/engine/build.py)."""
        checked = check_arguments(model, optimizer, observers, options, ddp_kwargs, kwargs, peak_lr)
        self.options: SyncOptions = checked.options
        self.optimizer, self.module = optimizer, model
        p = build_parts(model, optimizer, checked, device)
        self.rank, self.world_size, self.device = p.rank, p.world_size, p.device
        self.strategy, self.model, self.averager = p.strategy, p.model, p.averager
        # auto's boundary form, and the check it needs (trainer/engine/boundary_form.py)
        self._probing = self._auto = p.auto
        self._fused = self.strategy.fused_gradients  # (asked at every step)
        self._watch = p.watch
        self.now, self._marks = time.perf_counter, p.marks  # the host clock; a GPU's events
        self.link_name, self.virtual, self.clock = p.link_name, p.virtual, p.clock
        self.grad_state, self.float_buffers, self._params = p.grad_state, p.float_buffers, p.params
        self.controller, self.divergence = p.controller, p.divergence
        # N forward/backward passes per optimizer step, only the last all-reducing
        self.accumulation_steps = self.options.accumulation_steps
        self.observers: list[Any] = list(observers or [])  # (Observer: trainer/engine/observer.py)
        # K after warmup; changes only at boundaries. The controller's own start (random: its
        # mean, rounded); the others start at --sync-period (the Controller protocol).
        self.sync_period = int(self.controller.sync_period)
        self._period_cap: int | None = None
        self.warmup = False  # K is 1 while True (the built-in loop's warmup epochs)
        self.epoch = 0  # recorded in BoundaryStats; the loop sets it
        self.global_step = self.boundary = self.grad_syncs = self.param_syncs = 0
        # What crossed the network, apart from the logical syncs above: a fused boundary is one
        # gradient sync and one parameter sync in one collective; DDP's buckets are several.
        self.collectives = 0
        self.k_path = {}  # K -> seconds, boundaries, steps (a property: see there)
        self._last_boundary: BoundaryStats | None = None
        # ddp with no observers: the last record's field values, built only if it is read
        # (trainer/engine/ddp_path.py: a DdpKept, or a plain tuple in its order)
        self._lazy_record: tuple | None = None
        self.last_decision: SyncDecision | None = None
        self._last_step: StepTimes | tuple = StepTimes()
        self._interval = Interval()
        self._loss = LossSum()  # the interval's: read once per boundary (loss_sum.py)
        self._pending: InFlight | None = None  # launched, not yet applied (--fragment-delay)
        # the position 1..F of the next fragment sync in its round; 1 after a whole-model sync
        self._position, self._fragments = 1, self.options.fragments  # (fragments.py)
        self._in_step: Step | None = None
        # last: sync.model's forward and the optimizer's step report to this Sync from here
        self._optimizer_hooks = install_reports(self, optimizer)  # (trainer/engine/step.py)

    def _the_averager(self) -> ParameterAverager:
        """The averager, on the paths only a parameter-averaging strategy takes."""
        assert self.averager is not None
        return self.averager

    # ----- the step ----------------------------------------------------------------------------

    @property
    def k_in_force(self) -> int:
        return 1 if self.warmup else self.sync_period

    def _next_sync(self) -> tuple[int, int]:
        """(steps from the last boundary to the next one, the fragment it moves): K and the
        whole model, or the round's next fragment; the whole model while K in force < F."""
        k, frags = self.k_in_force, self.options.fragments
        if frags == 1 or k < frags:
            return k, WHOLE
        return fragment_gap(self._position, k, frags), self._position % frags

    @property
    def period_cap(self) -> int | None:
        """The most steps an interval can have (e.g. the steps of an epoch, when every epoch
        ends with a forced boundary), or None. A larger K could never take effect: K and the
        controller's decisions are capped at it, so every record shows the K that applies."""
        return self._period_cap

    @period_cap.setter
    def period_cap(self, steps: int | None) -> None:
        if steps is not None and steps < 1:
            raise OptionError(f"period_cap: {steps} steps; give at least 1, or None")
        self._period_cap = steps
        if steps is not None:
            self.sync_period = min(self.sync_period, steps)
        if isinstance(self.controller, KnowsCuts):  # --epoch-rounds: where rounds are cut short
            self.controller.set_cut(steps)

    def step(self, boundary: bool = False, micro_batches: int | None = None) -> Step:
        """One optimizer step of the loop, as `with sync.step() as s:`. `boundary=True` makes
        it a boundary whatever K says (the built-in loop does so at each epoch's last step, so
        epochs start identical). With `accumulation_steps` N, the step takes N forward and
        backward passes through sync.model, or `micro_batches` (1..N: a short batch at an
        epoch's end); only the last all-reduces gradients, as DDP's no_sync() on the others.
        (With N > 1 the Sync's own `step` is micro_step, trainer/engine/step.py: a step of one
        pass tests nothing.)"""
        if micro_batches is None:
            return Step(self, boundary)
        return micro_step(self, boundary, micro_batches)

    def _open_step(self, state: Step) -> AbstractContextManager | None:
        if self._in_step is not None:
            if self._in_step is CLOSED:
                raise RuntimeError("sync.step() after sync.close(): make a new autok.Sync")
            raise RuntimeError("sync.step() is already open: one optimizer step at a time")
        # every rank that lacks it stops here (set it on all: docs/design.md §6, "epoch rounds")
        if self.options.epoch_rounds and self._period_cap is None:
            raise OptionError(
                "epoch_rounds: meets K* with whole syncs per period_cap steps, and period_cap "
                "is None; set sync.period_cap to the steps between your loop's forced "
                "boundaries (an epoch's), or drop epoch_rounds"
            )
        if self._fragments == 1:  # K in force and the whole model, spelled out (per step)
            gap, fragment = 1 if self.warmup else self.sync_period, WHOLE
        else:
            gap, fragment = self._next_sync()
        is_boundary = state.is_boundary = state._last_of_epoch or self._interval.steps + 1 >= gap
        if state._last_of_epoch:  # the loop's boundary; the schedule's verdict: outer step or not
            state._due = fragment if self._interval.steps + 1 >= gap else None
        elif fragment != WHOLE:
            state._fragment = fragment
        if self.clock is not None:
            self.link_name = self.clock.move_to(self.global_step, self.epoch).name
        ctx = self.strategy.backward_context(self.model, is_boundary)
        self.grad_state.reset(local=ctx is not None)  # (a local step: no_sync's context)
        if is_boundary and self._watch is not None:
            self._watch.arm()  # the end of its backward is marked
        state._t0 = state._fwd_start = self.now()
        if self._marks is not None:
            self._marks.start()
        self._in_step = state  # last: a step whose opening raised is not left open
        return ctx

    def _after_forward(self, args: tuple) -> None:
        state = self._in_step
        if state is not None and state._t2 is None:
            t = self.now()
            state._forward += t - state._fwd_start
            state._fwd_start = state._t1 = t  # a further forward (accumulation) starts here
            if self._marks is not None:
                self._marks.mark(T1)
            if self.model.require_backward_grad_sync and torch.is_grad_enabled():
                self.grad_state.arm()  # DDP all-reduces this forward's backward
            if args and isinstance(x := args[0], torch.Tensor) and (shape := x.shape):
                self._interval.samples += shape[0]  # for samples/s in the records

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        state = self._in_step
        if state is None or state._t2 is not None:
            return
        state._t2 = self.now()
        if self._marks is not None:
            self._marks.mark(T2)
        lr = optimizer.param_groups[0]["lr"]
        # an LR held as a tensor is updated in place by the scheduler (fill_): kept as it is now
        state._lr = lr if type(lr) is float else lr_now(lr)
        if self._watch is not None and state.is_boundary:
            self._watch.check()  # the gradients, changed since backward ended?
            if self._fused:
                self._the_averager().capture_boundary_grads()  # g_i as it enters the step

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        state = self._in_step
        if state is not None and state._t3 is None and state._t2 is not None:
            state._t3 = self.now()
            if self._marks is not None:
                self._marks.mark(T3)

    def _close_step(self, state: Step) -> None:
        end = self.now()
        t1 = state._t1 if state._t1 is not None else state._t0
        t2 = state._t2 if state._t2 is not None else end  # GradScaler skipped the step
        t3 = state._t3 if state._t3 is not None else t2
        if state._lr is None:
            state._lr = self.optimizer.param_groups[0]["lr"]
        gs = self.grad_state
        if self._marks is None:
            forward, span, optimizer = state._forward, t2 - t1, t3 - t2
            # no bucket marked ready (a local step): exposed_wait would say None
            wait = gs.exposed_wait(t1, t2) if gs.last_ready is not None else None
        else:  # on the device's clock; the one host sync of the step
            forward, span, optimizer, wait = device_times(self._marks, gs, t1, t2)
        if self.virtual is not None:  # modelled, never measured (docs/design.md §4)
            forward, span, optimizer, wait = virtual_times(self, gs)
        if wait is None:  # nothing all-reduced in this step's backward
            grad_synced, backward, wait = False, span, 0.0
        else:
            grad_synced, backward = True, span - wait
            self.grad_syncs += 1
        synced = wait  # this step's exposed sync: the gradient wait, and any averaging below
        compute = forward + backward + optimizer
        # StepTimes' values, built only if `last_step` is read (each object a step makes is paid at
        # every step); set before any boundary closes below, whose observers may read it, and again
        # with its time
        self._last_step = (forward, backward, optimizer, synced, state.is_boundary, grad_synced)
        interval = self._interval
        if self.averager is None and close_ddp_lazily(
            self, state, interval, compute, wait, grad_synced
        ):
            return
        if self._pending is not None:  # a delayed average, one step older: applied now?
            synced = age_in_flight(self, state.is_boundary, interval, synced)
        self._loss.add(state.loss)
        interval.steps += 1
        interval.compute_seconds += compute
        # the step's payload: any all-reduced bucket counts, as its wait may not (a forward
        # after backward moves t1 past the buckets)
        interval.grad_bytes += gs.nbytes
        self.collectives += gs.buckets
        if grad_synced:  # (a local step's wait and syncs add nothing)
            interval.exposed_sync_seconds += wait
            interval.grad_syncs += 1
        if state.is_boundary:
            if self._watch is not None:
                self._watch.disarm()
            # Delayed (overlapped) after warmup, but never at a forced (epoch-end) boundary.
            delay = (
                self.options.delay
                if self.averager is not None and not self.warmup and not state._last_of_epoch
                else 0
            )
            carried = self._boundary(
                interval,
                self.k_in_force,
                state._lr,
                delay,
                fragment=state._fragment,
                forced=state._last_of_epoch,
                due=state._due,
            )
            self._interval = Interval(exposed_sync_seconds=carried)
            if carried:
                synced += carried
                self._last_step = (forward, backward, optimizer, synced, True, grad_synced)
        self.global_step += 1

    # ----- boundaries --------------------------------------------------------------------------

    def _boundary(
        self,
        interval: Interval,
        k: int,
        lr: float,
        delay: int = 0,
        boundary_step: bool = True,
        fragment: int = WHOLE,
        forced: bool = False,
        due: int | None = WHOLE,
    ) -> float:
        """Close the interval; return this rank's averaging wall time (counted in the next one).
        With a `delay` τ > 0 the averaging only starts here; finish_in_flight() completes it τ
        steps later. `boundary_step` is False for sync_now(): no step's gradients ride along.
        `fragment`: what the averaging moves (trainer/engine/fragments.py), or the whole model.
        `forced`: a boundary the loop asked for (an epoch's end). `due`: what the schedule
        syncs here, None for an unscheduled sync (ParameterAverager.start)."""
        lr = float(lr)  # the group's LR as the step read it, perhaps a tensor: a number here
        if self._fused and boundary_step:
            # the fused boundary's gradient AllReduce rides in the averaging
            self.grad_syncs += 1
            interval.grad_syncs += 1
        if self.averager is None:
            ddp_boundary(self, interval, k, lr, forced)
            return 0.0
        loss_sum = self._loss.take()  # one host sync per boundary, not per step
        # the interval's last step: this one at a step; between steps (sync_now()), the one
        # before global_step, which already counts the next
        last = self.global_step if boundary_step else self.global_step - 1
        common = fields_at_launch(self, interval, k, lr, fragment, last)
        emit(
            self.observers,
            "on_local_interval",
            interval.compute_seconds,
            interval.exposed_sync_seconds,
        )
        grads = self._watch.take() if self._watch is not None and boundary_step else UNCHECKED
        totals = IntervalTotals(
            loss_sum, interval.steps, interval.compute_seconds, interval.exposed_sync_seconds, grads
        )
        pending = self.averager.start(
            totals,
            lr,
            self.clock,
            delay > 0,
            fragment,
            boundary_step=boundary_step and self._fused,
            due=due,
        )
        self.param_syncs += 1
        self.collectives += 1  # the averaging: one collective, gradients riding in it if fused
        self._pending = InFlight(
            pending=pending,
            common=common,
            grad_bytes=interval.grad_bytes,
            sync_period=k,
            steps=interval.steps,
            delay=delay,
        )
        seconds = pending.seconds
        # booked once every rank has issued it (trainer/engine/clock.py)
        if self.virtual is not None:
            seconds = 0.0
            self.virtual.book(pending.nbytes, pending.compressed)
        # the round: the next fragment, or a new round after the whole model
        frags = self.options.fragments
        self._position = 1 if fragment == WHOLE else self._position % frags + 1
        if delay > 0:
            return seconds
        return seconds + finish_in_flight(self)

    def _close_boundary(
        self,
        stats: BoundaryStats,
        k: int,
        steps: int,
        params_finite: bool = True,
        judge: bool = True,
    ) -> None:
        """Judge, decide, report: the guard, the K path, the controller, the observers.
        `judge`: False where the guard has nothing it could find (ddp between its checks)."""
        if judge and (why := self.divergence.check(stats, params_finite)):
            if self.options.on_divergence == "rollback":
                raise Rollback(why, self.sync_period)
            raise Diverged(
                f"training diverged: {why}; lower --lr or --slowmo-beta, or use "
                "--on-divergence rollback with --checkpoint-every"
            )
        add_to_path(self.k_path, k, stats.compute_seconds + stats.exposed_sync_seconds, 1, steps)
        decision = self.controller.observe(stats)
        cap = self._period_cap
        if cap is not None and decision.next_sync_period > cap:
            decision = SyncDecision(
                cap,
                f"{decision.reason}; K {decision.next_sync_period} capped at {cap}, the steps "
                "between forced boundaries",
            )
        self.sync_period = decision.next_sync_period
        self._last_boundary, self._lazy_record = stats, None
        self.last_decision = decision
        emit(self.observers, "on_boundary", stats, decision)
        self.boundary += 1

    @property
    def k_path(self) -> KPath:
        """K -> the seconds, boundaries and steps spent at it, in the order K was first used
        (trainer/engine/k_path.py). Read it again for later steps: ddp's fast close adds to it
        when it is read."""
        if n := self._k1_boundaries:  # ddp's fast close keeps its K = 1 sums apart
            add_to_path(self._k_path, 1, self._k1_seconds, n, n)  # each of one step
            self._k1_seconds, self._k1_boundaries = 0.0, 0
        return self._k_path

    @k_path.setter
    def k_path(self, path: KPath) -> None:
        self._k_path = path
        self._k1_seconds, self._k1_boundaries = 0.0, 0

    @property
    def last_step(self) -> StepTimes:
        """This rank's times of the last closed `sync.step()`."""
        if isinstance(self._last_step, tuple):
            self._last_step = StepTimes(*self._last_step)
        return self._last_step

    @property
    def last_boundary(self) -> BoundaryStats | None:
        """The record of the last boundary (None before the first, and after load_state_dict
        until the next). Read it from the loop's own thread: on ddp it is built on reading (and
        reads the interval's loss)."""
        if self._lazy_record is not None:
            self._last_boundary = read_kept(self._lazy_record, self.world_size)
            self._lazy_record = None
        return self._last_boundary

    def sync_now(self) -> float:
        """A boundary now, outside any step (epoch end, before evaluation or a checkpoint): on
        return every rank holds identical parameters (and, by the buffer policy, buffers).
        Returns this rank's seconds spent. Collective: every rank must call it."""
        return boundary_now(self)  # (trainer/engine/sync_now.py)

    # ----- state (trainer/engine/resume.py) ----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything the engine needs to continue exactly (this rank's part), in plain tensors,
        numbers and lists that load with weights_only (trainer/engine/resume.py)."""
        return engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Call after the model's own state is loaded. A state that is not this kind of
        engine's (`_kind`), or with any value of the wrong type, range or shape, raises an
        OptionError naming what differs, checked whole before any of it is applied
        (trainer/engine/resume.py, load_engine_state)."""
        load_engine_state(self, state)

    def _kind(self) -> dict[str, Any]:
        """What a saved state must match to load here (checked by load_state_dict)."""
        return engine_kind(self)

    def _check_state(self, state: dict[str, Any]) -> None:
        """A saved state against this engine; raises BadState naming the first fault."""
        check_engine_state(self, state)

    def close(self) -> None:
        """End with a boundary (identical replicas), then stop what the engine runs. After it,
        neither sync.model nor the optimizer reports to the Sync, and sync.step() or
        sync_now() raises; state_dict() still gives the final state. A second close does
        nothing."""
        if self._in_step is CLOSED:
            return
        try:
            self.sync_now()
        finally:  # (a failed boundary still stops the observers, the exporter's server among them)
            emit(self.observers, "close")
            release_reports(self)  # the cycles they make, broken (trainer/engine/step.py)
            self._in_step = CLOSED  # no step opens again: its optimizer step would go unseen
