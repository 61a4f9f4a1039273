"""`autok experiment run NAME`: a named grid of complete runs (experiments/NAME.yaml) x seeds.

Each run is an `autok train` in DIR/<label>/seed-<s>/, tagged with experiment.json for
`autok report`. Finished runs (summary.json) are skipped; an interrupted one resumes from its
last checkpoint (every run checkpoints each epoch), so re-running the command continues.

A `vary` value may be a named bundle of settings ({name: gpt, task: ..., lr: ...}): the label
shows `key=name` and the run gets all of the bundle's settings, so one experiment can span
workloads that differ in several settings at once. A run may take its random policy's mean K
from another run of the same regime and seed (`random_mean: {mean_k_of: exposed-sync}`): it
starts once that run has finished, with the mean K that run's controller used after warmup.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autok.config import (
    NAME_MAX,
    ConfigError,
    TrainConfig,
    check_task,
    first_difference,
    load_config,
    read_yaml,
)
from autok.procs import start_logged
from autok.resources import experiments_dir
from autok.space import as_ran

MAX_RUNS = 10_000  # an experiment's runs (runs x vary x seeds), as --trials caps a sweep


@dataclass(frozen=True)
class Run:
    label: str  # the method and its varied settings, e.g. "cpdp-k4 lr=0.4"
    seed: int
    settings: dict[str, Any]
    order: int = 0  # the run's place in the grid (runs x vary x seeds): the report's row order
    mean_k_of: str | None = None  # the label of the run whose mean K sets random_mean

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


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
    seeds = exp.get("seeds", [42])
    if not isinstance(seeds, list) or not seeds or not all(type(x) is int for x in seeds):
        return "seeds: needs a non-empty list of integers"
    forms = [f for f in ("quick", "full") if f in exp]
    if not forms:
        return "needs a `quick` or `full` form"
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
            and _is_number(scale.get("base_lr"))
            and scale["base_lr"] > 0
            and type(scale.get("base_workers")) is int
            and scale["base_workers"] > 0
        ):
            return f"{form}.scale_lr: needs base_lr > 0 and an integer base_workers > 0"
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
    total = n_seeds * sum(
        math.prod(len(vary[k]) for k in vary if k not in run) for run in exp["runs"]
    )
    if total > MAX_RUNS:
        head = "--seeds: " if seeds and total // n_seeds <= MAX_RUNS else ""
        raise ConfigError(
            f"{head}experiment {exp['name']} ({form}) has {total:,} runs (runs x vary x "
            f"seeds); at most {MAX_RUNS:,}, each a full multi-worker job"
        )
    out = []
    dirs: dict[str, str] = {}
    tasks_checked: set[str] = set()
    for run in exp["runs"]:
        keys = [k for k in vary if k not in run]
        for combo in itertools.product(*(vary[k] for k in keys)):
            chosen = dict(zip(keys, combo, strict=True))
            bundled: dict[str, Any] = {}
            for k, v in chosen.items():
                if isinstance(v, dict):  # a named bundle: its settings, labelled by its name
                    bundled |= {key: val for key, val in v.items() if key != "name"}
                    chosen[k] = v["name"]
                else:
                    bundled[k] = v
            own = {k: v for k, v in run.items() if k != "name"}
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
            for seed in seeds or exp.get("seeds", [42]):
                s = {**settings, "seed": seed}
                try:
                    # a mean taken from another run is known only once it ran: any valid one
                    # stands in for it here
                    cfg = load_config({}, {**s, "random_mean": 1.0} if mean_of else s)
                    if cfg.task is not None and cfg.task not in tasks_checked:
                        check_task(cfg)  # imports and builds it once, before any run starts
                        tasks_checked.add(cfg.task)
                except ConfigError as exc:
                    raise ConfigError(f"experiment {exp['name']}, run {label!r}: {exc}") from None
                run_ = Run(label, seed, s, len(out), mean_of + suffix if mean_of else None)
                if run_.dir in dirs:  # two runs would write (and clear) one directory
                    raise ConfigError(
                        f"experiment {exp['name']}: runs {dirs[run_.dir]!r} and {label!r} "
                        f"(seed {seed}) share the directory {run_.dir}; give them distinct names"
                    )
                dirs[run_.dir] = label
                out.append(run_)
    return out


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
    return Run(run.label, run.seed, {**run.settings, "random_mean": round(mean, 4)}, run.order)


def _train(run: Run, run_dir: Path) -> tuple[str, float]:
    """One run to completion; returns (what happened, seconds)."""
    t0 = time.time()
    if (run_dir / "summary.json").exists():
        return "skipped (finished before)", 0.0
    base = [sys.executable, "-m", "autok.cli", "train", "--no-progress"]
    if has_checkpoint(run_dir, _workers(run)):
        cmd, how = [*base, "--resume", str(run_dir)], "resumed"
    else:
        clear_unstarted(run_dir)  # started, but no checkpoint yet: start it again
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.yaml").write_text(yaml.safe_dump(run.settings))
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
    (run_dir / "experiment.json").write_text(
        json.dumps(
            {"label": run.label, "seed": run.seed, "order": run.order, "settings": run.settings},
            indent=2,
        )
    )
    # console.log: all the run printed, errors included (train.log is the run's own log)
    with open(run_dir / "console.log", "a") as log:
        returncode = start_logged(cmd, log).wait()
    if returncode != 0:
        lines = (run_dir / "console.log").read_text().strip().splitlines()
        return f"FAILED: {lines[-1] if lines else returncode}", time.time() - t0
    return how, time.time() - t0


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
}
OWN_TEMP = re.compile(r"\.(config\.json|epochs\.csv|boundaries\.jsonl|summary\.json)\.tmp")
STAGING = re.compile(r"\.staging-epoch-\d{4,9}")
STAGED_FILE = re.compile(r"(rank\d+\.pt|\.rank\d+\.pt\.tmp|manifest\.json)")


def _workers(run: Run) -> int:
    return int(run.settings.get("workers", TrainConfig.model_fields["workers"].default))


def has_checkpoint(run_dir: Path, workers: int) -> bool:
    """A checkpoint `--resume` will accept (the same rules: see trainer/checkpoint.py); a run
    with none is started again instead of being refused on every rerun."""
    from trainer.checkpoint import latest_valid

    return latest_valid(run_dir, workers).path is not None


def foreign_files(run_dir: Path) -> list[Path]:
    """What in an unstarted run's directory autok did not write (and so must never delete)."""
    if not run_dir.exists():
        # out/<label> may be a file of the user's, where autok would make a directory
        return [p for p in run_dir.parents if p.exists() and not p.is_dir()][:1]
    if not run_dir.is_dir() or run_dir.is_symlink():
        return [run_dir]
    foreign = []
    for p in run_dir.iterdir():
        if p.name == "checkpoints" and p.is_dir() and not p.is_symlink():
            for c in p.iterdir():
                ours = STAGING.fullmatch(c.name) and c.is_dir() and not c.is_symlink()
                if not ours or any(
                    not (STAGED_FILE.fullmatch(f.name) and f.is_file()) for f in c.iterdir()
                ):
                    foreign.append(c)
        elif not (p.is_file() and (p.name in OWN_FILES or OWN_TEMP.fullmatch(p.name))):
            foreign.append(p)
    return foreign


def check_run_dirs(runs: list[Run], out: Path) -> None:
    """Before anything starts: every run that would start over holds only autok's files."""
    for run in runs:
        run_dir = out / run.dir
        if (run_dir / "summary.json").exists() or has_checkpoint(run_dir, _workers(run)):
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
            continue
        if foreign := foreign_files(run_dir):
            raise ConfigError(
                f"--out: {foreign[0]} was not written by autok; a run that starts over clears "
                "its directory, so move it away (autok never deletes what it did not write)"
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


def clear_unstarted(run_dir: Path) -> None:
    """Remove what an unstarted run left (autok's own files only; the logs keep their history).
    Anything else stops the run: it is refused, never deleted."""
    if foreign := foreign_files(run_dir):
        raise ConfigError(f"--out: {foreign[0]} was not written by autok; move it away")
    if not run_dir.exists():
        return
    for p in run_dir.iterdir():
        if p.name == "checkpoints":
            for staged in p.iterdir():
                shutil.rmtree(staged)
            p.rmdir()
        elif p.name not in ("train.log", "console.log"):
            p.unlink()


def run_experiment(runs: list[Run], out: Path, jobs: int = 1) -> int:
    """Run the grid, `jobs` runs at a time; returns the number of failed runs."""
    out.mkdir(parents=True, exist_ok=True)
    total, done, failed = len(runs), 0, 0

    def one(run: Run) -> None:
        nonlocal done, failed
        how, seconds = _train(run, out / run.dir)
        done += 1
        failed += how.startswith("FAILED")
        extra = ""
        summary = out / run.dir / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            name = data.get("metric", {}).get("name", "accuracy")
            best = data.get("peak_test_metric", data.get("peak_test_accuracy"))
            extra = f", best {name} {best:.4f}"
        print(
            f"[{done}/{total}] {run.label} seed {run.seed}: {how} ({seconds:.0f} s{extra})",
            flush=True,
        )

    def follower(run: Run) -> None:
        nonlocal done, failed
        try:
            run = with_matched_mean(run, out)
        except (OSError, ValueError) as exc:
            done += 1
            failed += 1
            print(f"[{done}/{total}] {run.label} seed {run.seed}: FAILED: {exc}", flush=True)
            return
        one(run)

    # One setting of the varied values (a regime) at a time, so an interrupted experiment leaves
    # whole comparisons behind; within it, a run whose mean K comes from another run starts
    # after the others have finished.
    regimes: dict[str, list[Run]] = {}
    for r in runs:
        regimes.setdefault(r.label.partition(" ")[2], []).append(r)
    for group in regimes.values():
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, [r for r in group if r.mean_k_of is None]))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(follower, [r for r in group if r.mean_k_of is not None]))
    return failed
