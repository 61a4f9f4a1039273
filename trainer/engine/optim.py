"""Optimizers and LR schedules (stepped once per optimizer step)."""

from __future__ import annotations

import math

import torch
from torch import nn


def build_optimizer(
    name: str, model: nn.Module, lr: float, momentum: float, weight_decay: float, nesterov: bool
) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(
            model.parameters(),
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            nesterov=nesterov,  # with momentum 0, refused by TrainConfig (and torch)
        )
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


# Adam's family: the torch optimizers that divide by a running second moment of the gradient
# (exp_avg_sq, square_avg, sum, exp_inf; Adafactor's factored one), whose K floor is 2
# (trainer/engine/k_floor.py). A subclass is one; a wrapper (ZeroRedundancyOptimizer) is not.
SECOND_MOMENT = tuple(
    getattr(torch.optim, name)
    for name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "Adagrad", "Adadelta", "RMSprop")
    + ("SparseAdam", "Adafactor")
    if hasattr(torch.optim, name)  # Adafactor: torch 2.5 on
)


def divides_by_second_moment(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` is of Adam's family (SECOND_MOMENT)."""
    return isinstance(optimizer, SECOND_MOMENT)


def lr_factor(
    step: int,
    total_steps: int,
    warmup_steps: int,
    schedule: str,
    milestones: tuple[float, ...] = (),
    gamma: float = 0.1,
) -> float:
    """Multiplier of the peak LR for optimizer step `step` (0-based): linear warmup, then
    constant, cosine annealing to zero at `total_steps`, or `step`: times `gamma` at each
    milestone, a fraction of the whole run (warmup included, as torch's MultiStepLR counts
    epochs from the start): from step round(m * total_steps) on (rounded: 0.1 of 30 steps
    is step 3, though 0.1 * 30 is 3.0000000000000004 in floating point)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "step":
        return gamma ** sum(step >= round(m * total_steps) for m in milestones)
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_steps: int,
    schedule: str,
    milestones: tuple[float, ...] = (),
    gamma: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s, total_steps, warmup_steps, schedule, milestones, gamma),
    )


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The per-parameter float state worth averaging (SGD momentum, Adam moments), in a fixed
    order so every rank lays out the same buffer."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
                t = state.get(key)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == p.shape:
                    out.append(t)
    return out


def delayed_state_problem(
    optimizer: torch.optim.Optimizer, world_size: int, tau: int = 1
) -> str | None:
    """Why the optimizer's state cannot be averaged τ steps late (`--sync-optimizer-state` with
    `--overlap-boundary` or `--fragment-delay τ`), or None. The average lands as
    v_i + (v̄ − v_i,sent), after τ steps of v ← β·v + (1 − β)·g²: at worst (g = 0, every other
    rank's v near 0) it is ≥ v_i,sent·(β^τ + 1/N − 1), negative once N > 1/(1 − β^τ), and its
    square root is then NaN. Adam's family (β = betas[1]) and RMSprop (β = alpha) keep such a
    second moment (docs/design.md §2)."""
    for group in optimizer.param_groups:
        betas = group.get("betas")
        beta = betas[1] if isinstance(betas, (tuple, list)) and len(betas) == 2 else None
        if isinstance(optimizer, torch.optim.RMSprop):
            beta = group.get("alpha")
        if not isinstance(beta, (int, float)) or not beta < 1:
            continue
        bound = 1 / (1 - beta**tau)
        if world_size > bound:
            late = "--overlap-boundary" if tau == 1 else f"--fragment-delay {tau}"
            return (
                f"--sync-optimizer-state: with {late}, {type(optimizer).__name__}'s second "
                f"moment (decay {beta:g}) can turn negative on {world_size} ranks (more than "
                f"1/(1 - {beta:g}^{tau}) = {bound:.4g}); drop one of the two"
            )
    return None
