"""The averager's own state (trainer/engine/averaging.py, ParameterAverager.state_dict and
load_state_dict), saved with the engine's (trainer/engine/resume.py) and applied after the
parameters, once trainer/engine/state_check.py has checked it whole (docs/design.md §3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from autok.trainer.engine.digest import replica_digest
from autok.trainer.engine.fragments import WHOLE

if TYPE_CHECKING:
    from autok.trainer.engine.averaging import ParameterAverager


def averager_state(averager: ParameterAverager) -> dict:
    """What a resume needs of the averager (its `state_dict`): θ_ref, the outer state, the
    replica check's digest and the error feedback, as tensors and numbers."""
    return {
        "ref": averager.ref,
        "velocity": averager.velocity,
        "boundaries": averager.boundaries,
        "digest": averager.last_digest,
        "fragment": averager.last_fragment,  # what the digest describes
        "residual": averager._residual,  # error feedback (compression), or None
        "residual2": averager._residual2,  # ... of the requantized sums this rank owned
        # a torch optimizer's own state (use_outer), under its own key: absent otherwise
        **(
            {"outer": averager._torch_outer.optimizer.state_dict()} if averager._torch_outer else {}
        ),
    }


def load_averager_state(
    averager: ParameterAverager, state: dict, recompute_digest: bool = True
) -> None:
    """Call after the parameters themselves are loaded. By default the replica check's
    digest is recomputed from them, so replicas that resumed from differing files are caught
    at the first boundary (a digest kept from before the load would describe other
    weights); a state saved between boundaries restores the last boundary's digest."""
    averager.flat.staged = None  # a boundary that raised may have left its copies
    averager.ref.copy_(state["ref"])
    if averager.velocity is not None and state["velocity"] is not None:
        averager.velocity.copy_(state["velocity"])
    if averager._torch_outer is not None:  # (autok.Sync checked it on a copy first)
        averager._torch_outer.optimizer.load_state_dict(state["outer"])
    averager.boundaries = int(state["boundaries"])
    if state.get("residual") is not None:
        averager._residual = state["residual"].to(
            averager.ref.device, averager.ref.dtype, copy=True
        )
        # absent from states saved before the quantized all-reduce (an all-gather, which
        # requantized nothing): zero is then exact, nothing requantized is owed
        second = state.get("residual2")
        averager._residual2 = (
            torch.zeros_like(averager.ref)
            if second is None
            else second.to(averager.ref.device, averager.ref.dtype, copy=True)
        )
    averager.last_fragment = int(state.get("fragment", WHOLE))
    if recompute_digest or "digest" not in state:
        # of what the last boundary left identical: its fragment (or the whole model)
        averager.last_digest = replica_digest(
            averager.region(averager.last_fragment)[2], averager._bits
        )
    else:
        averager.last_digest = int(state["digest"])
