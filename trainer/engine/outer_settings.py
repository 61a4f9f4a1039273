"""The outer step a boundary takes on the pseudo-gradient θ_ref − θ_avg: SlowMo's spelling
(--slowmo-beta) or an outer optimizer's (docs/design.md §2; trainer/engine/outer.py runs it).
Which spelling applies, and their defaults, are resolved by SyncOptions' validator: it reads the
strategy too (trainer/engine/options.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autok.trainer.engine.about import GROUPS, about
from autok.trainer.engine.outer import OuterOptimizer
from autok.trainer.engine.strategy_settings import AVERAGING as _AVERAGING

_SYNC = GROUPS[0]


class OuterSettings(BaseModel):
    """--slowmo-beta, --slowmo-lr-aware, --outer-optimizer, --outer-lr, --outer-momentum."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    slowmo_beta: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="SlowMo momentum β in [0, 1); 0 turns it off; on localsgd it makes the "
        "LocalSGD+SlowMo ablation (default: 0.3 on cpdp, 0 otherwise)",
        json_schema_extra=about(_SYNC),
    )
    slowmo_lr_aware: bool = Field(
        False,
        description="keep the SlowMo velocity in LR units (fairscale's form)",
        json_schema_extra=about(
            _SYNC, read_only_under=("strategy", _AVERAGING, "ddp has no SlowMo")
        ),
    )
    # --- outer optimizer on the pseudo-gradient θ_ref − θ_avg (trainer/engine/outer.py); unset:
    # SlowMo with --slowmo-beta (that spelling stays; giving both is refused)
    outer_optimizer: Literal["average", "slowmo", "nesterov", "sgd"] | None = Field(
        None,
        description="outer step on the pseudo-gradient θ_ref − θ_avg at each boundary: "
        "average, sgd, nesterov (DiLoCo) or slowmo (default: unset, SlowMo with --slowmo-beta)",
        json_schema_extra=about(_SYNC),
    )
    outer_lr: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="outer learning rate α: θ = θ_ref − α·step; slowmo: the slow LR (default: 0.7 "
        "on nesterov, 1 otherwise)",
        json_schema_extra=about(
            _SYNC,
            too_high="an outer step 10x the replicas' mean move overshoots; DiLoCo uses 0.7",
        ),
    )
    outer_momentum: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="outer momentum μ in [0, 1) (default: 0.9 on nesterov, 0 otherwise)",
        json_schema_extra=about(_SYNC),
    )

    @property
    def outer(self) -> OuterOptimizer:
        """The resolved outer step of a boundary (trainer/engine/outer.py)."""
        if self.outer_optimizer is None:
            return OuterOptimizer("slowmo", 1.0, self.slowmo_beta or 0.0, self.slowmo_lr_aware)
        # both resolved to the optimizer's defaults by validation (_check_outer)
        assert self.outer_lr is not None and self.outer_momentum is not None
        return OuterOptimizer(
            self.outer_optimizer, self.outer_lr, self.outer_momentum, self.slowmo_lr_aware
        )
