"""Observers (trainer/engine/observer.py): one typed Protocol with every event, a no-op base, one
`emit`, and an `on_step` that gets the step's numbers. No process group is needed here."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

import autok
from autok.trainer.engine.observer import (
    EVENTS,
    BaseObserver,
    Observer,
    StepInfo,
    check_observers,
    emit,
)
from autok.trainer.engine.step import StepTimes

ROOT = Path(__file__).resolve().parents[1]


def _emitted_events() -> set[str]:
    """Every event name the engine and the built-in loop pass to `emit`, read from their source."""
    names = set()
    for path in [*(ROOT / "trainer").rglob("*.py"), *(ROOT / "autok").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "emit":
                arg = node.args[1]
                assert isinstance(arg, ast.Constant), f"{path}: emit's event is not a literal"
                names.add(arg.value)
    return names


def test_the_observer_protocol_names_every_event_emitted_and_the_base_does_nothing():
    emitted = _emitted_events()
    assert emitted == set(EVENTS), emitted ^ set(EVENTS)
    for event in EVENTS:
        documented = getattr(Observer, event)
        assert documented.__doc__, event  # each event says when it comes and what it carries
        assert inspect.signature(getattr(BaseObserver, event)) == inspect.signature(documented)
        assert getattr(BaseObserver(), event)(*[None] * (len(_params(documented)))) is None


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_emit_reaches_the_observers_that_define_the_event_in_their_order():
    got = []

    class Boundaries:
        def on_boundary(self, stats, decision):
            got.append(("boundaries", stats, decision))

    class Steps(BaseObserver):
        def on_step(self, step):
            got.append(("steps", step.global_step, step.is_boundary, step.times.sync_seconds))

    observers = [Boundaries(), Steps(), Boundaries()]
    emit(observers, "on_boundary", 1, 2)
    emit(observers, "on_step", StepInfo(7, True, StepTimes(sync_seconds=0.5), 0.1))
    emit(observers, "on_epoch", {})  # defined by none but the base: nothing happens
    assert got == [("boundaries", 1, 2), ("boundaries", 1, 2), ("steps", 7, True, 0.5)]


class _OldStepObserver:
    """on_step as it was before StepInfo: it got the loop itself."""

    def on_step(self, trainer, is_boundary):
        pass


def test_an_observer_with_the_old_on_step_is_refused_in_one_line_before_anything_starts():
    check_observers([BaseObserver(), object()])

    class Optional:  # a second argument with a default is the new signature, extended
        def on_step(self, step, extra=None):
            pass

    check_observers([Optional()])

    class OldWithDefault:  # the old signature with a default: is_boundary would be always False
        def on_step(self, trainer, is_boundary=False):
            pass

    class KeywordOnly:  # cannot take the one StepInfo a step passes
        def on_step(self, trainer, *, is_boundary):
            pass

    for bad in (OldWithDefault(), KeywordOnly()):
        with pytest.raises(autok.OptionError, match=r"^observers: \w+\.on_step takes \(trainer"):
            check_observers([bad])
    for bad, says in ((BaseObserver, "BaseObserver is not an observer; pass an instance "
                       "(BaseObserver())"), (None, "None is not an observer")):  # fmt: skip
        with pytest.raises(autok.OptionError) as info:
            check_observers([bad])
        assert str(info.value) == f"observers: {says}"
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(autok.OptionError) as e:  # before the process group is asked for
        autok.Sync(model, opt, observers=[BaseObserver(), _OldStepObserver()])
    msg = str(e.value)
    assert msg.startswith("observers: _OldStepObserver.on_step takes (trainer, is_boundary)"), msg
    assert "\n" not in msg
    # the new signature passes the check: the next refusal is the missing process group
    with pytest.raises(autok.OptionError, match="process group"):
        autok.Sync(model, opt, observers=[BaseObserver()])


def test_every_policy_implements_every_method_of_the_controller_protocol():
    """The engine calls them directly (no getattr fallback): a policy missing one fails here."""
    from autok.controllers import REGISTRY, PolicyOptions
    from autok.controllers.base import Controller

    methods = [n for n in vars(Controller) if not n.startswith("_")]
    assert set(methods) >= {"sync_period", "observe", "state_dict", "load_state_dict", "rollback"}
    for name, factory in REGISTRY.items():
        controller = factory(4, PolicyOptions())
        missing = [m for m in methods if not hasattr(controller, m)]
        assert not missing, (name, missing)
        assert isinstance(controller.sync_period, int), name
