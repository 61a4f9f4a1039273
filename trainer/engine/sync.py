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
(docs/design.md §3, the module table): the step object (step.py), ddp's boundary and fast close
(ddp_path.py), an average in flight and its record (in_flight.py), auto's boundary form
(boundary_form.py), the saved state (resume.py), what the constructor builds (build.py), and the
observers (observer.py).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autok.controllers import build_controller
from autok.controllers.base import BoundaryStats, SyncDecision
from autok.trainer.engine.averaging import IntervalTotals, ParameterAverager, reconcile_buffers
from autok.trainer.engine.boundary_form import fused_sgd
from autok.trainer.engine.build import build_averager, check_fragments, virtual_clock
from autok.trainer.engine.ddp_path import close_ddp_lazily, ddp_boundary, read_kept
from autok.trainer.engine.divergence import Diverged, DivergenceGuard, Rollback
from autok.trainer.engine.fragments import WHOLE, fragment_gap
from autok.trainer.engine.grad_hook import GradSyncState, install_grad_sync
from autok.trainer.engine.grad_watch import UNCHECKED, GradWatch
from autok.trainer.engine.in_flight import InFlight, finish_in_flight
from autok.trainer.engine.link import LinkClock
from autok.trainer.engine.loss_sum import LossSum
from autok.trainer.engine.observer import check_observers, emit
from autok.trainer.engine.optim import delayed_state_problem
from autok.trainer.engine.options import (
    OptionError,
    SyncOptions,
    check_ddp_kwargs,
    flag,
    fused_is_exact,
    sync_options,
)
from autok.trainer.engine.profiler import T1, T2, T3, DeviceMarks, Interval
from autok.trainer.engine.resume import (
    check_engine_state,
    engine_kind,
    engine_state,
    load_engine_state,
)
from autok.trainer.engine.step import (
    CLOSED,
    MicroStep,
    Step,
    StepTimes,
    TimedDDP,
    lr_now,
    no_report,
)
from autok.trainer.engine.strategies import STRATEGIES, fused


def fused_boundary_is_exact(strategy: str, optimizer: torch.optim.Optimizer) -> bool:
    """The one-collective cpdp boundary is exact for SGD without dampening (linear in g)."""
    return (
        fused_is_exact(strategy, "sgd")  # the rule; what follows: this optimizer is that "sgd"
        and type(optimizer) is torch.optim.SGD
        and all(g.get("dampening", 0) == 0 for g in optimizer.param_groups)
    )


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
        DDP_KWARGS_TAKEN), e.g. find_unused_parameters for a model with unused parameters."""
        if options is not None and kwargs:
            raise OptionError(f"{flag(next(iter(kwargs)))}: give options or keywords, not both")
        opts = options if options is not None else sync_options(**kwargs)
        ddp_kwargs = check_ddp_kwargs(ddp_kwargs, opts.strategy, opts.accumulation_steps)
        check_observers(observers or [])
        # With unused parameters a rank's gradient may be None where another's is not: its
        # local step then skips the parameter (no weight decay, no momentum buffer), which the
        # fused boundary's correction m_i += ḡ − g_i cannot repair. DDP, reducing first, gives
        # every rank ḡ: the two-phase boundary (docs/design.md §2, the fused boundary's
        # conditions).
        unused = bool(ddp_kwargs.get("find_unused_parameters"))
        exact = fused_boundary_is_exact(opts.strategy, optimizer) and not unused
        if opts.boundary == "fused" and not exact:
            raise OptionError(
                "--boundary: fused is not exact with ddp_kwargs find_unused_parameters (a rank "
                "whose gradient is None skips the parameter's step); use two-phase or auto"
                if unused
                else "--boundary: fused is exact only for cpdp with torch.optim.SGD without "
                "dampening (AdamW is not linear in the gradient); use two-phase or auto"
            )
        if not dist.is_available() or not dist.is_initialized():
            raise OptionError(
                "autok.Sync needs an initialized process group (torchrun, or "
                "torch.distributed.init_process_group)"
            )
        self.options: SyncOptions = opts
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        delayed = opts.sync_optimizer_state and opts.delay > 0  # a late state average
        if delayed and (why := delayed_state_problem(optimizer, self.world_size, opts.delay)):
            raise OptionError(why)
        self.device = device or next(model.parameters()).device
        self.optimizer = optimizer
        self.module = model
        self.strategy = STRATEGIES[opts.strategy]
        # auto takes the fused boundary only once a boundary step has shown, on every rank, that
        # the loop leaves the gradients as backward gave them (no clipping): until then it is
        # two-phase, and for good if a rank changed them (trainer/engine/grad_watch.py;
        # docs/design.md,
        # "What the fused boundary needs unchanged")
        # auto keeps the gradients' all-reduce exact: fused would quantize them under --compress
        self._probing = self._auto = (
            opts.boundary == "auto" and exact and opts.delay == 0 and opts.compress == "none"
        )
        if opts.boundary == "fused":
            self.strategy = fused(self.strategy)
        self._fused = self.strategy.fused_gradients  # (asked at every step)
        # The host clock, read without a device sync; on a GPU the step's spans come from
        # DeviceMarks' events, read once at the step's close.
        self.now = time.perf_counter
        self._marks = DeviceMarks(self.device) if self.device.type == "cuda" else None

        plan = opts.link_plan
        self.link_name = plan.segments[0][1].name  # the profile in force (a schedule moves it)
        # --clock virtual: the link is physically ideal (nothing sleeps) and the virtual clock
        # books what it would cost instead (trainer/engine/clock.py; docs/design.md §4)
        self.virtual = (
            virtual_clock(opts, model, plan, self.world_size, self.rank)
            if opts.clock == "virtual"
            else None
        )
        ideal = plan.is_ideal or self.virtual is not None
        self.clock = None if ideal else LinkClock(plan, self.world_size, opts.seed)
        # On the averaging strategies DDP's own per-forward buffer broadcast would bypass the
        # emulator and the buffer policy: buffers are reconciled at boundaries instead (they
        # still start from rank 0's). ddp is DDP: rank 0's buffers at every forward, as plain
        # DDP broadcasts them, unless the policy keeps them local (docs/design.md, "Parameter
        # averaging").
        self.model = TimedDDP(
            model,
            forward_sync_buffers=opts.strategy == "ddp" and opts.buffer_policy != "local",
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            **ddp_kwargs,
        )
        # Called from sync.model's forward, which torch.compile does not trace: disabled here too,
        # with what it calls (the clock, the gradient hook it arms), or a compiled sync.model
        # would trace this frame and break its graph on the host clock (docs/design.md §4).
        self.model._after_forward = torch.compiler.disable(self._after_forward)
        # N forward/backward passes per optimizer step, only the last all-reducing: each
        # step's forwards are counted, by a report of its own (no cost to a step of one pass)
        self.accumulation_steps = opts.accumulation_steps
        if self.accumulation_steps > 1:
            self.model._after_forward = torch.compiler.disable(self._after_micro_forward)
            # rebound per instance, not branched on: a step of one pass pays nothing for it
            self.step = self._micro_step  # type: ignore[method-assign]
        self.grad_state = GradSyncState(self.world_size, self.clock)
        # DDP's built-in path times a backward by the first parameter's gradient, which an unused
        # parameter, or a static graph's delayed reduction, may never give: the comm hook, which
        # every bucket passes through, times and counts those (trainer/engine/grad_hook.py)
        reduction_as_given = not (unused or ddp_kwargs.get("static_graph"))
        install_grad_sync(self.model, self.grad_state, builtin=reduction_as_given)
        self.float_buffers = [b for b in model.buffers() if b.is_floating_point()]
        self._params = list(model.parameters())  # DDP fixes them: no parameter joins later
        self.averager: ParameterAverager | None = None
        check_fragments(opts, model)
        if self.strategy.averages_parameters:
            self.averager = build_averager(
                model,
                optimizer,
                opts,
                self.float_buffers,
                rank=self.rank,
                world_size=self.world_size,
                fused_sgd=fused_sgd(self, optimizer),
            )
        # the check a fused boundary, or auto's choice of it, needs at each boundary step
        self._watch = GradWatch(self._params) if self._fused or self._probing else None
        if peak_lr is None:  # (an LR may be a tensor: CUDA graphs, a compiled step)
            # Group 0's, the group every boundary reads η from: qsr's ratio η/peak is then one
            # group's schedule, whatever the order or relative LRs of the groups
            # (docs/design.md, "The LR a boundary records").
            peak_lr = float(optimizer.param_groups[0]["lr"])
        assert opts.sync_period is not None  # SyncOptions resolves K (its strategy's default)
        self.controller = build_controller(
            opts.policy, opts.sync_period, opts.policy_options(peak_lr)
        )
        # ddp's loss is rank-local (no averaging collective carries it): the guard judges the
        # parameters there, which the averaged gradients keep identical on every rank.
        self.divergence = DivergenceGuard(
            factor=opts.divergence_factor, shared_loss=self.averager is not None
        )
        self.observers: list[Any] = list(observers or [])  # (Observer: trainer/engine/observer.py)
        # K after warmup; changes only at boundaries. The controller's own start (random: its
        # mean, rounded); the others start at --sync-period.
        self.sync_period = int(self.controller.sync_period)  # (the Controller protocol)
        self._period_cap: int | None = None
        self.warmup = False  # K is 1 while True (the built-in loop's warmup epochs)
        self.epoch = 0  # recorded in BoundaryStats; the loop sets it
        self.global_step = self.boundary = self.grad_syncs = self.param_syncs = 0
        # What crossed the network, apart from the logical syncs above: a fused boundary is one
        # gradient sync and one parameter sync in a single collective; DDP may use several
        # buckets for one gradient sync.
        self.collectives = 0
        self.k_path = {}  # K -> seconds, boundaries, steps (a property: see there)
        self._last_boundary: BoundaryStats | None = None
        # ddp with no observers: the last record's field values, built only if it is read
        # (trainer/engine/ddp_path.py: a DdpKept, or a plain tuple in its order)
        self._lazy_record: tuple | None = None
        self.last_decision: SyncDecision | None = None
        self._last_step: StepTimes | tuple = StepTimes()
        self._interval = Interval()
        # The interval's loss sum (trainer/engine/loss_sum.py): read once per boundary, not per
        # step.
        self._loss = LossSum()
        self._pending: InFlight | None = None  # launched, not yet applied (--fragment-delay)
        # Fragments (trainer/engine/fragments.py): the position 1..F in the round of the next
        # fragment sync; back to 1 after every sync of the whole model.
        self._position = 1
        self._fragments = opts.fragments
        self._in_step: Step | None = None
        self._optimizer_hooks = (
            optimizer.register_step_pre_hook(self._before_optimizer_step),
            optimizer.register_step_post_hook(self._after_optimizer_step),
        )

    def _the_averager(self) -> ParameterAverager:
        """The averager, on the paths only a parameter-averaging strategy takes."""
        assert self.averager is not None
        return self.averager

    def _virtual_step(self, gs: GradSyncState) -> tuple[float, float, float, float | None]:
        """The step as _close_step reads it (forward, backward with its wait, optimizer, the
        gradient wait or None on a local step), booked on the virtual clock in place of what
        was measured: only counts (the bytes and buckets backward all-reduced) are read."""
        v = self.virtual
        assert v is not None  # called under --clock virtual only (_close_step)
        self.link_name = v.move_to(self.global_step, self.epoch).name
        forward, backward, wait = v.step(self.global_step, gs.nbytes, gs.buckets)
        return forward, backward + wait, 0.0, wait if gs.buckets else None

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

    def step(self, boundary: bool = False, micro_batches: int | None = None) -> Step:
        """One optimizer step of the loop, as `with sync.step() as s:`. `boundary=True` makes
        it a boundary whatever K says (the built-in loop does so at each epoch's last step, so
        epochs start identical). With `accumulation_steps` N, the step takes N forward and
        backward passes through sync.model, or `micro_batches` (1..N: a short batch at an
        epoch's end); only the last all-reduces gradients, as DDP's no_sync() on the others.
        (With N > 1 the Sync's own `step` is _micro_step: a step of one pass tests nothing.)"""
        if micro_batches is None:
            return Step(self, boundary)
        return self._micro_step(boundary, micro_batches)

    def _micro_step(self, boundary: bool = False, micro_batches: int | None = None) -> Step:
        n = self.accumulation_steps
        if micro_batches is None:
            return MicroStep(self, boundary, n)
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int):
            raise OptionError(f"micro_batches: {micro_batches!r:.40} is not a count of passes")
        if not 1 <= micro_batches <= n:
            raise OptionError(
                f"micro_batches: {micro_batches} passes in a step; give 1 to "
                f"accumulation_steps ({n})"
            )
        return MicroStep(self, boundary, micro_batches) if n > 1 else Step(self, boundary)

    def _open_step(self, state: Step) -> AbstractContextManager | None:
        if self._in_step is not None:
            if self._in_step is CLOSED:
                raise RuntimeError("sync.step() after sync.close(): make a new autok.Sync")
            raise RuntimeError("sync.step() is already open: one optimizer step at a time")
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

    def _after_micro_forward(self, args: tuple) -> None:
        """`_after_forward` with accumulation: the step's forwards counted; the last pass's
        forward runs with DDP's gradient sync back on (DDP decides at a forward whether its
        backward all-reduces), the earlier ones under no_sync() (MicroStep.__enter__)."""
        self._after_forward(args)
        state = self._in_step
        # (installed with accumulation only: every step is a MicroStep, CLOSED none)
        if isinstance(state, MicroStep) and state._t2 is None and torch.is_grad_enabled():
            state._passes += 1
            if state._passes == state._micro - 1 and state._held is not None:
                self.model.__dict__["require_backward_grad_sync"] = state._held
                state._held = None

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
            forward, span, optimizer, backward_end = self._marks.close()
            wait = gs.exposed_wait(t1, t2, backward_end)
            if wait is not None:
                wait = min(wait, span)
        if self.virtual is not None:  # modelled, never measured (docs/design.md §4)
            forward, span, optimizer, wait = self._virtual_step(gs)
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
        if self._pending is not None:
            # A delayed average is applied τ local steps after its sync started, or earlier
            # when the next boundary comes first (a K lowered below τ·F, an epoch's end).
            self._pending.age += 1
            if self._pending.age >= self._pending.delay or state.is_boundary:
                finish = finish_in_flight(self)
                interval.exposed_sync_seconds += finish
                synced += finish
                self._last_step = (forward, backward, optimizer, synced, *self._last_step[4:])
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
        common = dict(
            boundary=self.boundary,
            global_step=self.global_step,
            epoch=self.epoch,
            sync_period=k,
            interval_steps=interval.steps,
            lr=lr,
            warmup=self.warmup,
            link=self.link_name,
            # DistributedSampler gives every rank equally many samples per step.
            samples=interval.samples * self.world_size,
            grad_syncs=interval.grad_syncs,
            param_syncs=int(self.averager is not None),
            fragment=fragment,
            # the interval's peer wait: booked on the virtual clock, 0 on the wall clock
            peer_wait_seconds=self.virtual.take_peer_wait() if self.virtual is not None else 0.0,
        )
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
        self._count_k_path(k, stats.compute_seconds + stats.exposed_sync_seconds, steps)
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

    def _count_k_path(self, k: int, seconds: float, steps: int) -> None:
        _add_to_path(self.k_path, k, seconds, 1, steps)  # (ddp's fast-path sums folded in)

    @property
    def k_path(self) -> dict[int, dict[str, float]]:
        """K -> the seconds, boundaries and steps spent at it, in the order K was first used.
        Read it again for later steps: ddp's fast close adds to it when it is read."""
        if n := self._k1_boundaries:  # ddp's fast close keeps its K = 1 sums apart
            _add_to_path(self._k_path, 1, self._k1_seconds, n, n)  # each of one step
            self._k1_seconds, self._k1_boundaries = 0.0, 0
        return self._k_path

    @k_path.setter
    def k_path(self, path: dict[int, dict[str, float]]) -> None:
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
        if self._in_step is not None:
            if self._in_step is CLOSED:
                raise RuntimeError("sync.sync_now() after sync.close(): the replicas agree")
            raise RuntimeError("sync.sync_now() inside sync.step(): call it between steps")
        # under --clock virtual the seconds spent are the booked ones (docs/design.md §4)
        now = time.perf_counter if self.virtual is None else self.virtual.now
        t0 = now()
        if self.clock is not None:  # between steps: the position of the next one
            self.link_name = self.clock.move_to(self.global_step, self.epoch).name
        elif self.virtual is not None:
            self.link_name = self.virtual.move_to(self.global_step, self.epoch).name
        if self._pending is not None:
            # With no step closed since the boundary launched it, θ_i is θ_sent: θ_new is
            # written as is (settled); otherwise the steps taken meanwhile are kept.
            settle = self._pending.age == 0
            self._interval.exposed_sync_seconds += finish_in_flight(self, settle)
        if self.averager is None or (
            self._interval.steps == 0 and self.averager.last_fragment == WHOLE
        ):
            # Nothing open: replicas already agree (the last boundary moved the whole model).
            # ddp has no averaging collective to carry buffers, so they are reconciled here.
            if (
                self.averager is None
                and self.float_buffers
                and self.options.buffer_policy != "local"
            ):
                reconcile_buffers(
                    self.float_buffers,
                    self.options.buffer_policy,
                    self.rank,
                    self.world_size,
                    self.clock,
                )
                self.collectives += 1
            return now() - t0
        k = self.k_in_force
        lr = self.optimizer.param_groups[0]["lr"]
        # unscheduled: averages, injects no outer momentum (docs/design.md §2)
        carried = self._boundary(self._interval, k, lr, boundary_step=False, due=None)
        self._interval = Interval(exposed_sync_seconds=carried)
        return now() - t0

    # ----- state (trainer/engine/resume.py) ----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything the engine needs to continue exactly (this rank's part): SlowMo reference
        and velocity, the controller, the divergence guard, the link's jitter stream, counters
        and the open interval. Plain tensors, numbers and lists (loads with weights_only)."""
        return engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Call after the model's own state is loaded. Saved at a boundary (an empty interval),
        the replica check's digest is taken from the loaded weights; saved mid-interval, the
        digest of the last boundary is restored. A state that is not this kind of engine's
        (`_kind`), or with any value of the wrong type, range or shape, raises an OptionError
        naming what differs, checked whole before any of it is applied
        (trainer/engine/resume.py, load_engine_state)."""
        load_engine_state(self, state)

    def _kind(self) -> dict[str, Any]:
        """What a saved state must match to load here (checked by load_state_dict)."""
        return engine_kind(self)

    def _check_state(self, state: dict[str, Any]) -> None:
        """Every part of a saved state against this engine; raises BadState naming the first
        fault. Applies nothing."""
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
            # sync.model reports each forward to this Sync, and the optimizer each step: cycles
            # only the cyclic GC would free, with DDP's reducer and the process group it holds,
            # perhaps not until the interpreter finalizes, where a gloo group's teardown is not
            # safe. Broken here, they go when the loop drops them.
            self.model._after_forward = no_report
            self.__dict__.pop("step", None)  # accumulation's bound _micro_step: a cycle too
            self.grad_state.release()
            if self._watch is not None:
                self._watch.disarm()
            for hook in self._optimizer_hooks:  # the user's optimizer is theirs again
                hook.remove()
            self._in_step = CLOSED  # no step opens again: its optimizer step would go unseen


def _add_to_path(
    path: dict[int, dict[str, float]], k: int, seconds: float, boundaries: int, steps: int
) -> None:
    """Count boundaries at K into a K path (`Sync.k_path`), K added where it is new."""
    at_k = path.get(k)
    if at_k is None:
        at_k = path[k] = {"seconds": 0.0, "boundaries": 0, "steps": 0}
    at_k["seconds"] += seconds
    at_k["boundaries"] += boundaries
    at_k["steps"] += steps
