"""One `sync.step()`: the handle the loop body gets, the step's clock points, and `sync.model`
(docs/design.md §3, Public API). `Sync` keeps the step's state machine and its order of work; what
a step object holds lives here, one object per step (each object a step makes is paid at every
step: docs/design.md §4, Per step)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.nn.parallel import DistributedDataParallel

from autok.trainer.engine.fragments import WHOLE
from autok.trainer.engine.options import UNUSED_PARAMETERS_HINT, OptionError

if TYPE_CHECKING:
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


def no_report(args: tuple) -> None:
    """A closed Sync's `_after_forward`: forwards of sync.model are no longer timed."""


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
