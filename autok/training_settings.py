"""The training itself: how many workers, the optimizer, its LR and schedule, the batch and the
epochs (docs/design.md §2, Regimes: the LR decay). One of the run's settings models that
TrainConfig (autok/config.py) composes; what reads settings of several is checked there.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autok.trainer.engine.options import COUNT_MAX, GROUPS, about

# The run's own bounds (the engine's are in trainer/engine/*_settings.py); each bound's reason is
# its field's `about(too_low=..., too_high=...)`, printed with the refusal.
MAX_LOCAL_WORKERS = 256
MILESTONES_MAX = 16  # LR drops in one run; schedules in the literature have two or three
_SYNC, _OPTIM = GROUPS[0], GROUPS[3]
# SGD's own options (--momentum, --nesterov): AdamW would silently ignore them
_SGDS = (
    "optimizer",
    frozenset({"sgd"}),
    "it is SGD's; AdamW keeps its own moments, betas 0.9 and 0.999",
)


def parse_milestones(text: str) -> tuple[float, ...]:
    """`0.5,0.75` -> (0.5, 0.75): fractions of the run in (0, 1), increasing. Raises ValueError
    saying what is wrong (the caller names the flag)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > MILESTONES_MAX:
        raise ValueError(f"{len(parts)} milestones; at most {MILESTONES_MAX}")
    out: list[float] = []
    for p in parts:
        try:
            m = float(p)
        except ValueError:
            raise ValueError(f"{p[:20]!r} is not a number (e.g. 0.5,0.75)") from None
        if not 0.0 < m < 1.0:
            raise ValueError(f"{p[:20]} is not a fraction of the run in (0, 1)")
        if out and m <= out[-1]:
            raise ValueError(f"{p[:20]} does not come after {out[-1]!r}: give them increasing")
        out.append(m)
    return tuple(out)


# Whether each --optimizer divides by a running second moment of the gradient (Adam's family),
# which sets exposed-sync's K floor (trainer/engine/k_floor.py); tests/test_k_floor.py checks it
# against the torch class autok train builds for each name.
DIVIDES_BY_SECOND_MOMENT = {"sgd": False, "adamw": True}


class TrainingSettings(BaseModel):
    """--workers, and the optimization group: --optimizer, --lr, ..., --lr-gamma."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # --- distribution and synchronization
    workers: int = Field(
        4,
        ge=1,
        le=MAX_LOCAL_WORKERS,
        description="worker processes to spawn (ignored under torchrun, which sets the world)",
        json_schema_extra=about(
            _SYNC,
            too_high=f"at most {MAX_LOCAL_WORKERS} local worker processes, each a full Python "
            "with torch; spread larger worlds over machines with torchrun",
            before="strategy",
        ),
    )
    # --- optimization
    optimizer: Literal["sgd", "adamw"] = Field(
        "sgd",
        description="sgd (momentum, weight decay, Nesterov) or adamw",
        json_schema_extra=about(_OPTIM),
    )
    lr: float = Field(
        0.1,
        ge=1e-12,
        le=1e6,
        description="peak learning rate",
        json_schema_extra=about(
            _OPTIM,
            too_low="a smaller step leaves float32 parameters unchanged",
            too_high="no schedule peaks higher, and far larger rates overflow float32",
        ),
    )
    momentum: float = Field(
        0.9,
        ge=0.0,
        lt=1.0,
        description="SGD momentum",
        json_schema_extra=about(_OPTIM, read_only_under=_SGDS),
    )
    nesterov: bool = Field(
        False,
        description="Nesterov momentum (sgd)",
        json_schema_extra=about(_OPTIM, read_only_under=_SGDS),
    )
    weight_decay: float = Field(
        5e-4,
        ge=0.0,
        le=10.0,
        description="weight decay",
        json_schema_extra=about(
            _OPTIM, too_high="larger decay overflows or flips the parameters every step"
        ),
    )
    batch_size: int = Field(
        32,
        ge=1,
        le=1 << 20,
        description="batch size per worker",
        json_schema_extra=about(_OPTIM, too_high="per worker; larger batches exhaust memory"),
    )
    epochs: int = Field(
        30,
        ge=1,
        le=COUNT_MAX,
        description="training epochs",
        json_schema_extra=about(_OPTIM, too_high="a million epochs is beyond any run", resume=True),
    )
    warmup_epochs: int = Field(
        1,
        ge=0,
        description="epochs run at K=1 (every step a boundary)",
        json_schema_extra=about(_OPTIM),
    )
    lr_warmup_epochs: int | None = Field(
        None,
        ge=0,
        description="epochs of linear LR warmup (default: --warmup-epochs)",
        json_schema_extra=about(_OPTIM),
    )
    lr_schedule: Literal["constant", "cosine", "step"] = Field(
        "cosine",
        description="after warmup: constant, cosine to zero, or step (x --lr-gamma at each of "
        "--lr-milestones), stepped per optimizer step",
        json_schema_extra=about(_OPTIM),
    )
    # the regimes where K matters (docs/design.md §2, Regimes): LR decay, label skew, stragglers
    lr_milestones: str | None = Field(
        None,
        max_length=200,
        description="step: where the LR drops, as fractions of the whole run in (0, 1), "
        "increasing, e.g. 0.5,0.75 (default: unset)",
        json_schema_extra=about(_OPTIM),
    )
    lr_gamma: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="step: the LR's factor at each milestone, in (0, 1)",
        json_schema_extra=about(_OPTIM, too_high="a factor of 1 or more would not decay the LR"),
    )

    @field_validator("lr_milestones", mode="before")
    @classmethod
    def _milestones_as_text(cls, v: Any) -> Any:
        """A YAML list (or one number) reads as the flag's text; the text is canonical, so a
        saved config validates again unchanged (a resume)."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = [v]
        if isinstance(v, (list, tuple)):
            v = ",".join(str(m) for m in v)
        if isinstance(v, str):
            try:
                return ",".join(repr(m) for m in parse_milestones(v))
            except ValueError as exc:
                raise ValueError(f"--lr-milestones: {exc}") from None
        return v

    @property
    def milestones(self) -> tuple[float, ...]:
        """--lr-milestones as numbers (empty when unset)."""
        return parse_milestones(self.lr_milestones) if self.lr_milestones else ()
