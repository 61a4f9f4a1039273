"""What a collective's own thread may still hold after the caller has its result.

gloo runs each collective on a worker thread that drops the work's references to its tensors,
and a future's Python callbacks, only at the next turn of its loop: after the caller's wait has
returned (just after a blocking all-reduce of a fresh tensor returned, the worker still held it
about 1 time in 4: `python -m benchmarks.exit_race`). A thread that drops a tensor's last C++
reference but one decrefs the tensor's Python object, taking the GIL (torch's PyObject
preservation: the C++ references keep the Python object alive); in older torch, one that drops
the last reference to a tensor whose Python object died meanwhile frees it, also under the GIL.
During the interpreter's finalization Python 3.11 ends a thread that takes the GIL with
pthread_exit; the unwind meets a noexcept C++ frame and the process aborts ("terminate called
without an active exception") after a run that succeeded (docs/design.md §5, At exit).

So every tensor autok hands to a collective is first held here, with one C++ reference of this
module's own (a one-element `torch.ScriptList`): the backend's thread then never drops the last
C++ reference but one, so it never touches the Python object, and this module drops its own, on
the caller's thread, once the backend has let go (the use count is back to what it was). A Python
callback is held until nothing but this module references it. At exit, before the interpreter
finalizes, the process waits (bounded) until the backends have let go of everything.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

# At exit, the most a process waits for the backends' threads: a collective that never ends (a
# peer gone) or a result still referenced (an overlapped average never applied, at an exit by an
# exception) must not hang the exit; it costs this, and a line on stderr, instead.
EXIT_SETTLE_SECONDS = 5.0
# Held objects are few (those of the collectives in flight, and the last ones); a backend that
# keeps every tensor must not grow this without bound: past it the oldest are dropped.
MAX_HELD = 1024
_POLL_SECONDS = 0.0005
_CALLBACK = -1  # a callback's entry: released when only this list references it

F = TypeVar("F", bound=Callable[..., Any])

# (object, the use count it returns to once released, this module's C++ reference or None)
_held: list[tuple[Any, int, Any]] = []
_orphans: list[list] = []  # a forked child's inherited entries, never freed there
_lock = threading.Lock()
_at_exit = False
_warned = False  # the held list has overflowed once (said on stderr)
_ScriptList: Any = None


def hand(*tensors: torch.Tensor) -> None:
    """Call just before passing `tensors` to a collective: the very objects passed (a view made
    for the call is a tensor of its own). Each is held until the backend has dropped the
    references the collective took."""
    with _lock:
        released = _prune() if _held else None
        for t in tensors:
            own = _script_list([t])  # a C++ reference, taken here on the caller's thread
            # Tensor._use_count, the C++ references to the tensor, is not in torch's stubs
            _held.append((t, t._use_count(), own))  # type: ignore[attr-defined]
        if not _at_exit:
            _watch_exit()
    del released  # (freed outside the lock: a finalizer it runs may hand something over)


def _script_list(items: list) -> Any:
    """A torch.ScriptList (a list of C++ values), torch imported on first use: this module
    loads without torch, as link.py's users do."""
    global _ScriptList
    if _ScriptList is None:
        import torch

        _ScriptList = torch.ScriptList
    return _ScriptList(items)


def hand_callback(fn: F) -> F:
    """Call with a Python callback before attaching it to a collective's future (returns it): a
    fresh closure, which nothing but that future keeps once the caller's frame is gone. An
    exception it passes on must not carry its traceback: that holds the callback's frame, and
    the frame the callback, for as long as whoever waits keeps the exception."""
    with _lock:
        released = _prune()
        _held.append((fn, _CALLBACK, None))
        _watch_exit()
    del released
    return fn


def settle(seconds: float = EXIT_SETTLE_SECONDS) -> int:
    """Wait, sleeping, until the backends have let go of every held object, at most `seconds`;
    returns how many they still hold."""
    deadline = time.monotonic() + seconds
    while True:
        with _lock:
            released = _prune()
            left = len(_held)
        del released
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL_SECONDS)


def held() -> int:
    """How many objects are held now (released ones included until the next hand-over or
    settle)."""
    return len(_held)


def _prune() -> list:
    """Drop what the backends have released from the list (under _lock); returns the dropped
    entries, for the caller to free once the lock is released."""
    global _warned
    floor = 0  # what a callback nothing else references reads: measured when one is held
    keep: list[tuple[Any, int, Any]] = []
    dropped: list[tuple[Any, int, Any]] = []
    for e in _held:
        if e[1] != _CALLBACK:
            busy = e[0]._use_count() > e[1]
        else:
            floor = floor or _refs((object(), _CALLBACK, None))
            busy = _refs(e) > floor
        (keep if busy else dropped).append(e)
    if len(keep) > MAX_HELD:
        if not _warned:
            print(f"autok: over {MAX_HELD} tensors held by collectives; the oldest let go "
                  "(docs/design.md §5, At exit)", file=sys.stderr)  # fmt: skip
            _warned = True
        dropped += keep[:-MAX_HELD]
        keep = keep[-MAX_HELD:]
    _held[:] = keep
    return dropped


def _refs(entry: tuple[Any, int, Any]) -> int:
    """The reference count of an entry's object, read the same way for a held callback and for
    the fresh object _prune compares it with (so that counts differing between Python versions
    cancel)."""
    obj = entry[0]
    return sys.getrefcount(obj)


def _settle_at_exit() -> None:
    left = settle(EXIT_SETTLE_SECONDS)
    if left:
        print(
            f"autok: {left} object(s) still held by a collective after {EXIT_SETTLE_SECONDS:g} s "
            "at exit (docs/design.md §5, At exit)",
            file=sys.stderr,
        )


def _watch_exit() -> None:
    global _at_exit
    if not _at_exit:
        # atexit runs after the main thread's last statement and before finalization begins,
        # when a backend's thread can still take the GIL
        atexit.register(_settle_at_exit)
        _at_exit = True


def _forget() -> None:
    """In a forked child: the parent's backend threads are not there to let anything go, and
    what they held (perhaps device memory) is not the child's to free: kept, never dropped."""
    global _held, _lock
    _orphans.append(_held)
    _held = []
    _lock = threading.Lock()  # (perhaps held, at the fork, by a thread now gone)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
