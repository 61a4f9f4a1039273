"""`autok sweep --backend ray`: Ray Tune over the same space and trials as the Optuna backend.

A Tuner with OptunaSearch (define-by-run over the space file) and an ASHA scheduler on per-epoch
test metric (accuracy, or the task's own); each trial reserves as many CPUs as it has workers
and runs the multi-worker training as a subprocess, exactly like an Optuna trial. Works on a
local Ray, against a cluster (`--address auto` or `ray://HOST:PORT`), and as a Ray job
(`ray job submit -- autok sweep ...`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
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
    TrialLines,
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


# Ray's switch for a Ray of one machine (its default on Windows and macOS): the node's IP is
# loopback, so every server of the node listens on loopback only (docs/design.md §9).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def start_ray(address: str | None) -> bool:
    """Connects to `address`, or without one starts a Ray of this machine's CPUs on loopback
    only, with no dashboard; False when Ray was already up. Otherwise a local Ray's GCS,
    raylet, agents and workers listen on every interface, open to anyone who reaches them."""
    if not address:
        # Ray reads the switch when it is first imported: set before `import ray`.
        os.environ.update(LOOPBACK_ENV)
        # Ray starts its workers at nice 15: beside any other load on the machine (a build,
        # a second job) the trials would starve. A trial is the work: normal priority.
        os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    if ray.is_initialized():
        return False
    try:
        ray.init(
            # "local": a new Ray of this machine's CPUs, as --address's help says; never a
            # cluster that `ray start` left running here (nor a stale record of one)
            address=address or "local",
            include_dashboard=False,
            log_to_driver=False,
            num_cpus=None if address else os.cpu_count(),
        )
    except Exception as exc:
        if not address:
            raise
        # an address may carry credentials (ray://user:pw@host): never echoed
        why = redact(first_line(exc), address)
        raise ConfigError(f"--address: {redact_url(address)}: {why}") from None
    if not address:
        check_loopback(ray)
    return True


def check_loopback(ray: Any) -> None:
    """A caller that imported ray before start_ray set the switch gets a Ray on every
    interface: it is shut down and refused, never run open."""
    node_ip = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(node_ip).is_loopback:
        ray.shutdown()
        raise RuntimeError(
            f"a local Ray listens on {node_ip}, not only on loopback: ray was imported before "
            f"the sweep could set {next(iter(LOOPBACK_ENV))}=0; set it before importing ray"
        )


def say_trials(opts: SweepOptions, fixed: dict[str, Any], space: list[Dim]) -> Any:
    """A Tune callback, run in this (the driver's) process, that says each trial as it ends, as
    the Optuna backend does (autok.sweep.TrialLines). Defined here: importing Ray waits for
    start_ray."""
    from ray.tune import Callback

    class SayTrials(Callback):
        def __init__(self) -> None:
            self.lines: TrialLines | None = None

        def __getstate__(self) -> dict:  # Ray saves its run config: the bar stays here
            return {}

        def __setstate__(self, state: dict) -> None:
            self.lines = None

        def setup(
            self,
            stop: Any = None,
            num_samples: int | None = None,
            total_num_samples: int | None = None,
            **info: Any,
        ) -> None:  # Callback.setup's signature: Tune passes these by name
            self.lines = TrialLines(opts, fixed)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
            m = trial.last_result or {}
            if m.get("completed"):
                self._say(trials, trial, COMPLETE, "")
            else:
                self._say(trials, trial, PRUNED, f"stopped by ASHA after epoch {m.get('epoch')}")

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
            error = trial.get_error()
            self._say(trials, trial, FAIL, str(error).strip().splitlines()[-1] if error else "")

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if self.lines is not None:
                self.lines.close()

        def _say(self, trials: list, trial: Any, state: str, reason: str) -> None:
            if self.lines is None:
                return
            m = trial.last_result or {}
            res = {**m, "reason": reason}
            if state != COMPLETE:
                res["wall_seconds"] = None  # as trials.csv: a stopped trial's time is no result
            params = {d.name: (trial.config or {}).get(d.name) for d in space}
            number = trials.index(trial) if trial in trials else len(trials)
            self.lines.trial_ended(number, state, params, res, float(m.get("time_total_s", 0.0)))

    return SayTrials()


def sweep_ray(opts: SweepOptions, fixed: dict[str, Any], space: list[Dim]) -> list[dict]:
    from autok.config import TrainConfig

    workers = trial_workers(fixed)
    epochs = int(fixed.get("epochs", TrainConfig.model_fields["epochs"].default))
    started = start_ray(opts.address)  # before any import of ray (start_ray says why)
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

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
    metric: str | list[str]
    mode: str | list[str]
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
        run_config=tune.RunConfig(
            storage_path=storage,
            name=opts.study_name,
            verbose=0,
            # the lines keep no storage URL either: Ray pickles its run config into --out
            callbacks=[
                say_trials(dataclasses.replace(opts, storage=None, enqueue=()), fixed, space)
            ],
        ),
    )
    grid = tuner.fit()
    rows = []
    for i in range(len(grid)):  # (ResultGrid is indexed, typed without __iter__)
        result = grid[i]
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
