"""g_i of the fused cpdp boundary (docs/design.md §1): the boundary step's gradients, captured
into the averaging buffer's gradient segment as they enter the optimizer step, ride with the
parameters in ONE collective; each momentum buffer is then corrected by (ḡ − g_i)
(trainer/engine/averaging.py, ParameterAverager.start and finish)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from operator import is_not
from typing import cast

import torch

from autok.trainer.engine.exact_sums import N_SCALARS
from autok.trainer.engine.flat_buffer import FlatBuffer, views_of
from autok.trainer.engine.options import UNUSED_PARAMETERS_HINT, OptionError

Momenta = tuple[list[torch.Tensor], list[torch.Tensor]]  # (momentum buffers, their gradients)
_NO_STATE: dict = {}  # a parameter's optimizer state before its first step (never written)


class FusedGrads:
    """The fused SGD, where its g_i sit in the buffer, and whether this boundary's are there."""

    def __init__(
        self,
        sgd: torch.optim.SGD,
        params: list[torch.Tensor],
        flat: FlatBuffer,
        averaged_extras: Callable[[], list[torch.Tensor]],
        broadcast_extras: Callable[[], list[torch.Tensor]],
    ) -> None:
        if sgd.param_groups[0].get("dampening", 0) != 0:
            raise ValueError("the fused boundary needs SGD without dampening")
        self.sgd, self.params, self.flat = sgd, params, flat
        self._averaged_extras, self._broadcast_extras = averaged_extras, broadcast_extras
        self.numel = sum(p.numel() for p in params)
        self.captured = False  # g_i of the fused boundary step is in the buffer
        # the gradient segment: (the store it is cut from, the segment, its views); at first
        # cut from no store (so the first boundary cuts it)
        none = torch.empty(0)
        self.views: tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] = (none, none, [])

    def capture(self) -> None:
        """Keep g_i as it enters the fused boundary's optimizer step. Called from an optimizer
        step pre-hook: the gradient must be read BEFORE the step, since torch's multi-tensor
        SGD (foreach, the default on CUDA) with Nesterov and no weight decay adds μ·buf into
        p.grad in place."""
        grads = [p.grad for p in self.params]
        seg, views = self.segment()
        if all(g is not None and not g.requires_grad for g in grads):
            torch._foreach_copy_(views, grads)  # type: ignore[arg-type]  # (None: just checked)
        else:  # a missing gradient is a zero; one kept with its graph (create_graph) detached
            pairs = enumerate(zip(grads, self.params, strict=True))
            if unused := [i for i, (g, p) in pairs if g is None and p.requires_grad]:
                # DDP, whose reduction this boundary stands in for, refuses an unused parameter
                # (the two-phase boundary with find_unused_parameters handles one; Sync)
                raise OptionError(
                    f"ddp_kwargs: parameter {unused[0]} got no gradient at a boundary (unused); "
                    f"{UNUSED_PARAMETERS_HINT}"
                )
            filled = [
                g.detach() if g is not None else torch.zeros_like(p)
                for g, p in zip(grads, self.params, strict=True)
            ]
            torch.cat([g.reshape(-1) for g in filled], out=seg)
        # A fused SGD (fused=True) under a GradScaler is handed the scale and found_inf by
        # scaler.step and unscales, or skips the step, inside its own kernel, after this hook:
        # g_i as it moves the weights is g / scale, or zeros for a step skipped on an inf
        # (as a plain SGD's skipped step, whose hook never runs). On the device: no host sync.
        opt = self.sgd
        scale, found = getattr(opt, "grad_scale", None), getattr(opt, "found_inf", None)
        if scale is not None:
            seg.div_(scale.to(seg.device))  # as the kernel does (a division)
        if found is not None:
            seg.masked_fill_(found.to(seg.device) > 0, 0.0)
        self.captured = True

    def segment(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Where the fused boundary's g_i sit in the collective's buffer, [θ | g_i | averaged
        extras | broadcast extras | scalars]: captured there, they are not copied again. The
        segment and its views shaped as the parameters, cut once per allocation of the buffer
        (it may grow: optimizer state appears after the first step), not at every boundary."""
        extras = self._averaged_extras() + self._broadcast_extras()
        flat = self.flat
        flat.buffer(2 * self.numel + sum(t.numel() for t in extras) + N_SCALARS)
        if self.views[0] is not flat.store:
            seg = flat.store[self.numel : 2 * self.numel]
            self.views = (flat.store, seg, views_of(seg, self.params))
        return self.views[1], self.views[2]

    def boundary_grads(self) -> list[torch.Tensor]:
        """g_i as views of the buffer's gradient segment, captured as it entered the boundary's
        step. A step that did not run on this rank (GradScaler skipped it: its gradient held an
        inf) carries zeros: it applied no gradient, and an inf must not reach the other ranks."""
        seg, views = self.segment()
        if not self.captured:
            seg.zero_()
        self.captured = False
        return views

    def momenta(self, grads: list[torch.Tensor]) -> Momenta | None:
        """The fused SGD's momentum buffers and, paired with them, the gradient views of their
        parameters (a parameter without a buffer has no momentum to correct); None if none.
        Every parameter has one once a step with momentum ran: looked up in C (map), no
        Python a parameter on the boundary's path (docs/design.md §4, Per step)."""
        states = map(self.sgd.state.get, self.params, repeat(_NO_STATE))
        found = list(map(dict.get, states, repeat("momentum_buffer")))
        if all(map(is_not, found, repeat(None))):  # (the cast: None is ruled out just now)
            return (cast("list[torch.Tensor]", found), list(grads)) if found else None
        get = self.sgd.state.get  # one lookup a parameter: a tensor hashes in Python
        bufs, gs = [], []
        for p, g in zip(self.params, grads, strict=True):
            st = get(p)
            buf = st.get("momentum_buffer") if st else None
            if buf is not None:
                bufs.append(buf)
                gs.append(g)
        return (bufs, gs) if bufs else None
