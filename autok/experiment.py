"""`autok experiment run NAME`: a named grid of complete runs (experiments/NAME.yaml) x seeds.

Each run is an `autok train` in DIR/<label>/seed-<s>/, tagged with experiment.json for
`autok report`. Finished runs (summary.json) are skipped; an interrupted one resumes from its
last checkpoint (every run checkpoints each epoch), so re-running the command continues. One
that never reached a checkpoint starts over, clearing only what autok can prove it wrote: the
directory it made and signed with its marker (`foreign_files`); nothing is ever written or
deleted through a symbolic link under --out.

A `vary` value may be a named bundle of settings ({name: gpt, task: ..., lr: ...}): the label
shows `key=name` and the run gets all of the bundle's settings, so one experiment can span
workloads that differ in several settings at once. A run may take its random policy's mean K
from another run of the same regime and seed (`random_mean: {mean_k_of: exposed-sync}`): it
starts once that run has finished, with the mean K that run's controller used after warmup.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import os
import re
import secrets
import shutil
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import yaml

from autok import pilot
from autok.config import (
    NAME_MAX,
    ConfigError,
    TrainConfig,
    check_task,
    finite_number,
    first_difference,
    load_config,
    read_yaml,
)
from autok.controllers import RAN_BEFORE, read_drop, reads, revision_problem
from autok.procs import start_logged
from autok.resources import experiments_dir
from autok.runlock import LOCK_NAME, RunInUse, RunLock, acquire, release
from autok.space import as_ran
from autok.trainer.loop.environment import difference, environment

MAX_RUNS = 10_000  # an experiment's runs (runs x vary x seeds), as --trials caps a sweep


@dataclass(frozen=True)
class Run:
    label: str  # the method and its varied settings, e.g. "cpdp-k4 lr=0.4"
    seed: int
    settings: dict[str, Any]
    order: int = 0  # the run's place in the grid (runs x vary x seeds): the report's row order
    mean_k_of: str | None = None  # the label of the run whose mean K sets random_mean
    stage: str = "main"  # "pilot": a run on the pilot's seeds (autok/pilot.py)
    from_pilot: bool = False  # `sync_period: pilot`: settings from the regime's pilot choice
    # with `from_pilot`: the settings the run's own entry gives, kept over the pilot choice's
    given: tuple[str, ...] = ()

    @property
    def dir(self) -> str:
        return f"{re.sub(r'[^A-Za-z0-9.=_-]+', '_', self.label)}/seed-{self.seed}"


def available() -> list[str]:
    return sorted(p.stem for p in experiments_dir().glob("*.yaml"))


def load_experiment(name: str) -> dict[str, Any]:
    path = Path(name) if name.endswith(".yaml") else experiments_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"experiment {name[:80]!r} not found; choose from {available()} or give a .yaml path"
        )
    exp = read_yaml(path, "experiment")
    if why := experiment_problem(exp):
        raise ConfigError(f"experiment: {path}: {why}")
    return exp


def experiment_problem(exp: Any) -> str | None:
    """What is wrong with an experiment file's structure, or None (settings are checked as runs
    by `expand`)."""
    if not isinstance(exp, dict):
        return "must be a mapping with name, runs and a quick and/or full form"
    if not isinstance(exp.get("name"), str) or not exp["name"].strip():
        return "name: needs a non-empty string"
    runs = exp.get("runs")
    if not isinstance(runs, list) or not runs:
        return "runs: needs a non-empty list of {name: ..., settings...}"
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("name"), str) or not run["name"]:
            return f"runs[{i}]: needs a mapping with a string `name`"
        if run["name"].strip(".") == "":  # it names the run's directory: "." or ".." escape
            return f"runs[{i}].name: {run['name']!r} cannot name a directory"
        if isinstance(mean := run.get("random_mean"), dict):
            earlier = [r.get("name") for r in runs[:i] if isinstance(r, dict)]
            if set(mean) != {"mean_k_of"} or mean["mean_k_of"] not in earlier:
                return (
                    f"runs[{i}].random_mean: give a number or {{mean_k_of: NAME}} naming an "
                    "earlier run"
                )
        if "only" in run and not (
            isinstance(run["only"], dict)
            and all(isinstance(v, list) and v for v in run["only"].values())
        ):
            return f"runs[{i}].only: needs a mapping of varied setting -> list of its values"
    seeds = exp.get("seeds", [42])
    if not isinstance(seeds, list) or not seeds or not all(type(x) is int for x in seeds):
        return "seeds: needs a non-empty list of integers"
    forms = [f for f in ("quick", "full") if f in exp]
    if not forms:
        return "needs a `quick` or `full` form"
    if why := measured_problem(exp.get("measured", {}), forms):
        return why
    if why := pilot.problem(exp):
        return why
    for form in forms:
        spec = exp[form]
        if not isinstance(spec, dict):
            return f"{form}: needs a mapping (base, vary, scale_lr)"
        if not isinstance(spec.get("base", {}), dict):
            return f"{form}.base: needs a mapping of settings"
        vary = spec.get("vary", {})
        if not isinstance(vary, dict) or not all(isinstance(v, list) and v for v in vary.values()):
            return f"{form}.vary: needs a mapping of setting -> non-empty list of values"
        for key, values in vary.items():
            for v in values:
                if isinstance(v, dict) and not (isinstance(v.get("name"), str) and v["name"]):
                    return f"{form}.vary.{key}: a bundle of settings needs a string `name`"
        scale = spec.get("scale_lr")
        if scale is not None and not (
            isinstance(scale, dict)
            and finite_number(scale.get("base_lr"))
            and scale["base_lr"] > 0
            and type(scale.get("base_workers")) is int
            and scale["base_workers"] > 0
        ):
            return f"{form}.scale_lr: needs base_lr > 0 and an integer base_workers > 0"
    return None


def count_runs(exp: dict[str, Any], form: str, seeds: list[int] | None = None) -> int:
    """How many runs `expand` makes of the form (runs x vary x seeds), without building any."""
    vary = exp[form].get("vary", {})
    plan = pilot.spec(exp)
    total = 0
    for run in exp["runs"]:
        combos = math.prod(sum(_runs_at(run, k, v) for v in vary[k]) for k in vary if k not in run)
        on_pilot = plan.seeds if plan is not None and run["name"] in plan.runs else None
        total += combos * len(on_pilot or seeds or exp.get("seeds", [42]))
    return total


def _runs_at(run: dict[str, Any], key: str, value: Any) -> bool:
    """Whether `run` runs where `key` takes `value`: its `only` may name the values (a bundle by
    its name) at which the run means something."""
    name = value["name"] if isinstance(value, dict) else value
    return name in run.get("only", {}).get(key, [name])


def estimate(exp: dict[str, Any], form: str) -> str:
    """The form's run count and time, as `autok experiment list` shows them: the time is a
    measured one (the file's `measured`, from docs/reproduction.md), scaled by runs when the
    grid has changed since; a form nobody timed says so instead of guessing."""
    n = count_runs(exp, form)
    m = exp.get("measured", {}).get(form)
    if m is None:
        return f"{form}: {n} runs, not timed"
    minutes = m["minutes"] * n / m["runs"]
    how = (
        "measured"
        if n == m["runs"]
        else f"scaled from {m['minutes']:g} min measured for {m['runs']} runs"
    )
    return f"{form}: {n} runs, about {_duration(minutes)} ({how} on {m['machine']}, {m['source']})"


def _duration(minutes: float) -> str:
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def listing(name: str) -> str:
    """`autok experiment list`'s entry of one experiment: its name and description, then each
    form's runs and time on an indented line."""
    exp = load_experiment(name)
    forms = "; ".join(estimate(exp, f) for f in ("quick", "full") if f in exp)
    return f"{name:18} {exp.get('description', '')}\n{'':18} {forms}"


MEASURED_TEXT = 200  # characters of a measurement's `machine` and `source`


def measured_problem(measured: Any, forms: list[str]) -> str | None:
    """What is wrong with `measured` ({form: {runs, minutes, machine, source}}: how long a form took
    where, for `autok experiment list`), or None."""
    if not isinstance(measured, dict):
        return "measured: needs a mapping of form -> {runs, minutes, machine, source}"
    for form, m in measured.items():
        if form not in forms:
            return f"measured.{form}: names no form of this experiment ({', '.join(forms)})"
        if not (
            isinstance(m, dict)
            and set(m) == {"runs", "minutes", "machine", "source"}
            and type(m["runs"]) is int
            and 0 < m["runs"] <= MAX_RUNS
            and finite_number(m["minutes"])
            and m["minutes"] > 0
            and all(
                isinstance(m[k], str) and 0 < len(m[k]) <= MEASURED_TEXT
                for k in ("machine", "source")
            )
        ):
            return (
                f"measured.{form}: needs runs (1..{MAX_RUNS}), minutes > 0, and `machine` "
                f"and `source` (text of at most {MEASURED_TEXT} characters)"
            )
    return None


def expand(
    exp: dict[str, Any],
    form: str,
    seeds: list[int] | None = None,
    extra: dict[str, Any] | None = None,
) -> list[Run]:
    """Every run of the grid: runs x the form's `vary` product x seeds; validated up front.
    A setting a run fixes itself is not varied for it (DDP in the K sweep: `sync_period: 1`)."""
    if form not in exp:
        raise ConfigError(f"experiment {exp['name']}: has no --{form} form")
    spec = exp[form]
    vary = spec.get("vary", {})
    # counted before anything is built: a short file can multiply out to 10^8 runs
    n_seeds = len(seeds or exp.get("seeds", [42]))
    total = count_runs(exp, form, seeds)
    if total > MAX_RUNS:
        head = "--seeds: " if seeds and total // n_seeds <= MAX_RUNS else ""
        raise ConfigError(
            f"{head}experiment {exp['name']} ({form}) has {total:,} runs (runs x vary x "
            f"seeds); at most {MAX_RUNS:,}, each a full multi-worker job"
        )
    plan = pilot.spec(exp)
    if plan is not None and seeds and set(seeds) & set(plan.seeds):
        raise ConfigError("--seeds: must differ from the experiment's pilot.seeds")
    out: list[Run] = []
    dirs: dict[str, str] = {}
    tasks_checked: set[str] = set()
    for run in exp["runs"]:
        keys = [k for k in vary if k not in run]
        for combo in itertools.product(*(vary[k] for k in keys)):
            if not all(_runs_at(run, k, v) for k, v in zip(keys, combo, strict=True)):
                continue  # `only`: a run that means something in some regimes only
            chosen = dict(zip(keys, combo, strict=True))
            bundled: dict[str, Any] = {}
            for k, v in chosen.items():
                if isinstance(v, dict):  # a named bundle: its settings, labelled by its name
                    bundled |= {key: val for key, val in v.items() if key != "name"}
                    chosen[k] = v["name"]
                else:
                    bundled[k] = v
            own = {k: v for k, v in run.items() if k not in ("name", "only")}
            from_pilot = own.get("sync_period") == pilot.FROM_PILOT
            # what the entry itself gives, over the pilot's choice
            given = tuple(k for k in own if k != "sync_period") if from_pilot else ()
            if from_pilot:  # known once the pilot ran; a fixed K stands in for checking
                own |= {"sync_period": 1, "strategy": own.get("strategy", "cpdp")}
            on_pilot = plan is not None and run["name"] in plan.runs
            mean_of = (
                own.pop("random_mean")["mean_k_of"]
                if isinstance(own.get("random_mean"), dict)
                else None
            )
            settings = {
                **spec.get("base", {}),
                **bundled,
                **own,
                **(extra or {}),
            }
            if scale := spec.get("scale_lr"):  # linear scaling with the global batch
                workers = settings.get("workers", TrainConfig.model_fields["workers"].default)
                if type(workers) is not int:
                    raise ConfigError(f"experiment {exp['name']}: scale_lr needs integer workers")
                settings["lr"] = scale["base_lr"] * workers / scale["base_workers"]
            suffix = "".join(f" {k}={v}" for k, v in chosen.items())
            label = run["name"] + suffix
            name = Run(label, 0, {}).dir.split("/")[0]  # the run's directory under --out
            if len(name.encode()) > NAME_MAX:  # the run could never be written
                raise ConfigError(
                    f"experiment {exp['name']}: run {label[:40]!r}... names a directory of "
                    f"{len(name.encode())} bytes; at most {NAME_MAX} (shorten its name or values)"
                )
            for seed in plan.seeds if on_pilot and plan else seeds or exp.get("seeds", [42]):
                s = {**settings, "seed": seed}
                try:
                    cfg = validated(s, mean_of)
                    if cfg.task is not None and cfg.task not in tasks_checked:
                        check_task(cfg)  # imports and builds it once, before any run starts
                        tasks_checked.add(cfg.task)
                except ConfigError as exc:
                    raise ConfigError(f"experiment {exp['name']}, run {label!r}: {exc}") from None
                run_ = Run(
                    label,
                    seed,
                    s,
                    len(out),
                    mean_of + suffix if mean_of else None,
                    "pilot" if on_pilot else "main",
                    from_pilot,
                    given,
                )
                if run_.dir in dirs:  # two runs would write (and clear) one directory
                    raise ConfigError(
                        f"experiment {exp['name']}: runs {dirs[run_.dir]!r} and {label!r} "
                        f"(seed {seed}) share the directory {run_.dir}; give them distinct names"
                    )
                dirs[run_.dir] = label
                out.append(run_)
    _check_pilot_choices(exp["name"], out)
    return out


def _check_pilot_choices(name: str, runs: list[Run]) -> None:
    """A run taking the pilot's choice runs the chosen pilot run's settings with its own over
    them (`with_pilot_choice`): checked now, against every pilot run of its regime that the
    pilot could choose, so that a pairing that cannot train is refused before anything runs."""
    seen: set[str] = set()
    for run in runs:
        if not run.from_pilot or run.label in seen:
            continue
        seen.add(run.label)
        suffix = run.label.partition(" ")[2]
        pilots = (r.label.partition(" ") for r in runs if r.stage == "pilot")
        for arm in dict.fromkeys(head for head, _, rest in pilots if rest == suffix):
            try:
                validated(with_pilot_choice(run, runs, arm).settings, None)
            except ConfigError as exc:
                raise ConfigError(
                    f"experiment {name}, run {run.label!r} with the settings of pilot run "
                    f"{arm!r}: {exc}"
                ) from None


def mean_k_used(run_dir: Path) -> float:
    """The mean K in force over a finished run's post-warmup boundary intervals (the K its
    controller chose, before any epoch end cut an interval short). The records do not say
    which were warmup: its epochs come from the run's config.json."""
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    warmup = config.get("warmup_epochs", 0) if isinstance(config, dict) else 0
    warmup = warmup if type(warmup) is int else 0
    ks = []
    with open(run_dir / "boundaries.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("epoch"), int):
                continue
            if rec["epoch"] >= warmup and isinstance(rec.get("sync_period"), int):
                ks.append(rec["sync_period"])
    if not ks:
        raise ValueError(f"{run_dir}: no boundary after warmup to take a mean K from")
    return sum(ks) / len(ks)


def with_matched_mean(run: Run, out: Path) -> Run:
    """`run` with random_mean set from the run it follows (which must have finished)."""
    source = out / Run(run.mean_k_of or "", run.seed, {}).dir
    if not (source / "summary.json").exists():
        raise ValueError(f"{run.mean_k_of!r} (seed {run.seed}) did not finish")
    mean = min(mean_k_used(source), float(run.settings.get("max_sync_period", 64)))
    return Run(
        run.label,
        run.seed,
        {**run.settings, "random_mean": round(mean, 4)},
        run.order,
        stage=run.stage,
    )


def _train(run: Run, out: Path, secret: bytes) -> tuple[str, float]:
    """One run to completion; returns (what happened, seconds). This process holds the run's
    lock (autok/runlock.py) from before it clears or writes anything there until the train it
    starts, which shares it, ends: a run another process trains is left alone."""
    held: list[RunLock] = []
    try:
        return _train_holding(run, out, secret, held)
    except RunInUse as exc:
        return f"FAILED: {exc}", 0.0
    except OSError as exc:  # the lock file cannot be opened (a link, a FIFO, no permission)
        return f"FAILED: cannot lock {out / run.dir} ({exc.strerror or exc})", 0.0
    finally:
        for lock in held:
            release(lock)


def _train_holding(run: Run, out: Path, secret: bytes, held: list[RunLock]) -> tuple[str, float]:
    t0 = time.time()
    # checked again here: a run may start hours after check_run_dirs looked
    refuse_links(out, run)
    run_dir = out / run.dir
    if (run_dir / "summary.json").exists():
        return "skipped (finished before)", 0.0
    if (run_dir / LOCK_NAME).is_file():  # a train ran there: is one still running?
        held.append(acquire(run_dir))
    base = [sys.executable, "-m", "autok.cli", "train", "--no-progress"]
    if has_checkpoint(run_dir, _workers(run)):
        held += [] if held else [acquire(run_dir)]
        cmd, how = [*base, "--resume", str(run_dir)], "resumed"
        if run.settings.get("task") is not None:  # the grid names the code, never the run dir
            cmd += ["--task", str(run.settings["task"])]
    else:
        start_over(run_dir, run.dir, secret)  # started, but no checkpoint yet: start it again
        held += [] if held else [acquire(run_dir)]  # its directory is autok's now
        _write_text(run_dir / "run.yaml", yaml.safe_dump(run.settings))
        cmd = [
            *base,
            "--config",
            str(run_dir / "run.yaml"),
            "--checkpoint-every",
            "1",
            "--out",
            str(run_dir),
        ]
        how = "done"
    _write_text(
        run_dir / "experiment.json",
        json.dumps(
            {
                "label": run.label,
                "seed": run.seed,
                "order": run.order,
                "stage": run.stage,
                "settings": run.settings,
            },
            indent=2,
        ),
    )
    # console.log: all the run printed, errors included (train.log is the run's own log)
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    with os.fdopen(os.open(run_dir / "console.log", append, 0o644), "a") as log:
        returncode = start_logged(cmd, log, lock_fd=held[0].fd).wait()
    if returncode != 0:
        lines = (run_dir / "console.log").read_text().strip().splitlines()
        return failure(lines, returncode), time.time() - t0
    return how, time.time() - t0


# How `autok train` ends a run that diverged: trainer/engine/divergence.py's Diverged, named by the
# CLI's one error line (autok/cli.py, error_line); a result, not a failure (docs/design.md §7).
DIVERGED = re.compile(r"autok: training failed: (?:[\w.]+\.)?Diverged: (.+)")
TAIL_LINES = 20  # a log's last lines searched for that line (shutdown warnings may follow it)


def failure(lines: list[str], returncode: int) -> str:
    """What a run that exited non-zero was: "diverged: WHY" when its training diverged (a
    result of the grid, such as beta = 0.9's, which `autok report` lists with its reason), else
    "FAILED: its last line" (a crash or a refusal)."""
    said = [ln for ln in lines[-TAIL_LINES:] if ln.startswith("autok: ")]
    if said and (m := DIVERGED.fullmatch(said[-1].strip())):
        return f"diverged: {m.group(1)}"
    return f"FAILED: {lines[-1] if lines else returncode}"


# What a run directory of an experiment holds when autok wrote it: `autok train`'s files, the
# experiment's own (run.yaml, experiment.json, console.log) and their temporary names.
OWN_FILES = {
    "config.json",
    "epochs.csv",
    "boundaries.jsonl",
    "summary.json",
    "model.pt",
    "k_lr.png",
    "run.yaml",
    "experiment.json",
    "train.log",
    "console.log",
    LOCK_NAME,
}
OWN_TEMP = re.compile(r"\.(config\.json|epochs\.csv|boundaries\.jsonl|summary\.json)\.tmp")
STAGING = re.compile(r"\.staging-epoch-\d{4,9}")
STAGED_FILE = re.compile(r"(rank\d+\.pt|\.rank\d+\.pt\.tmp|manifest\.json)")
# Those names prove nothing (a user's own model.pt has one). What proves that autok made a run
# directory is its marker, written into it before anything else and signed with the secret that
# only this experiment's state in --out holds, for this run: a marker copied from another
# experiment or another run does not pass (docs/design.md §7, Experiment).
STATE = ".autok-experiment.json"
MARKER = ".autok-run.json"
SMALL_FILE = 4096  # the state and a marker are under 500 bytes: a larger one is not autok's


def _read_small(path: Path) -> bytes:
    """A small regular file's bytes, never through a symbolic link (ELOOP), never a FIFO's."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > SMALL_FILE:
            raise ValueError(f"{path} is not a file of at most {SMALL_FILE} bytes")
        return os.read(fd, SMALL_FILE + 1)
    finally:
        os.close(fd)


def _write_text(path: Path, text: str, new: bool = False) -> None:
    """Write `path`, never through a symbolic link (a link there fails with ELOOP); `new`: only
    if nothing is there yet."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if new else os.O_TRUNC)
    with os.fdopen(os.open(path, flags, 0o644), "w", encoding="utf-8") as f:
        f.write(text)


def read_secret(out: Path) -> bytes | None:
    """The secret of the experiment in `out`, or None before its first run. A state file autok
    cannot read as its own is refused: nothing in `out` could be proven autok's."""
    path = out / STATE
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        secret = bytes.fromhex(json.loads(_read_small(path))["secret"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        secret = b""
    if len(secret) != 32:
        raise ConfigError(f"--out: {path} is not autok's experiment state; move it away")
    return secret


def ensure_secret(out: Path) -> bytes:
    """The experiment's secret, made on its first run (written whole, then renamed into place:
    a crash leaves no torn state)."""
    if (secret := read_secret(out)) is not None:
        return secret
    secret = secrets.token_bytes(32)
    tmp = out / f"{STATE}.{secrets.token_hex(4)}.tmp"
    _write_text(tmp, json.dumps({"secret": secret.hex()}), new=True)
    os.replace(tmp, out / STATE)  # replaces a name, never follows one
    return secret


def _mac(secret: bytes, rel: str, run_id: str) -> str:
    return hmac.new(secret, f"{rel}\0{run_id}".encode(), hashlib.sha256).hexdigest()


def is_marked(run_dir: Path, rel: str, secret: bytes | None) -> bool:
    """Whether autok made `run_dir` for this experiment's run `rel` (its directory under --out)."""
    if secret is None:
        return False
    try:
        marker = json.loads(_read_small(run_dir / MARKER))
        mac = _mac(secret, rel, str(marker["id"]))
        return marker["run"] == rel and hmac.compare_digest(str(marker["mac"]), mac)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False


def mark(run_dir: Path, rel: str, secret: bytes) -> None:
    run_id = secrets.token_hex(16)  # the run's own id: two markers never read alike
    marker = {"run": rel, "id": run_id, "mac": _mac(secret, rel, run_id)}
    _write_text(run_dir / MARKER, json.dumps(marker), new=True)


def linked_component(out: Path, rel: str) -> Path | None:
    """The first directory under `out` on the way to run `rel` that is a symbolic link: a write
    or a delete there would land outside --out."""
    p = out
    for part in Path(rel).parts:
        p = p / part
        if p.is_symlink():
            return p
    return None


def refuse_links(out: Path, run: Run) -> None:
    if linked := linked_component(out, run.dir):
        raise ConfigError(
            f"--out: {linked} is a symbolic link; autok never writes or deletes through one "
            "(make it a directory, or choose another --out)"
        )


def _workers(run: Run) -> int:
    return int(run.settings.get("workers", TrainConfig.model_fields["workers"].default))


def has_checkpoint(run_dir: Path, workers: int) -> bool:
    """A checkpoint `--resume` will accept (the same rules: see trainer/loop/checkpoint.py); a run
    with none is started again instead of being refused on every rerun."""
    from autok.trainer.loop.checkpoint import latest_valid

    return latest_valid(run_dir, workers).path is not None


def _plain_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _staged(c: Path) -> bool:
    """A checkpoint the trainer was still staging (no complete one: the run starts over)."""
    if not (STAGING.fullmatch(c.name) and c.is_dir() and not c.is_symlink()):
        return False
    return all(STAGED_FILE.fullmatch(f.name) and _plain_file(f) for f in c.iterdir())


def foreign_files(run_dir: Path, rel: str, secret: bytes | None) -> list[Path]:
    """What in an unstarted run's directory autok cannot prove it wrote (and so must never
    delete): all of it, unless the directory holds this experiment's marker for run `rel`; then
    whatever autok would not have written there (another name, a link)."""
    if not (run_dir.exists() or run_dir.is_symlink()):
        # out/<label> may be a file of the user's, where autok would make a directory
        return [p for p in run_dir.parents if p.exists() and not p.is_dir()][:1]
    if not run_dir.is_dir() or run_dir.is_symlink():
        return [run_dir]
    # the marker last: a refusal names the user's file, not autok's
    entries = sorted(run_dir.iterdir(), key=lambda p: (p.name == MARKER, p.name))
    if not is_marked(run_dir, rel, secret):
        return entries  # an empty directory holds nothing to lose: it is made autok's
    foreign = []
    for p in entries:
        if p.name == "checkpoints" and p.is_dir() and not p.is_symlink():
            foreign += [c for c in sorted(p.iterdir()) if not _staged(c)]
        elif not (
            _plain_file(p)
            and (p.name in OWN_FILES or p.name == MARKER or OWN_TEMP.fullmatch(p.name))
        ):
            foreign.append(p)
    return foreign


def linked_entries(run_dir: Path) -> list[Path]:
    """The symbolic links a resumed run would write or prune through (autok makes none)."""
    if not run_dir.is_dir():
        return []
    top = sorted(run_dir.iterdir())
    ckpt = run_dir / "checkpoints"
    below = sorted(ckpt.iterdir()) if ckpt.is_dir() and not ckpt.is_symlink() else []
    return [p for p in top + below if p.is_symlink()]


def check_run_dirs(runs: list[Run], out: Path) -> None:
    """Before anything starts: no run's directory is reached through a symbolic link, and every
    run that would start over holds only files autok can prove it wrote there."""
    secret = read_secret(out)
    try:
        plan = pilot.read_plan(out) if any(r.from_pilot for r in runs) else {}
    except ValueError as exc:
        raise ConfigError(f"--out: {exc}; choose a new --out (it is kept)") from None
    for run in runs:
        variant = run.label.partition(" ")[2]
        if run.from_pilot and variant in plan:  # as it ran: with the pilot's choice
            group = [r for r in runs if r.label.partition(" ")[2] == variant]
            try:
                run = with_pilot_choice(run, group, plan[variant]["best_fixed"])
            except ValueError as exc:
                raise ConfigError(f"--out: {out / pilot.PLAN}: {exc}; choose a new --out") from None
        refuse_links(out, run)
        run_dir = out / run.dir
        finished = (run_dir / "summary.json").exists()
        if finished or has_checkpoint(run_dir, _workers(run)):
            if not finished and (linked := linked_entries(run_dir)):
                raise ConfigError(
                    f"--out: {linked[0]} is a symbolic link; a resumed run writes there, and "
                    "autok never writes or deletes through one (move it away)"
                )
            # skipped or resumed: nothing is cleared; but a run made with other settings would
            # stand in the report for this one
            was = _recorded(run_dir)
            if was is not None:  # saved before autok refused what it never applied
                was = as_ran(was)[0]
            # a mean K taken from another run is set when the run starts: not compared
            skip = {"random_mean"} if run.mean_k_of else set()
            if was is not None and (key := first_difference(was, run.settings, skip)):
                raise ConfigError(
                    f"--out: {run_dir} holds a run made with {key} {was.get(key)!r}, this "
                    f"experiment gives {run.settings.get(key)!r}; choose a new --out (a run "
                    "there is kept, never redone)"
                )
            if was is not None and (why := started_elsewhere(run_dir, run)):
                raise ConfigError(why)
            if why := made_elsewhere(run_dir, finished) or ruled_elsewhere(run_dir, run):
                raise ConfigError(why)
            continue
        if why := unproven(run_dir, run.dir, secret):
            raise ConfigError(why)


def validated(settings: dict[str, Any], mean_of: str | None) -> TrainConfig:
    """A run's settings as `autok train` would read them. A mean K taken from another run
    (`mean_of`) is known only once that run ran: any valid one stands in for it here."""
    return load_config({}, {**settings, "random_mean": 1.0} if mean_of else settings)


def started_elsewhere(run_dir: Path, run: Run) -> str | None:
    """Why a kept run whose run.yaml matches still does not stand for `run` (one line), or None:
    both leave a setting whose default has moved to its default, and what it ran with (its
    config.json) is not what these settings resolve to now: the K it started at (exposed-sync's
    default start moved from 4 to 1: docs/policies.md), the K floor (from 1 to the optimizer's:
    docs/design.md §6, "the floor"; a config.json without one ran with none, 1), the faster-link
    check (from off to 3: docs/design.md §6, "a faster link"; without one it ran off)."""
    if not (run_dir / "config.json").is_file():
        return None
    try:
        config = json.loads(_read_small(run_dir / "config.json"))
        now = validated(run.settings, run.mean_k_of)
        started, floor = config["sync_period"], config.get("k_floor") or 1
        drop = read_drop(config.get("link_drop", RAN_BEFORE["link_drop"]), config)
    except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # nothing to compare: the run.yaml check stands alone
    if "sync_period" not in run.settings and started != now.sync_period:
        return (
            f"--out: {run_dir} holds a run that started at K = {started}, these settings now "
            f"start at K = {now.sync_period} (the default changed); choose a new --out (a run "
            "there is kept, never redone)"
        )
    if "k_floor" not in run.settings and floor != (now.k_floor or 1):
        return (
            f"--out: {run_dir} holds a run with K's floor at {floor}, these settings now keep "
            f"it at {now.k_floor} (the default follows the optimizer now); choose a new --out "
            "(a run there is kept, never redone)"
        )
    now_drop = read_drop(now.link_drop, {"link_shift": now.link_shift})
    if "link_drop" not in run.settings and reads(now.policy, "link_drop") and drop != now_drop:
        shown = f"{drop:g}" if isinstance(drop, int | float) else repr(drop)
        return (
            f"--out: {run_dir} holds a run that read a faster link at {shown}, these settings "
            f"now at {now_drop:g} (--link-drop's default changed); choose a new --out (a run "
            "there is kept, never redone)"
        )
    return None


def made_elsewhere(run_dir: Path, finished: bool) -> str | None:
    """Why a kept run does not stand for one made here, finished or to be resumed (one line
    naming --out), or None: the `environment` its summary.json (finished) or config.json (to be
    resumed) records is not this one, or it records none. On the virtual clock a run is a
    function of its seed and settings on one installation only (trainer/loop/environment.py)."""
    try:
        name = "summary.json" if finished else "config.json"
        recorded = json.loads(_read_small(run_dir / name)).get("environment")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if (why := difference(recorded, environment())) is None:
        return None
    return (
        f"--out: {run_dir} holds a run made with {why}; a run's numbers depend on them, so "
        "choose a new --out (a run there is kept, never redone)"
    )


def ruled_elsewhere(run_dir: Path, run: Run) -> str | None:
    """Why a kept run does not stand for one made here (one line naming --out), or None: its
    config.json records another revision of its K policy's rule, or none where the policy's has
    moved since runs began to record it (docs/design.md §6, "the rule's revision"): the same
    settings and seed may give another K path."""
    try:
        policy = validated(run.settings, run.mean_k_of).policy
    except (ConfigError, ValueError, TypeError):
        return None  # the run.yaml check and the settings' own refusal stand alone
    try:
        recorded = json.loads(_read_small(run_dir / "config.json")).get("policy_revision")
    except (OSError, ValueError, AttributeError, RecursionError):
        if revision_problem(policy, None) is None:
            return None  # whatever it recorded, this policy's rule has not moved
        return (
            f"--out: {run_dir} holds a run whose config.json cannot be read, so which revision "
            f"of {policy}'s rule made it is unknown; choose a new --out (a run there is kept, "
            "never redone)"
        )
    if (why := revision_problem(policy, recorded)) is None:
        return None
    return (
        f"--out: {run_dir} holds a run made by {why}; the same settings may take another K "
        "path now, so choose a new --out (a run there is kept, never redone)"
    )


def _recorded(run_dir: Path) -> dict[str, Any] | None:
    """The settings a run was started with (its run.yaml), or None if it has none readable."""
    if not (run_dir / "run.yaml").exists():
        return None
    try:  # bounded as every YAML autok reads (size, aliases; a FIFO is no regular file)
        was = read_yaml(run_dir / "run.yaml", "--out")
    except ConfigError:
        return None
    return was if isinstance(was, dict) else None


def unproven(run_dir: Path, rel: str, secret: bytes | None) -> str | None:
    """Why an unstarted run may not clear its directory (one line naming --out and the first
    file), or None."""
    if not (foreign := foreign_files(run_dir, rel, secret)):
        return None
    if foreign[0] == run_dir or not run_dir.is_dir() or is_marked(run_dir, rel, secret):
        return (
            f"--out: {foreign[0]} was not written by autok; a run that starts over clears its "
            "directory, so move it away (autok never deletes what it did not write)"
        )
    return (
        f"--out: {foreign[0]}: autok cannot prove it wrote this (its run directory has no "
        f"{MARKER} of this experiment); a run that starts over clears its directory, so move "
        "it away"
    )


def clear_unstarted(run_dir: Path, rel: str, secret: bytes | None) -> None:
    """Remove what an unstarted run left (the files autok wrote in the directory it made; the
    logs keep their history, the marker its proof). Anything else stops the run: it is
    refused, never deleted."""
    if why := unproven(run_dir, rel, secret):
        raise ConfigError(why)
    if not run_dir.exists():
        return
    for p in run_dir.iterdir():
        if p.name == "checkpoints":
            for staged in p.iterdir():
                shutil.rmtree(staged)
            p.rmdir()
        elif p.name not in ("train.log", "console.log", MARKER, LOCK_NAME):  # the lock is held
            p.unlink()


def start_over(run_dir: Path, rel: str, secret: bytes) -> None:
    """Ready a run that starts (again): what autok wrote before is cleared, and a directory
    made now (or found empty) gets its marker before anything else is written into it."""
    clear_unstarted(run_dir, rel, secret)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not is_marked(run_dir, rel, secret):
        mark(run_dir, rel, secret)


@dataclass
class Tally:
    """How the runs of a grid ended. A diverged run is a result, not a failure: only `failed`
    (crashes, refusals) makes `autok experiment run` exit non-zero, so `run && report` works
    on a grid whose divergence is part of what it shows."""

    finished: int = 0
    diverged: int = 0
    failed: int = 0


class Progress:
    """The `[i/N] LABEL seed S: ...` line of each run as it ends. Runs end on the pool's threads
    (`--jobs`), so a run's number is taken and its line written under one lock, in one write:
    two runs ending together never show one number, and never share a line (print writes the
    text and its newline apart)."""

    def __init__(self, total: int, tally: Tally, stream: TextIO | None = None) -> None:
        self.total, self.tally, self.done = total, tally, 0
        self._stream = stream  # None: sys.stdout as it is when a line is written
        self._lock = threading.Lock()

    def ended(self, run: Run, how: str, more: str = "") -> None:
        """`how`: what happened ("done", "diverged ...", "FAILED: why"); `more`, what follows."""
        with self._lock:
            self.done += 1
            self.tally.failed += how.startswith("FAILED")
            self.tally.diverged += how.startswith("diverged")
            self.tally.finished += not how.startswith(("FAILED", "diverged"))
            stream = sys.stdout if self._stream is None else self._stream
            stream.write(f"[{self.done}/{self.total}] {run.label} seed {run.seed}: {how}{more}\n")
            stream.flush()


def run_experiment(
    runs: list[Run],
    out: Path,
    jobs: int = 1,
    plan_spec: pilot.PilotSpec | None = None,
    predictions: dict[str, Any] | None = None,
) -> Tally:
    """Run the grid, `jobs` runs at a time; how its runs ended."""
    predictions = predictions or {}
    out.mkdir(parents=True, exist_ok=True)
    secret = ensure_secret(out)  # before any run: it signs the markers of the dirs autok makes
    tally = Tally()
    progress = Progress(len(runs), tally)

    def one(run: Run) -> None:
        how, seconds = _train(run, out, secret)
        extra = ""
        summary = out / run.dir / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            name = data.get("metric", {}).get("name", "accuracy")
            best = data.get("peak_test_metric", data.get("peak_test_accuracy"))
            best = math.nan if best is None else best  # null: no value (strict JSON)
            extra = f", best {name} {best:.4f}"
        progress.ended(run, how, f" ({seconds:.0f} s{extra})")

    def follower(run: Run) -> None:
        try:
            run = with_matched_mean(run, out)
        except (OSError, ValueError) as exc:
            progress.ended(run, f"FAILED: {exc}")
            return
        one(run)

    def main_run(run: Run, group: list[Run], entry: dict[str, Any] | str) -> None:
        if not run.from_pilot:
            one(run)
            return
        try:
            if isinstance(entry, str):  # the pilot could not choose: why
                raise ValueError(entry)
            chosen = with_pilot_choice(run, group, entry["best_fixed"])
        except ValueError as exc:
            progress.ended(run, f"FAILED: {exc}")
            return
        one(chosen)

    # One setting of the varied values (a regime) at a time, so an interrupted experiment leaves
    # whole comparisons behind. Within it: the pilot's runs, then its plan (autok/pilot.py),
    # then the main seeds, and last a run whose mean K comes from another run.
    regimes: dict[str, list[Run]] = {}
    for r in runs:
        regimes.setdefault(r.label.partition(" ")[2], []).append(r)
    for variant, group in regimes.items():
        first = [r for r in group if r.stage == "pilot"]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, first))
        entry = (
            make_plan(out, variant, first, plan_spec, predictions)
            if first
            else "the pilot ran nothing in this regime"
        )
        mains = [r for r in group if r.stage == "main" and r.mean_k_of is None]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(partial(main_run, group=group, entry=entry), mains))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(follower, [r for r in group if r.mean_k_of is not None]))
    return tally


def make_plan(
    out: Path,
    variant: str,
    pilot_runs: list[Run],
    plan_spec: pilot.PilotSpec | None,
    predictions: dict[str, Any],
) -> dict[str, Any] | str:
    """The regime's plan (OUT/plan.json), kept once written; or why it cannot be made."""
    existing = pilot.read_plan(out).get(variant)
    if existing is not None:
        return existing
    if plan_spec is None:
        return "the experiment has no pilot"
    from autok.report import ReportError, read_run

    by_method: dict[str, list] = {}
    for r in pilot_runs:
        if not (out / r.dir / "summary.json").exists():
            return f"the pilot run {r.label!r} seed {r.seed} did not finish"
        try:
            by_method.setdefault(r.label.split(" ", 1)[0], []).append(read_run(out / r.dir))
        except (OSError, ReportError, ValueError) as exc:
            return f"the pilot run {r.label!r} seed {r.seed} cannot be read: {exc}"
    entry = pilot.choose(by_method, plan_spec)
    regime = variant.partition("=")[2]
    if regime in predictions:
        entry["prediction"] = predictions[regime]
    pilot.write_entry(out, variant, entry)
    print(
        f"autok: {variant or 'the experiment'}: target {entry['target']:.4f} "
        f"({entry['metric']}), best fixed K on the pilot: {entry['best_fixed']} "
        f"(written to {out / pilot.PLAN})",
        flush=True,
    )
    return entry


def with_pilot_choice(run: Run, group: list[Run], best: str) -> Run:
    """`run` (sync_period: pilot) with the settings of the regime's best pilot run, and over
    them the settings the run's own entry gives (a pilot run giving one otherwise is refused
    up front: `pilot.problem`), so that none of them is dropped unsaid."""
    suffix = run.label.partition(" ")[2]
    label = f"{best} {suffix}" if suffix else best
    source = next((r for r in group if r.stage == "pilot" and r.label == label), None)
    if source is None:  # plan.json names a run this experiment's pilot does not have
        raise ValueError(f"{pilot.PLAN} names {label!r}, which is not a run of this pilot")
    own = {k: run.settings[k] for k in run.given}
    return Run(run.label, run.seed, {**source.settings, **own, "seed": run.seed}, run.order)
