"""The run's typed configuration. Field `foo_bar` is flag `--foo-bar` and YAML key `foo_bar`.

Every error names the flag to change: the CLI prints it on one line and exits with code 2.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controllers import REGISTRY as POLICIES
from controllers import PolicyOptions
from trainer.data import DATASETS, check_data_dir
from trainer.link import PROFILES, LinkProfile, resolve_profile
from trainer.models import DEFAULT_MODEL, MODELS, incompatibility

STRATEGIES = ("ddp", "localsgd", "cpdp")


class ConfigError(ValueError):
    """A bad setting; the message starts with the flag to change."""


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    # --- distribution and synchronization
    workers: int = Field(4, ge=1, description="worker processes (ranks) to spawn locally")
    strategy: Literal["ddp", "localsgd", "cpdp"] = "cpdp"
    sync_period: int | None = Field(
        None, ge=1, description="K: optimizer steps between boundaries; default 4 (1 on ddp)"
    )
    policy: str = "fixed"
    slowmo_beta: float | None = Field(
        None, ge=0.0, lt=1.0, description="SlowMo β; default 0.3 on cpdp, 0 on localsgd"
    )
    slowmo_lr_aware: bool = False
    sync_optimizer_state: bool = False
    buffer_policy: Literal["average", "broadcast", "local"] = "average"
    boundary: Literal["auto", "fused", "two-phase"] = "auto"
    overlap_boundary: bool = False
    # --- K policy options (see controllers/)
    target_sync_share: float = Field(0.2, gt=0.0, lt=1.0)
    max_sync_period: int = Field(64, ge=1)
    sync_window: int = Field(4, ge=1, description="boundaries per controller window")
    k_growth: int = Field(2, ge=2)
    drift_limit: float = Field(3.0, gt=1.0)
    loss_rise: float = Field(0.1, gt=0.0)
    guard_cooldown: int = Field(32, ge=1)
    k_lowering: bool = False
    qsr_base: int | None = Field(None, ge=1)
    qsr_alpha: float | None = Field(None, gt=0.0)
    # --- optimization
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    nesterov: bool = False
    weight_decay: float = Field(5e-4, ge=0.0)
    batch_size: int = Field(32, ge=1, description="per worker")
    epochs: int = Field(30, ge=1)
    warmup_epochs: int = Field(1, ge=0, description="epochs at K=1 (and of linear LR warmup)")
    lr_warmup_epochs: int | None = Field(None, ge=0, description="default: --warmup-epochs")
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    # --- data and model
    dataset: str = "mnist1d"
    data_dir: Path | None = None
    model: str | None = None
    mnist1d_samples: int = Field(5000, ge=100)
    image_size: int = Field(32, ge=8, description="imagefolder crop size")
    loader_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank")
    # --- link emulator
    link: str = "wan"
    link_rtt_ms: float | None = Field(None, ge=0.0)
    link_bandwidth_gbps: float | None = Field(None, gt=0.0)
    link_jitter_ms: float | None = Field(None, ge=0.0)
    # --- run
    seed: int = 42
    out: Path | None = None
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    progress: bool = True
    collective_timeout: float = Field(300.0, gt=0.0, description="seconds")
    # --- checkpoints and failures
    checkpoint_every: int = Field(0, ge=0, description="epochs; 0: only the final checkpoint")
    stop_after_epochs: int | None = Field(None, ge=1)
    max_restarts: int = Field(0, ge=0)
    on_divergence: Literal["stop", "rollback"] = "stop"
    divergence_factor: float = Field(4.0, gt=1.0)
    max_rollbacks: int = Field(3, ge=0)
    metrics_port: int = Field(0, ge=0, le=65535, description="0 disables")
    metrics_per_rank: bool = False

    @model_validator(mode="after")
    def _cross_field(self) -> TrainConfig:
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset: unknown {self.dataset!r}; choose from {list(DATASETS)}")
        if self.model is None:
            self.model = DEFAULT_MODEL[self.dataset]
        if self.model not in MODELS:
            raise ValueError(f"--model: unknown {self.model!r}; choose from {list(MODELS)}")
        if why := incompatibility(self.dataset, self.model):
            raise ValueError(f"--model: {why}")
        if why := check_data_dir(self.dataset, self.data_dir):
            raise ValueError(f"--data-dir: {why}")
        if self.link not in PROFILES:
            raise ValueError(f"--link: unknown {self.link!r}; choose from {list(PROFILES)}")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy: unknown {self.policy!r}; choose from {sorted(POLICIES)}")
        if self.sync_period is None:
            self.sync_period = 1 if self.strategy == "ddp" else 4
        if self.slowmo_beta is None:
            self.slowmo_beta = 0.3 if self.strategy == "cpdp" else 0.0
        if self.strategy == "ddp":
            if self.sync_period != 1:
                raise ValueError("--sync-period: ddp synchronizes every step; use 1 (or cpdp)")
            if self.slowmo_beta != 0.0:
                raise ValueError("--slowmo-beta: ddp has no SlowMo; use localsgd or cpdp")
            if self.policy != "fixed":
                raise ValueError("--policy: ddp keeps K=1; adaptive policies need localsgd/cpdp")
        if self.boundary == "fused" and not self.fused_is_exact:
            raise ValueError(
                "--boundary: fused is exact only for cpdp with --optimizer sgd "
                "(AdamW is not linear in the gradient); use two-phase or auto"
            )
        if self.overlap_boundary and self.strategy == "ddp":
            raise ValueError("--overlap-boundary: ddp has no parameter averaging to overlap")
        if self.overlap_boundary and self.boundary == "fused":
            raise ValueError(
                "--overlap-boundary: needs --boundary two-phase (or auto): the "
                "fused boundary's momentum correction cannot arrive a step late"
            )
        if self.metrics_per_rank and self.metrics_port == 0:
            raise ValueError(
                "--metrics-per-rank: needs --metrics-port (per-rank ports are PORT+rank)"
            )
        if self.max_sync_period < self.sync_period:
            raise ValueError(
                f"--max-sync-period: {self.max_sync_period} is below --sync-period "
                f"{self.sync_period}"
            )
        if self.lr_warmup_epochs is None:
            self.lr_warmup_epochs = self.warmup_epochs
        if self.warmup_epochs > self.epochs:
            raise ValueError(
                f"--warmup-epochs: {self.warmup_epochs} exceeds --epochs {self.epochs}"
            )
        if self.lr_warmup_epochs > self.epochs:
            raise ValueError(f"--lr-warmup-epochs: exceeds --epochs {self.epochs}")
        return self

    @property
    def fused_is_exact(self) -> bool:
        return self.strategy == "cpdp" and self.optimizer == "sgd"

    @property
    def fused_boundary(self) -> bool:
        """auto: fused whenever it is exact (and no overlap asks for the two-phase path)."""
        if self.boundary == "auto":
            return self.fused_is_exact and not self.overlap_boundary
        return self.boundary == "fused"

    def policy_options(self) -> PolicyOptions:
        """Every PolicyOptions field is the setting of the same name; the peak LR is --lr."""
        names = [f.name for f in dataclasses.fields(PolicyOptions) if f.name != "peak_lr"]
        return PolicyOptions(peak_lr=self.lr, **{n: getattr(self, n) for n in names})

    @property
    def link_profile(self) -> LinkProfile:
        return resolve_profile(
            self.link, self.link_rtt_ms, self.link_bandwidth_gbps, self.link_jitter_ms
        )


def read_yaml(path: Path, flag_name: str) -> Any:
    """A YAML file's content; a missing or malformed file is a ConfigError naming the flag."""
    if not path.is_file():
        raise ConfigError(f"{flag_name}: no such file {path}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag_name}: {path} is not valid YAML ({exc})") from None


def load_config(file_values: dict, cli_values: dict) -> TrainConfig:
    """Merge a YAML file's values with the flags given (flags win) and validate."""
    merged = {k.replace("-", "_"): v for k, v in file_values.items()}
    merged.update(cli_values)
    try:
        return TrainConfig(**merged)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """The first error as one line that starts with the flag to change."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ())]
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if msg.startswith("--"):
        return msg
    if err.get("type") == "extra_forbidden":
        return f"{flag(loc[0])}: unknown setting (check the name in your --config file)"
    field = loc[0] if loc else "config"
    got = err.get("input")
    return f"{flag(field)}: {msg.lower()} (got {got!r})"
