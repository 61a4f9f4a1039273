"""The run's typed configuration. Field `foo_bar` is flag `--foo-bar` and YAML key `foo_bar`.

Every error names the flag to change: the CLI prints it on one line and exits with code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from autok.controllers import PolicyOptions
from autok.metrics_http import MetricsHost
from autok.trainer.engine.fragments import tensors_refusal
from autok.trainer.engine.link import LinkSchedule
from autok.trainer.engine.options import (
    COUNT_MAX,
    GROUPS,
    SEED_MAX,
    STRATEGIES,
    OptionError,
    SyncOptions,
    about,
    about_of,
    describe,
    flag,
    fused_is_exact,
    read_only_under,
)
from autok.trainer.loop.data import DATASETS, check_data_dir, class_labels
from autok.trainer.loop.models import DEFAULT_MODEL, MODELS, incompatibility
from autok.trainer.loop.tasks import ACCURACY, TASK_SPEC, Metric, TaskError, load_task, metric_of

__all__ = [
    "STRATEGIES",
    "SEED_MAX",
    "ConfigError",
    "SyncSettings",
    "TrainConfig",
    "flag",
    "describe",
]


class ConfigError(OptionError):
    """A bad setting; the message starts with the flag to change."""


# The run's own bounds (the engine's are in trainer/engine/options.py); each bound's reason is
# its field's `about(too_low=..., too_high=...)`, printed with the refusal.
MAX_LOCAL_WORKERS = 256
MAX_LOCAL_PROCESSES = 1024  # workers and their DataLoader processes together
_SYNC, _OPTIM, _DATA, _FAILURES = GROUPS[0], GROUPS[3], GROUPS[4], GROUPS[7]
# SGD's own options (--momentum, --nesterov): AdamW would silently ignore them
_SGDS = (
    "optimizer",
    frozenset({"sgd"}),
    "it is SGD's; AdamW keeps its own moments, betas 0.9 and 0.999",
)


MILESTONES_MAX = 16  # LR drops in one run; schedules in the literature have two or three


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


# The built-in task's settings: a --task builds its own data and model instead.
TASK_OWNS = ("dataset", "data_dir", "model", "mnist1d_samples", "image_size")
# The engine's options that `autok train`'s loop does not take (autok.Sync's alone: no group,
# so no flag), refused from a --config file (docs/design.md §2).
LIBRARY_ONLY = tuple(n for n, f in SyncOptions.model_fields.items() if about_of(f, n).group is None)


def schedule_past_run(plan: LinkSchedule, epochs: int) -> str | None:
    """Why a --link-schedule names an epoch the run never reaches (epochs count from 0, as in
    epochs.csv), or None: that profile would never apply. Step positions depend on the data's
    size, known only once the task is built."""
    if plan.unit != "epoch" or plan.segments[-1][0] < epochs:
        return None
    start, profile = next((s, p) for s, p in plan.segments if s >= epochs)
    return (
        f"{profile.name}@epoch={start} is past the run (--epochs {epochs}: epochs 0 to "
        f"{epochs - 1}); drop it or raise --epochs"
    )


class SyncSettings(SyncOptions):
    """What `autok.Sync` takes: the engine's options and the service's around it (metrics)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="serve Prometheus metrics on this port from rank 0 (0: off)",
        json_schema_extra=about("metrics", resume=True),
    )
    metrics_host: MetricsHost = Field(
        "127.0.0.1",
        description="IP address the metrics server binds; 127.0.0.1 serves this machine only, "
        "0.0.0.0 (or ::) lets Prometheus on another machine scrape it",
        json_schema_extra=about("metrics", resume=True),
    )
    metrics_per_rank: bool = Field(
        False,
        description="also serve each rank's own compute and wait times on PORT+rank",
        json_schema_extra=about("metrics", resume=True),
    )

    @model_validator(mode="after")
    def _metrics_cross_field(self) -> SyncSettings:
        if self.metrics_per_rank and self.metrics_port == 0:
            raise ValueError(
                "--metrics-per-rank: needs --metrics-port (per-rank ports are PORT+rank)"
            )
        return self


class TrainConfig(SyncSettings):
    """The engine's options (SyncOptions: strategy, K, policy, SlowMo, boundary, link, guard)
    and the run's: workers, optimization, data, model, checkpoints, metrics."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

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
    # the study's default: the emulated WAN (autok.Sync's own default is none, docs/design.md §3)
    link: str = Field(
        "wan",
        description=SyncOptions.model_fields["link"].description,
        json_schema_extra=SyncOptions.model_fields["link"].json_schema_extra,
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
    # --- data and model
    task: str | None = Field(
        None,
        max_length=200,
        description="MODULE:FUNCTION returning an autok.Task; default: "
        "the built-in classification of --dataset with --model",
        json_schema_extra=about(_DATA),
    )
    dataset: str = Field(
        "mnist1d",
        description="mnist1d and digits are built in; cifar100, tinyimagenet, imagefolder read "
        "--data-dir",
        json_schema_extra=about(_DATA),
    )
    data_dir: Path | None = Field(
        None, description="root of an on-disk data set", json_schema_extra=about(_DATA)
    )
    model: str | None = Field(
        None,
        description="cnn1d (mnist1d), cnn (digits), mlp, resnet18, resnet50, vit-s "
        "(default: the data set's)",
        json_schema_extra=about(_DATA),
    )
    mnist1d_samples: int = Field(
        5000,
        ge=100,
        le=1_000_000,
        description="samples generated for mnist1d (80% train, 20% test)",
        json_schema_extra=about(
            _DATA,
            too_high="mnist1d is generated on one core at about 2,000 samples/s",
            read_only_under=("dataset", frozenset({"mnist1d"}), "only mnist1d is generated"),
        ),
    )
    image_size: int = Field(
        32,
        ge=8,
        le=1024,
        description="crop size for imagefolder",
        json_schema_extra=about(
            _DATA,
            too_high="larger crops exhaust memory at any batch size",
            read_only_under=(
                "dataset",
                frozenset({"imagefolder"}),
                "only imagefolder images are cropped to a size",
            ),
        ),
    )
    loader_workers: int = Field(
        0,
        ge=0,
        le=64,
        description="DataLoader worker processes per rank",
        json_schema_extra=about(
            _DATA, too_high="DataLoader processes per rank; more only contend for the cores"
        ),
    )
    partition: Literal["iid", "dirichlet"] = Field(
        "iid",
        description="how the training set is split over the ranks: iid (a new random split "
        "every epoch) or dirichlet (a fixed label-skewed shard per rank, --partition-alpha)",
        json_schema_extra=about(_DATA),
    )
    partition_alpha: float | None = Field(
        None,
        gt=0.0,
        le=1e6,
        description="dirichlet: the concentration α; 0.1 gives each rank a few classes, 100 "
        "is nearly iid (default: unset)",
        json_schema_extra=about(_DATA),
    )
    straggler: Literal["none", "random", "slow-rank"] = Field(
        "none",
        description="inject a slow worker: slow-rank (the last rank, every step) or random (one "
        "rank drawn per step, with --straggler-prob), seeded",
        json_schema_extra=about("stragglers"),
    )
    straggler_ms: float | None = Field(
        None,
        gt=0.0,
        le=60_000.0,
        description="the extra compute time of a slow step, ms (default: unset)",
        json_schema_extra=about(
            "stragglers", too_high="a minute per step; no straggler to emulate is slower"
        ),
    )
    straggler_prob: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="random: the chance that a step has a straggler",
        json_schema_extra=about("stragglers"),
    )
    # --- run
    out: Path | None = Field(
        None,
        description="run directory (default: runs/<timestamp>)",
        json_schema_extra=about("run"),
    )
    tensorboard: Path | None = Field(
        None,
        description="also write the per-boundary and per-epoch scalars as TensorBoard event "
        "files into this directory (default: unset)",
        json_schema_extra=about("metrics", resume=True),
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="process-group backend; auto picks nccl on GPUs, gloo otherwise",
        json_schema_extra=about(_SYNC),
    )
    progress: bool = Field(
        True,
        description="show the progress bar (the closing summary is printed either way)",
        json_schema_extra=about("run", resume=True),
    )
    collective_timeout: float = Field(
        300.0,
        ge=1.0,
        le=604_800.0,
        description="seconds before a collective waiting on a lost peer fails",
        json_schema_extra=about(
            _SYNC,
            too_low="process-group setup alone needs about a second",
            too_high="a week; a peer silent that long is gone",
            resume=True,
        ),
    )
    # --- checkpoints and failures (listed before the engine's divergence guard)
    checkpoint_every: int = Field(
        0,
        ge=0,
        le=COUNT_MAX,
        description="checkpoint every E epochs (0: only the final one); each keeps the "
        "previous good one",
        json_schema_extra=about(_FAILURES, before="on_divergence"),
    )
    stop_after_epochs: int | None = Field(
        None,
        ge=1,
        le=COUNT_MAX,
        description="stop cleanly after this many epochs, with a checkpoint; continue with "
        "--resume (default: unset)",
        json_schema_extra=about(_FAILURES, resume=True, before="on_divergence"),
    )
    max_restarts: int = Field(
        0,
        ge=0,
        le=1000,
        description="restart all workers from the last checkpoint this many times when one dies",
        json_schema_extra=about(_FAILURES, resume=True, before="on_divergence"),
    )
    max_rollbacks: int = Field(
        3,
        ge=0,
        le=1000,
        description="rollbacks before giving up (with --on-divergence rollback)",
        json_schema_extra=about(
            _FAILURES,
            read_only_under=(
                "on_divergence",
                frozenset({"rollback"}),
                "stop ends the run at the first divergence",
            ),
        ),
    )

    @field_validator("out", "data_dir", "tensorboard", mode="before")
    @classmethod
    def _a_real_path(cls, v: Any) -> Any:
        # pydantic reads "" as Path("."): a run would land in the current directory.
        if isinstance(v, str) and not v.strip():
            raise ValueError("empty path; give a directory")
        if isinstance(v, (str, Path)) and "\0" in str(v):
            raise ValueError("the path contains a NUL byte")
        return v

    @field_validator("task")
    @classmethod
    def _a_task_spec(cls, v: str | None) -> str | None:
        if v is not None and not TASK_SPEC.match(v):
            raise ValueError(f"--task: {v[:120]!r} is not MODULE:FUNCTION (e.g. mypkg.tasks:build)")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> TrainConfig:
        for name in LIBRARY_ONLY:
            if getattr(self, name) != type(self).model_fields[name].default:
                raise ValueError(
                    f"{flag(name)}: autok train's loop takes one forward/backward pass per "
                    "step; gradient accumulation is autok.Sync's, in your own loop"
                )
        if self.task is not None:
            # A value that differs from the default was asked for (a resumed run's saved
            # config carries every default): the task would silently ignore it.
            fields = type(self).model_fields
            given = [f for f in TASK_OWNS if getattr(self, f) != fields[f].default]
            if given:
                raise ValueError(
                    f"{flag(given[0])}: the task builds its own data and model; "
                    "drop it or drop --task"
                )
        else:
            self._check_builtin_task()
        if why := schedule_past_run(self.link_plan, self.epochs):
            raise ValueError(f"--link-schedule: {why}")
        # SGD's options under AdamW are refused as unread (their about(read_only_under=...))
        if self.nesterov and self.momentum == 0.0:  # torch's SGD refuses it; it was dropped
            raise ValueError(
                "--nesterov: looks ahead along the momentum, and --momentum is 0; "
                "give --momentum > 0 or drop --nesterov"
            )
        if self.boundary == "fused" and not self.fused_is_exact:
            raise ValueError(
                "--boundary: fused is exact only for cpdp with --optimizer sgd "
                "(AdamW is not linear in the gradient); use two-phase or auto"
            )
        if (procs := self.workers * (1 + self.loader_workers)) > MAX_LOCAL_PROCESSES:
            raise ValueError(
                f"--loader-workers: {self.workers} workers x (1 + {self.loader_workers}) = "
                f"{procs} processes on this machine; keep it at most {MAX_LOCAL_PROCESSES}"
            )
        if self.lr_warmup_epochs is None:
            self.lr_warmup_epochs = self.warmup_epochs
        if self.warmup_epochs > self.epochs:
            raise ValueError(
                f"--warmup-epochs: {self.warmup_epochs} exceeds --epochs {self.epochs}"
            )
        if self.lr_warmup_epochs > self.epochs:
            raise ValueError(f"--lr-warmup-epochs: exceeds --epochs {self.epochs}")
        self._check_regimes()
        return self

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

    def _check_regimes(self) -> None:
        """The regime knobs (docs/design.md §2, Regimes): an option its mode is blind to is refused,
        not ignored ("given" is "differs from the default", as for the policies' options)."""
        gamma_default = type(self).model_fields["lr_gamma"].default
        if self.lr_schedule == "step":
            if self.lr_milestones is None:
                raise ValueError(
                    "--lr-schedule: step needs --lr-milestones (fractions of the run, e.g. "
                    "0.5,0.75)"
                )
            warmup = self.lr_warmup_epochs
            assert warmup is not None  # resolved to --warmup-epochs before the regimes' check
            inside = [m for m in self.milestones if m * self.epochs < warmup]
            if inside:
                raise ValueError(
                    f"--lr-milestones: {inside[0]!r} of {self.epochs} epochs falls inside the LR "
                    f"warmup (--lr-warmup-epochs {self.lr_warmup_epochs}); give a later one"
                )
        elif self.lr_milestones is not None:
            raise ValueError("--lr-milestones: needs --lr-schedule step")
        elif self.lr_gamma != gamma_default:
            raise ValueError("--lr-gamma: only --lr-schedule step multiplies the LR by it")
        if self.partition == "dirichlet" and self.partition_alpha is None:
            raise ValueError(
                "--partition: dirichlet needs --partition-alpha (e.g. 0.1: strongly "
                "label-skewed; 100: nearly iid)"
            )
        if self.partition != "dirichlet" and self.partition_alpha is not None:
            raise ValueError("--partition-alpha: needs --partition dirichlet")
        if self.straggler != "none" and self.straggler_ms is None:
            raise ValueError(
                f"--straggler: {self.straggler} needs --straggler-ms (the delay of a slow step)"
            )
        if self.straggler == "none" and self.straggler_ms is not None:
            raise ValueError("--straggler-ms: needs --straggler random or slow-rank")
        prob_default = type(self).model_fields["straggler_prob"].default
        if self.straggler != "random" and self.straggler_prob != prob_default:
            raise ValueError("--straggler-prob: only --straggler random draws its stragglers")

    @property
    def milestones(self) -> tuple[float, ...]:
        """--lr-milestones as numbers (empty when unset)."""
        return parse_milestones(self.lr_milestones) if self.lr_milestones else ()

    def _check_builtin_task(self) -> None:
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

    def _check_unread(self, skip: frozenset[str] = frozenset()) -> None:
        # With --task, or an unknown --dataset, the data flags are refused by _cross_field
        # naming the task (TASK_OWNS) or the data set: not as flags the data set does not read.
        if self.task is not None or self.dataset not in DATASETS:
            skip = skip | {"dataset"}
        super()._check_unread(skip)

    @property
    def fused_is_exact(self) -> bool:
        """The engine's rule for the built-in optimizers (--optimizer sgd is torch's SGD without
        dampening), checked before anything is launched."""
        return fused_is_exact(self.strategy, self.optimizer)

    def policy_options(self, peak_lr: float | None = None) -> PolicyOptions:
        """The policy's options; its peak LR is --lr."""
        return super().policy_options(self.lr if peak_lr is None else peak_lr)


# The run's settings read only under some values of another, the engine's among them: refused
# elsewhere, drawn and dropped by sweeps and resumes alike (autok/space.py). Read from the
# fields' about(read_only_under=...), never kept by hand.
READ_ONLY_UNDER = read_only_under(TrainConfig)


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


PROBED_DATASETS = ("imagefolder", "tinyimagenet")  # files a checksum cannot vouch for


def check_task(cfg: TrainConfig) -> Metric:
    """Before anything is launched or written: a --task imports, runs, and returns a usable
    autok.Task (built once here, in the launching process); its metric. One line naming --task
    otherwise, or --fragments when the model has fewer parameters than fragments (every
    built-in model has more than FRAGMENTS_MAX: `tests/test_fragments.py`)."""
    by_tensor = cfg.fragment_by != "element"  # F is bounded by the model's tensor count
    if cfg.task is None and cfg.dataset not in PROBED_DATASETS and not by_tensor:
        # the built-in classification: embedded data, or CIFAR-100 files whose checksums the
        # config checked; image files are decoded only when read, so those are probed here
        return ACCURACY
    try:  # a --task, or image files under --data-dir: built and probed on two samples here
        task = load_task(cfg)
    except TaskError as exc:
        raise ConfigError(str(exc)) from None
    if why := tensors_refusal(task.model, cfg.fragments, cfg.fragment_by):
        raise ConfigError(why)
    if cfg.task is None:
        return metric_of(task)
    if cfg.partition == "dirichlet":  # the built-in data sets all have class labels
        try:
            class_labels(task.train_dataset)
        except ValueError as exc:
            raise ConfigError(
                f"--partition: dirichlet splits by class label, and {cfg.task}: {exc}; use iid"
            ) from None
    numel = sum(p.numel() for p in task.model.parameters())
    if cfg.fragments > numel:
        raise ConfigError(
            f"--fragments: {cfg.fragments} fragments of {cfg.task}'s model with {numel} "
            f"parameters; give at most {numel}"
        )
    return metric_of(task)


NAME_MAX = 255  # bytes in one file name, on Linux and macOS file systems


def first_difference(was: dict, now: dict, ignore=frozenset()) -> str | None:
    """The first key (sorted) whose value differs between two settings mappings (absent counts
    as a value), outside `ignore`; None when they agree."""
    keys = (was.keys() | now.keys()) - ignore
    changed = sorted(k for k in keys if was.get(k) != now.get(k))
    return changed[0] if changed else None


def check_backend(
    cfg: TrainConfig, flag_name: str = "--backend", count_workers: bool = True
) -> None:
    """Before anything is launched or written: an explicit --backend nccl has a GPU for every
    worker here (the workers would each fail on it). `auto` picks what the machine has.
    `count_workers`: False where the worker count is not cfg's (a sweep that searches it)."""
    if cfg.backend != "nccl":
        return
    import torch  # only for this check: the CLI stays torch-free otherwise

    from autok.procs import under_torchrun

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        raise ConfigError(f"{flag_name}: nccl needs NVIDIA GPUs; this machine has none (give gloo)")
    if count_workers and not under_torchrun() and cfg.workers > gpus:
        raise ConfigError(
            f"--workers: {cfg.workers} workers with nccl need a GPU each and this machine has "
            f"{gpus}; give --workers {gpus} or fewer, or {flag_name} gloo"
        )


def load_config(file_values: dict, cli_values: dict) -> TrainConfig:
    """Merge a YAML file's values with the flags given (flags win) and validate."""
    merged = {str(k).replace("-", "_"): v for k, v in file_values.items()}
    merged.update(cli_values)
    try:
        return TrainConfig(**merged)
    except ValidationError as exc:
        raise ConfigError(describe(exc, TrainConfig)) from None
