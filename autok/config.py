"""The run's typed configuration. Field `foo_bar` is flag `--foo-bar` and YAML key `foo_bar`.

Every error names the flag to change: the CLI prints it on one line and exits with code 2.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, TypeGuard

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from autok.controllers import PolicyOptions
from autok.data_settings import DataSettings
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
from autok.trainer.loop.data import DATASETS, class_labels
from autok.trainer.loop.tasks import ACCURACY, Metric, TaskError, load_task, metric_of
from autok.training_settings import DIVIDES_BY_SECOND_MOMENT, TrainingSettings
from autok.training_settings import MAX_LOCAL_WORKERS as MAX_LOCAL_WORKERS
from autok.training_settings import MILESTONES_MAX as MILESTONES_MAX
from autok.training_settings import parse_milestones as parse_milestones

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


def finite_number(v: Any) -> TypeGuard[float]:
    """A number a file may give for a setting: int or float, finite, not a bool (YAML's and
    JSON's true are ints to Python)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# The run's own bounds (the engine's are in trainer/engine/*_settings.py; the workers' and the
# milestones' in autok/training_settings.py); each bound's reason is its field's
# `about(too_low=..., too_high=...)`, printed with the refusal.
MAX_LOCAL_PROCESSES = 1024  # workers and their DataLoader processes together
_SYNC, _FAILURES = GROUPS[0], GROUPS[7]


# The built-in task's settings: a --task builds its own data and model instead.
TASK_OWNS = (
    "dataset",
    "data_dir",
    "model",
    "mnist1d_samples",
    "mnist1d_test_samples",
    "image_size",
)
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


class TrainConfig(DataSettings, TrainingSettings, SyncSettings):
    """The engine's options (SyncOptions: strategy, K, policy, SlowMo, boundary, link, guard)
    and the run's: workers and optimization (TrainingSettings, autok/training_settings.py), data
    and model (DataSettings, autok/data_settings.py), stragglers, checkpoints, metrics. Its own
    validators check what reads settings of several.

    The bases are listed last first, as SyncOptions' are (trainer/engine/options.py): pydantic
    orders the fields base by base from the end of the MRO, so they keep one class's order."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

    # inherited: workers and optimization (TrainingSettings), data and model (DataSettings)
    # the study's default: the emulated WAN (autok.Sync's own default is none, docs/design.md §3)
    link: str = Field(
        "wan",
        description=SyncOptions.model_fields["link"].description,
        json_schema_extra=SyncOptions.model_fields["link"].json_schema_extra,
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

    def named_second_moment(self) -> bool | None:
        """--optimizer's, so that config.json records the K floor it gives (k_floor.py)."""
        return DIVIDES_BY_SECOND_MOMENT[self.optimizer]

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
