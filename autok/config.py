"""The run's typed configuration. Field `foo_bar` is flag `--foo-bar` and YAML key `foo_bar`.

Every error names the flag to change: the CLI prints it on one line and exits with code 2.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autok.metrics_http import MetricsHost
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


# Bounds of the settings whose extremes crash, hang or exhaust the machine mid-run: the reason
# is printed with the refusal (lower bound "ge", upper bound "le"). Every float must be finite.
SEED_MAX = 2**32 - 1
MAX_LOCAL_WORKERS = 256
MAX_LOCAL_PROCESSES = 1024  # workers and their DataLoader processes together
LIMIT_REASONS: dict[tuple[str, str], str] = {
    ("workers", "le"): f"at most {MAX_LOCAL_WORKERS} local worker processes, each a full "
    "Python with torch; spread larger worlds over machines with torchrun",
    ("loader_workers", "le"): "DataLoader processes per rank; more only contend for the cores",
    ("mnist1d_samples", "le"): "mnist1d is generated on one core at about 2,000 samples/s",
    ("seed", "ge"): f"seeds are 32-bit (numpy's RNG): use 0..{SEED_MAX}",
    ("seed", "le"): f"seeds are 32-bit (numpy's RNG): use 0..{SEED_MAX}",
    ("lr", "le"): "no schedule peaks higher, and far larger rates overflow float32",
    ("lr", "ge"): "a smaller step leaves float32 parameters unchanged",
    ("weight_decay", "le"): "larger decay overflows or flips the parameters every step",
    ("qsr_alpha", "le"): "(alpha/lr)^2 would overflow; K is capped by --max-sync-period anyway",
    ("link_rtt_ms", "le"): "a minute per round trip; no link to emulate is slower",
    ("link_jitter_ms", "le"): "a minute of jitter per collective; no link to emulate is slower",
    ("link_bandwidth_gbps", "ge"): "below 1 kbit/s one collective would take hours",
    ("collective_timeout", "ge"): "process-group setup alone needs about a second",
    ("collective_timeout", "le"): "a week; a peer silent that long is gone",
    ("image_size", "le"): "larger crops exhaust memory at any batch size",
    ("batch_size", "le"): "per worker; larger batches exhaust memory",
    ("epochs", "le"): "a million epochs is beyond any run",
    ("sync_period", "le"): "K beyond 2^20 steps is never reached: epoch ends synchronize anyway",
    ("max_sync_period", "le"): "K beyond 2^20 steps is never reached: epoch ends synchronize "
    "anyway",
    ("qsr_base", "le"): "K beyond 2^20 steps is never reached: epoch ends synchronize anyway",
}
K_MAX = 2**20
COUNT_MAX = 1_000_000  # epochs, windows, cooldowns, restarts: beyond any run


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

    # --- distribution and synchronization
    workers: int = Field(
        4, ge=1, le=MAX_LOCAL_WORKERS, description="worker processes (ranks) to spawn locally"
    )
    strategy: Literal["ddp", "localsgd", "cpdp"] = "cpdp"
    sync_period: int | None = Field(
        None,
        ge=1,
        le=K_MAX,
        description="K: optimizer steps between boundaries; default 4 (1 on ddp)",
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
    max_sync_period: int = Field(64, ge=1, le=K_MAX)
    sync_window: int = Field(4, ge=1, le=COUNT_MAX, description="boundaries per controller window")
    k_growth: int = Field(2, ge=2, le=1024)
    drift_limit: float = Field(3.0, gt=1.0)
    loss_rise: float = Field(0.1, gt=0.0)
    guard_cooldown: int = Field(32, ge=1, le=COUNT_MAX)
    k_lowering: bool = False
    qsr_base: int | None = Field(None, ge=1, le=K_MAX)
    qsr_alpha: float | None = Field(None, gt=0.0, le=1e6)
    # --- optimization
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(0.1, ge=1e-12, le=1e6)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    nesterov: bool = False
    weight_decay: float = Field(5e-4, ge=0.0, le=10.0)
    batch_size: int = Field(32, ge=1, le=1 << 20, description="per worker")
    epochs: int = Field(30, ge=1, le=COUNT_MAX)
    warmup_epochs: int = Field(1, ge=0, description="epochs at K=1 (and of linear LR warmup)")
    lr_warmup_epochs: int | None = Field(None, ge=0, description="default: --warmup-epochs")
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    # --- data and model
    dataset: str = "mnist1d"
    data_dir: Path | None = None
    model: str | None = None
    mnist1d_samples: int = Field(5000, ge=100, le=1_000_000)
    image_size: int = Field(32, ge=8, le=1024, description="imagefolder crop size")
    loader_workers: int = Field(0, ge=0, le=64, description="DataLoader worker processes per rank")
    # --- link emulator
    link: str = "wan"
    link_rtt_ms: float | None = Field(None, ge=0.0, le=60_000.0)
    link_bandwidth_gbps: float | None = Field(None, ge=1e-6)
    link_jitter_ms: float | None = Field(None, ge=0.0, le=60_000.0)
    # --- run
    seed: int = Field(42, ge=0, le=SEED_MAX)
    out: Path | None = None
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    progress: bool = True
    collective_timeout: float = Field(300.0, ge=1.0, le=604_800.0, description="seconds")
    # --- checkpoints and failures
    checkpoint_every: int = Field(
        0, ge=0, le=COUNT_MAX, description="epochs; 0: only the final checkpoint"
    )
    stop_after_epochs: int | None = Field(None, ge=1, le=COUNT_MAX)
    max_restarts: int = Field(0, ge=0, le=1000)
    on_divergence: Literal["stop", "rollback"] = "stop"
    divergence_factor: float = Field(4.0, gt=1.0)
    max_rollbacks: int = Field(3, ge=0, le=1000)
    metrics_port: int = Field(0, ge=0, le=65535, description="0 disables")
    metrics_host: MetricsHost = "127.0.0.1"
    metrics_per_rank: bool = False

    @field_validator("out", "data_dir", mode="before")
    @classmethod
    def _a_real_path(cls, v: Any) -> Any:
        # pydantic reads "" as Path("."): a run would land in the current directory.
        if isinstance(v, str) and not v.strip():
            raise ValueError("empty path; give a directory")
        if isinstance(v, (str, Path)) and "\0" in str(v):
            raise ValueError("the path contains a NUL byte")
        return v

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
        if (procs := self.workers * (1 + self.loader_workers)) > MAX_LOCAL_PROCESSES:
            raise ValueError(
                f"--loader-workers: {self.workers} workers x (1 + {self.loader_workers}) = "
                f"{procs} processes on this machine; keep it at most {MAX_LOCAL_PROCESSES}"
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


YAML_MAX_BYTES = 1 << 20  # settings, spaces and grids are a few KB
YAML_MAX_NODES = 100_000  # after alias expansion: a "billion laughs" file is refused, not built


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one short phrase with the position."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or "malformed"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(str(problem).split())[:120] + where


def _expanded_nodes(root: yaml.Node) -> int:
    """Nodes of the document with every alias expanded (aliases share nodes when composed, so a
    tiny file can stand for billions); stops counting past the limit. Recursion is refused."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            kids = _children(node)
            sizes[key] = min(YAML_MAX_NODES + 1, 1 + sum(sizes[id(k)] for k in kids))
            continue
        if key in sizes:
            continue
        if key in active:
            raise ValueError("an alias refers to its own anchor (a recursive structure)")
        active.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def read_yaml(path: Path, flag_name: str) -> Any:
    """A YAML file's content; a missing, unreadable, oversized or malformed file is a ConfigError
    naming the flag, on one line of bounded length."""
    if not path.is_file():
        what = "not a regular file:" if path.exists() else "no such file"
        raise ConfigError(f"{flag_name}: {what} {path}")
    try:
        with open(path, "rb") as f:
            data = f.read(YAML_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{flag_name}: cannot read {path} ({exc.strerror})") from None
    if len(data) > YAML_MAX_BYTES:
        raise ConfigError(
            f"{flag_name}: {path} is over {YAML_MAX_BYTES >> 20} MiB; not a YAML settings file"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{flag_name}: {path} is not UTF-8 text (byte {exc.start})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_nodes(node) > YAML_MAX_NODES:
            raise ValueError(f"over {YAML_MAX_NODES} values once its aliases are expanded")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag_name}: {path} is not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, RecursionError) as exc:  # nesting too deep, a value PyYAML cannot build
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(f"{flag_name}: {path} is refused: {why[:160]}") from None
    finally:
        loader.dispose()


def load_config(file_values: dict, cli_values: dict) -> TrainConfig:
    """Merge a YAML file's values with the flags given (flags win) and validate."""
    merged = {str(k).replace("-", "_"): v for k, v in file_values.items()}
    merged.update(cli_values)
    try:
        return TrainConfig(**merged)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """The first error as one line that starts with the flag to change (and, for a bound, why)."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ())]
    msg = " ".join(str(err.get("msg", "invalid")).split())
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if msg.startswith("--"):
        return msg
    if err.get("type") == "extra_forbidden":
        return f"{flag(loc[0])[:60]}: unknown setting (check the name in your --config file)"
    field = loc[0] if loc else "config"
    got = repr(err.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    line = f"{flag(field)}: {msg.lower()} (got {got})"
    side = {
        "less_than_equal": "le",
        "less_than": "le",
        "greater_than_equal": "ge",
        "greater_than": "ge",
    }.get(str(err.get("type")))
    if reason := LIMIT_REASONS.get((field, side or "")):
        line += f": {reason}"
    return line
