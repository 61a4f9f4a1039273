"""Python bytecodes executed per step: a count, not a time, so a noisy machine cannot move it.

On the project's shared 2-core machine a per-step time ratio moves by more than the few µs the hot
path's changes are worth; the Python work of a step does not move at all. `count` runs a
function under `sys.settrace` with opcode events and returns every bytecode executed in this
thread, and those in autok's own frames: code in its modules (`autok`, `trainer`,
`controllers`), wherever it is called from (torch calls autok's hooks back), and generated code
(a dataclass's `__init__`) that autok's code calls. Autograd runs a CPU backward, and its hooks,
on the thread that called it, so the hooks are counted too. The counts depend on the Python
version (3.11 here); the total depends on torch's too, autok's own on the code paths autok
takes. `autok bench` (a) and (g) print the counts beside their time ratios;
tests/test_hot_path.py holds autok's per-step count to a budget.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import autok
import autok.controllers as controllers
import autok.trainer as trainer

# autok's own source directories, as code objects name their files
OWN = tuple(str(Path(m.__file__).parent) + "/" for m in (autok, trainer, controllers))


def count(fn: Callable[[], object], own: tuple[str, ...] = OWN) -> tuple[int, int]:
    """(bytecodes executed by fn(), those in autok's own frames): frames of code in files under
    `own`, and generated code (`<string>`: a dataclass's __init__) called from one of those,
    which is the construction of one of autok's records."""
    total = mine = 0

    def other(frame: FrameType, event: str, arg: object) -> Callable:
        nonlocal total
        if event == "opcode":
            total += 1
        return other

    def autok_frame(frame: FrameType, event: str, arg: object) -> Callable:
        nonlocal total, mine
        if event == "opcode":
            total += 1
            mine += 1
        return autok_frame

    def call(frame: FrameType, event: str, arg: object) -> Callable:
        # each new frame: whose it is decides its local tracer
        frame.f_trace_opcodes = True
        name = frame.f_code.co_filename
        if name == "<string>" and frame.f_back is not None:
            name = frame.f_back.f_code.co_filename
        return autok_frame if name.startswith(own) else other

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return total, mine
