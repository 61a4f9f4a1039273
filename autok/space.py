"""A search space over `autok train` settings, read from YAML, usable by Optuna and Ray Tune."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from autok.config import (
    READ_ONLY_UNDER,
    ConfigError,
    TrainConfig,
    finite_number,
    flag,
    load_config,
    read_yaml,
)
from autok.controllers import CAPS, POLICY_OPTIONS, READS
from autok.controllers import REGISTRY as POLICIES
from autok.controllers.options import SKEW_RULE_OPTIONS
from autok.resources import default_space
from autok.trainer.engine.link import PROFILES
from autok.trainer.engine.options import default_slowmo_beta
from autok.trainer.engine.outer import DEFAULT_MOMENTUM
from autok.trainer.loop.data import DATASETS
from autok.trainer.loop.models import MODELS


@dataclass(frozen=True)
class Dim:
    name: str
    kind: str  # int | float | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple | None = None

    # A categorical dimension has choices, an int or float one low and high (load_space):
    # these read them typed without the None.
    def _choices(self) -> tuple:
        assert self.choices is not None, f"{self.name}: a categorical dimension without choices"
        return self.choices

    def _range(self) -> tuple[float, float]:
        assert self.low is not None and self.high is not None, f"{self.name}: no low or high"
        return self.low, self.high

    def outside(self, value: Any) -> str | None:
        """Why an enqueued value does not belong to this dimension, or None."""
        if self.kind == "categorical":
            return None if value in self._choices() else f"{value!r:.40} is not one of the choices"
        low, high = self._range()
        if not finite_number(value) or not low <= value <= high:
            return f"{value!r:.40} is not a number in [{low:g}, {high:g}]"
        if self.kind == "int" and not float(value).is_integer():
            return f"{value!r:.40} is not an integer"
        return None

    def ends(self) -> tuple:
        """Its choices, or the two ends of its range (as ints for an int dimension): the values
        a check tries it at."""
        if self.kind == "categorical":
            return self._choices()
        return tuple(int(b) if self.kind == "int" else b for b in self._range())

    def suggest(self, trial) -> Any:
        """Optuna's define-by-run suggestion."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self._choices()))
        low, high = self._range()
        if self.kind == "int":
            return trial.suggest_int(self.name, int(low), int(high), log=self.log)
        return trial.suggest_float(self.name, low, high, log=self.log)


def conditional(
    read_only_under: Mapping[str, tuple[str, frozenset[str], str]] = READ_ONLY_UNDER,
) -> dict[str, tuple[str, frozenset]]:
    """Settings read only under some values of another: name -> (the choosing setting, the
    values under which it is read). Both are derived, never kept by hand: the K-policy options
    from the policies' registry entries (their `reads`), the others from the fields'
    `about(read_only_under=...)` (the strategy's, the optimizer's, the data set's, ...)."""
    return {
        **{
            name: ("policy", frozenset(p for p, reads in READS.items() if name in reads))
            for name in POLICY_OPTIONS
            if name not in CAPS
        },
        **{name: (chooser, readers) for name, (chooser, readers, _) in read_only_under.items()},
    }


# A sweep draws such a setting only in trials where it is read, and drops a fixed one from the
# trials where it is not (TrainConfig refuses it there).
CONDITIONAL = conditional()
_CHOOSERS = frozenset(chooser for chooser, _ in CONDITIONAL.values())


def _value(name: str, settings: dict[str, Any]) -> Any:
    return settings.get(name, TrainConfig.model_fields[name].default)


def applies(name: str, settings: dict[str, Any]) -> bool:
    """Whether a run with `settings` reads setting `name` (always, unless CONDITIONAL)."""
    cond = CONDITIONAL.get(name)
    if cond is None:
        return True
    try:
        return _value(cond[0], settings) in cond[1]
    except TypeError:  # an unhashable choice (a list from --config): TrainConfig names it
        return True


def never_read(settings: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The settings a run with `settings` accepts no more because it never read them, which
    autok accepted before it refused them (a K-policy option its policy does not read, SGD's
    momentum under AdamW, --nesterov with --momentum 0, which SGD was built without): name ->
    (the value given, why it was never read). A resumed run or study drops them, with a note,
    and runs as it ran. The skew rule's options with --skew-drift 0 are among them."""
    out: dict[str, tuple[Any, str]] = {}
    fields = TrainConfig.model_fields
    for name, (chooser, _) in CONDITIONAL.items():
        value = settings.get(name, fields[name].default)
        if value != fields[name].default and not applies(name, settings):
            out[name] = (value, f"{flag(chooser)} {_value(chooser, settings)} does not read it")
    if (
        "nesterov" not in out
        and settings.get("nesterov") is True
        and (_value("momentum", settings) == 0.0)
    ):
        out["nesterov"] = (True, "--momentum is 0")
    if (
        "slowmo_lr_aware" not in out
        and settings.get("slowmo_lr_aware") is True
        and _slowmo_momentum(settings) == 0.0
    ):
        out["slowmo_lr_aware"] = (True, "SlowMo's momentum is 0: no velocity to rescale")
    skew_off = _value("skew_drift", settings) == 0
    for name in SKEW_RULE_OPTIONS if skew_off else ():
        value = settings.get(name, fields[name].default)
        if name not in out and value != fields[name].default:
            out[name] = (value, "--skew-drift is 0 (off)")
    return out


def _slowmo_momentum(settings: dict[str, Any]) -> Any:
    """The outer momentum a run with `settings` resolves (trainer/engine/options.py
    `_check_outer`)."""
    kind = settings.get("outer_optimizer")
    if kind is not None:
        given = settings.get("outer_momentum")
        return DEFAULT_MOMENTUM.get(kind) if given is None else given
    beta = settings.get("slowmo_beta")
    return default_slowmo_beta(_value("strategy", settings)) if beta is None else beta


def as_ran(settings: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Settings saved before autok refused what they never applied (a run's config.json, a
    study's fixed part, an experiment run's run.yaml), changed to what the run ran, and a note
    per change. Refusing them would strand the run: they cannot change on a resume.

    - an option it never read (never_read) is dropped (a full config takes its default);
    - a --qsr-base above --max-sync-period: under qsr, K = max(base, min(cap, ·)) was the base
      throughout, so the cap is raised to it; under composite, whose K is capped, the base was
      never reached, so it is lowered to the cap (qsr's K then sits at the cap as before)."""
    out = dict(settings)
    notes = []
    for name, (value, why) in never_read(settings).items():
        out.pop(name)
        notes.append(f"{flag(name)} {value}, which it never read ({why}); resuming without it")
    base, cap = out.get("qsr_base"), _value("max_sync_period", out)
    policy = _value("policy", out)
    if isinstance(base, int) and isinstance(cap, int) and base > cap:
        if policy == "qsr":
            out["max_sync_period"] = base
            notes.append(
                f"--qsr-base {base} above --max-sync-period {cap}, which K ran past; resuming "
                f"with the cap at {base}"
            )
        elif policy == "composite":
            out["qsr_base"] = cap
            notes.append(
                f"--qsr-base {base} above --max-sync-period {cap}, which K never reached; "
                f"resuming with the base at {cap}"
            )
    return out, notes


def suggest_all(space: list[Dim], trial, fixed: dict[str, Any]) -> dict[str, Any]:
    """One trial's drawn settings, define-by-run, the choosing settings (policy, optimizer)
    first: a conditional setting is drawn only where the trial reads it (a conditional space,
    as Optuna builds one), so a space over `policy` and `target_sync_share` gives a `fixed`
    trial no share to refuse."""
    params: dict[str, Any] = {}
    for d in sorted(space, key=lambda d: d.name not in _CHOOSERS):
        if applies(d.name, {**fixed, **params}):
            params[d.name] = d.suggest(trial)
    return params


def trial_settings(fixed: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A trial's settings: the fixed part and the drawn values, less the fixed conditional
    settings the trial does not read (a fixed --target-sync-share in a trial that drew the
    policy `fixed`). check_fixed refuses one that no trial would read."""
    merged = {**fixed, **params}
    return {k: v for k, v in merged.items() if applies(k, merged)}


def unread_reason(name: str, fixed: dict[str, Any], chosen: list[Any] | None = None) -> str:
    """Why setting `name` is read by no trial: the values its choosing setting takes (`chosen`,
    else the fixed or default one) do not read it."""
    chooser, readers = CONDITIONAL[name]
    values = chosen or [_value(chooser, fixed)]
    return (
        f"{flag(chooser)} {', '.join(str(v) for v in values)} does not read it; drop it, or "
        f"give {flag(chooser)} one of {', '.join(sorted(readers))}"
    )


def check_fixed(fixed: dict[str, Any], space: list[Dim]) -> None:
    """A fixed conditional setting (other than its default) that no trial would read is
    refused: every trial would drop it. A choice counts as reading it only if it reads it and
    makes a valid run with the fixed part (exposed-sync under --strategy ddp does not). One
    that some trials read is checked by itself here (its type and bounds), as the trials that
    drop it cannot check it. A choosing value that is itself invalid is left to the fixed
    part's own check, which names it."""
    dims = {d.name: d for d in space}
    for name, value in fixed.items():
        cond = CONDITIONAL.get(name)
        if cond is None or value == TrainConfig.model_fields[name].default:
            continue
        chooser, readers = cond
        drawn = dims.get(chooser)
        values = drawn.choices if drawn is not None and drawn.choices else (_value(chooser, fixed),)
        if any(field_problem(chooser, v) for v in values):
            continue
        if why := field_problem(name, value):
            raise ConfigError(f"{flag(name)}: {why}")
        reading = [v for v in values if v in readers]
        if not reading:
            raise ConfigError(f"{flag(name)}: {unread_reason(name, fixed, list(values))}")
        others = one_off(space, (chooser, name))
        if all(check_settings({**fixed, chooser: v}, o) for v in reading for o in others):
            raise ConfigError(
                f"{flag(name)}: read only with {flag(chooser)} {', '.join(map(str, reading))}, "
                "which makes no valid run with the fixed settings; drop it"
            )


def one_off(space: list[Dim], skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Draws near what some trial runs, to try a setting against: every searched setting at
    its default, or one of them (outside `skip`) at an end of its range or at a choice."""
    return [{}] + [{d.name: v} for d in space if d.name not in skip for v in d.ends()]


def check_settings(fixed: dict[str, Any], params: dict[str, Any]) -> str | None:
    """Why this combination is not a valid run, or None (the fixed conditional settings it
    does not read dropped, as the trial drops them: trial_settings)."""
    try:
        load_config({}, {**trial_settings(fixed, params), "out": None})
    except ConfigError as exc:
        return str(exc)
    return None


def load_enqueue(
    path: Path | None, space: list[Dim], fixed: dict[str, Any] | None = None
) -> tuple[dict, ...]:
    """A YAML list of {setting: value} over the space's dimensions, to evaluate first. An
    entry's conditional setting must be read under the entry's own choice (suggest_all would
    not draw it): given, or fixed by the sweep."""
    if path is None:
        return ()
    raw = read_yaml(path, "--enqueue")
    names = {d.name for d in space}
    if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
        raise ConfigError(f"--enqueue: {path} must be a list of mappings")
    if len(raw) > MAX_ENQUEUED:
        raise ConfigError(f"--enqueue: {path} lists over {MAX_ENQUEUED} settings")
    dims = {d.name: d for d in space}
    out = []
    for i, given in enumerate(raw):
        p = {str(k).replace("-", "_"): v for k, v in given.items()}
        if len(p) < len(given):  # sync-period and sync_period: the last would win
            raise ConfigError(f"--enqueue: {path.name}: entry {i + 1} sets a setting twice")
        if unknown := set(p) - names:
            raise ConfigError(f"--enqueue: {sorted(unknown)[:3]} not in the search space")
        for name, value in p.items():
            if why := dims[name].outside(value):
                raise ConfigError(f"--enqueue: {path.name}: entry {i + 1}: {name}: {why}")
        for name in p:  # every value is one of its dimension's: the choices are known ones
            cond = CONDITIONAL.get(name)
            if cond is None:
                continue
            chooser, readers = cond
            if chooser in dims and chooser not in p:  # drawn: read under every choice?
                if all(
                    applies(name, {**(fixed or {}), **p, chooser: c})
                    for c in dims[chooser].choices or ()
                ):
                    continue
                raise ConfigError(
                    f"--enqueue: {path.name}: entry {i + 1}: {name}: read only with {chooser} "
                    f"{', '.join(sorted(readers))}; give {chooser} in the entry too"
                )
            if not applies(name, settings := {**(fixed or {}), **p}):
                raise ConfigError(
                    f"--enqueue: {path.name}: entry {i + 1}: {name}: {chooser} "
                    f"{_value(chooser, settings)} does not read it"
                )
        out.append(p)
    return tuple(out)


MAX_ENQUEUED = 10_000


def field_problem(name: str, value: Any) -> str | None:
    """Why `value` is not a valid value of setting `name` by itself (its type, its bounds, a
    finite number), or None. Combinations are checked per trial."""
    field = TrainConfig.model_fields[name]
    # a type built at run time: no static type describes it
    ann: Any = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
    try:
        TypeAdapter(ann, config=ConfigDict(allow_inf_nan=False)).validate_python(value)
    except ValidationError as exc:
        return " ".join(str(exc.errors()[0]["msg"]).split()).lower()
    if name in NAMED and value not in NAMED[name]:
        return f"unknown; choose from {sorted(NAMED[name])}"
    return None


# Settings whose value is a name from a registry (checked by TrainConfig's cross-field step).
NAMED = {"policy": POLICIES, "dataset": DATASETS, "model": MODELS, "link": PROFILES}


def load_space(path: Path | None) -> list[Dim]:
    """Parse and validate a space file; every problem is a ConfigError naming --space."""
    path = path or default_space()  # experiments/spaces/default.yaml, shipped in the package
    raw = read_yaml(path, "--space")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"--space: {path} must map setting names to ranges")
    dims: list[Dim] = []
    for key, spec in raw.items():
        name = str(key).replace("-", "_")
        where = f"--space: {path.name}: {str(key)[:40]}"
        if any(d.name == name for d in dims):
            raise ConfigError(f"{where}: given twice")
        if name not in TrainConfig.model_fields:
            raise ConfigError(f"{where}: not an `autok train` setting")
        # mnist1d_test_samples: every trial's objective is read on the one test set
        if name in ("out", "workers", "mnist1d_test_samples"):
            raise ConfigError(f"{where}: fixed per sweep, cannot be searched")
        if name == "task":  # its metric sets the sweep's direction: one per sweep
            raise ConfigError(f"{where}: fixed per sweep (give --task), cannot be searched")
        if not isinstance(spec, dict) or spec.get("type") not in ("int", "float", "categorical"):
            raise ConfigError(f"{where}: needs type: int, float or categorical")
        kind = spec["type"]
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices:
                raise ConfigError(f"{where}: categorical needs a non-empty list `choices`")
            for c in choices:  # Optuna stores None, bool, int, float and str
                if not isinstance(c, (type(None), bool, int, float, str)):
                    raise ConfigError(f"{where}: choice {c!r:.40} is not a plain value")
                if why := field_problem(name, c):
                    raise ConfigError(f"{where}: choice {c!r:.40}: {why}")
            dims.append(Dim(name, kind, choices=tuple(choices)))
            continue
        low, high, log = spec.get("low"), spec.get("high"), spec.get("log", False)
        if not (finite_number(low) and finite_number(high)) or low > high:
            raise ConfigError(f"{where}: needs finite numbers low <= high")
        if not isinstance(log, bool):
            raise ConfigError(f"{where}: log must be true or false")
        if log and low <= 0:
            raise ConfigError(f"{where}: log scale needs low > 0")
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise ConfigError(f"{where}: int bounds must be integers")
        if kind == "float" and _is_int_field(name):
            raise ConfigError(f"{where}: an integer setting; use type: int")
        if TrainConfig.model_fields[name].annotation is bool:  # every draw between 0 and 1 fails
            raise ConfigError(
                f"{where}: a true/false setting; use type: categorical, choices: [true, false]"
            )
        for bound, v in (("low", low), ("high", high)):
            if why := field_problem(name, int(v) if kind == "int" else v):
                raise ConfigError(f"{where}: {bound} {v!r}: {why}")
        dims.append(Dim(name, kind, float(low), float(high), log))
    return dims


def _is_int_field(name: str) -> bool:
    args = typing.get_args(TrainConfig.model_fields[name].annotation)
    return TrainConfig.model_fields[name].annotation is int or (int in args and float not in args)
