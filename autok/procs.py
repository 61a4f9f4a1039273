"""Process hygiene: children die with their parent, so nothing outlives a killed sweep or job.

Why not `preexec_fn=die_with_parent`: preexec_fn runs Python in the forked child before exec,
which is unsafe when the parent has threads (a sweep with --jobs, an experiment): a lock another
thread held at the fork (the import lock, the loader's lock inside dlopen, malloc's) stays held
forever in the child. Instead the child is `python -m autok.procs PARENT_PID CMD...`: a fresh
process that sets its own parent-death signal and execs CMD, which keeps it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def start_logged(
    cmd: list[str],
    log,
    *,
    new_session: bool = False,
    cwd: str | None = None,
    lock_fd: int | None = None,
) -> subprocess.Popen:
    """A child with stdout and stderr in `log`, no stdin, dying with this process (on Linux;
    elsewhere it just runs). `new_session`: the child gets its own session and process group, so
    a terminal's Ctrl-C reaches only this process, which then decides how the child stops.
    `lock_fd`: a run lock this process holds, shared with the child (autok/runlock.py)."""
    from autok.runlock import LOCK_FD_ENV

    env = None if lock_fd is None else {**os.environ, LOCK_FD_ENV: str(lock_fd)}
    return subprocess.Popen(
        [sys.executable, "-m", "autok.procs", str(os.getpid()), *cmd],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=new_session,
        cwd=cwd,
        env=env,
        pass_fds=() if lock_fd is None else (lock_fd,),
    )


def exec_dying_with(parent: int, cmd: list[str]) -> None:
    """Become `cmd`, asking first for SIGTERM when `parent` dies (the request survives exec)."""
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the request: nobody would send it
        sys.exit(f"autok.procs: parent {parent} is gone; not starting {cmd[0]}")
    os.execvp(cmd[0], cmd)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent dies (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))


if __name__ == "__main__":
    exec_dying_with(int(sys.argv[1]), sys.argv[2:])


def process_started() -> float:
    """When this process started (Unix time), interpreter start-up and imports included: from
    /proc on Linux; elsewhere, now. A command's total time is measured from here."""
    import time

    try:
        with open("/proc/self/stat", "rb") as f:
            # field 22, after the parenthesised name (which may hold spaces): clock ticks since boot
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:  # seconds since boot, to 10 ms (btime: to 1 s)
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def under_torchrun() -> bool:
    """This process is one of torchrun's workers (its environment says so)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def torchrun_restart() -> bool:
    """torchrun is restarting its workers after a failure (--max-restarts)."""
    return under_torchrun() and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


# What the worker server imports once, for every worker it forks (autok/launch.py); the last
# one shortens its exit (autok/forkserver_exit.py).
WORKER_MODULES = (
    "torch",
    "torch.distributed",
    "autok.launch",
    "autok.trainer.loop.run",
    "autok.forkserver_exit",
)


def worker_start_method() -> str:
    """How local workers start: forked from a server that imported torch and the worker's
    modules once (`forkserver`) on Linux, else a fresh interpreter each (`spawn`). macOS has
    a fork server too, but its system libraries may start threads that a fork breaks (why
    Python spawns there by default), and importing torch loads them."""
    import multiprocessing

    linux = sys.platform.startswith("linux")
    return (
        "forkserver"
        if linux and "forkserver" in multiprocessing.get_all_start_methods()
        else "spawn"
    )


def start_worker_server() -> None:
    """Start the worker server now, without waiting for it: its imports (seconds of torch)
    overlap the launcher's own. Torch-free, so the CLI calls it before importing torch. The
    server never runs a torch op or touches CUDA (OpenMP and CUDA are not fork-safe): it only
    imports (docs/design.md §9, Processes). Its one other thread, numpy's OpenBLAS pool, stops
    itself around a fork (its pthread_atfork handler), as for torch's own forked DataLoader
    workers. A server already running is kept."""
    if worker_start_method() != "forkserver":
        return
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(list(WORKER_MODULES))
    forkserver.ensure_running()
