"""One writer per run directory: an OS file lock on OUT/.autok.lock.

Two processes training one run (`autok train --resume R` while R still trains) would write the
same epochs twice under the same temporary names. The launching process (the local launcher,
or rank 0 under torchrun) holds an exclusive `flock` on the lock file for the run's lifetime;
the kernel releases it on any exit, `kill -9` included, so a crashed run never leaves a stale
lock. The lock is the open file description's: a child given the descriptor (AUTOK_RUN_LOCK_FD,
as `autok experiment run` gives its trains) shares it instead of being refused by its parent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = ".autok.lock"
LOCK_FD_ENV = "AUTOK_RUN_LOCK_FD"


class RunInUse(Exception):
    """Another process holds the run's lock; the message names the run."""


def _inherited(path: Path) -> int | None:
    """The descriptor of `path` a parent that holds its lock passed down, or None."""
    try:
        fd = int(os.environ.get(LOCK_FD_ENV, ""))
        held, here = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except (ValueError, OSError):
        return None
    return fd if (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino) else None


@dataclass
class RunLock:
    fd: int
    path: Path
    created: bool  # the lock file did not exist before this process took it

    def undo(self) -> None:
        """Give the lock back after a refusal, leaving the directory as it was found."""
        if self.created:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        release(self)


# what this process holds: released when its run ends (an in-process caller, such as a test
# calling autok.cli.main, runs again on the same directory), else at exit
_HELD: list[RunLock] = []


def release(lock: RunLock) -> None:
    if lock in _HELD:
        _HELD.remove(lock)
    with contextlib.suppress(OSError):
        os.close(lock.fd)


def release_all() -> None:
    for lock in list(_HELD):
        release(lock)


def acquire(out: Path) -> RunLock:
    """Lock `out` for this process (and the children it passes the descriptor to). The caller
    keeps it for the run's lifetime (the descriptor is closed at exit). RunInUse when another
    process holds it, OSError when the lock file cannot be opened. Never follows a symbolic
    link (docs/design.md §7: no write goes through one); an existing lock file is opened, never
    written, so a refused run changes nothing."""
    path = out / LOCK_NAME
    created = not os.path.lexists(path)
    fd = _inherited(path)
    if fd is None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(path, flags, 0o644)  # OSError: the caller says why it cannot
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device is no lock file
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunInUse(f"{out} is being written by another autok process") from None
    lock = RunLock(fd, path, created)
    _HELD.append(lock)
    return lock
