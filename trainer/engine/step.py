"""One `sync.step()`: the handle the loop body gets, the step's clock points, and `sync.model`
(docs/design.md §3, Public API). `Sync` keeps the step's state machine and its order of work; what
a step object holds lives here, one object per step (each object a step makes is paid at every
step: docs/design.md §4, Per step), with the reports that give the Sync its clock points
(sync.model's forward, the optimizer's step hooks, accumulation's count of passes) and a step's
times as the virtual clock books them."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import MethodType
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from autok.trainer.engine.fragments import WHOLE
from autok.trainer.engine.options import UNUSED_PARAMETERS_HINT, OptionError

if TYPE_CHECKING:
    from autok.trainer.engine.grad_hook import GradSyncState
    from autok.trainer.engine.profiler import DeviceMarks
    from autok.trainer.engine.sync import Sync


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


# What DDP's error at a forward says when the last synchronized backward left a parameter unused
UNFINISHED_REDUCTION = "Expected to have finished reduction in the prior iteration"

CLOSED: Any = object()  # Sync._in_step once closed: no step opens, no boundary runs


def lr_now(lr: Any) -> Any:
    """The step's LR as it is now, where the group holds it as a tensor (CUDA graphs, a compiled
    step), which a scheduler then updates in place: a number read now on the CPU, a copy on an
    accelerator (no host sync per step; read at the boundary)."""
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" else lr.detach().clone()
    return lr


def micro_step(sync: Sync, boundary: bool = False, micro_batches: int | None = None) -> Step:
    """`sync.step()` with accumulation_steps N > 1 (bound as the Sync's own `step`), or with
    `micro_batches` given: a MicroStep of N passes, or of `micro_batches` (1..N)."""
    n = sync.accumulation_steps
    if micro_batches is None:
        return MicroStep(sync, boundary, n)
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int):
        raise OptionError(f"micro_batches: {micro_batches!r:.40} is not a count of passes")
    if not 1 <= micro_batches <= n:
        raise OptionError(
            f"micro_batches: {micro_batches} passes in a step; give 1 to accumulation_steps ({n})"
        )
    return MicroStep(sync, boundary, micro_batches) if n > 1 else Step(sync, boundary)


def after_micro_forward(sync: Sync, args: tuple) -> None:
    """`Sync._after_forward` with accumulation: the step's forwards counted; the last pass's
    forward runs with DDP's gradient sync back on (DDP decides at a forward whether its
    backward all-reduces), the earlier ones under no_sync() (MicroStep.__enter__)."""
    sync._after_forward(args)
    state = sync._in_step
    # (installed with accumulation only: every step is a MicroStep, CLOSED none)
    if isinstance(state, MicroStep) and state._t2 is None and torch.is_grad_enabled():
        state._passes += 1
        if state._passes == state._micro - 1 and state._held is not None:
            sync.model.__dict__["require_backward_grad_sync"] = state._held
            state._held = None


def device_times(
    marks: DeviceMarks, gs: GradSyncState, t1: float, t2: float
) -> tuple[float, float, float, float | None]:
    """The step as `Sync._close_step` reads it (forward, backward with its wait, optimizer, the
    gradient wait or None on a local step), on the device's clock: the one host sync of the
    step (docs/design.md §4)."""
    forward, span, optimizer, backward_end = marks.close()
    wait = gs.exposed_wait(t1, t2, backward_end)
    if wait is not None:
        wait = min(wait, span)
    return forward, span, optimizer, wait


def virtual_times(sync: Sync, gs: GradSyncState) -> tuple[float, float, float, float | None]:
    """The step as `Sync._close_step` reads it (forward, backward with its wait, optimizer, the
    gradient wait or None on a local step), booked on the virtual clock in place of what was
    measured (docs/design.md §4): only counts (the bytes and buckets backward all-reduced) are
    read. The link profile in force moves with the step."""
    v = sync.virtual
    assert v is not None  # called under --clock virtual only (_close_step)
    sync.link_name = v.move_to(sync.global_step, sync.epoch).name
    forward, backward, wait = v.step(sync.global_step, gs.nbytes, gs.buckets)
    return forward, backward + wait, 0.0, wait if gs.buckets else None


def no_report(args: tuple) -> None:
    """A closed Sync's `_after_forward`: forwards of sync.model are no longer timed."""


def install_reports(
    sync: Sync, optimizer: torch.optim.Optimizer
) -> tuple[RemovableHandle, RemovableHandle]:
    """sync.model's report of each forward's end, and the optimizer's step hooks (the end of
    backward, the end of the step): the step's clock points, given to the Sync. Returns the
    hooks' handles (`release_reports` removes them)."""
    # Called from sync.model's forward, which torch.compile does not trace: disabled here too,
    # with what it calls (the clock, the gradient hook it arms), or a compiled sync.model
    # would trace this frame and break its graph on the host clock (docs/design.md §4).
    sync.model._after_forward = torch.compiler.disable(sync._after_forward)
    if sync.accumulation_steps > 1:
        # each step's forwards counted, by a report of its own (no cost to a step of one pass)
        report = MethodType(after_micro_forward, sync)
        sync.model._after_forward = torch.compiler.disable(report)
        # rebound per instance, not branched on: a step of one pass pays nothing for it
        sync.step = MethodType(micro_step, sync)  # type: ignore[method-assign]
    return (
        optimizer.register_step_pre_hook(sync._before_optimizer_step),
        optimizer.register_step_post_hook(sync._after_optimizer_step),
    )


def release_reports(sync: Sync) -> None:
    """`install_reports` undone, at `Sync.close`. sync.model reports each forward to the Sync,
    and the optimizer each step: cycles only the cyclic GC would free, with DDP's reducer and the
    process group it holds, perhaps not until the interpreter finalizes, where a gloo group's
    teardown is not safe. Broken here, they go when the loop drops them."""
    sync.model._after_forward = no_report
    sync.__dict__.pop("step", None)  # accumulation's bound micro_step: a cycle too
    sync.grad_state.release()
    if sync._watch is not None:
        sync._watch.disarm()
    for hook in sync._optimizer_hooks:  # the user's optimizer is theirs again
        hook.remove()


class TimedDDP(DistributedDataParallel):
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


class Step(StepHandle):
    """`with sync.step() as s`: the handle the loop body gets, and the step's state (its clock
    points), one object per step (each object a step makes is paid at every step).
    A class rather than a generator context manager, which costs a generator and its frames on
    every step. The state's fields are private (the body sets `loss` alone) and read their
    class defaults until the step sets them; one object serves one step."""

    _opened = False  # entered once: the object serves no other step
    _ctx: AbstractContextManager | None = None  # the backward context of a local step
    _last_of_epoch = False  # a boundary the loop asked for (`boundary=True`)
    _fragment = WHOLE  # what the step's boundary moves
    _due: int | None = WHOLE  # forced: what the schedule syncs (None: nothing, no outer step)
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
        elif exc_type is RuntimeError and UNFINISHED_REDUCTION in str(exc):
            # DDP's many-line account of a parameter that got no gradient in the last
            # synchronized backward, as one line naming the argument that fixes it
            raise OptionError(
                f"ddp_kwargs: a parameter of the model got no gradient in a synchronized "
                f"backward (unused); {UNUSED_PARAMETERS_HINT}"
            ) from exc
        return False


class MicroStep(Step):
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
