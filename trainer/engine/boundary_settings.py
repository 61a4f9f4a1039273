"""What a boundary carries and how it lands: compression, optimizer state, buffers, the cpdp
boundary's form, overlap, and where the outer state waits between boundaries; and the step
before it (micro-batches per optimizer step). Composed into SyncOptions
(trainer/engine/options.py), whose validator checks them against the strategy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autok.trainer.engine.about import GROUPS, about
from autok.trainer.engine.strategy_settings import AVERAGING as _AVERAGING

ACCUMULATION_MAX = 65_536  # micro-batches per optimizer step
_SYNC = GROUPS[0]
_DDP_STATES = "every ddp step applies the same averaged gradient: optimizer states never differ"


class BoundarySettings(BaseModel):
    """--compress, --sync-optimizer-state, --buffer-policy, --boundary, --overlap-boundary,
    --outer-state-device; and autok.Sync's accumulation_steps (no flag)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # what the averaging collective carries: Δ_i = θ_i − θ_ref quantized
    # (trainer/engine/compress.py)
    compress: Literal["none", "fp16", "int8"] = Field(
        "none",
        description="what the parameter averaging carries: none (fp32 θ), or the pseudo-gradient "
        "θ − θ_ref in fp16 or int8 with a per-chunk scale and error feedback; with --boundary "
        "fused the gradients ride it too, quantized without error feedback (default: none)",
        json_schema_extra=about(_SYNC),
    )
    sync_optimizer_state: bool = Field(
        False,
        description="also average momentum buffers / Adam moments at boundaries",
        json_schema_extra=about(_SYNC, read_only_under=("strategy", _AVERAGING, _DDP_STATES)),
    )
    buffer_policy: Literal["average", "broadcast", "local"] = Field(
        "average",
        description="BatchNorm statistics at boundaries: average, broadcast (rank 0) or local",
        json_schema_extra=about(_SYNC),
    )
    boundary: Literal["auto", "fused", "two-phase"] = Field(
        "auto",
        description="cpdp boundary: fused (one collective carrying parameters and gradients, "
        "exact for SGD), two-phase (gradient AllReduce, then parameter AllReduce), or auto "
        "(fused when exact, and not under --compress)",
        json_schema_extra=about(
            _SYNC,
            read_only_under=(
                "strategy",
                frozenset({"cpdp"}),
                "only a cpdp boundary has both a gradient and a parameter collective to fuse "
                "or split",
            ),
        ),
    )
    overlap_boundary: bool = Field(
        False,
        description="start parameter averaging asynchronously and apply it one local step "
        "later, hiding the link latency behind compute (changes the algorithm: see README)",
        json_schema_extra=about(_SYNC),
    )
    # Where θ_ref and the outer velocity live between boundaries (trainer/engine/averaging.py):
    # "cpu" keeps the model's device at most 2x the parameters (docs/design.md §4)
    outer_state_device: Literal["model", "cpu"] = Field(
        "model",
        description="where θ_ref and the outer velocity live between boundaries: model (its "
        "device) or cpu (host memory, staged per boundary; the device then holds at most 2x "
        "the parameters)",
        json_schema_extra=about(_SYNC, before="boundary"),
    )
    # --- the step: forward/backward passes per optimizer step, only the last all-reduces
    # (trainer/engine/sync.py). Library only: `autok train`'s loop takes one per step
    # (autok/config.py), so it has no group (no flag)
    accumulation_steps: int = Field(
        1,
        ge=1,
        le=ACCUMULATION_MAX,
        description="micro-batches per optimizer step",
        json_schema_extra=about(
            None,
            too_high="a larger batch per optimizer step needs no more passes: give each a "
            "larger micro-batch",
        ),
    )
