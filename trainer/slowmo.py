"""SlowMo at a boundary, on flat tensors (DESIGN §1).

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
) -> torch.Tensor:
    """Advance (ref, velocity) in place from the averaged parameters; return the new θ (= ref).

    β = 0 returns θ_avg itself (copied into ref): SlowMo off must not round θ_avg through
    θ_ref + (θ_avg − θ_ref), so that cpdp with K=1, β=0 reproduces ddp bit for bit. With β > 0
    and `delta` given, `avg` is not read (it may be None). `scale`: θ_avg − θ_ref is
    scale·`delta`, scale a power of two; `decayed`: the velocity already holds β·v (both as in
    trainer.outer.outer_step_).
    """
    if beta == 0.0 or velocity is None:
        ref.copy_(avg)
        return ref
    # Δ = θ_avg − θ_ref; the averager passes the one it has already computed for the update norm
    if delta is None:
        delta = avg.sub(ref)
    if not decayed:
        velocity.mul_(beta)
    if lr_aware:
        velocity.add_(delta, alpha=1.0 / lr * scale)
        ref.add_(velocity, alpha=lr)
    else:
        velocity.add_(delta, alpha=scale)
        ref.add_(velocity)
    return ref
