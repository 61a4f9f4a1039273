"""Streaming fragment sync's settings: F, τ, how a delayed average lands and what a fragment
is (docs/design.md §2, "Fragments"; trainer/engine/fragments.py). Their bounds against K and
the strategy are checked by SyncOptions (trainer/engine/options.py), which knows both.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autok.controllers.options import K_MAX
from autok.controllers.options import K_REASON as _K_REASON
from autok.trainer.engine.about import GROUPS, about
from autok.trainer.engine.fragments import FRAGMENTS_MAX

_SYNC = GROUPS[0]


class FragmentSettings(BaseModel):
    """--fragments, --fragment-delay, --fragment-merge, --fragment-alpha, --fragment-by."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # --- streaming fragment sync (trainer/engine/fragments.py): each boundary moves 1/F of the
    # model
    fragments: int = Field(
        1,
        ge=1,
        le=FRAGMENTS_MAX,
        description="F: split the parameters into F contiguous fragments that sync in turn, one "
        "every K/F steps, so each boundary moves 1/F of the model (localsgd; needs K >= F; epoch "
        "ends sync every fragment) (default: 1)",
        json_schema_extra=about(
            _SYNC, too_high=f"more than {FRAGMENTS_MAX} fragments only add a latency per sync"
        ),
    )
    fragment_delay: int = Field(
        0,
        ge=0,
        le=K_MAX,
        description="τ: apply a sync's average τ local steps after it started, keeping the "
        "steps taken meanwhile; τ <= K/F; --overlap-boundary is F = 1, τ = 1 (default: 0)",
        json_schema_extra=about(_SYNC, too_high=_K_REASON),
    )
    # How a delayed average lands on the local steps taken meanwhile (docs/design.md §2,
    # "Fragments", the merge): keep is autok's own (overlap local SGD), lerp torchft's and
    # Streaming DiLoCo's mix. Two settings, not α alone: α = 1 is no merge at all, and keep is
    # no α, so neither can be spelled by a value of the other.
    fragment_merge: Literal["keep", "lerp"] = Field(
        "keep",
        description="how a delayed average (--fragment-delay, --overlap-boundary) lands: keep "
        "(θ_global plus the local steps taken since it started) or lerp ((1 − α)·θ_global + "
        "α·θ_local, α = --fragment-alpha, torchft's fragment_update_alpha) (default: keep)",
        json_schema_extra=about(_SYNC),
    )
    fragment_alpha: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="α of --fragment-merge lerp: the share of θ_local kept where a delayed "
        "average lands (0 discards the local steps, torchft's default) (default: 0.0)",
        json_schema_extra=about(
            _SYNC,
            too_high="α = 1 keeps θ_local whole: every average would be thrown away",
            read_only_under=(
                "fragment_merge",
                frozenset({"lerp"}),
                "keep adds the local steps to θ_global and mixes nothing",
            ),
        ),
    )
    # What a fragment is (trainer/engine/fragments.py, fragment_plan)
    fragment_by: Literal["element", "module", "strided"] = Field(
        "element",
        description="how --fragments cuts the parameters: element (near-equal contiguous "
        "slices, a cut may fall inside a tensor), module (contiguous runs of whole parameter "
        "tensors, near-equal by bytes) or strided (fragment j takes tensors j, j + F, j + 2F, "
        "...) (default: element)",
        json_schema_extra=about(_SYNC),
    )
