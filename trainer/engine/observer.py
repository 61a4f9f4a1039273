"""Observers: what the engine and the built-in loop tell sinks, exporters and user callbacks
(docs/design.md §3, Data flow). `Observer` names every event with its arguments; an observer
defines the events it wants (any subset) or subclasses `BaseObserver`, whose events do nothing.
`emit` is the one place events are delivered."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from autok.controllers.base import BoundaryStats, SyncDecision
from autok.trainer.engine.options import OptionError
from autok.trainer.engine.step import StepTimes

# Every event an observer may define, in the order of Observer's methods.
EVENTS = (
    "on_boundary",
    "on_local_interval",
    "on_step",
    "on_epoch",
    "on_rewind",
    "on_stop",
    "on_end",
    "close",
)


@dataclass(slots=True)
class StepInfo:
    """One closed optimizer step of the built-in loop, as `on_step` gets it: the step's numbers,
    not the loop (an observer holds what else it needs)."""

    global_step: int  # optimizer steps closed so far, this one included
    is_boundary: bool
    times: StepTimes  # this rank's times of the step (Sync.last_step)
    # the LR of the next step: the scheduler has stepped (as the optimizer's group 0 holds it,
    # perhaps a tensor)
    next_lr: Any


class Observer(Protocol):
    """Every event an observer may receive. The engine (`autok.Sync`) emits `on_boundary` and
    `on_local_interval`; the built-in loop (`autok train`) adds the others. `Sync.close()` calls
    `close`. Each is optional: an observer defines those it wants."""

    def on_boundary(self, stats: BoundaryStats, decision: SyncDecision) -> None:
        """A boundary closed: its record (reduced over the ranks) and the K decided for the next
        interval. Every rank gets the same."""

    def on_local_interval(self, compute_seconds: float, wait_seconds: float) -> None:
        """A boundary is about to close: this rank's own, unreduced compute and exposed wait of
        the interval (the per-rank metrics)."""

    def on_step(self, step: StepInfo) -> None:
        """The built-in loop closed an optimizer step (after the LR scheduler stepped)."""

    def on_epoch(self, row: dict[str, Any]) -> None:
        """The built-in loop ended an epoch: its row of epochs.csv."""

    def on_rewind(self, last_epoch: int) -> None:
        """A rollback (--on-divergence rollback) continues after `last_epoch`: later records go."""

    def on_stop(self, epoch: int) -> None:
        """The run stops on purpose after `epoch` (--stop-after-epochs), to be resumed."""

    def on_end(self, summary: dict[str, Any]) -> None:
        """The run ended: summary.json's contents."""

    def close(self) -> None:
        """The Sync closed: release what the observer holds (a file, a server)."""


class BaseObserver:
    """An observer whose events do nothing: subclass it and define those you want."""

    def on_boundary(self, stats: BoundaryStats, decision: SyncDecision) -> None:
        pass

    def on_local_interval(self, compute_seconds: float, wait_seconds: float) -> None:
        pass

    def on_step(self, step: StepInfo) -> None:
        pass

    def on_epoch(self, row: dict[str, Any]) -> None:
        pass

    def on_rewind(self, last_epoch: int) -> None:
        pass

    def on_stop(self, epoch: int) -> None:
        pass

    def on_end(self, summary: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def emit(observers: Iterable[Any], event: str, *args: Any) -> None:
    """Deliver `event` to every observer that defines it, in their order."""
    for obs in observers:
        fn = getattr(obs, event, None)
        if fn is not None:
            fn(*args)


def check_observers(observers: Iterable[Any]) -> None:
    """An OptionError naming an observer that would fail or mislead once the run started: a
    class or None where an instance belongs, or an `on_step` with the signature before StepInfo
    (`on_step(trainer, is_boundary)`, with or without a default) or one that cannot take one
    StepInfo."""
    for obs in observers:
        if obs is None or isinstance(obs, type):
            name = getattr(obs, "__name__", "None")
            hint = f"; pass an instance ({name}())" if obs is not None else ""
            raise OptionError(f"observers: {name} is not an observer{hint}")
        fn = getattr(obs, "on_step", None)
        if fn is None or not callable(fn):
            continue
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: not judged
            continue
        params = sig.parameters.values()
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        old = len(positional) >= 2 and (
            positional[1].default is inspect.Parameter.empty
            or positional[1].name == "is_boundary"
            or positional[0].name == "trainer"
        )
        try:
            sig.bind(None)  # the one StepInfo every step passes
        except TypeError:
            old = True
        if old:
            raise OptionError(
                f"observers: {type(obs).__name__}.on_step takes (trainer, is_boundary), the old "
                "signature; define on_step(step), which gets a StepInfo (docs/api.md, Observers)"
            )
