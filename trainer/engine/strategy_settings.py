"""The strategy, its K and the K policy: which boundary the replicas meet at, how often, and
how the period evolves (docs/design.md §2). The first of SyncOptions' settings after the K
policies' own (trainer/engine/options.py composes them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autok.controllers import POLICIES as POLICY_ENTRIES
from autok.controllers import POLICY_OPTIONS
from autok.controllers.options import K_MAX
from autok.controllers.options import K_REASON as _K_REASON
from autok.trainer.engine.about import GROUPS, about

_SYNC, _POLICY = GROUPS[0], GROUPS[1]
# the strategies that average parameters at a boundary (ddp only all-reduces gradients)
AVERAGING = frozenset({"localsgd", "cpdp"})
# --policy's help names every registered policy, with what its registry entry notes
_POLICY_HELP = "how K evolves while training: " + ", ".join(
    name + (f" ({policy.note})" if policy.note else "") for name, policy in POLICY_ENTRIES.items()
)


class StrategySettings(BaseModel):
    """--strategy, --sync-period (K) and --policy."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # --- strategy, K and the K policy
    strategy: Literal["ddp", "localsgd", "cpdp"] = Field(
        "cpdp",
        description="ddp: sync every step; localsgd: average every K; cpdp: grad sync + average "
        "+ SlowMo every K",
        json_schema_extra=about(_SYNC),
    )
    sync_period: int | None = Field(
        None,
        ge=1,
        le=K_MAX,
        description="K, optimizer steps between boundaries (default: 4; 1 on ddp; under "
        "exposed-sync's direct rule with lowering, which sets K from its first measured boundary, "
        "its --k-floor (1; 2 under Adam's family); --k-schedule's first K under scheduled; never "
        "under --k-floor)",
        json_schema_extra=about(_SYNC, too_high=_K_REASON),
    )
    # listed first of its group, before the policies' own options (inherited: earlier fields)
    policy: str = Field(
        "fixed",
        description=_POLICY_HELP,
        json_schema_extra=about(_POLICY, before=POLICY_OPTIONS[0]),
    )
