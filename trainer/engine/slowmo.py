"""SlowMo at a boundary, on flat tensors (docs/design.md §2, SlowMo).

    Δ = θ_avg − θ_ref ;  v ← β·v + Δ ;  θ_new = θ_ref + v ;  θ_ref ← θ_new

With `lr_aware` (fairscale's form) the velocity is kept in units of the learning rate η in force,
v ← β·v + Δ/η and θ_new = θ_ref + η·v, so a decaying LR also shrinks the remembered momentum.
"""

from __future__ import annotations

import torch


def slowmo_update_(
    ref: torch.Tensor,
    velocity: torch.Tensor | None,
    avg: torch.Tensor | None,
    beta: float,
    lr: float,
    lr_aware: bool = False,
    delta: torch.Tensor | None = None,
    scale: float = 1.0,
    decayed: bool = False,
    alpha: float = 1.0,
) -> torch.Tensor:
    """Advance (ref, velocity) in place from the averaged parameters; return the new θ (= ref).

    β = 0 returns θ_avg itself (copied into ref): SlowMo off must not round θ_avg through
    θ_ref + (θ_avg − θ_ref), so that cpdp with K=1, β=0 reproduces ddp bit for bit. With β > 0
    and `delta` given, `avg` is not read (it may be None). `scale`: θ_avg − θ_ref is
    scale·`delta`, scale a power of two; `decayed`: the velocity already holds β·v (both as in
    autok.trainer.engine.outer.outer_step_). `alpha`: the slow LR α of `--outer-lr` on `slowmo`,
    θ_new = θ_ref + α·v (α·η·v lr-aware); 1 is the paper's (and `--slowmo-beta`'s) SlowMo.

    This is SlowMo's one implementation, kept apart from torch.optim.SGD (which equals it for
    α = 1 and lr_aware off, tests/test_outer.py): lr_aware's v in units of η is no torch
    optimizer's arithmetic (docs/design.md §2, "Outer optimizers").
    """
    if alpha == 1.0 and (beta == 0.0 or velocity is None):
        assert avg is not None  # SlowMo off copies θ_avg: its callers pass it
        ref.copy_(avg)
        return ref
    # Δ = θ_avg − θ_ref; the averager passes the one it has already computed for the update norm
    if delta is None:
        assert avg is not None  # without Δ, θ_avg is what the step is taken from
        delta = avg.sub(ref)
    if velocity is None:  # β = 0 with a slow LR α ≠ 1: θ_ref + α·Δ
        ref.add_(delta, alpha=alpha * scale)
        return ref
    if not decayed:
        velocity.mul_(beta)
    if lr_aware:
        velocity.add_(delta, alpha=1.0 / lr * scale)
        ref.add_(velocity, alpha=alpha * lr)
    else:  # (α = 1: a + 1·b is a + b exactly, fused or not)
        velocity.add_(delta, alpha=scale)
        ref.add_(velocity, alpha=alpha)
    return ref
