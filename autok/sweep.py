"""`autok sweep`: a joint search over K, β, LR (and any train flag), each trial a full run.

Optuna embedded (sqlite in the sweep dir, or --storage postgresql://... for several machines)
or Ray Tune on a cluster (OptunaSearch over the same space, ASHA). Outputs in DIR: trials.csv,
pareto.csv, pareto.png, best.yaml, and a printed table.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autok.config import ConfigError, TrainConfig, load_config
from autok.pareto import pareto_front, plot_front
from autok.space import Dim
from autok.trials import COMPLETE, FAIL, PRUNED, TrialResult, run_trial

OBJECTIVES = ("pareto", "accuracy", "time-to-accuracy")


@dataclass(frozen=True)
class SweepOptions:
    backend: str = "optuna"
    trials: int = 10
    jobs: int = 1
    out: Path = Path("sweeps/default")
    resume: bool = False
    storage: str | None = None
    study_name: str = "autok"
    objective: str = "pareto"
    pruner: str = "median"
    target_accuracy: float = 0.9
    seed: int = 0
    address: str | None = None  # ray
    enqueue: tuple[dict, ...] = ()  # settings to evaluate first (warm start)


class TrialFailed(Exception):
    pass


def check_settings(fixed: dict[str, Any], params: dict[str, Any]) -> str | None:
    """Why this combination is not a valid run, or None."""
    try:
        load_config({}, {**fixed, **params, "out": None})
    except ConfigError as exc:
        return str(exc)
    return None


def objective_values(opts: SweepOptions, res: TrialResult) -> list[float]:
    if opts.objective == "pareto":
        return [res.peak_test_accuracy, res.wall_seconds]
    if opts.objective == "accuracy":
        return [res.peak_test_accuracy]
    return [res.time_to_accuracy]


def intermediate(opts: SweepOptions, accuracy: float) -> float:
    """Per-epoch value reported for pruning, in the study's direction: accuracy when maximizing,
    the error 1 - accuracy when minimizing time to accuracy."""
    return accuracy if opts.objective == "accuracy" else 1.0 - accuracy


# ----- Optuna ----------------------------------------------------------------------------------


def _storage(opts: SweepOptions):
    import optuna

    if opts.storage:
        try:
            return optuna.storages.RDBStorage(opts.storage)
        except Exception as exc:  # a bad URL, a missing driver, an unreachable server
            raise ConfigError(f"--storage: {opts.storage}: {exc}") from None
    url = f"sqlite:///{(opts.out / 'study.db').resolve()}"
    # Parallel trials write from several threads: wait for the lock instead of failing fast
    # ("database is locked"), and let SQLite's WAL journal keep readers off the writer.
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs={"connect_args": {"timeout": 120}},
        skip_compatibility_check=False,
    )


def sweep_optuna(opts: SweepOptions, fixed: dict[str, Any], space: list[Dim]) -> list[dict]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = _storage(opts)
    existing = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if opts.study_name in existing and not opts.resume:
        raise ConfigError(
            f"--out: study {opts.study_name!r} exists in {opts.out}; pass --resume "
            "to continue it, or choose a new --out"
        )
    if opts.resume and opts.study_name not in existing:
        raise ConfigError(f"--resume: no study {opts.study_name!r} to continue in {opts.out}")
    directions = {
        "pareto": ["maximize", "minimize"],
        "accuracy": ["maximize"],
        "time-to-accuracy": ["minimize"],
    }[opts.objective]
    pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
    if opts.objective != "pareto":  # Optuna prunes single-objective studies only
        epochs = int(fixed.get("epochs", TrainConfig.model_fields["epochs"].default))
        pruner = (
            optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs)
            if opts.pruner == "hyperband"
            else optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
        )
    study = optuna.create_study(
        storage=storage,
        study_name=opts.study_name,
        directions=directions,
        sampler=optuna.samplers.TPESampler(seed=opts.seed),
        pruner=pruner,
        load_if_exists=opts.resume,
    )
    if not opts.resume:
        study.set_user_attr("fixed", {k: _plain(v) for k, v in fixed.items()})
    for params in opts.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)

    def objective(trial: optuna.Trial) -> list[float] | float:
        params = {d.name: d.suggest(trial) for d in space}
        run_dir = opts.out / "trials" / f"trial-{trial.number:04d}"
        trial.set_user_attr("run_dir", str(run_dir))
        if why := check_settings(fixed, params):
            trial.set_user_attr("reason", f"invalid settings: {why}")
            raise TrialFailed(why)

        def report(epoch: int, acc: float) -> bool:
            if opts.objective == "pareto":
                return False
            trial.report(intermediate(opts, acc), epoch)
            return trial.should_prune()

        res = run_trial({**fixed, **params}, run_dir, report, opts.target_accuracy)
        for key in ("peak_test_accuracy", "wall_seconds", "time_to_accuracy"):
            trial.set_user_attr(key, _plain(getattr(res, key)))
        trial.set_user_attr("reason", res.reason)
        if res.state == PRUNED:
            raise optuna.TrialPruned(res.reason)
        if res.state == FAIL:
            raise TrialFailed(res.reason)
        values = objective_values(opts, res)
        return values if len(values) > 1 else values[0]

    try:
        study.optimize(objective, n_trials=opts.trials, n_jobs=opts.jobs, catch=(TrialFailed,))
    finally:  # also on Ctrl-C: the study so far is on disk, and --resume continues it
        rows = optuna_rows(study, space)
        write_outputs(opts, fixed, space, rows)
    return rows


def _plain(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def optuna_rows(study, space: list[Dim]) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                **{d.name: t.params.get(d.name) for d in space},
                "peak_test_accuracy": attrs.get("peak_test_accuracy"),
                "wall_seconds": attrs.get("wall_seconds"),
                "time_to_accuracy": attrs.get("time_to_accuracy"),
                "run_dir": attrs.get("run_dir", ""),
                "reason": attrs.get("reason", ""),
            }
        )
    return rows


# ----- outputs ---------------------------------------------------------------------------------


def _finished(rows: list[dict]) -> list[dict]:
    return [
        r
        for r in rows
        if r["state"] == COMPLETE
        and r["peak_test_accuracy"] is not None
        and r["wall_seconds"] is not None
    ]


def best_row(opts: SweepOptions, rows: list[dict]) -> dict | None:
    done = _finished(rows)
    if not done:
        return None
    if opts.objective == "time-to-accuracy":
        reached = [r for r in done if r["time_to_accuracy"] is not None]
        if reached:
            return min(reached, key=lambda r: r["time_to_accuracy"])
    # pareto: the most accurate point of the front (ties: the faster); accuracy: the same
    return max(done, key=lambda r: (r["peak_test_accuracy"], -r["wall_seconds"]))


def write_outputs(opts: SweepOptions, fixed: dict, space: list[Dim], rows: list[dict]) -> None:
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    columns = [
        "number",
        "state",
        *[d.name for d in space],
        "peak_test_accuracy",
        "wall_seconds",
        "time_to_accuracy",
        "run_dir",
        "reason",
    ]
    with open(out / "trials.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    done = _finished(rows)
    front = pareto_front([(r["peak_test_accuracy"], r["wall_seconds"]) for r in done])
    with open(out / "pareto.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(done[i] for i in front)
    plot_rows = [
        {**r, "sync_period": r.get("sync_period") or fixed.get("sync_period") or 4} for r in done
    ]
    plot_front(plot_rows, front, out / "pareto.png")
    best = best_row(opts, rows)
    if best is not None:
        config = {k: _plain(v) for k, v in fixed.items() if k != "out"}
        config.update({d.name: best[d.name] for d in space})
        (out / "best.yaml").write_text(
            f"# best trial {best['number']} of {out}: peak test accuracy "
            f"{best['peak_test_accuracy']:.4f}, {best['wall_seconds']:.1f} s\n"
            f"# run it: autok train --config {out / 'best.yaml'}\n"
            + yaml.safe_dump(config, sort_keys=True)
        )


def table(rows: list[dict], space: list[Dim], limit: int = 15) -> str:
    done = sorted(_finished(rows), key=lambda r: -r["peak_test_accuracy"])
    head = ["#", "state", *[d.name for d in space], "peak acc", "wall s"]
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in done[:limit] + [r for r in rows if r["state"] != COMPLETE][:limit]:
        cells = [str(r["number"]), r["state"]]
        for d in space:
            v = r[d.name]
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        acc, wall = r["peak_test_accuracy"], r["wall_seconds"]
        cells += [f"{acc:.4f}" if acc is not None else "-", f"{wall:.1f}" if wall else "-"]
        lines.append("  ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)
