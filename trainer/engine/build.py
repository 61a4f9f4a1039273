"""What `Sync.__init__` builds from its options besides its own state: the averager with what rides
with the parameters, and the virtual clock (docs/design.md §2, §4). Functions of plain arguments,
so that the Sync's constructor reads as the order it builds things in."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from autok.trainer.engine.averaging import ParameterAverager
from autok.trainer.engine.clock import VirtualClock
from autok.trainer.engine.fragments import tensors_refusal
from autok.trainer.engine.link import LinkSchedule
from autok.trainer.engine.optim import state_tensors
from autok.trainer.engine.options import OptionError, SyncOptions


@dataclass(slots=True)
class Extras:
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


def check_fragments(opts: SyncOptions, model: nn.Module) -> None:
    """--fragments: at most one fragment per parameter element (per parameter tensor, where
    --fragment-by cuts between tensors)."""
    numel = sum(p.numel() for p in model.parameters())
    if opts.fragments > numel:
        raise OptionError(
            f"--fragments: {opts.fragments} fragments of a model with {numel} parameters; "
            f"give at most {numel}"
        )
    if why := tensors_refusal(model, opts.fragments, opts.fragment_by):
        raise OptionError(why)


def build_averager(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    opts: SyncOptions,
    float_buffers: list[torch.Tensor],
    *,
    rank: int,
    world_size: int,
    fused_sgd: torch.optim.SGD | None,
) -> ParameterAverager:
    """The parameter averager of an averaging strategy (trainer/engine/averaging.py)."""
    extras = Extras(optimizer, opts, float_buffers)
    return ParameterAverager(
        list(model.parameters()),
        rank=rank,
        world_size=world_size,
        outer=opts.outer,
        compress=opts.compress,
        averaged_extras=extras.averaged,
        broadcast_extras=extras.broadcast,
        fused_sgd=fused_sgd,
        fragments=opts.fragments,
        offload=opts.outer_state_device == "cpu",
        fragment_by=opts.fragment_by,
        merge_alpha=float(opts.fragment_alpha) if opts.fragment_merge == "lerp" else None,
    )


def virtual_clock(
    opts: SyncOptions, model: nn.Module, plan: LinkSchedule, world_size: int, rank: int
) -> VirtualClock:
    """--clock virtual's clock; --model-bytes scales every collective's bytes by the model's
    own parameter bytes (a small model booked as the large one it stands for)."""
    own = sum(p.numel() * p.element_size() for p in model.parameters())
    scale = opts.model_bytes / own if opts.model_bytes is not None and own else 1.0
    compute_ms = opts.compute_ms or 0.0  # (set whenever virtual: trainer/engine/options.py)
    return VirtualClock(plan, world_size, rank, opts.seed, compute_ms, scale)
