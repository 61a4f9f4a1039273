"""Process hygiene: children die with their parent, so nothing outlives a killed sweep or job."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess

_PR_SET_PDEATHSIG = 1


def start_logged(cmd: list[str], log) -> subprocess.Popen:
    """A child with stdout and stderr in `log`, no stdin, dying with this process."""
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent dies (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
