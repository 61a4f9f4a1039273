"""The K policies' options, declared once: each field's type, default, bounds, help line and
`about` (group, why a bound is where it is). The engine's SyncOptions inherits these fields, so
each is an `autok.Sync` option and an `autok train` flag of the same name with no second
declaration (trainer/engine/options.py); a policy factory gets them as a PolicyOptions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.config import JsonDict

from autok.controllers.exposed_sync import GRADE_WINDOWS
from autok.controllers.link_check import SHIFT_ROUNDS
from autok.controllers.scheduled import parse_k_schedule

K_MAX = 2**20
COUNT_MAX = 1_000_000  # epochs, windows, cooldowns, restarts: beyond any run
K_REASON = "K beyond 2^20 steps is never reached: epoch ends synchronize anyway"
# The group of `autok train --help` (and docs/flags.md) that lists these options; the engine's
# GROUPS takes its name from here.
GROUP = "K policy"


def about(*, too_high: str | None = None, before: str | None = None) -> JsonDict:
    """A K-policy option's `json_schema_extra`, in the form the engine's `about` writes and its
    `about_of` reads back (trainer/engine/options.py: the controllers sit below the engine, so
    they cannot call it): its group, why its upper bound is where it is, and the option of its
    group it is listed just before (else field order)."""
    said = {"group": GROUP, "too_high": too_high, "before": before}
    return {"autok": {k: v for k, v in said.items() if v is not None}}


class PolicySettings(BaseModel):
    """The options a K policy may read (each Policy's `reads` names its own). Field `foo_bar` is
    flag `--foo-bar`; the engine refuses one the chosen policy does not read."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    target_sync_share: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="exposed-sync/composite: raise K while exposed sync is above this "
        "share of (compute + exposed sync)",
        json_schema_extra=about(),
    )
    max_sync_period: int = Field(
        64,
        ge=1,
        le=K_MAX,
        description="largest K any policy may choose (adacomm starts at it)",
        json_schema_extra=about(too_high=K_REASON),
    )
    sync_window: int = Field(
        4,
        ge=1,
        le=COUNT_MAX,
        description="boundaries per controller decision (exposed-sync, adacomm, composite)",
        json_schema_extra=about(),
    )
    k_growth: int = Field(
        2,
        ge=2,
        le=1024,
        description="factor by which exposed-sync steps K under --k-rule double, and by which "
        "its guard backs off under either rule",
        json_schema_extra=about(),
    )
    drift_limit: float = Field(
        3.0,
        gt=1.0,
        description="guard: back off when the window's drift ratio exceeds this multiple of "
        "its level in the first post-warmup window",
        json_schema_extra=about(),
    )
    loss_rise: float = Field(
        0.1,
        gt=0.0,
        description="guard: back off when the window's loss exceeds the best window's by this "
        "fraction",
        json_schema_extra=about(),
    )
    # on skewed data the link's K misses the target (controllers/exposed_sync.py)
    skew_drift: float = Field(
        1.4,
        ge=0.0,
        le=1e6,
        description="exposed-sync/composite: the drift ratio of the first window at K >= 2 "
        "above which the data counts as skewed and K is held under --skew-cap's soft cap for "
        "the rest of the run (0: off)",
        json_schema_extra=about(too_high="a drift ratio is a ratio of norms; 0 turns it off"),
    )
    # iid judged at the first decision where the rounds before it read far under --skew-drift
    # (controllers/exposed_sync.py, "cleared early")
    skew_clear: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="exposed-sync/composite: where a run's first 2 rounds run at K >= 2 (a "
        "floor of 2, or a starting K of 2 or more; no warmup), the fraction of --skew-drift "
        "at or under which their mean drift ratio counts the data as iid at its first "
        "decision, before --skew-drift's full window (any other reading waits for it; 0: off)",
        json_schema_extra=about(too_high="at --skew-drift itself it would clear skewed data"),
    )
    skew_cap: int = Field(
        4,
        ge=1,
        le=K_MAX,
        description="exposed-sync/composite, on skewed data (--skew-drift), and on any until a "
        "window at K >= 2 has judged it: the link's K* above which K grows only as "
        "sqrt(cap * K*)",
        json_schema_extra=about(too_high=K_REASON),
    )
    skew_strong: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="exposed-sync/composite, on skewed data: the drift ratio over the first "
        f"{GRADE_WINDOWS} windows of --skew-drift's kind (rounds and steps at K >= 2) above "
        "which skew counts as strong and the soft cap scales with half of --skew-cap (0: off)",
        json_schema_extra=about(too_high="a drift ratio is a ratio of norms; 0 turns it off"),
    )
    # the soft cap's law: the square root by default (controllers/exposed_sync.py, "the cap's
    # exponent"); 2/3 fits the controller panel's best levels on two links (docs/design.md §6)
    skew_power: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="exposed-sync/composite, on skewed data: the soft cap's exponent, K <= "
        "cap^(1-p) * K*^p above --skew-cap (0.5, the default: sqrt(cap * K*); 1: K* itself)",
        json_schema_extra=about(too_high="K* itself is the link's K: no cap"),
    )
    skew_grade_gamma: float = Field(
        0.0,
        ge=0.0,
        le=2.0,
        description="exposed-sync/composite, with --skew-strong: read the grading window's "
        "drift ratio times (K/4)^gamma, K its steps a round, so that one threshold may "
        "serve several K (the ratio falls with K; 0.28 on the controller panel's shards; 0, "
        "the default: as measured)",
        json_schema_extra=about(
            too_high="the ratio falls as K^-0.28 on the panel's shards: 2 is seven times that"
        ),
    )
    # a link that changes mid-run is met in SHIFT_ROUNDS rounds (controllers/link_check.py);
    # off by default: on the panel's flip-link it moved the skew judgement (docs/design.md §6)
    link_shift: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description=f"exposed-sync/composite: {SHIFT_ROUNDS} rounds in a row whose network time "
        "is over this many times the window's level (its median) end the window there: a "
        "slower link is met two rounds after it changes rather than after --sync-window "
        "rounds; a faster one likewise under the level divided by --link-drop (by this where "
        "--link-drop is 0) (0, the default: off; 3 is the ratio measured; near 1 ordinary "
        "jitter reads as a change)",
        json_schema_extra=about(too_high="a ratio of sync times; 0 turns it off"),
    )
    # its faster-link half alone, on by default: a K too large for a fast link buys no time
    # and costs quality (controllers/link_check.py, "a faster link"; docs/design.md §6)
    link_drop: float = Field(
        3.0,
        ge=0.0,
        le=1e6,
        description=f"exposed-sync/composite: {SHIFT_ROUNDS} rounds in a row whose network time "
        "is under the window's level (the lower median of its rounds and the last decision's "
        "level; with --link-shift, its median) divided by this end the window there: a faster "
        "link is met two rounds after it changes, a slower one after --sync-window rounds "
        "unless --link-shift (0: off, or --link-shift's ratio where that is given)",
        json_schema_extra=about(too_high="a ratio of sync times; 0 turns it off"),
    )
    # K* and the soft cap are periods; an epoch holds whole syncs (controllers/exposed_sync.py,
    # "epoch rounds"); off by default
    epoch_rounds: bool = Field(
        False,
        description="exposed-sync/composite, under --k-rule direct: meet the link's K* and the "
        "soft skew cap with the K whose mean round, E/ceil(E/K) steps where every E steps end "
        "with a boundary (an epoch), is nearest them, rather than with K* or the cap rounded, "
        "whose epoch may end on a short round that pays a whole sync (15 of 32: rounds of 15, "
        "15 and 2; with it 16). A loop of your own over autok.Sync must set its period_cap, on "
        "every rank",
        json_schema_extra=about(),
    )
    # Adam's second moment after K = 1 (controllers/exposed_sync.py, "Adam's family")
    k_floor: int | None = Field(
        None,
        ge=1,
        le=K_MAX,
        description="exposed-sync/composite: the lowest K it chooses (lowering, a back-off, a "
        "cap; warmup's K = 1 aside) and the lowest it starts at (the floor under the direct "
        "rule with lowering, else max(4, floor)); a --sync-period under it is refused "
        "(default: the optimizer's: 2 under Adam's family, which divides by a second moment of "
        "the gradient (AdamW, Adam, RMSprop, ...), unless --max-sync-period is 1; else 1)",
        json_schema_extra=about(too_high=K_REASON),
    )
    guard_cooldown: int = Field(
        32,
        ge=1,
        le=COUNT_MAX,
        description="boundaries after a back-off before K may rise above the backed-off value "
        "(on data judged skewed, --skew-drift: never)",
        json_schema_extra=about(),
    )
    # the direct rule with lowering: the panel's default adaptive policy (docs/policies.md)
    k_lowering: bool = Field(
        True,
        description="exposed-sync: also lower K when K/growth would keep the share well under "
        "target (a link that got faster)",
        json_schema_extra=about(before="drift_limit"),
    )
    k_rule: Literal["double", "direct"] = Field(
        "direct",
        description="exposed-sync/composite: double (step K by --k-growth) or direct (jump to "
        "the K that brings the share to the target, up or down, from the measured compute and "
        "sync)",
        json_schema_extra=about(before="drift_limit"),
    )
    qsr_base: int | None = Field(
        None,
        ge=1,
        le=K_MAX,
        description="qsr/composite: K_base (default: --sync-period)",
        json_schema_extra=about(too_high=K_REASON),
    )
    qsr_alpha: float | None = Field(
        None,
        gt=0.0,
        le=1e6,
        description="qsr/composite: alpha in K = (alpha/lr)^2 (default: --lr x sqrt(K_base))",
        json_schema_extra=about(
            too_high="(alpha/lr)^2 would overflow; K is capped by --max-sync-period anyway"
        ),
    )
    random_mean: float | None = Field(
        None,
        ge=1.0,
        le=K_MAX,
        description="random: the mean of the K drawn at each boundary (default: --sync-period)",
        json_schema_extra=about(),
    )
    k_schedule: str | None = Field(
        None,
        max_length=2048,
        description="scheduled: K from step 0, then from each step given: K,K@step=N,... "
        "(steps counted from 0), e.g. 16,32@step=160,16@step=352; its first K is the run's "
        "--sync-period",
        json_schema_extra=about(),
    )

    @field_validator("link_shift", "link_drop")
    @classmethod
    def _off_or_above_one(cls, ratio: float, info: ValidationInfo) -> float:
        if 0 < ratio <= 1:
            name = str(info.field_name)
            kind = "a faster link" if name == "link_drop" else "a changed link"
            raise ValueError(
                f"--{name.replace('_', '-')}: {ratio:g} would read every round as {kind}; give "
                "a ratio above 1 (3: the ratio measured) or 0 (off)"
            )
        return ratio

    @model_validator(mode="after")
    def _checked_where_it_acts(self) -> PolicySettings:
        """A changed link closes a window early: one of SHIFT_ROUNDS rounds or fewer closes no
        later, so a --link-shift (or a --link-drop other than its default) given with it would
        change nothing; --epoch-rounds meets K*, which the doubling rule does not read."""
        default_drop = type(self).model_fields["link_drop"].default
        for name, given in (
            ("link_shift", self.link_shift > 0),
            ("link_drop", self.link_drop > 0 and self.link_drop != default_drop),
        ):
            if given and self.sync_window <= SHIFT_ROUNDS:
                opt = f"--{name.replace('_', '-')}"
                raise ValueError(
                    f"{opt}: a window of --sync-window {self.sync_window} rounds closes no later "
                    f"than the check ({SHIFT_ROUNDS} rounds); drop {opt} or widen the window"
                )
        if self.epoch_rounds and self.k_rule != "direct":  # the doubling rule reads no K*
            raise ValueError(
                f"--epoch-rounds: meets the direct rule's K*, and --k-rule is {self.k_rule}; "
                "drop --epoch-rounds or give --k-rule direct"
            )
        return self

    @field_validator("k_schedule")
    @classmethod
    def _parses(cls, text: str | None) -> str | None:
        if text is not None:
            try:
                parse_k_schedule(text)
            except ValueError as exc:
                raise ValueError(f"--k-schedule: {exc}") from None
        return text


class PolicyOptions(PolicySettings):
    """What a policy's factory gets: the K-policy settings, and the run's own that every policy
    may read (RUN_OPTIONS: the peak LR, the seed)."""

    model_config = ConfigDict(frozen=True)

    peak_lr: float = 0.1
    seed: int = 42


# The K-policy options, in their declaration order (each is also a setting of the same name).
POLICY_OPTIONS = tuple(PolicySettings.model_fields)
RUN_OPTIONS = frozenset(PolicyOptions.model_fields) - frozenset(POLICY_OPTIONS)
# The skew rule's own options, with what each does: unread with the rule off (--skew-drift 0), so
# refused there (trainer/engine/options.py) and dropped from a run saved so (autok/space.py
# never_read)
SKEW_RULE_OPTIONS = {
    "skew_cap": "shapes the soft skew cap",
    "skew_power": "shapes the soft skew cap",
    "skew_clear": "judges skew early",
}
