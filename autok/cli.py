"""`autok train` (and, as they land, sweep | report | bench).

Flags are generated from TrainConfig, so every setting has exactly one flag, one YAML key, and a
help line showing its default. Bad input: one line naming the flag, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import tempfile
import time
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autok.config import (
    LIBRARY_ONLY,
    NAME_MAX,
    SEED_MAX,
    TASK_OWNS,
    YAML_MAX_BYTES,
    ConfigError,
    TrainConfig,
    about_of,
    check_backend,
    check_task,
    flag,
    load_config,
    read_yaml,
)
from autok.controllers import ran_before, revision, revision_problem
from autok.extras import require, require_run, require_storage
from autok.sweep import OBJECTIVE_ALIASES, OBJECTIVES
from autok.trainer.engine.clock import CLOCKS
from autok.trainer.engine.options import GROUPS

if TYPE_CHECKING:
    from autok.runlock import RunLock
    from autok.trainer.loop.tasks import Metric

EXIT_USAGE = 2
# What a run leaves in its --out: a fresh run refuses a directory holding any of them (another
# run's checkpoints would be pruned, or resumed from by a restart). Not train.log, which a run
# appends to: `experiment run` starts an unstarted run again keeping its log's history.
RUN_FILES = (
    "config.json",
    "epochs.csv",
    "boundaries.jsonl",
    "summary.json",
    "model.pt",
    "checkpoints",
)

# Each setting's help line, group and resume rule are its field's (trainer/engine/about.py
# `about`): these are read from the fields, never kept by hand (docs/design.md §3).
HELP: dict[str, str] = {n: f.description or "" for n, f in TrainConfig.model_fields.items()}


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, no usage dump
        # "argument --workers: invalid int value: 'x'" -> "--workers: invalid int value: 'x'"
        raise UsageError(re.sub(r"^argument ([^:]+): ", r"\1: ", message))


def path_arg(text: str) -> Path:
    """A path flag's value. Path("") is ".", so an empty value would quietly mean the current
    directory: refuse it (and NUL bytes, which no file name holds)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path; give a directory or file name")
    if "\0" in text:
        raise argparse.ArgumentTypeError("the path contains a NUL byte")
    # a name over NAME_MAX makes every later stat() raise ENAMETOOLONG, far from this flag
    if long := [part for part in Path(text).parts if len(os.fsencode(part)) > NAME_MAX]:
        raise argparse.ArgumentTypeError(
            f"a name in the path is {len(os.fsencode(long[0]))} bytes long; at most {NAME_MAX}"
        )
    return Path(text)


def escaped(help_text: str) -> str:
    """A help line as argparse takes it: it formats help with %, so a literal % is %%."""
    return help_text.replace("%", "%%")


def _arg_type(annotation: Any) -> tuple[Any, list[str] | None]:
    """(converter, choices) for a TrainConfig field annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _arg_type(args[0])
    if origin is Literal:
        return str, list(typing.get_args(annotation))
    return annotation, None


def flag_groups(model: type[TrainConfig] = TrainConfig) -> dict[str, tuple[str, ...]]:
    """`autok train --help`'s groups (GROUPS, in order), each with its settings' fields: in
    the model's field order, except that a field's `before` lists it just before another
    field of its group. autok.Sync's own options (no group) have no flag."""
    fields = model.model_fields
    out: dict[str, tuple[str, ...]] = {}
    for title in GROUPS:
        names = [n for n, f in fields.items() if about_of(f, n).group == title]
        for name in list(names):
            if (ahead := about_of(fields[name], name).before) is None:
                continue
            if ahead not in names:
                raise ValueError(f"{name}: before={ahead!r} is not a setting of {title!r}")
            names.remove(name)
            names.insert(names.index(ahead), name)
        out[title] = tuple(names)
    return out


def resume_may_change(model: type[TrainConfig] = TrainConfig) -> frozenset[str]:
    """The settings a resume may change (`about(resume=True)`): the others continue the run as
    configured (docs/design.md §7)."""
    return frozenset(n for n, f in model.model_fields.items() if about_of(f, n).resume)


FLAG_GROUPS = flag_groups()
OTHER_GROUP = "other settings"


def add_train_flags(
    p: argparse.ArgumentParser,
    renamed: dict[str, str] | None = None,
    model: type[TrainConfig] = TrainConfig,
) -> dict[str, argparse._ArgumentGroup]:
    """One flag per field of `model` (TrainConfig), in its groups (flag_groups), with its help
    line; `renamed` maps a field to another flag (dest unchanged). Returns the groups by title."""
    renamed = renamed or {}
    by_group = flag_groups(model)
    groups = {title: p.add_argument_group(title) for title in by_group}
    group_of = {name: title for title, names in by_group.items() for name in names}
    groups["run"].add_argument(
        "--config", type=path_arg, help="YAML file of settings; flags given here win"
    )
    fields = model.model_fields
    order = [n for names in by_group.values() for n in names]
    order += [n for n in fields if n not in group_of and n not in LIBRARY_ONLY]
    for name in order:
        field = fields[name]
        if name not in group_of and OTHER_GROUP not in groups:
            groups[OTHER_GROUP] = p.add_argument_group(OTHER_GROUP)
        g = groups[group_of.get(name, OTHER_GROUP)]
        text = field.description or ""
        if "(default" not in text:  # a default that depends on other flags is spelled out
            text += f" (default: {'unset' if field.default is None else field.default})"
        conv, choices = _arg_type(field.annotation)
        conv = path_arg if conv is Path else conv
        # a renamed flag keeps its own dest: the sweep's --backend would otherwise share it
        dest = renamed[name].lstrip("-").replace("-", "_") if name in renamed else name
        names: dict[str, Any] = dict(dest=dest, default=argparse.SUPPRESS, help=escaped(text))
        if conv is bool:
            g.add_argument(
                renamed.get(name, flag(name)), action=argparse.BooleanOptionalAction, **names
            )
        else:
            g.add_argument(
                renamed.get(name, flag(name)),
                type=conv,
                choices=choices,
                metavar=name.upper() if not choices else None,
                **names,
            )
    return groups


class VersionAction(argparse.Action):
    """`autok --version`: the installed distribution's version, read only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace, values, option_string=None
    ) -> typing.NoReturn:
        print(f"autok {package_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autok")
    except PackageNotFoundError:  # a bare checkout on PYTHONPATH, never installed
        return "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(prog="autok", description="CPDP training with an online sync period K.")
    parser.add_argument("--version", action=VersionAction, help="print autok's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    train = sub.add_parser("train", help="train with ddp, localsgd or cpdp")
    train_groups = add_train_flags(train)
    train_groups["run"].add_argument(
        "--resume",
        type=path_arg,
        metavar="DIR",
        default=None,
        help="continue the run in DIR from its last good checkpoint (same settings; only "
        + ", ".join(flag(k) for k in sorted(RESUME_MAY_CHANGE))
        + " may change)",
    )
    sweep = sub.add_parser(
        "sweep",
        help="joint search over K, beta, LR (any train flag); each trial a full run",
        description="Every `autok train` flag given here is the fixed part of each trial; "
        "--out is the sweep directory.",
    )
    s = sweep.add_argument_group("sweep")
    s.add_argument(
        "--backend",
        choices=["optuna", "ray"],
        default="optuna",
        help="optuna: embedded (sqlite in --out); ray: Ray Tune (default: optuna)",
    )
    s.add_argument("--trials", type=int, default=10, help="trials to run now (default: 10)")
    s.add_argument("--jobs", type=int, default=1, help="trials at a time (default: 1)")
    s.add_argument(
        "--space",
        type=path_arg,
        default=None,
        help="YAML search space (default: experiments/spaces/default.yaml)",
    )
    s.add_argument(
        "--resume", action="store_true", help="continue the study in --out (--backend optuna)"
    )
    s.add_argument(
        "--storage",
        default=None,
        help="Optuna storage URL, e.g. postgresql://user:pw@host/db for several "
        "machines (default: sqlite file in --out)",
    )
    s.add_argument("--study-name", default="autok", help="(default: autok)")
    s.add_argument(
        "--objective",
        choices=[*OBJECTIVES, *OBJECTIVE_ALIASES],
        default="pareto",
        help="pareto: the best test metric (accuracy, or the --task's own) and the least "
        "training wall-clock (start-up is reported apart, as total seconds); metric or "
        "time-to-target: one objective, with pruning; accuracy and "
        "time-to-accuracy are the same two (default: pareto)",
    )
    s.add_argument(
        "--pruner",
        choices=["median", "hyperband"],
        default="median",
        help="pruner for single-objective sweeps (default: median)",
    )
    s.add_argument(
        "--target",
        "--target-accuracy",
        dest="target",
        type=float,
        default=None,
        help="the test metric value time-to-target measures the time to (default: 0.9 for "
        "accuracy; a task with another metric must give it)",
    )
    s.add_argument("--sampler-seed", type=int, default=0, help="(default: 0)")
    s.add_argument(
        "--enqueue",
        type=path_arg,
        default=None,
        help="YAML list of settings to evaluate first, e.g. known-good K and beta (default: none)",
    )
    s.add_argument(
        "--address",
        default=None,
        help="ray: cluster address, auto or ray://HOST:PORT (default: a local Ray)",
    )
    exp = sub.add_parser("experiment", help="run a named experiment grid (experiments/NAME.yaml)")
    esub = exp.add_subparsers(dest="action", required=True, parser_class=Parser)
    esub.add_parser("list", help="the named experiments, with each form's runs and time")
    run = esub.add_parser("run", help="run (or continue) an experiment")
    run.add_argument("name", help="a name from `autok experiment list`, or a .yaml path")
    form = run.add_mutually_exclusive_group()
    form.add_argument(
        "--quick",
        action="store_const",
        dest="form",
        const="quick",
        help="the CPU form: mnist1d or digits, minutes on 2 cores (default)",
    )
    form.add_argument(
        "--full",
        action="store_const",
        dest="form",
        const="full",
        help="the study's setting (ResNet-50 / CIFAR-100, 8 workers, 100 epochs)",
    )
    run.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="override the experiment's seeds"
    )
    run.add_argument("--jobs", type=int, default=1, help="runs at a time (default: 1)")
    run.add_argument("--out", type=path_arg, required=True, help="experiment directory")
    run.add_argument(
        "--data-dir", type=path_arg, default=None, help="data for the --full form (CIFAR-100 files)"
    )
    # every run on one clock (trainer/engine/clock.py): virtual runs rank by modelled time, not
    # noise
    run.add_argument("--clock", choices=CLOCKS, default=None, help=escaped(HELP["clock"]))
    run.add_argument("--compute-ms", type=float, default=None, help=escaped(HELP["compute_ms"]))
    run.add_argument("--model-bytes", type=int, default=None, help=escaped(HELP["model_bytes"]))
    rep = sub.add_parser("report", help="tables and plots of an experiment directory")
    rep.add_argument(
        "dir", type=path_arg, help="an experiment's --out directory (autok experiment run)"
    )
    sub.add_parser(
        "bench", add_help=False, help="side-by-side engine measurements (autok bench --help)"
    )
    # `--backend` is the sweep's (optuna|ray); the trials' process-group backend is renamed.
    add_train_flags(sweep, renamed={"backend": "--dist-backend"})
    return parser


def config_from_args(ns: argparse.Namespace) -> TrainConfig:
    return load_config({}, given_values(ns))


RESUME_MAY_CHANGE = resume_may_change()


def resume_config(ns: argparse.Namespace) -> TrainConfig:
    """The run's own resolved config.json, with the few settings a resume may change."""
    run = ns.resume
    if not (run / "config.json").is_file():
        raise ConfigError(f"--resume: {run} holds no run (config.json missing)")
    try:
        saved = read_config_json(run / "config.json")
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"--resume: {run / 'config.json'} is unreadable ({exc})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"--resume: {run / 'config.json'} is not a JSON object")
    given = given_values(ns)
    check_resume_task(run, saved.get("task"), given.get("task"))
    from autok.trainer.loop.sinks import check_outputs

    if why := check_outputs(run):
        raise ConfigError(f"--resume: {why}; move the file away to resume without it")
    saved.pop("link_profile", None)
    saved.pop("stop_after_epochs", None)  # a one-shot instruction, not a property of the run
    from autok.trainer.loop.environment import difference, environment

    # a run saved before it was recorded: nothing to compare (trainer/loop/environment.py)
    if (was := saved.pop("environment", None)) is not None and (
        why := difference(was, environment())
    ):
        raise ConfigError(
            f"--resume: {run} was started with {why}; continued here its numbers would mix "
            "two installations: resume it where it started, or start a new --out"
        )
    # a run saved before its rule's revision was recorded ran revision 0: where its policy's
    # rule has moved since, continued here it would follow two rules (docs/design.md §6)
    if why := revision_problem(saved.get("policy"), saved.pop("policy_revision", None)):
        raise ConfigError(
            f"--resume: {run} was started by {why}; continued here its K path would follow "
            "two rules: resume it with the autok that started it, or start a new --out"
        )
    from autok.space import as_ran

    saved, notes = as_ran(saved)
    # saved before K's floor or the faster-link check were settings: it ran without them
    # (docs/design.md §6, "the floor", "a faster link")
    saved.update(ran_before(saved.get("policy"), saved))
    # --task is the command line's, already checked to be the run's own
    if changed := sorted(set(given) - RESUME_MAY_CHANGE - {"resume", "task"}):
        raise ConfigError(
            f"--resume: {flag(changed[0])} cannot change when resuming; it "
            f"continues {run} as configured"
        )
    saved.update(given)
    saved["out"] = str(run)
    saved.pop("resume", None)
    cfg = load_config({}, saved)
    for note in notes:  # what a run saved before autok refused them never applied
        print(f"autok: note: --resume: {run} has {note}", file=sys.stderr)
    return cfg


def check_resume_task(run: Path, saved: Any, given: str | None) -> None:
    """A run directory is data: the code a resume runs (--task) is named by its command line,
    never by config.json (whoever can write the run could name any importable module, whose
    import runs its code: docs/design.md §9, "Checkpoints are data"). Before anything is
    imported: config.json's task must be the one the command line gives."""
    if saved == given:
        return

    def shown(v: Any) -> str:
        return repr(v[:120] if isinstance(v, str) else v)[:130]

    if given is None:
        raise ConfigError(
            f"--task: {run} was trained with --task {shown(saved)}; give the same --task to "
            "resume it (a run directory never names the code a resume runs)"
        )
    was = f"--task {shown(saved)}" if saved is not None else "the built-in task (no --task)"
    raise ConfigError(
        f"--task: {shown(given)} is not the task {run} was trained with ({was}); a resume "
        "continues the run's own task"
    )


def read_config_json(path: Path) -> Any:
    """A run's config.json as JSON, read with a cap (it is a few KB). Raises OSError,
    ValueError (over the cap, malformed JSON or UTF-8) or RecursionError (nested deeper than
    Python's stack)."""
    if not path.is_file():  # (a FIFO would block the read)
        raise OSError(f"{path} is not a file")
    with open(path, "rb") as f:
        data = f.read(YAML_MAX_BYTES + 1)
    if len(data) > YAML_MAX_BYTES:
        raise ValueError(f"over {YAML_MAX_BYTES >> 20} MiB")
    return json.loads(data.decode("utf-8"))


def given_values(ns: argparse.Namespace) -> dict[str, Any]:
    """The settings the user gave: the --config file's, overridden by the flags on the line."""
    values = {k: v for k, v in vars(ns).items() if k not in ("command", "config", "resume")}
    file_values: dict[str, Any] = {}
    if ns.config is not None:
        file_values = read_yaml(ns.config, "--config") or {}
        if not isinstance(file_values, dict):
            raise ConfigError(f"--config: {ns.config} must hold a mapping of settings")
    spelled: dict[str, str] = {}
    for k in file_values:  # sync-period and sync_period are one setting: the last would win
        key = str(k).replace("-", "_")
        if key in spelled:
            raise ConfigError(
                f"--config: {ns.config} sets {key} twice ({spelled[key]!r} and {str(k)!r})"
            )
        spelled[key] = str(k)
    merged = {str(k).replace("-", "_"): v for k, v in file_values.items()}
    merged.update(values)
    return merged


def check_out_path(out: Path, flag_name: str = "--out") -> None:
    """Refuse a directory that cannot exist there, without creating anything."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag_name}: {out} exists and is not a directory")
    for parent in out.absolute().parents:  # the nearest existing ancestor must be a directory
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ConfigError(f"{flag_name}: {parent} is not a directory, so {out} cannot be")
            break


def make_out_dir(out: Path, flag_name: str = "--out") -> list[Path]:
    """Create `out` and check that a file can be written in it: the last check before anything
    is launched. Returns the directories it created, deepest first, for `remove_created`."""
    check_out_path(out, flag_name)
    created = [p for p in (out.absolute(), *out.absolute().parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out, prefix=".autok-write-test-"):
            pass
    except OSError as exc:
        remove_created(created)
        raise ConfigError(f"{flag_name}: cannot write in {out} ({exc.strerror})") from None
    return created


def remove_created(created: list[Path]) -> None:
    """Undo make_out_dir after a refusal: only the directories it made, and only while empty."""
    for d in created:
        with contextlib.suppress(OSError):
            d.rmdir()


def prepare_out_dir(cfg: TrainConfig, write: bool) -> Path:
    out = cfg.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    check_out_path(out)
    # Under torchrun only rank 0 writes; the others would find rank 0's fresh config.json.
    taken = [f for f in RUN_FILES if (out / f).exists()] if write else []
    if taken:
        raise ConfigError(f"--out: {out} already holds a run ({taken[0]}); choose a new directory")
    if write:
        from autok.runlock import LOCK_NAME

        # a lock another process holds refuses the run before make_out_dir writes its probe
        lock = hold_run(out, "--out") if (out / LOCK_NAME).is_file() else None
        try:
            created = make_out_dir(out)
        except ConfigError:
            if lock is not None:
                lock.undo()
            raise
        lock = lock or hold_run(out, "--out", created)
        # again under the lock: a run started beside this one may have written its files
        if taken := [f for f in RUN_FILES if (out / f).exists()]:
            lock.undo()
            raise ConfigError(
                f"--out: {out} already holds a run ({taken[0]}); choose a new directory"
            )
        try:
            write_config(cfg, out)
        except OSError as exc:
            lock.undo()
            remove_created(created)
            raise ConfigError(
                f"--out: cannot write {out / 'config.json'} ({exc.strerror})"
            ) from None
    return out


def hold_run(out: Path, flag_name: str, created: list[Path] | None = None) -> RunLock:
    """The run's lock (autok/runlock.py), held by this process until it exits: a second
    process writing the same run is refused before it writes anything."""
    from autok.runlock import LOCK_NAME, RunInUse, acquire

    try:
        return acquire(out)
    except RunInUse as exc:
        remove_created(created or [])
        raise ConfigError(f"{flag_name}: {exc}; one process at a time trains a run") from None
    except OSError as exc:
        remove_created(created or [])
        why = exc.strerror or str(exc)
        raise ConfigError(f"{flag_name}: cannot lock {out / LOCK_NAME} ({why})") from None


def resolved_config(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """config.json's contents for this run."""
    resolved = cfg.model_dump(mode="json") | {"out": str(out)}
    # strict JSON: link none's unlimited bandwidth is null, not the Infinity json.dump would write
    resolved["link_profile"] = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in cfg.link_profile.__dict__.items()
    }
    from autok.trainer.loop.environment import environment

    resolved["environment"] = environment()  # what its numbers depend on besides settings
    # and the K policy's rule as this version has it (docs/design.md §6, "the rule's revision")
    resolved["policy_revision"] = revision(cfg.policy)
    return resolved


def write_config(cfg: TrainConfig, out: Path) -> None:
    from autok.trainer.loop.sinks import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", resolved_config(cfg, out))


def check_restarted_run(cfg: TrainConfig, out: Path) -> bool:
    """A torchrun restart (--max-restarts) continues its own run: the one its command line
    configured. An --out that holds a run configured otherwise (the first attempt was refused
    because --out held another run) is refused, and left as it is. True where config.json is
    this job's already (not written again)."""
    path = out / "config.json"
    if not path.exists():
        # The first attempt failed before writing it, so it wrote nothing else either: any
        # other run file is another run's (its checkpoints would be resumed from).
        if taken := [f for f in RUN_FILES if (out / f).exists()]:
            raise ConfigError(
                f"--out: {out} holds another run ({taken[0]}); a torchrun restart continues "
                "only its own run: give a new --out"
            )
        return False
    try:
        saved = read_config_json(path)
    except (OSError, ValueError, RecursionError):
        saved = None
    ours = resolved_config(cfg, out)
    if saved != ours:
        keys = sorted(set(ours) | set(saved)) if isinstance(saved, dict) else []
        differs = next((k for k in keys if saved.get(k) != ours.get(k)), None)
        what = f" (its {flag(differs)} differs)" if differs else ""
        if differs == "environment":
            what = " (it was started with other package versions or another CPU)"
        # --resume refuses a run of another revision too (resume_config)
        other = " or --resume that run" if differs != "policy_revision" else ""
        if differs == "policy_revision":
            what = " (it was started by another revision of its K policy's rule)"
        raise ConfigError(
            f"--out: {out} holds a run this command did not configure{what}; a torchrun "
            f"restart continues only its own run: give a new --out{other}"
        )
    return True


def check_resumable(out: Path, cfg: TrainConfig) -> None:
    """Before anything is launched or written: the run has a checkpoint this world can continue
    from. A resume that cannot continue is refused; it never starts over on top of the run."""
    from autok.procs import under_torchrun
    from autok.trainer.loop.checkpoint import CheckpointError, model_layout, resume_point
    from autok.trainer.loop.tasks import TaskError, load_task

    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else cfg.workers
    try:  # the model the workers will build: a checkpoint whose tensors do not fit it is refused
        layout = model_layout(load_task(cfg).model)
    except TaskError as exc:
        raise ConfigError(str(exc)) from None
    try:
        found = resume_point(out, world, layout)
    except CheckpointError as exc:
        raise ConfigError(f"--resume: {exc}") from None
    done = found.epoch + 1  # epochs 0..found.epoch; equal to --epochs: only the run's end
    if cfg.epochs < done:
        raise ConfigError(
            f"--epochs: {cfg.epochs}, but the checkpoint has {done} epochs done; give {done} "
            "or more (the run is left as it was)"
        )
    stop = cfg.stop_after_epochs
    if stop is not None and stop <= done < cfg.epochs:  # it would never stop: trains to the end
        raise ConfigError(
            f"--stop-after-epochs: {stop}, but the checkpoint has {done} epochs done; give "
            f"more than {done}, or leave it out"
        )


def check_target(metric: Metric, target: float | None, objective: str) -> float:
    """The sweep's --target for this metric: an accuracy is a fraction; another metric has no
    natural target, so time-to-target needs one given."""
    if target is None:
        if metric.name == "accuracy":
            return 0.9
        if OBJECTIVE_ALIASES.get(objective, objective) == "time-to-target":
            raise ConfigError(
                f"--target: the task's metric is {metric.name}; give the value to reach"
            )
        return math.nan
    if metric.name == "accuracy" and not 0 < target <= 1:
        raise ConfigError(
            f"--target: {target} is not a fraction in (0, 1] (accuracies are fractions)"
        )
    return target


def cmd_train(ns: argparse.Namespace) -> int:
    from autok.metrics import check_metrics_ports
    from autok.procs import torchrun_restart, under_torchrun  # torch-free

    rank0 = not under_torchrun() or os.environ.get("RANK") == "0"
    if ns.resume is not None or torchrun_restart():
        # An explicit --resume, or torchrun restarting its workers after a failure: continue
        # the run in place from its last good checkpoint.
        cfg = resume_config(ns) if ns.resume is not None else config_from_args(ns)
        if cfg.out is None:
            raise ConfigError("--out: a job that torchrun restarts needs --out to find its run")
        out = Path(cfg.out)
        if ns.resume is not None:
            check_resumable(out, cfg)
        require_run(cfg)  # a missing extra: one line naming it (autok/extras.py)
        check_task(cfg)
        check_backend(cfg)
        check_metrics_ports(cfg)
        ours = ns.resume is None and check_restarted_run(cfg, out)
        # the launching process holds the run until it exits (autok/runlock.py)
        lock = hold_run(out, "--resume" if ns.resume is not None else "--out") if rank0 else None
        if lock is not None and cfg.tensorboard is not None:  # the last check, as on a fresh run
            try:
                make_out_dir(cfg.tensorboard, "--tensorboard")
            except ConfigError:
                lock.undo()
                raise
        if rank0 and not ours:
            write_config(cfg, out)
        return launch_run(cfg, out, resume=True)
    cfg = config_from_args(ns)
    if cfg.out is None and under_torchrun():
        # each rank would name its own runs/<time> (its clock, its second), and a rank's
        # checkpoint files would land beside no config.json
        raise ConfigError(
            "--out: under torchrun every rank must write into one run directory; give --out "
            "(the same path on every node)"
        )
    require_run(cfg)  # a missing extra: one line naming it (autok/extras.py)
    check_task(cfg)
    check_backend(cfg)
    check_metrics_ports(cfg)  # a taken port fails here, not in rank 0 after config.json
    tb_created = []
    if rank0 and cfg.tensorboard is not None:  # writable, before anything else is written
        tb_created = make_out_dir(cfg.tensorboard, "--tensorboard")
    try:
        out = prepare_out_dir(cfg, write=rank0)
    except ConfigError:
        remove_created(tb_created)
        raise
    if rank0:
        print(f"autok: run directory {out} (starting {cfg.workers} workers)", flush=True)
    return launch_run(cfg, out)


def launch_run(cfg: TrainConfig, out: Path, resume: bool = False) -> int:
    """Train; Ctrl-C (exit 130) says how the run continues: from its last complete checkpoint,
    which an interrupted write never touches (trainer/loop/checkpoint.py)."""
    import signal
    import threading

    from autok.procs import start_worker_server, under_torchrun

    if not under_torchrun():  # its imports overlap this process's own (autok/launch.py)
        start_worker_server()
    from autok.launch import launch  # torch: only once the settings are known good

    # A train started with SIGINT ignored (a background job of a non-interactive shell: how
    # some CI runners and agents start commands) would pass the ignoring on to every worker
    # and train to the end through any Ctrl-C: Python's own handler is put back meanwhile.
    on_main = threading.current_thread() is threading.main_thread()
    ignored = on_main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        launch(cfg, out, resume=resume)
    except KeyboardInterrupt:
        done = [p for p in (out / "checkpoints").glob("epoch-*") if (p / "manifest.json").is_file()]
        task = f" --task {cfg.task}" if cfg.task else ""  # a resume names its code (--task)
        raise KeyboardInterrupt(
            f"continue with: autok train --resume {out}{task}"
            if done
            else f"before the first checkpoint: nothing to resume in {out}; start it again "
            "with another --out"
        ) from None
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        from autok.runlock import release_all

        release_all()  # the run has ended: its lock (hold_run) goes with it
    return 0


SWEEP_KEYS = (
    "backend",
    "trials",
    "jobs",
    "space",
    "resume",
    "storage",
    "study_name",
    "objective",
    "pruner",
    "target",
    "sampler_seed",
    "address",
    "enqueue",
)


MAX_TRIALS, MAX_JOBS = 10_000, 64
# what a sweep writes in its --out (autok/sweep.py, autok/sweep_ray.py)
SWEEP_FILES = ("study.db", "trials.csv", "pareto.csv", "best.yaml", "trials", "ray")


def check_sweep_flags(ns: argparse.Namespace) -> None:
    """The sweep's own flags (the fixed train flags are checked as a run)."""
    if not 1 <= ns.trials <= MAX_TRIALS:
        raise ConfigError(f"--trials: {ns.trials} is outside 1..{MAX_TRIALS} (each is a full run)")
    if not 1 <= ns.jobs <= MAX_JOBS:
        raise ConfigError(
            f"--jobs: {ns.jobs} is outside 1..{MAX_JOBS} (each trial at a time spawns --workers "
            "processes)"
        )
    if not 0 <= ns.sampler_seed <= SEED_MAX:
        raise ConfigError(
            f"--sampler-seed: {ns.sampler_seed} is outside 0..{SEED_MAX} (Optuna's sampler "
            "takes a 32-bit seed)"
        )
    if ns.target is not None and not math.isfinite(ns.target):
        raise ConfigError(f"--target: {ns.target} is not a finite number")
    if not ns.study_name.strip():
        raise ConfigError("--study-name: empty; give a name")
    if ns.address is not None and ns.backend != "ray":
        raise ConfigError("--address: a Ray cluster's address; give it with --backend ray")


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def cmd_sweep(ns: argparse.Namespace) -> int:
    from autok.space import check_fixed, load_enqueue, load_space, trial_settings
    from autok.sweep import SweepOptions, check_space, sweep_optuna, table

    sweep_args = {k: getattr(ns, k) for k in SWEEP_KEYS}
    given = {k: v for k, v in vars(ns).items() if k not in SWEEP_KEYS and k != "out"}
    if "dist_backend" in given:  # the trials' --backend, renamed beside the sweep's own
        given["backend"] = given.pop("dist_backend")
    train_args = argparse.Namespace(**given)
    out = getattr(ns, "out", None) or Path("sweeps") / time.strftime("%Y%m%d-%H%M%S")
    check_sweep_flags(ns)
    require("autok sweep")  # its extras, before any file is read (autok/extras.py)
    if ns.backend == "ray":
        require("--backend ray")
    require_storage(ns.storage)
    # The fixed part is what the user gave (defaults that depend on searched settings, such as
    # beta on a searched strategy, stay free); it must be a valid run by itself.
    fixed = given_values(train_args)
    space = load_space(sweep_args.pop("space"))
    # a fixed setting that only some trials read (--target-sync-share with a searched policy)
    check_fixed(fixed, space)
    fixed_cfg = load_config({}, trial_settings(fixed, {}))
    require_run(fixed_cfg)
    metric = check_task(fixed_cfg)
    if fixed_cfg.metrics_port:
        from autok.metrics import check_metrics_ports

        if ns.jobs > 1:
            raise ConfigError(
                f"--metrics-port: {ns.jobs} trials at a time (--jobs) would each serve on "
                f"{fixed_cfg.metrics_port}; give --jobs 1, or no --metrics-port"
            )
        check_metrics_ports(fixed_cfg)  # taken: every trial would fail on it
    sweep_args["target"] = check_target(metric, sweep_args["target"], sweep_args["objective"])
    sweep_args["objective"] = OBJECTIVE_ALIASES.get(sweep_args["objective"], ns.objective)
    fixed = {k: str(v) if isinstance(v, Path) else v for k, v in fixed.items()}
    check_space(fixed, space)
    sweep_args["enqueue"] = load_enqueue(sweep_args["enqueue"], space, fixed)
    if ns.address is None:  # trials on this machine (on a cluster's nodes, their GPUs count)
        searched = {d.name for d in space}
        check_backend(fixed_cfg, "--dist-backend", count_workers="workers" not in searched)
    if fixed.get("task") is not None and (owned := [d for d in space if d.name in TASK_OWNS]):
        raise ConfigError(
            f"--space: {owned[0].name}: the --task builds its own data and model; "
            "it cannot be searched"
        )
    opts = SweepOptions(
        out=Path(out),
        workdir=os.getcwd(),
        seed=sweep_args.pop("sampler_seed"),
        metric_name=metric.name,
        higher_is_better=metric.higher_is_better,
        **sweep_args,
    )
    check_out_path(opts.out)
    if opts.resume and opts.backend == "ray":
        # Ray's Tuner.restore unpickles what it finds under --out: whoever wrote there could
        # run code in this process. Optuna's study.db is data.
        raise ConfigError(
            "--resume: a Ray sweep cannot be continued safely (Ray's restore unpickles the files "
            "in --out); start it again with a new --out, or sweep with --backend optuna"
        )
    # A new study must not write its trials.csv, best.yaml and trial directories over another
    # sweep's (under another --study-name, nothing else would stop it).
    held = [f for f in SWEEP_FILES if (opts.out / f).exists()] if not opts.resume else []
    if held:
        raise ConfigError(
            f"--out: {opts.out} already holds a sweep ({held[0]}); continue it with --resume "
            "(and its --study-name), or choose a new --out"
        )
    if opts.backend == "ray":
        from autok.sweep_ray import check_ray

        check_ray(opts, fixed)
    on_sqlite = opts.backend == "optuna" and opts.storage is None
    if opts.resume and on_sqlite and not (opts.out / "study.db").is_file():
        raise ConfigError(f"--resume: no study to continue in {opts.out} (no study.db)")
    if opts.resume and on_sqlite and not _is_sqlite(opts.out / "study.db"):
        # opened as is, an empty file would get Optuna's tables before any refusal
        raise ConfigError(
            f"--resume: {opts.out / 'study.db'} is not a SQLite database (empty or damaged); "
            "move it away, or choose a new --out"
        )
    created = make_out_dir(opts.out)
    try:
        if opts.backend == "ray":
            from autok.sweep_ray import sweep_ray

            rows = sweep_ray(opts, fixed, space)
        else:
            rows = sweep_optuna(opts, fixed, space)
    except ConfigError:  # refused before any trial (e.g. --storage): leave no empty directory
        remove_created(created)
        raise
    print(table(rows, space, opts=opts))
    print(f"\nautok: {len(rows)} trials in {out}: trials.csv, pareto.csv, pareto.png, best.yaml")
    return 0


def cmd_experiment(ns: argparse.Namespace) -> int:
    from autok.experiment import (
        available,
        check_run_dirs,
        expand,
        listing,
        load_experiment,
        run_experiment,
    )

    if ns.action == "list":  # with each form's runs and time (autok/experiment.py, estimate)
        for name in available():
            print(listing(name))
        return 0
    if not 1 <= ns.jobs <= MAX_JOBS:
        raise ConfigError(
            f"--jobs: {ns.jobs} is outside 1..{MAX_JOBS} (each run at a time spawns its workers)"
        )
    seen: set[int] = set()
    for seed in ns.seeds or []:
        if not 0 <= seed <= SEED_MAX:
            raise ConfigError(f"--seeds: {seed} is outside 0..{SEED_MAX} (seeds are 32-bit)")
        if seed in seen:
            raise ConfigError(f"--seeds: {seed} is given twice (one run directory per seed)")
        seen.add(seed)
    check_out_path(ns.out)
    exp = load_experiment(ns.name)
    extra = {"data_dir": str(ns.data_dir)} if ns.data_dir else {}
    for name in ("clock", "compute_ms", "model_bytes"):  # every run's, checked with its own
        if getattr(ns, name) is not None:
            extra[name] = getattr(ns, name)
    runs = expand(exp, ns.form or "quick", ns.seeds, extra or None)
    for run in runs:  # each run's data set, model and --tensorboard (autok/extras.py)
        require_run(run.settings)
    check_run_dirs(runs, ns.out)
    make_out_dir(ns.out)
    print(
        f"autok: experiment {exp['name']} ({ns.form or 'quick'}): {len(runs)} runs into {ns.out}",
        flush=True,
    )
    from autok import pilot

    tally = run_experiment(runs, ns.out, ns.jobs, pilot.spec(exp), exp.get("predictions"))
    # a diverged run is a result (the report lists it); only a crash or a refusal fails
    ended = f", {tally.diverged} diverged" if tally.diverged else ""
    ended += f", {tally.failed} failed" if tally.failed else ""
    print(
        f"autok: {tally.finished} of {len(runs)} runs finished{ended}; "
        f"`autok report {ns.out}` makes the tables"
    )
    return 1 if tally.failed else 0


def cmd_report(ns: argparse.Namespace) -> int:
    from autok.report import ReportError, one_run, report

    if not ns.dir.is_dir():
        raise ConfigError(f"report: {ns.dir} is not a directory")
    try:
        if (single := one_run(ns.dir)) is not None:  # a run's own directory: its files say it
            print(single)
            return 0
        require("autok report")  # the plots and intervals of an experiment (autok/extras.py)
        print(report(ns.dir))
    except ReportError as exc:  # a run's file is malformed: it names the file and the field
        raise ConfigError(f"report: {exc}") from None
    except FileNotFoundError as exc:
        raise ConfigError(f"report: {exc}") from None
    except OSError as exc:  # e.g. a read-only directory: report.md cannot be written
        raise ConfigError(f"report: cannot write in {ns.dir} ({exc.strerror})") from None
    print(f"autok: wrote {ns.dir / 'report.md'}, report.csv and PNG plots")
    return 0


MAX_ERROR_CHARS = 280  # with "autok: error: ", under 300
# what Ctrl-C leaves, by command (a train says it with its run directory: launch_run)
INTERRUPTED = {
    "sweep": "a sweep continues with --resume",
    "experiment": "running the experiment again continues it",
}


def one_line(text: str) -> str:
    """An error as one line of bounded length, whatever the input it quotes."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def error_line(text: str) -> str:
    """The `Type: message` line of a (worker's) traceback, else its last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Diverged|Mismatch)\b: ", ln):
            return ln
    return lines[-1] if lines else ""


def _checkout_with_benchmarks() -> Path | None:
    """The autok checkout that benchmarks/ comes from: `pip install autok` does not install it,
    so `autok bench` runs a checkout's own (docs/design.md §3): the one autok was installed from
    in editable mode, else the one that holds the working directory."""
    source = Path(__file__).resolve().parents[1]
    for folder in (source, Path.cwd(), *Path.cwd().parents):
        if (folder / "benchmarks" / "bench_cli.py").is_file() and _names_autok(folder):
            return folder
    return None


def _names_autok(folder: Path) -> bool:
    """Whether folder/pyproject.toml is autok's own ([project] name), read bounded; anything
    unreadable or malformed is not."""
    import tomllib

    try:
        with open(folder / "pyproject.toml", "rb") as f:
            data = f.read(YAML_MAX_BYTES + 1)
        project = tomllib.loads(data.decode("utf-8")).get("project")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    named = isinstance(project, dict) and project.get("name") == "autok"
    return named and len(data) <= YAML_MAX_BYTES


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    command = "autok"
    argv = sys.argv[1:] if argv is None else argv
    from autok.procs import process_started

    # The run's total time counts from this process's start (workers inherit it): a summary
    # reports the time a user waits, start-up included, beside the training time.
    os.environ["AUTOK_STARTED"] = repr(process_started())
    if argv[:1] == ["bench"]:  # its flags are the benchmark's own
        checkout = _checkout_with_benchmarks()
        if checkout is None:
            print(
                "autok: error: bench: the benchmarks ship with the repository, not the package; "
                "run `autok bench` from a checkout of autok (the folder that holds benchmarks/)",
                file=sys.stderr,
            )
            return 2
        sys.path.insert(0, str(checkout))
        from benchmarks.bench_cli import main as bench  # torch only after the flags parse

        try:
            bench(argv[1:])
        except SystemExit as exc:  # its one-line refusals exit 2, as every command's
            if exc.code is None:
                return 0
            return exc.code if isinstance(exc.code, int) else 1
        return 0
    commands = dict(train=cmd_train, sweep=cmd_sweep, experiment=cmd_experiment, report=cmd_report)
    try:
        ns = parser.parse_args(argv)
        command = ns.command
        rc = commands[ns.command](ns) if ns.command in commands else EXIT_USAGE
        # what is still buffered for a pipe is written here, where a reader that has gone is
        # caught below, not at the interpreter's exit ("Exception ignored ... BrokenPipeError")
        sys.stdout.flush()
        return rc
    except (UsageError, ConfigError) as exc:
        print(f"autok: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        hint = str(exc) or INTERRUPTED.get(command, "")
        print(f"autok: interrupted{f' ({hint})' if hint else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `autok experiment list | head`: the reader has what it wanted
        # stdout's buffer would fail again at exit: point it at /dev/null, and exit as a shell
        # reports a process that SIGPIPE ended (128 + 13), without a word
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # e.g. a worker failed: its own traceback is already on stderr
        from autok.sweep import redact  # no URL's password reaches the terminal, whatever failed

        last = [one_line(redact(error_line(str(exc))))]
        what = "training" if command == "train" else command
        print(f"autok: {what} failed: {last[-1] if last else type(exc).__name__}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
