"""Whether the loop changed the gradients between the end of backward and `optimizer.step()`:
the condition the fused cpdp boundary is exact under (docs/design.md, "What the fused boundary
needs unchanged").

The fused boundary takes the boundary step with each rank's own gradient gᵢ and averages the
gradients afterwards; the two-phase boundary (DDP) averages first. Anything the loop does to the
gradients in between is applied to gᵢ in the one and to ḡ in the other: the same only where it
is linear and alike on every rank. Clipping by norm is not (DDP clips the averaged gradient, the
fused form each rank's), nor is noise, nor a rank's own scaling.

Exact, not a fingerprint of the values: at the end of backward (a final autograd callback, run
after DDP's own, which writes the averaged gradients back) each parameter's gradient object and
its version counter are kept; at the optimizer step pre-hook a gradient that is another object,
or whose version moved, was changed. Every in-place op on a tensor (clipping's `mul_`, `clamp_`,
`add_` of noise, an item written) bumps its version counter; assigning `p.grad` replaces the
object. GradScaler's unscale (`_amp_foreach_non_finite_check_and_unscale_`) bumps no version
counter: it is linear and alike on every rank (one scale), so the plain AMP idiom stays fused;
`unscale_` followed by clipping is seen by the clipping. Not seen: a write through `.data` or
`torch.no_grad()` aliasing that bypasses autograd's counter (`p.grad.data.mul_`), which torch's
own clipping does not use.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, is_
from typing import Any

import torch
from torch.autograd import Variable

_queue_callback = Variable._execution_engine.queue_callback
# Read over every parameter by map in C: a boundary of a model with hundreds of tensors runs
# no Python per tensor for the mark and the check (tests/test_hot_path.py counts the bytecodes)
_GRAD, _VERSION = attrgetter("grad"), attrgetter("_version")

# What a boundary step's check found, summed over ranks in the averaging collective's scalars
# (trainer/engine/exact_sums.py, GRADS_CHECKED and GRADS_CHANGED).
UNCHECKED, CLEAN, CHANGED = 0, 1, 2


class GradWatch:
    """Marks the gradients at the end of a boundary step's backward and checks them at its
    optimizer step. Armed only for boundary steps (a hook on one parameter while armed): local
    steps pay nothing."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = [p for p in params if p.requires_grad]
        self._handle: Any = None
        # the gradients at the end of the last backward, and their version counters
        self._marked: tuple[list[torch.Tensor | None], list[int]] | None = None
        self.verdict = UNCHECKED

    def arm(self) -> None:
        """A boundary step opens: its backward is marked where it ends."""
        self._marked, self.verdict = None, UNCHECKED
        if self._handle is None and self.params:
            # The first parameter's gradient accumulation runs in every backward that reaches
            # it (DDP, as Sync builds it, needs every parameter used); as in
            # trainer/engine/grad_hook.py
            self._handle = self.params[0].register_post_accumulate_grad_hook(self._on_grad)

    def disarm(self) -> None:
        """The boundary step closed: the hook goes (local steps run no Python for it)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._marked = None

    def _on_grad(self, _param: torch.Tensor) -> None:
        # queued now it runs once every node of the graph has run; it queues _mark behind any
        # callback queued meanwhile, DDP's end-of-backward one (which writes ḡ back) among them
        _queue_callback(self._queue_mark)

    def _queue_mark(self) -> None:
        _queue_callback(self._mark)

    def _mark(self) -> None:
        grads = list(map(_GRAD, self.params))
        self._marked = grads, _versions(grads)

    def check(self) -> int:
        """At the boundary step's optimizer pre-hook: CHANGED if a gradient is another object
        or was written in place since the end of the last backward, CLEAN if not, UNCHECKED if
        no backward was marked in this step."""
        marked = self._marked
        if marked is None:
            self.verdict = UNCHECKED
            return self.verdict
        was, versions = marked
        grads = list(map(_GRAD, self.params))
        same = all(map(is_, grads, was)) and _versions(grads) == versions
        self.verdict = CLEAN if same else CHANGED
        return self.verdict

    def take(self) -> int:
        """The step's verdict, once (the boundary packs it); UNCHECKED after."""
        verdict, self.verdict = self.verdict, UNCHECKED
        return verdict


def _versions(grads: list[torch.Tensor | None]) -> list[int]:
    """Each gradient's version counter; -1 for a parameter without one (None)."""
    try:
        return list(map(_VERSION, grads))
    except AttributeError:  # (None has no version)
        return [-1 if g is None else g._version for g in grads]
