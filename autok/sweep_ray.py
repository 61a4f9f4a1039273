"""`autok sweep --backend ray`: Ray Tune over the same space and trials as the Optuna backend.

A Tuner with OptunaSearch (define-by-run over the space file) and an ASHA scheduler on per-epoch
test metric (accuracy, or the task's own); each trial reserves as many CPUs as it has workers
and runs the multi-worker training as a subprocess, exactly like an Optuna trial. Works on a
local Ray, against a cluster (`--address auto` or `ray://HOST:PORT`), and as a Ray job
(`ray job submit -- autok sweep ...`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from autok.config import ConfigError
from autok.space import Dim, check_settings, suggest_all, trial_settings
from autok.sweep import (
    SweepOptions,
    directions,
    first_line,
    objective_values,
    redact,
    redact_url,
    write_outputs,
)
from autok.trials import COMPLETE, FAIL, PRUNED, run_trial


class DefineSpace:
    """Optuna define-by-run over the space; a class, since Ray pickles its searcher."""

    def __init__(self, space: list[Dim], fixed: dict[str, Any]) -> None:
        self.space, self.fixed = space, fixed

    def __call__(self, trial) -> None:
        suggest_all(self.space, trial, self.fixed)


def _trainable(config: dict[str, Any], fixed: dict[str, Any], out: str, opts: SweepOptions) -> None:
    from ray import tune

    trial_id = tune.get_context().get_trial_id()
    run_dir = Path(out) / "trials" / f"ray-{trial_id}"
    if why := check_settings(fixed, config):
        raise ValueError(f"invalid settings: {why}")
    t0, peak = time.time(), math.nan
    better = max if opts.higher_is_better else min

    def report(epoch: int, value: float) -> bool:
        nonlocal peak
        peak = value if math.isnan(peak) else better(peak, value)
        tune.report(
            {
                "test_metric": value,
                "peak_test_metric": peak,
                "epoch": epoch,
                "wall_seconds": time.time() - t0,
                "run_dir": str(run_dir),
            }
        )
        return False  # ASHA stops the trial itself; the subprocess dies with this process

    workdir = opts.workdir if opts.workdir and os.path.isdir(opts.workdir) else None
    res = run_trial(
        trial_settings(fixed, config),
        run_dir,
        report,
        opts.target,
        higher_is_better=opts.higher_is_better,
        workdir=workdir,
    )
    if res.state == FAIL:
        raise RuntimeError(res.reason)
    values = objective_values(opts, res)
    final = {
        "test_metric": res.peak_test_metric,
        "peak_test_metric": res.peak_test_metric,
        "wall_seconds": res.wall_seconds,
        "epoch": res.epochs,
        "objective": values[0],
        "time_to_target": res.time_to_target,
        "total_seconds": res.total_seconds,
        "run_dir": str(run_dir),
        "completed": True,
    }
    # Ray's loggers warn on inf: a target never reached is reported as missing.
    tune.report({k: v for k, v in final.items() if not (isinstance(v, float) and math.isinf(v))})


def node_cpus(ray: Any) -> tuple[float, float]:
    """(the CPUs of the largest live node, the CPUs of the whole cluster)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    largest = max((float(n.get("Resources", {}).get("CPU", 0)) for n in nodes), default=0.0)
    return largest, float(ray.cluster_resources().get("CPU", 0))


def trial_workers(fixed: dict[str, Any]) -> int:
    from autok.config import TrainConfig

    return int(fixed.get("workers", TrainConfig.model_fields["workers"].default))


def check_ray(opts: SweepOptions, fixed: dict[str, Any]) -> None:
    """Without --address the sweep starts a local Ray with this machine's CPUs: a trial that
    cannot fit is refused before Ray starts (the CLI calls this before --out is created). With
    a HOST:PORT --address, something must answer there (check_address)."""
    if opts.backend == "ray" and not opts.address:
        check_trial_fits(trial_workers(fixed), os.cpu_count() or 1, "this machine")
    elif opts.backend == "ray" and opts.address:
        check_address(opts.address)


ADDRESS_TIMEOUT = 5.0  # seconds to wait for a TCP connection to --address


def check_address(address: str) -> None:
    """A HOST:PORT address (`ray://HOST:PORT`, or a cluster's GCS `HOST:PORT`) must accept a TCP
    connection: where nothing answers, `ray.init` retries for minutes, printing Ray's own
    warnings, before it fails. `auto`, `local` and addresses without a port are left to Ray.
    The message names the host and port only, never a password in the address."""
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else "//" + address)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number: Ray refuses it with its own message
        return
    if not host or port is None:
        return
    try:
        socket.create_connection((host, port), timeout=ADDRESS_TIMEOUT).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__  # e.g. "Connection refused", "timed out"
        raise ConfigError(
            f"--address: nothing answers at {host}:{port} ({why}); start the cluster "
            "(`ray start --head`) or give its address"
        ) from None


def check_trial_fits(workers: int, cpus: float, where: str) -> None:
    """A trial reserves `workers` CPUs as one bundle, so on one node (its workers are local
    processes there): where no node has that many it is never scheduled, and Tune would wait for
    it forever. `where` names the node, e.g. "this machine". ConfigError naming --workers."""
    if workers <= cpus:
        return
    hint = f"give --workers {int(cpus)} or fewer, or " if cpus >= 1 else ""
    raise ConfigError(
        f"--workers: each trial reserves {workers} CPUs on one node (one per worker) and "
        f"{where} has {cpus:g}; {hint}give Ray more CPUs per node"
    )


def sweep_ray(opts: SweepOptions, fixed: dict[str, Any], space: list[Dim]) -> list[dict]:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from autok.config import TrainConfig

    workers = trial_workers(fixed)
    epochs = int(fixed.get("epochs", TrainConfig.model_fields["epochs"].default))
    started = False
    if not ray.is_initialized():
        if not opts.address:
            # Ray starts its workers at nice 15: beside any other load on the machine (a build,
            # a second job) the trials would starve. A trial is the work: normal priority.
            os.environ.setdefault("RAY_worker_niceness", "0")
        try:
            ray.init(
                # "local": a new Ray of this machine's CPUs, as --address's help says; never a
                # cluster that `ray start` left running here (nor a stale record of one)
                address=opts.address or "local",
                include_dashboard=False,
                log_to_driver=False,
                num_cpus=None if opts.address else os.cpu_count(),
            )
        except Exception as exc:
            if not opts.address:
                raise
            # an address may carry credentials (ray://user:pw@host): never echoed
            why = redact(first_line(exc), opts.address)
            raise ConfigError(f"--address: {redact_url(opts.address)}: {why}") from None
        started = True
    # Before anything is submitted or written: the cluster as it is now must fit one trial.
    largest, total = node_cpus(ray)
    try:
        where = "the Ray cluster's largest node" if total > largest else "the Ray cluster"
        check_trial_fits(workers, largest, where)
    except ConfigError:
        if started:
            ray.shutdown()
        raise

    modes = [d[:3] for d in directions(opts)]  # maximize -> max, minimize -> min
    if opts.objective == "pareto":
        metric, mode = ["peak_test_metric", "wall_seconds"], modes
    elif opts.objective == "metric":
        metric, mode = "peak_test_metric", modes[0]
    else:
        metric, mode = "time_to_target", "min"
    search = OptunaSearch(
        DefineSpace(space, fixed),
        metric=metric,
        mode=mode,
        seed=opts.seed,
        points_to_evaluate=list(opts.enqueue) or None,
    )
    scheduler = ASHAScheduler(
        metric="test_metric",
        mode="max" if opts.higher_is_better else "min",
        time_attr="epoch",
        max_t=epochs,
        grace_period=1,
        reduction_factor=2,
    )
    out = opts.out.resolve()
    trainable = tune.with_resources(
        tune.with_parameters(
            _trainable,
            fixed=fixed,
            out=str(out),
            # what a trial needs, without the storage URL (it may hold a password)
            opts=dataclasses.replace(opts, storage=None, enqueue=()),
        ),
        {"cpu": workers},
    )
    storage = str(out / "ray")
    # never Tuner.restore: it unpickles what it finds there (the CLI refuses --resume with Ray)
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=search,
            scheduler=scheduler,
            num_samples=opts.trials,
            max_concurrent_trials=opts.jobs,
        ),
        run_config=tune.RunConfig(storage_path=storage, name=opts.study_name, verbose=0),
    )
    grid = tuner.fit()
    rows = []
    for i, result in enumerate(grid):
        m = result.metrics or {}
        if result.error is not None:
            state, reason = FAIL, str(result.error).strip().splitlines()[-1][:300]
        elif m.get("completed"):
            state, reason = COMPLETE, ""
        else:
            state, reason = PRUNED, f"stopped by ASHA after epoch {m.get('epoch')}"
        rows.append(
            {
                "number": i,
                "state": state,
                **{d.name: (result.config or {}).get(d.name) for d in space},
                "peak_test_metric": m.get("peak_test_metric"),
                "wall_seconds": m.get("wall_seconds") if state == COMPLETE else None,
                "time_to_target": m.get("time_to_target"),
                "total_seconds": m.get("total_seconds"),
                "run_dir": m.get("run_dir", ""),
                "reason": reason,
            }
        )
    write_outputs(opts, fixed, space, rows)
    return rows
