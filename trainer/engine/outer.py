"""The outer step at a boundary, on flat tensors: what θ becomes once θ_avg is known.

Every outer optimizer works on the pseudo-gradient Δ = θ_ref − θ_avg (the distance the replicas
moved, on average, since the last boundary, with the sign of a gradient) and keeps a velocity v:

| kind       | update (μ = momentum, α = outer LR)                           | θ_new              |
|------------|---------------------------------------------------------------|--------------------|
| `average`  | none                                                          | θ_avg              |
| `sgd`      | v ← μ·v + Δ (torch.optim.SGD's buffer)                        | θ_ref − α·v        |
| `nesterov` | v ← μ·v + Δ; step = Δ + μ·v (torch.optim.SGD, nesterov=True)  | θ_ref − α·step     |
| `slowmo`   | u ← μ·u + (θ_avg − θ_ref) [/η if lr_aware]                     | θ_ref + α·u [·η]   |

and θ_ref ← θ_new, at scheduled boundaries only: an unscheduled sync (`sync_now()`, an epoch
end the schedule did not make due) sets the replicas to θ_avg and leaves θ_ref and v as they
were (docs/design.md §2, "Unscheduled syncs"). DiLoCo is `nesterov` with α = 0.7, μ = 0.9.
`slowmo` is trainer/engine/slowmo.py (SlowMo, Wang et al. 2020): u = −v, and α is the
paper's slow learning rate, which the `--slowmo-beta` spelling fixes at 1, so `slowmo` α = 1
equals `sgd` α = 1 bit for bit (the rounding of IEEE arithmetic is symmetric in sign). Its
`lr_aware` form keeps u in units of the inner LR η in force (fairscale's), so a decaying η also
shrinks the remembered momentum.

Where the update is θ_avg itself (α = 1 and μ = 0, or `average`), θ_avg is copied: computing
θ_ref − (θ_ref − θ_avg) would round, and the copy is what keeps cpdp with K = 1 equal to ddp bit
for bit (docs/design.md §2 and §8).

Any other torch.optim.Optimizer is the outer step through `TorchOuter` (autok.Sync's
`outer_optimizer=FACTORY`), as torchft's DiLoCo applies one: θ_ref is its parameters, Δ their
gradient, one `step()` gives θ_new. The names stay on `outer_step_` (docs/design.md §2, "Outer
optimizers", says why); `sgd` and `nesterov` are torch.optim.SGD's arithmetic op for op, which
tests/test_outer.py checks bit for bit against a factory of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch loads on first use: the options (and `autok --help`) read this module
    import torch

# "torch": a torch.optim.Optimizer built by the user's factory (TorchOuter), never a flag value
OuterKind = Literal["average", "slowmo", "nesterov", "sgd", "torch"]
OuterFactory = Callable[[list["torch.Tensor"]], "torch.optim.Optimizer"]
OUTER_KINDS: tuple[str, ...] = ("average", "slowmo", "nesterov", "sgd")
# DiLoCo's outer Nesterov (Douillard et al. 2023); SGD/SlowMo default to plain averaging + β.
DEFAULT_LR = {"average": 1.0, "slowmo": 1.0, "nesterov": 0.7, "sgd": 1.0}
DEFAULT_MOMENTUM = {"average": 0.0, "slowmo": 0.0, "nesterov": 0.9, "sgd": 0.0}


@dataclass(frozen=True)
class OuterOptimizer:
    """The resolved outer optimizer: kind, outer LR α, momentum μ (and SlowMo's lr_aware)."""

    kind: OuterKind = "average"
    lr: float = 1.0
    momentum: float = 0.0
    lr_aware: bool = False

    @property
    def needs_velocity(self) -> bool:
        """A velocity of the averager's own (a torch optimizer keeps its state itself)."""
        return self.kind not in ("average", "torch") and self.momentum > 0.0

    @property
    def is_plain_average(self) -> bool:
        """θ_new = θ_avg exactly: copied, never computed (never for a torch optimizer: its
        SGD(lr=1) computes θ_ref − Δ, which rounds, and it is the user's arithmetic)."""
        if self.kind == "torch":
            return False
        return self.kind == "average" or (self.lr == 1.0 and self.momentum == 0.0)


def outer_step_(
    spec: OuterOptimizer,
    ref: torch.Tensor,
    velocity: torch.Tensor | None,
    avg: torch.Tensor | None,
    inner_lr: float,
    delta: torch.Tensor | None = None,
    scale: float = 1.0,
    decayed: bool = False,
) -> torch.Tensor:
    """Advance (ref, velocity) in place from θ_avg; return θ_new (which is `ref`).

    `delta` is θ_avg − θ_ref if the caller has it (the averager computes it for the update
    norm, or receives it as the mean of the ranks' θ_i − θ_ref); it may be overwritten. Every
    step but a plain average reads only `delta` when given, so `avg` may then be None.
    `velocity` must exist when `spec.needs_velocity`. `scale`: θ_avg − θ_ref is scale·`delta`,
    with scale a power of two (the averager passes the ranks' sum of Δ_i and 1/N), so that
    every product with it is exact and the step is bit-identical to one on the mean.
    `decayed`: the velocity already holds μ·v, the first op of every update with a velocity
    (the averager takes it before the collective, where it waits for nothing)."""
    if scale != 1.0 and math.frexp(scale)[0] != 0.5:
        raise ValueError(f"outer_step_: scale {scale} is not a power of two")
    if spec.is_plain_average:
        assert avg is not None  # a plain average copies θ_avg: its callers pass it
        ref.copy_(avg)
        return ref
    if delta is None:
        assert avg is not None  # without Δ, θ_avg is what the step is taken from
        delta = avg.sub(ref)
    if velocity is not None and not decayed:
        velocity.mul_(spec.momentum)
    if spec.kind == "slowmo":  # SlowMo is written once: trainer/engine/slowmo.py, α its slow LR
        from autok.trainer.engine.slowmo import slowmo_update_

        return slowmo_update_(  # its velocity (if any) decayed just above
            ref, velocity, avg, spec.momentum, inner_lr, spec.lr_aware, delta, scale, True, spec.lr
        )
    # The pseudo-gradient Δ = θ_ref − θ_avg = −scale·delta. Its negation (and the scale) ride in
    # the factors where one add uses it; each product is exact (a sign, a power of two), so
    # this is bit-identical to negating first, a pass fewer.
    if velocity is None:  # μ = 0: sgd and nesterov are both θ_ref − α·Δ
        ref.add_(delta, alpha=spec.lr * scale)
        return ref
    if spec.kind == "sgd":
        velocity.add_(delta, alpha=-scale)
        ref.add_(velocity, alpha=-spec.lr)
        return ref
    pseudo = delta.neg_() if scale == 1.0 else delta.mul_(-scale)
    velocity.add_(pseudo)
    # nesterov looks ahead along the velocity: step = Δ + μ·v
    step = pseudo.add_(velocity, alpha=spec.momentum)
    ref.add_(step, alpha=-spec.lr)
    return ref


def unscheduled_(
    spec: OuterOptimizer,
    stepped: tuple[int, int],
    inner_lr: float,
    ref: torch.Tensor,
    velocity: torch.Tensor | None,
    theta_avg: torch.Tensor | None,
    delta: torch.Tensor,
) -> torch.Tensor:
    """θ_new of an unscheduled sync over a moved slice, in a buffer (not θ_ref): θ_avg, with
    θ_ref and the velocity (or a torch optimizer's state) untouched, so the next scheduled
    boundary's Δ spans everything since the last one, as if this sync had not been
    (docs/design.md §2, "Unscheduled syncs"). Only `stepped`, [lo, hi) of the slice (the
    fragment due at an epoch end), takes the outer step. `theta_avg` is None where the buffer
    holds Δ̄ = θ_avg − θ_ref (`delta`, compressed); the θ_i were sent otherwise, so θ_avg is
    their mean, and identical replicas stay as they are bit for bit (N = 2)."""
    lo, hi = stepped
    if lo < hi:  # (a torch optimizer moves the whole model: never a slice of it)
        assert spec.kind != "torch"
        vel = velocity[lo:hi] if velocity is not None else None
        avg = theta_avg[lo:hi] if theta_avg is not None else None
        outer_step_(spec, ref[lo:hi], vel, avg, inner_lr, delta=delta[lo:hi])
    if theta_avg is None:  # θ_ref + Δ̄ (the stepped slice is overwritten just below)
        theta_avg = delta.add_(ref)
    theta_avg[lo:hi].copy_(ref[lo:hi])
    return theta_avg


class TorchOuter:
    """A torch.optim.Optimizer as the outer step, as torchft's DiLoCo applies one: its
    parameters are θ_ref, as views of the averager's flat θ_ref shaped as the model's
    parameters (so param groups per layer work); at a boundary their `.grad` is the
    pseudo-gradient Δ = θ_ref − θ_avg and one `step()` leaves θ_new in θ_ref. SGD(lr=1,
    momentum=0) is then θ_ref − Δ = θ_avg (to rounding). Its state is the optimizer's own
    (`state_dict()`), saved with the averager's."""

    def __init__(self, factory: OuterFactory, flat: torch.Tensor, shapes: list[torch.Size]):
        self.flat = flat  # θ_ref, adopted by the averager (ParameterAverager.use_outer)
        sizes = [math.prod(s) for s in shapes]
        self.params = [c.view(s) for c, s in zip(flat.split(sizes), shapes, strict=True)]
        self.sizes = sizes
        try:
            opt = factory(list(self.params))  # a copy: the factory may consume the list
        except (TypeError, ValueError) as exc:  # torch's own refusals (a bad lr) are these
            raise ValueError(f"the factory raised {type(exc).__name__}: {str(exc)[:100]}") from None
        if why := _refusal(opt, self.params):
            raise ValueError(why)
        self.optimizer = opt
        self.name = f"{type(opt).__module__}.{type(opt).__qualname__}"

    def step_(self, delta: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """θ_ref ← the optimizer's step on Δ = −scale·`delta` (overwritten: `delta` is
        θ_avg − θ_ref as outer_step_ takes it, scale a power of two, so the negation and the
        scale are exact); return θ_ref."""
        if scale != 1.0 and math.frexp(scale)[0] != 0.5:
            raise ValueError(f"TorchOuter.step_: scale {scale} is not a power of two")
        pseudo = delta.neg_() if scale == 1.0 else delta.mul_(-scale)
        for p, g in zip(self.params, pseudo.split(self.sizes), strict=True):
            p.grad = g.view_as(p)
        try:
            self.optimizer.step()
        finally:  # no gradient outlives the boundary: they are views of its buffer
            for p in self.params:
                p.grad = None
        return self.flat


def _refusal(opt: object, params: list[torch.Tensor]) -> str | None:
    """Why the factory's result cannot be the outer step, or None."""
    import torch

    if not isinstance(opt, torch.optim.Optimizer):
        return f"the factory returned a {type(opt).__name__}, not a torch.optim.Optimizer"
    held = [id(p) for g in opt.param_groups for p in g["params"]]
    if len(held) != len(set(held)) or set(held) != {id(p) for p in params}:
        return (
            "the optimizer's param groups must hold exactly the parameters the factory was "
            "given, each once (build it over them: lambda params: torch.optim.SGD(params, ...))"
        )
    return None
