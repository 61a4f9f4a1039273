"""`autok experiment run NAME`: a named grid of complete runs (experiments/NAME.yaml) x seeds.

Each run is an `autok train` in DIR/<label>/seed-<s>/, tagged with experiment.json for
`autok report`. Finished runs (summary.json) are skipped; an interrupted one resumes from its
last checkpoint (every run checkpoints each epoch), so re-running the command continues.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autok.config import ConfigError, load_config
from autok.procs import start_logged

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@dataclass(frozen=True)
class Run:
    label: str  # the method and its varied settings, e.g. "cpdp-k4 lr=0.4"
    seed: int
    settings: dict[str, Any]

    @property
    def dir(self) -> str:
        return f"{re.sub(r'[^A-Za-z0-9.=_-]+', '_', self.label)}/seed-{self.seed}"


def available() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def load_experiment(name: str) -> dict[str, Any]:
    path = Path(name) if name.endswith(".yaml") else EXPERIMENTS / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"experiment {name!r} not found; choose from {available()} or give a .yaml path"
        )
    return yaml.safe_load(path.read_text())


def expand(
    exp: dict[str, Any],
    form: str,
    seeds: list[int] | None = None,
    extra: dict[str, Any] | None = None,
) -> list[Run]:
    """Every run of the grid: runs x the form's `vary` product x seeds; validated up front.
    A setting a run fixes itself is not varied for it (DDP in the K sweep: `sync_period: 1`)."""
    spec = exp[form]
    vary = spec.get("vary", {})
    out = []
    for run in exp["runs"]:
        keys = [k for k in vary if k not in run]
        for combo in itertools.product(*(vary[k] for k in keys)):
            chosen = dict(zip(keys, combo, strict=True))
            settings = {
                **spec.get("base", {}),
                **{k: v for k, v in run.items() if k != "name"},
                **chosen,
                **(extra or {}),
            }
            if scale := spec.get("scale_lr"):  # linear scaling with the global batch
                settings["lr"] = scale["base_lr"] * settings["workers"] / scale["base_workers"]
            label = run["name"] + "".join(f" {k}={v}" for k, v in chosen.items())
            for seed in seeds or exp.get("seeds", [42]):
                s = {**settings, "seed": seed}
                try:
                    load_config({}, s)
                except ConfigError as exc:
                    raise ConfigError(f"experiment {exp['name']}, run {label!r}: {exc}") from None
                out.append(Run(label, seed, s))
    return out


def _train(run: Run, run_dir: Path) -> tuple[str, float]:
    """One run to completion; returns (what happened, seconds)."""
    t0 = time.time()
    if (run_dir / "summary.json").exists():
        return "skipped (finished before)", 0.0
    base = [sys.executable, "-m", "autok.cli", "train", "--no-progress"]
    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("epoch-*")):
        cmd, how = [*base, "--resume", str(run_dir)], "resumed"
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # started, but no checkpoint yet: start it again
        run_dir.mkdir(parents=True)
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
        json.dumps({"label": run.label, "seed": run.seed, "settings": run.settings}, indent=2)
    )
    with open(run_dir / "train.log", "a") as log:
        returncode = start_logged(cmd, log).wait()
    if returncode != 0:
        lines = (run_dir / "train.log").read_text().strip().splitlines()
        return f"FAILED: {lines[-1] if lines else returncode}", time.time() - t0
    return how, time.time() - t0


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
            extra = f", peak accuracy {json.loads(summary.read_text())['peak_test_accuracy']:.4f}"
        print(
            f"[{done}/{total}] {run.label} seed {run.seed}: {how} ({seconds:.0f} s{extra})",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, runs))
    return failed
