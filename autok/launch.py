"""Start the workers: spawn `--workers` local processes, or join the world under torchrun."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging
import os
import signal
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autok.config import SyncSettings, TrainConfig
from autok.procs import die_with_parent, start_worker_server, under_torchrun, worker_start_method
from autok.trainer.loop.data import DATA_SEED, prepare_mnist1d, prepare_mnist1d_test


def usable_cpus() -> int:
    """The cores this process may run on: taskset, cgroup cpusets and Slurm narrow them, and
    os.cpu_count() does not see that."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_backend(cfg: TrainConfig) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def prepare_data(cfg: TrainConfig) -> None:
    """Work done once before the workers start, so N processes do not repeat it."""
    if cfg.task is None and cfg.dataset == "mnist1d":
        prepare_mnist1d(cfg.mnist1d_samples, DATA_SEED)
        prepare_mnist1d_test(cfg.mnist1d_test_samples)


def worker(
    rank: int,
    world_size: int,
    cfg_json: str,
    out_dir: str | None,
    local_rank: int,
    observers=None,
    resume: bool = False,
    init_method: str | None = None,
) -> dict | None:
    from autok.trainer.loop.run import Trainer, print_summary
    from autok.trainer.loop.runlog import LOGGER, close_run_logger

    cfg = TrainConfig.model_validate_json(cfg_json)
    backend = pick_backend(cfg)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        # Share the cores among the local ranks instead of each grabbing all of them.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        torch.set_num_threads(max(1, usable_cpus() // local))
    if not dist.is_initialized():
        timeout = timedelta(seconds=cfg.collective_timeout)
        store = None
        if under_torchrun():
            # torchrun's store outlives a restart of the workers; fresh keys per attempt keep a
            # restarted group from reading the dead workers' addresses.
            base, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            store = dist.PrefixStore(f"autok/attempt-{attempt}", base)
        dist.init_process_group(
            backend,
            init_method=init_method if store is None else None,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
    observers = list(observers or [])
    exporter = start_exporter(cfg, rank, out_dir)
    if exporter is not None:
        observers.append(exporter)
    trainer = None
    try:
        trainer = Trainer(
            cfg,
            rank,
            world_size,
            Path(out_dir) if out_dir else None,
            device,
            observers,
            resume=resume,
        )
        summary = trainer.run()
        if summary is None:  # --stop-after-epochs
            if rank == 0:
                logging.getLogger(LOGGER).info(
                    f"autok: stopped after {cfg.stop_after_epochs} epochs with a checkpoint;"
                    f" continue with: autok train --resume {out_dir}"
                    + (f" --task {cfg.task}" if cfg.task else "")  # a resume names its code
                )
            return None
        trainer.finish()
        if rank == 0:
            print_summary(summary)  # --no-progress hides the bar only
        return summary
    finally:
        if exporter is not None:
            exporter.close()
        # Free DDP's reducer (which holds the process group) and any collective work before the
        # group goes, so gloo's threads are joined now, not during interpreter shutdown, where
        # they cannot take the GIL and abort the process (seen once: SIGABRT after the summary
        # was written; pytorch/pytorch#179291 describes the mechanism).
        trainer = None
        close_run_logger()
        gc.collect()
        dist.destroy_process_group()


def start_exporter(cfg: SyncSettings, rank: int, out_dir: str | None):
    """Rank 0 serves the cluster's metrics on --metrics-port; with --metrics-per-rank every rank
    also serves its own times (rank r on PORT+r), bound to --metrics-host. Up before the first
    step; prints the address really bound."""
    if cfg.metrics_port == 0 or (rank > 0 and not cfg.metrics_per_rank):
        return None
    from autok.metrics import MetricsExporter
    from autok.metrics_http import url_host

    exporter = MetricsExporter(
        cfg.metrics_port + rank,
        run_id=Path(out_dir).name if out_dir else "run",
        strategy=cfg.strategy,
        policy=cfg.policy,
        link=cfg.link_profile,
        rank=rank,
        cluster=rank == 0,
        per_rank=cfg.metrics_per_rank,
        host=cfg.metrics_host,
        target_sync_share=cfg.target_sync_share,
    )
    if getattr(cfg, "progress", True):  # autok.Sync has no progress bar to silence
        where = f"http://{url_host(exporter.host)}:{exporter.port}/metrics"
        if exporter.host in ("0.0.0.0", "::"):
            where += " (all interfaces)"
        print(f"autok: rank {rank} metrics at {where}", flush=True)
    return exporter


def _spawned(
    rank: int, world_size: int, cfg_json: str, out_dir: str | None, store: str, resume: bool
) -> None:
    die_with_parent()  # a killed launcher (Ctrl-C, a sweep's kill) takes its workers along
    # Ctrl-C reaches the whole process group, but only the launcher decides: it stops every
    # worker (join_all) and exits 130. A worker's own KeyboardInterrupt would be swallowed by
    # torch's spawn wrapper as exit 0, and the launcher would take an interrupted run for a
    # finished one; stopped by the launcher instead, a worker dies as a killed one does, which
    # the checkpoint protocol survives (docs/design.md §7, checkpoints/: temp names, renames).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    worker(
        rank,
        world_size,
        cfg_json,
        out_dir,
        local_rank=rank,
        resume=resume,
        init_method=f"file://{store}",
    )


def store_file() -> str:
    """A fresh rendezvous file for one local launch. A file store needs no port, so nothing can
    take it between choosing and binding (free_port's race)."""
    fd, path = tempfile.mkstemp(prefix="autok-rdzv-")
    os.close(fd)
    os.unlink(path)  # FileStore creates it; it must not exist from an earlier launch
    return path


class _Launcher:
    """What a spawned worker takes from the launcher when it starts, and a forked one would take
    from the worker server instead: the environment and stdout/stderr as they are now (the
    server's are those of when it started, maybe a test or an earlier launch ago). The working
    directory and sys.path travel already (multiprocessing's preparation data)."""

    def __init__(self) -> None:
        self.env = dict(os.environ)

    def __reduce__(self):
        from multiprocessing.reduction import DupFd  # only while a worker is being started

        fds = [DupFd(fd) if _is_open(fd) else None for fd in (1, 2)]
        return (_Inherited, (self.env, *fds))


class _Inherited:
    def __init__(self, env: dict[str, str], stdout, stderr) -> None:
        self.env, self.stdio = env, ((stdout, 1), (stderr, 2))

    def apply(self) -> None:
        os.environ.clear()
        os.environ.update(self.env)
        for dup, target in self.stdio:
            if dup is not None and (fd := dup.detach()) != target:
                os.dup2(fd, target)
                os.close(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _forked(rank: int, inherited: _Inherited, fn, *args) -> None:
    inherited.apply()
    fn(rank, *args)


def start_workers(fn, args: tuple, nprocs: int):
    """fn(rank, *args) on `nprocs` new processes (torch's ProcessContext, not joined). Where the
    platform has a fork server, they are forked from it: it imported torch and the workers'
    modules once (autok/procs.py, WORKER_MODULES), so a worker starts in a fraction of a second
    where a fresh interpreter took seconds, N times over on a few cores. The server only
    imported: it ran no torch op and never touched CUDA, so forking it is safe where forking
    the launcher (which may have run torch ops: OpenMP and CUDA are not fork-safe) is not
    (docs/design.md §9, Processes). A forked worker gets the launcher's environment and stdio
    of now (_Launcher), so it sees what a spawned one would."""
    method = worker_start_method()
    if method == "forkserver":
        start_worker_server()  # a no-op where the CLI started it early
        fn, args = _forked, (_Launcher(), fn, *args)
    return mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method=method)


@functools.cache
def freeze_heap_at_exit() -> None:
    """At the launcher's exit, freeze what is alive then (gc.freeze): the interpreter's final
    collections skip the millions of objects torch imported, which they would walk to free
    nothing (most of a second of the command's end, benchmarks/results/startup.md). Exit
    handlers still run and objects still go by reference count; only garbage in cycles at exit
    is not collected, and the launcher's files are closed before then (the workers write the
    run's outputs)."""
    atexit.register(gc.freeze)


def launch(cfg: TrainConfig, out_dir: Path | None, resume: bool = False) -> None:
    cfg_json = cfg.model_dump_json()
    out = str(out_dir) if out_dir else None
    if under_torchrun():  # torchrun restarts failed workers itself (its --max-restarts)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        worker(rank, world, cfg_json, out, int(os.environ.get("LOCAL_RANK", 0)), resume=resume)
        return
    freeze_heap_at_exit()
    prepare_data(cfg)
    restarts = 0
    while True:
        store = store_file()
        ctx = start_workers(_spawned, (cfg.workers, cfg_json, out, store, resume), cfg.workers)
        try:
            join_all(ctx)
            return
        except mp.ProcessExitedException as exc:
            # A worker died without raising (killed, out of memory): restart them all from the
            # last good checkpoint. A worker that raised an error is not retried: it would again.
            if restarts >= cfg.max_restarts or out is None:
                raise
            restarts += 1
            resume = True
            why = str(exc).strip().splitlines()[-1]
            print(
                f"autok: {why}; restarting all workers from the last checkpoint ({restarts} "
                f"of --max-restarts {cfg.max_restarts})",
                flush=True,
            )
        finally:
            _remove(store)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def join_all(ctx) -> None:
    """Wait for every worker; on any error or signal, stop the rest rather than orphan them."""
    try:
        while not ctx.join():
            pass
    except BaseException:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(timeout=10)
        raise


def _run_worker_entry(
    rank: int, world_size: int, store: str, fn, args, result_dir: str, timeout: float = 300
) -> None:
    torch.set_num_threads(max(1, usable_cpus() // world_size))
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )
    try:
        out = fn(rank, world_size, *args)
    finally:
        gc.collect()  # as in worker(): gloo's threads are joined before interpreter shutdown
        dist.destroy_process_group()
    torch.save(out, Path(result_dir) / f"{rank}.pt")


def run_workers(fn, world_size: int, *args, timeout: float = 300) -> list:
    """fn(rank, world_size, *args) on `world_size` new processes (start_workers) joined by gloo
    on localhost; returns the per-rank results. For tests and benchmarks that drive the engine
    directly."""
    with tempfile.TemporaryDirectory() as d:
        store = store_file()
        ctx = start_workers(
            _run_worker_entry, (world_size, store, fn, args, d, timeout), world_size
        )
        try:
            join_all(ctx)
        finally:
            _remove(store)
        return [torch.load(Path(d) / f"{r}.pt", weights_only=False) for r in range(world_size)]
