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
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from autok.controllers import build_controller
from autok.controllers.base import BoundaryStats, SyncDecision
from autok.trainer.engine.averaging import (
    IntervalTotals,
    ParameterAverager,
    Reconciled,
    reconcile_buffers,
)
from autok.trainer.engine.clock import VirtualClock
from autok.trainer.engine.divergence import Diverged, DivergenceGuard, Rollback, params_finite
from autok.trainer.engine.fragments import WHOLE, fragment_gap
from autok.trainer.engine.grad_hook import GradSyncState, install_grad_sync
from autok.trainer.engine.grad_watch import UNCHECKED, GradWatch
from autok.trainer.engine.link import LinkClock, LinkSchedule
from autok.trainer.engine.loss_sum import LossSum, read_held
from autok.trainer.engine.optim import delayed_state_problem, state_tensors
from autok.trainer.engine.options import (
    UNUSED_PARAMETERS_HINT,
    OptionError,
    SyncOptions,
    check_ddp_kwargs,
    flag,
    sync_options,
)
from autok.trainer.engine.profiler import T1, T2, T3, DeviceMarks, Interval
from autok.trainer.engine.state_check import (
    BadState,
    check_averager,
    check_counters,
    check_link,
    check_pending,
    k_values,
    loads_into_copy,
)
from autok.trainer.engine.strategies import STRATEGIES, fused

# ddp has a boundary every step, and judging the parameters finite costs three ops and a host
# sync (params_finite: 72-130 µs on the cnn1d at the end of a step on this 2-core machine,
# against a 1.4-3 ms step; more on a large model): ddp judges them at every
# DDP_PARAM_CHECK_EVERY-th boundary and at every forced (epoch-end) one, so a divergence is
# caught at most that many steps late (64 steps, about 0.1-0.2 s of the cnn1d; at 16 the check
# cost 5-8 µs a step, docs/design.md §3). Its other checks (drift, update) are zero by construction.
DDP_PARAM_CHECK_EVERY = 64


@dataclass(slots=True)
class StepTimes:
    """One `sync.step()` on this rank, for a loop's own accounting (seconds)."""

    forward_seconds: float = 0.0
    backward_seconds: float = 0.0  # backward compute; the wait for gradient buckets is sync
    optimizer_seconds: float = 0.0
    sync_seconds: float = 0.0  # exposed: gradient wait + this step's share of averaging
    is_boundary: bool = False
    grad_synced: bool = False


class StepHandle:
    """What `with sync.step() as s` gives the loop body."""

    def __init__(self, is_boundary: bool) -> None:
        self.is_boundary = is_boundary
        self.loss: torch.Tensor | float | None = None


def fused_boundary_is_exact(strategy: str, optimizer: torch.optim.Optimizer) -> bool:
    """The one-collective cpdp boundary is exact for SGD without dampening (linear in g)."""
    return (
        strategy == "cpdp"
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
        delayed = opts.sync_optimizer_state and opts.overlap_boundary  # a late state average
        if delayed and (why := delayed_state_problem(optimizer, self.world_size)):
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
        self._probing = self._auto = opts.boundary == "auto" and exact and opts.delay == 0
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
        self.virtual = self._virtual_clock(model, plan) if opts.clock == "virtual" else None
        ideal = plan.is_ideal or self.virtual is not None
        self.clock = None if ideal else LinkClock(plan, self.world_size, opts.seed)
        # On the averaging strategies DDP's own per-forward buffer broadcast would bypass the
        # emulator and the buffer policy: buffers are reconciled at boundaries instead (they
        # still start from rank 0's). ddp is DDP: rank 0's buffers at every forward, as plain
        # DDP broadcasts them, unless the policy keeps them local (docs/design.md, "Parameter
        # averaging").
        self.model = _TimedDDP(
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
        numel = sum(p.numel() for p in model.parameters())
        if opts.fragments > numel:
            raise OptionError(
                f"--fragments: {opts.fragments} fragments of a model with {numel} parameters; "
                f"give at most {numel}"
            )
        if self.strategy.averages_parameters:
            extras = _Extras(optimizer, opts, self.float_buffers)
            self.averager = ParameterAverager(
                list(model.parameters()),
                rank=self.rank,
                world_size=self.world_size,
                outer=opts.outer,
                compress=opts.compress,
                averaged_extras=extras.averaged,
                broadcast_extras=extras.broadcast,
                fused_sgd=self._fused_sgd(optimizer),
                fragments=opts.fragments,
                offload=opts.outer_state_device == "cpu",
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
        self.observers: list[Any] = list(observers or [])
        # K after warmup; changes only at boundaries. The controller's own start (random: its
        # mean, rounded); the others start at --sync-period.
        self.sync_period = int(getattr(self.controller, "sync_period", opts.sync_period))
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
        self._lazy_record: tuple | None = None
        self.last_decision: SyncDecision | None = None
        self._last_step: StepTimes | tuple = StepTimes()
        self._interval = Interval()
        # The interval's loss sum (trainer/engine/loss_sum.py): read once per boundary, not per
        # step.
        self._loss = LossSum()
        self._pending: _InFlight | None = None  # launched, not yet applied (--fragment-delay)
        # Fragments (trainer/engine/fragments.py): the position 1..F in the round of the next
        # fragment sync; back to 1 after every sync of the whole model.
        self._position = 1
        self._fragments = opts.fragments
        self._in_step: _Step | None = None
        self._optimizer_hooks = (
            optimizer.register_step_pre_hook(self._before_optimizer_step),
            optimizer.register_step_post_hook(self._after_optimizer_step),
        )

    def _fused_sgd(self, optimizer: torch.optim.Optimizer) -> torch.optim.SGD | None:
        """The optimizer a fused boundary corrects (or auto probes for one): SGD, as the
        exactness check (fused_boundary_is_exact) required of either."""
        if not (self._fused or self._probing):
            return None
        assert isinstance(optimizer, torch.optim.SGD)
        return optimizer

    def _the_averager(self) -> ParameterAverager:
        """The averager, on the paths only a parameter-averaging strategy takes."""
        assert self.averager is not None
        return self.averager

    def _virtual_clock(self, model: nn.Module, plan: LinkSchedule) -> VirtualClock:
        """--clock virtual's clock; --model-bytes scales every collective's bytes by the model's
        own parameter bytes (a small model booked as the large one it stands for)."""
        opts = self.options
        own = sum(p.numel() * p.element_size() for p in model.parameters())
        scale = opts.model_bytes / own if opts.model_bytes is not None and own else 1.0
        compute_ms = opts.compute_ms or 0.0  # (set whenever virtual: trainer/engine/options.py)
        return VirtualClock(plan, self.world_size, self.rank, opts.seed, compute_ms, scale)

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

    def step(self, boundary: bool = False, micro_batches: int | None = None) -> _Step:
        """One optimizer step of the loop, as `with sync.step() as s:`. `boundary=True` makes
        it a boundary whatever K says (the built-in loop does so at each epoch's last step, so
        epochs start identical). With `accumulation_steps` N, the step takes N forward and
        backward passes through sync.model, or `micro_batches` (1..N: a short batch at an
        epoch's end); only the last all-reduces gradients, as DDP's no_sync() on the others.
        (With N > 1 the Sync's own `step` is _micro_step: a step of one pass tests nothing.)"""
        if micro_batches is None:
            return _Step(self, boundary)
        return self._micro_step(boundary, micro_batches)

    def _micro_step(self, boundary: bool = False, micro_batches: int | None = None) -> _Step:
        n = self.accumulation_steps
        if micro_batches is None:
            return _MicroStep(self, boundary, n)
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int):
            raise OptionError(f"micro_batches: {micro_batches!r:.40} is not a count of passes")
        if not 1 <= micro_batches <= n:
            raise OptionError(
                f"micro_batches: {micro_batches} passes in a step; give 1 to "
                f"accumulation_steps ({n})"
            )
        return _MicroStep(self, boundary, micro_batches) if n > 1 else _Step(self, boundary)

    def _open_step(self, state: _Step) -> AbstractContextManager | None:
        if self._in_step is not None:
            if self._in_step is _CLOSED:
                raise RuntimeError("sync.step() after sync.close(): make a new autok.Sync")
            raise RuntimeError("sync.step() is already open: one optimizer step at a time")
        if self._fragments == 1:  # K in force and the whole model, spelled out (per step)
            gap, fragment = 1 if self.warmup else self.sync_period, WHOLE
        else:
            gap, fragment = self._next_sync()
        is_boundary = state.is_boundary = state._last_of_epoch or self._interval.steps + 1 >= gap
        if fragment != WHOLE and not state._last_of_epoch:
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
        backward all-reduces), the earlier ones under no_sync() (_MicroStep.__enter__)."""
        self._after_forward(args)
        state = self._in_step
        # (installed with accumulation only: every step is a _MicroStep, _CLOSED none)
        if isinstance(state, _MicroStep) and state._t2 is None and torch.is_grad_enabled():
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
        state._lr = lr if type(lr) is float else _lr_now(lr)
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

    def _close_step(self, state: _Step) -> None:
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
        if self.averager is None and self._close_ddp_lazily(
            state, interval, compute, wait, grad_synced
        ):
            return
        if self._pending is not None:
            # A delayed average is applied τ local steps after its sync started, or earlier
            # when the next boundary comes first (a K lowered below τ·F, an epoch's end).
            self._pending.age += 1
            if self._pending.age >= self._pending.delay or state.is_boundary:
                finish = self._finish_boundary()
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
    ) -> float:
        """Close the interval; return this rank's averaging wall time (counted in the next one).
        With a `delay` τ > 0 the averaging only starts here; _finish_boundary() completes it τ
        steps later. `boundary_step` is False for sync_now(): no step's gradients ride along.
        `fragment`: what the averaging moves (trainer/engine/fragments.py), or the whole model.
        `forced`: a boundary the loop asked for (an epoch's end)."""
        lr = float(lr)  # the group's LR as the step read it, perhaps a tensor: a number here
        if self._fused and boundary_step:
            # the fused boundary's gradient AllReduce rides in the averaging
            self.grad_syncs += 1
            interval.grad_syncs += 1
        if self.averager is None:
            self._ddp_boundary(interval, k, lr, forced)
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
        )
        self._emit("on_local_interval", interval.compute_seconds, interval.exposed_sync_seconds)
        grads = self._watch.take() if self._watch is not None and boundary_step else UNCHECKED
        totals = IntervalTotals(
            loss_sum, interval.steps, interval.compute_seconds, interval.exposed_sync_seconds, grads
        )
        pending = self.averager.start(
            totals, lr, self.clock, delay > 0, fragment, boundary_step=boundary_step and self._fused
        )
        self.param_syncs += 1
        self.collectives += 1  # the averaging: one collective, gradients riding in it if fused
        self._pending = _InFlight(pending, common, interval.grad_bytes, k, interval.steps, delay)
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
        return seconds + self._finish_boundary()

    def _ddp_boundary(self, interval: Interval, k: int, lr: float, forced: bool) -> None:
        """ddp's record, every step: written out rather than through the general path, whose
        dictionaries and checks ddp would pay at every step (docs/design.md §4, Per step). ddp's
        replicas never drift, and no averaging collective carries reduced scalars, so the record
        holds this rank's own timing and loss. The guard judges the parameters, which the averaged
        gradients keep identical on every rank, at every DDP_PARAM_CHECK_EVERY-th and every forced
        boundary; its other checks (drift, update, a rank-local loss) cannot fire on ddp. Where
        nobody reads the record now, its loss is read only if the record is (`last_boundary`)."""
        if self.observers:
            self._emit("on_local_interval", interval.compute_seconds, interval.exposed_sync_seconds)
        kept = (
            interval.steps,
            self._loss,
            self.boundary,
            self.global_step,
            self.epoch,
            k,
            interval.compute_seconds,
            interval.exposed_sync_seconds,
            interval.grad_bytes,
            lr,
            self.warmup,
            interval.samples,
            interval.grad_syncs,
            self.link_name,
        )
        judge = forced or self.boundary % DDP_PARAM_CHECK_EVERY == 0
        if judge or self.observers or self.last_decision is None:
            stats = self._ddp_stats(kept, self._loss.take())
            finite = not judge or params_finite(self._params)
            self._close_boundary(stats, k, interval.steps, params_finite=finite, judge=judge)
            return
        # Nobody reads this record now and the guard has nothing to judge; ddp's controller is
        # `fixed` (the options allow no other), so its decision stands. The record is kept as
        # its values, its loss unread, and built if `last_boundary` is read.
        self._lazy_record, self._loss = kept, LossSum()
        seconds = interval.compute_seconds + interval.exposed_sync_seconds
        self._count_k_path(k, seconds, interval.steps)
        self.sync_period = self.last_decision.next_sync_period
        self.boundary += 1

    def _ddp_stats(self, kept: tuple, loss_sum: float) -> BoundaryStats:
        """A ddp boundary's record from the values kept at its close (`_ddp_boundary`,
        `_close_ddp_lazily`), with the interval's loss sum read from what [1] held."""
        steps, _, boundary, global_step, epoch, k, compute, exposed, nbytes, lr = kept[:10]
        warmup, samples, grad_syncs, link = kept[10:]
        return BoundaryStats(
            boundary,
            global_step,
            epoch,
            k,
            steps,
            compute,
            exposed,
            0.0,  # drift: ddp's replicas never drift
            0.0,  # update
            0.0,  # drift ratio
            loss_sum / steps,
            nbytes,
            float(lr),  # (read per step as the group holds it, perhaps a tensor)
            warmup,
            samples * self.world_size,  # DistributedSampler: equal samples per rank
            grad_syncs,
            0,  # parameter syncs
            link,
        )

    def _close_ddp_lazily(
        self, state: _Step, interval: Interval, compute: float, wait: float, grad_synced: bool
    ) -> bool:
        """ddp's step (a boundary of one step) where nobody reads its record now and the guard
        has nothing to judge: `_ddp_boundary`'s lazy branch, written out for the hot path
        (docs/design.md §4, Per step): the record kept as one tuple of its values, the K path's sums
        kept as two numbers (`k_path` folds them in), the loss held as LossSum holds a CPU scalar
        but no LossSum made per step; LossSum's test of what it holds is inlined (each call is paid
        at every step; tests/test_hot_path.py counts the bytecodes). False, with nothing changed,
        where the general path must run: observers, no decision yet, a boundary the guard
        judges, an interval of more than this step, or a loss LossSum would not hold as it is.
        A boundary at an interval's first step has K = 1 in force (ddp's options allow no other
        K). `last_boundary` builds the record from what is kept."""
        acc = self._loss  # anything added since the sum started: a restored state's
        if (
            self.observers
            or self.last_decision is None
            or not state.is_boundary  # (never on ddp, whose K is 1)
            or interval.steps  # (never on ddp either: K = 1 is this close's assumption)
            or state._last_of_epoch
            or self.boundary % DDP_PARAM_CHECK_EVERY == 0
            or acc.held
            or acc.number
            or acc.device_sum is not None
        ):
            return False
        loss = state.loss
        if loss is None:
            held = []
        elif (
            isinstance(loss, torch.Tensor) and loss.is_cpu and not loss.dim() and loss._base is None
        ):
            t = loss.detach()  # as LossSum.add holds it: keep the two tests the same
            held = [(t, t._version)]
        else:
            return False
        gs = self.grad_state
        compute += interval.compute_seconds
        exposed = interval.exposed_sync_seconds + wait
        self._lazy_record = (
            1,  # the interval's steps
            held,
            self.boundary,
            self.global_step,
            self.epoch,
            1,  # K
            compute,
            exposed,
            interval.grad_bytes + gs.nbytes,
            state._lr,
            self.warmup,
            interval.samples,
            interval.grad_syncs + grad_synced,
            self.link_name,
        )
        self._k1_seconds += compute + exposed
        self._k1_boundaries += 1  # each of one step
        self.collectives += gs.buckets
        self.boundary += 1
        self.global_step += 1
        # the next interval: this one emptied in place, as Interval() makes it (its steps are 0
        # already), without that frame at every step; nothing else holds it
        interval.compute_seconds = interval.exposed_sync_seconds = interval.loss_sum = 0.0
        interval.grad_bytes = interval.samples = interval.grad_syncs = 0
        return True

    def _finish_boundary(self, settle: bool = False) -> float:
        """Complete the launched averaging; return the seconds this rank spent waiting for it
        and applying it. `settle`: no step since it was launched (sync_now): θ_new exactly."""
        flight, self._pending, averager = self._pending, None, self.averager
        # its callers check that an averaging, which only an averager launches, is in flight
        assert flight is not None and averager is not None
        pending = flight.pending
        rec = averager.finish(pending, settle=settle)
        if self._probing and rec.grads_checked:
            self._choose_boundary(rec)
        finish_seconds = rec.wall_seconds - pending.seconds
        if self.virtual is not None:  # the wait for what _boundary booked (trainer/engine/clock.py)
            finish_seconds = self.virtual.wait(self.virtual.booked)
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
        self._close_boundary(stats, flight.sync_period, flight.steps)
        return finish_seconds

    def _choose_boundary(self, rec: Reconciled) -> None:
        """auto's choice, from a two-phase boundary step whose gradients some rank checked (the
        sums are every rank's, so every rank chooses alike): the fused boundary from the next
        one where every rank checked and none found them changed after backward; two-phase for
        good where one did (docs/design.md, "What the fused boundary needs unchanged")."""
        if rec.grads_changed:
            self._probing, self._watch = False, None
        elif rec.grads_checked == self.world_size:
            self._probing = False
            self.strategy = fused(self.strategy)
            self._fused = True

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
        self._emit("on_boundary", stats, decision)
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
            loss = self._lazy_record[1]
            # a LossSum (_ddp_boundary) or the held (tensor, version) list (_close_ddp_lazily)
            total = loss.take() if isinstance(loss, LossSum) else read_held(loss)
            self._last_boundary = self._ddp_stats(self._lazy_record, total)
            self._lazy_record = None
        return self._last_boundary

    def sync_now(self) -> float:
        """A boundary now, outside any step (epoch end, before evaluation or a checkpoint): on
        return every rank holds identical parameters (and, by the buffer policy, buffers).
        Returns this rank's seconds spent. Collective: every rank must call it."""
        if self._in_step is not None:
            if self._in_step is _CLOSED:
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
            self._interval.exposed_sync_seconds += self._finish_boundary(settle)
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
        carried = self._boundary(self._interval, k, lr, boundary_step=False)
        self._interval = Interval(exposed_sync_seconds=carried)
        return now() - t0

    def _emit(self, event: str, *args: Any) -> None:
        for obs in self.observers:
            fn = getattr(obs, event, None)
            if fn is not None:
                fn(*args)

    # ----- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything the engine needs to continue exactly (this rank's part): SlowMo reference
        and velocity, the controller, the divergence guard, the link's jitter stream, counters
        and the open interval. Plain tensors, numbers and lists (loads with weights_only)."""
        in_flight = None
        if self._pending is not None:
            # A delayed average (--fragment-delay, --overlap-boundary) is saved with its reduced
            # buffer, and is applied after a resume at the step it would have been.
            flight = self._pending
            in_flight = {
                "averager": self._the_averager().pending_state(flight.pending),
                "common": flight.common,
                "grad_bytes": flight.grad_bytes,
                "sync_period": flight.sync_period,
                "steps": flight.steps,
                "delay": flight.delay,
                "age": flight.age,
            }
        return {
            "kind": self._kind(),
            "pending": in_flight,
            "averager": self.averager.state_dict() if self.averager else None,
            "controller": self.controller.state_dict(),
            "divergence": self.divergence.state_dict(),
            "link": self.clock.state_dict() if self.clock else None,
            "virtual": self.virtual.state_dict() if self.virtual else None,
            "counters": {
                "sync_period": self.sync_period,
                "fragment_position": self._position,
                "global_step": self.global_step,
                "boundary": self.boundary,
                "grad_syncs": self.grad_syncs,
                "param_syncs": self.param_syncs,
                "collectives": self.collectives,
                "k_path": self.k_path,
                "interval": {f.name: getattr(self._interval, f.name) for f in fields(Interval)},
                **self._loss.state_dict(),  # loss_sum, loss_held
                "boundary_form": self._boundary_form(),
            },
        }

    def _boundary_form(self) -> str:
        """The cpdp boundary taken now: auto's choice, so a resume continues on the same path."""
        return "fused" if self._fused else "probing" if self._probing else "two-phase"

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
        if why := self._foreign(state):
            raise OptionError(f"load_state_dict: {why}")
        try:
            self._check_state(state)
        except BadState as exc:
            raise OptionError(f"load_state_dict: {exc}") from None
        c = state["counters"]
        form = c.get("boundary_form")  # absent from states saved before auto's check
        if form is not None and form not in _BOUNDARY_FORMS:
            raise OptionError(
                f"load_state_dict: counters.boundary_form: {str(form)[:20]!r}; one of "
                f"{', '.join(_BOUNDARY_FORMS)}"
            )
        in_flight = state.get("pending")
        if self.averager is not None:
            # (with an average in flight, the digest is the one it carries: not recomputed)
            at_boundary = c["interval"]["steps"] == 0 and in_flight is None
            self.averager.load_state_dict(state["averager"], recompute_digest=at_boundary)
        self._pending = None
        if in_flight is not None:
            self._pending = _InFlight(
                self._the_averager().restore_pending(in_flight["averager"]),
                dict(in_flight["common"]),
                in_flight["grad_bytes"],
                in_flight["sync_period"],
                in_flight["steps"],
                in_flight["delay"],
                in_flight["age"],
            )
        self.controller.load_state_dict(state["controller"])
        self.divergence.load_state_dict(state["divergence"])
        if self.clock is not None and state["link"] is not None:
            self.clock.load_state_dict(state["link"])
        if self.virtual is not None and state.get("virtual") is not None:
            self.virtual.load_state_dict(state["virtual"])
        self.sync_period = c["sync_period"]
        self._position = c.get("fragment_position", 1)  # absent before fragments existed
        self.global_step, self.boundary = c["global_step"], c["boundary"]
        self.grad_syncs, self.param_syncs = c["grad_syncs"], c["param_syncs"]
        self.collectives = c.get("collectives", 0)  # absent from checkpoints before it existed
        self.k_path = {int(k): dict(v) for k, v in c["k_path"].items()}
        self._interval = Interval(**c["interval"])
        self._last_boundary = self._lazy_record = None  # the record before the load is not this
        self._loss = LossSum()
        self._loss.load_state_dict(c)  # loss_held: absent from states saved before it
        if form is not None and self._auto:
            self._restore_boundary_form(form)

    def _restore_boundary_form(self, form: str) -> None:
        """auto's choice as saved (an explicit --boundary is the user's and stays)."""
        self._probing, self._fused = form == "probing", form == "fused"
        base = STRATEGIES[self.options.strategy]
        self.strategy = fused(base) if self._fused else base
        if form == "two-phase":
            self._watch = None
        elif self._watch is None:
            self._watch = GradWatch(self._params)

    def _kind(self) -> dict[str, Any]:
        """What a saved state must match to load here (checked by load_state_dict)."""
        return {
            "strategy": self.options.strategy,
            "policy": self.options.policy,
            "world_size": self.world_size,
            "numel": self.averager.numel if self.averager is not None else None,
            # the settings that shape the averager's state: its velocity, residual, fragments
            "outer_optimizer": self.options.outer.kind,
            "compress": self.options.compress,
            "fragments": self.options.fragments,
            "clock": self.options.clock,  # a virtual time line continues only a virtual one
        }

    def _check_state(self, state: dict[str, Any]) -> None:
        """Every part of a saved state against this engine (trainer/engine/state_check.py); raises
        BadState naming the first fault. Applies nothing."""
        check_counters(state["counters"], self.options.strategy, self.options.fragments)
        if self.averager is not None:
            check_averager(state["averager"], self.averager, self.options)
        if state.get("pending") is not None:
            check_pending(state["pending"], self.averager)
        k_values(state["controller"], "controller")
        loads_into_copy(self.controller, state["controller"], "controller")
        loads_into_copy(self.divergence, state["divergence"], "divergence", optional=("first",))
        if self.clock is not None and state["link"] is not None:
            check_link(state["link"])
        if self.virtual is not None and state.get("virtual") is not None:
            try:
                self.virtual.check_state(state["virtual"])
            except ValueError as exc:
                raise BadState(str(exc)) from None

    def _foreign(self, state: Any) -> str | None:
        if not isinstance(state, dict):
            return f"expected the dict sync.state_dict() returns, got {type(state).__name__}"
        keys = ("counters", "averager", "controller", "divergence", "link")
        if missing := [k for k in keys if k not in state]:
            return f"not an autok.Sync state (no {missing[0]!r})"
        if (state["averager"] is None) != (self.averager is None):
            saved = "ddp (no parameter averaging)" if state["averager"] is None else "averaging"
            return f"saved by {saved}; this Sync's strategy is {self.options.strategy}"
        kind = state.get("kind")  # absent from states saved before it was recorded
        if isinstance(kind, dict):
            mine = self._kind()
            for k, v in mine.items():
                if k in kind and kind[k] != v:
                    return f"saved with {k} {kind[k]!r}; this Sync has {v!r}"
        return None

    def close(self) -> None:
        """End with a boundary (identical replicas), then stop what the engine runs. After it,
        neither sync.model nor the optimizer reports to the Sync, and sync.step() or
        sync_now() raises; state_dict() still gives the final state. A second close does
        nothing."""
        if self._in_step is _CLOSED:
            return
        try:
            self.sync_now()
        finally:  # (a failed boundary still stops the observers, the exporter's server among them)
            for obs in self.observers:
                close = getattr(obs, "close", None)
                if close is not None:
                    close()
            # sync.model reports each forward to this Sync, and the optimizer each step: cycles
            # only the cyclic GC would free, with DDP's reducer and the process group it holds,
            # perhaps not until the interpreter finalizes, where a gloo group's teardown is not
            # safe. Broken here, they go when the loop drops them.
            self.model._after_forward = _no_report
            self.__dict__.pop("step", None)  # accumulation's bound _micro_step: a cycle too
            self.grad_state.release()
            if self._watch is not None:
                self._watch.disarm()
            for hook in self._optimizer_hooks:  # the user's optimizer is theirs again
                hook.remove()
            self._in_step = _CLOSED  # no step opens again: its optimizer step would go unseen


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


# What DDP's error at a forward says when the last synchronized backward left a parameter unused
_UNFINISHED_REDUCTION = "Expected to have finished reduction in the prior iteration"

_CLOSED: Any = object()  # Sync._in_step once closed: no step opens, no boundary runs

_BOUNDARY_FORMS = ("fused", "probing", "two-phase")  # Sync._boundary_form


@dataclass
class _Extras:
    """What rides with the parameters at a boundary, for the averager. Its own object, not
    methods of the Sync: the averager would hold the Sync in a cycle (see Sync.close)."""

    optimizer: torch.optim.Optimizer
    options: SyncOptions
    float_buffers: list[torch.Tensor]

    def averaged(self) -> list[torch.Tensor]:
        extras = state_tensors(self.optimizer) if self.options.sync_optimizer_state else []
        if self.options.buffer_policy == "average":
            extras = extras + self.float_buffers
        return extras

    def broadcast(self) -> list[torch.Tensor]:
        return self.float_buffers if self.options.buffer_policy == "broadcast" else []


def _lr_now(lr: Any) -> Any:
    """The step's LR as it is now, where the group holds it as a tensor (CUDA graphs, a compiled
    step), which a scheduler then updates in place: a number read now on the CPU, a copy on an
    accelerator (no host sync per step; read at the boundary)."""
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" else lr.detach().clone()
    return lr


def _no_report(args: tuple) -> None:
    """A closed Sync's `_after_forward`: forwards of sync.model are no longer timed."""


class _TimedDDP(DistributedDataParallel):
    """`sync.model`: DDP that reports the end of each forward to the engine. A forward hook on
    the module would do the same, but any module hook sends every call through nn.Module's slow
    path (about 5 µs a step on the cnn1d in a one-process test; docs/design.md §4, Per step); this
    is one frame."""

    _after_forward: Any = None

    # Never traced by torch.compile: the report reads the host clock, which a compiled
    # sync.model would break its graph on (docs/design.md §4). recursive=False: the frames this
    # one calls (DDP's forward, the user's module) are compiled as they would be without autok.
    @torch.compiler.disable(recursive=False)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        self._after_forward(args)
        return out


@dataclass
class _InFlight:
    """A delayed averaging: launched at a boundary, applied `delay` closed steps later."""

    pending: Any  # autok.trainer.engine.averaging._Pending
    common: dict[str, Any]  # the boundary's BoundaryStats fields known at launch
    grad_bytes: int
    sync_period: int  # the K of the interval it closed
    steps: int
    delay: int
    age: int = 0  # steps closed since it was launched


class _Step(StepHandle):
    """`with sync.step() as s`: the handle the loop body gets, and the step's state (its clock
    points), one object per step (each object a step makes is paid at every step).
    A class rather than a generator context manager, which costs a generator and its frames on
    every step. The state's fields are private (the body sets `loss` alone) and read their
    class defaults until the step sets them; one object serves one step."""

    _opened = False  # entered once: the object serves no other step
    _ctx: AbstractContextManager | None = None  # the backward context of a local step
    _last_of_epoch = False  # a boundary the loop asked for (`boundary=True`)
    _fragment = WHOLE  # what the step's boundary moves
    _t0 = _fwd_start = _forward = 0.0
    _t1: float | None = None
    _t2: float | None = None
    _t3: float | None = None
    _lr: float | None = None

    def __init__(self, sync: Sync, boundary: bool) -> None:
        self._sync, self.loss = sync, None
        if boundary:
            self._last_of_epoch = True

    def __enter__(self) -> StepHandle:
        if self._opened:
            raise RuntimeError("a sync.step() serves one step: open a new one for each")
        self._opened = True  # first: an opening that raised leaves nothing to enter again
        sync = self._sync
        ctx = sync._open_step(self)
        if ctx is not None:
            try:
                ctx.__enter__()
            except BaseException:
                sync._in_step = None
                raise
            self._ctx = ctx
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        sync = self._sync
        sync._in_step = None
        if self._ctx is not None:
            self._ctx.__exit__(exc_type, exc, tb)
        if exc_type is None:
            sync._close_step(self)
        elif exc_type is RuntimeError and _UNFINISHED_REDUCTION in str(exc):
            # DDP's many-line account of a parameter that got no gradient in the last
            # synchronized backward, as one line naming the argument that fixes it
            raise OptionError(
                f"ddp_kwargs: a parameter of the model got no gradient in a synchronized "
                f"backward (unused); {UNUSED_PARAMETERS_HINT}"
            ) from exc
        return False


class _MicroStep(_Step):
    """A step of `micro` forward/backward passes through sync.model (accumulation_steps, or
    fewer where the loop says so): only the last pass's backward all-reduces gradients; the
    others accumulate them locally, as under DDP's no_sync(). K counts the step once, and its
    collectives are those of one pass (docs/design.md §2). A step that saw another number of
    passes is refused at its close: its gradients would have been all-reduced never, or twice."""

    _passes = 0  # forwards with autograd on, before the optimizer step
    _held: bool | None = None  # DDP's gradient sync, held off until the last pass's forward

    def __init__(self, sync: Sync, boundary: bool, micro: int) -> None:
        super().__init__(sync, boundary)
        self._micro = micro

    def __enter__(self) -> StepHandle:
        super().__enter__()
        attrs = self._sync.model.__dict__
        if self._ctx is None and self._micro > 1:  # this step's backward all-reduces
            self._held = attrs["require_backward_grad_sync"]
            attrs["require_backward_grad_sync"] = False
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        sync = self._sync
        if self._held is not None:  # fewer passes than announced: DDP's flag back as it was
            sync.model.__dict__["require_backward_grad_sync"] = self._held
            self._held = None
        if exc_type is None and self._passes != self._micro:
            sync._in_step = None
            if self._ctx is not None:
                self._ctx.__exit__(None, None, None)
            raise RuntimeError(
                f"accumulation_steps: {self._passes} forward passes through sync.model in this "
                f"step, expected {self._micro}; give sync.step(micro_batches=n) for a short step"
            )
        return super().__exit__(exc_type, exc, tb)
