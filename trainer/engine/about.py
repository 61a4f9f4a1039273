"""What a setting's field says besides its type, bounds, default and help line (About), written
by `about(...)` into its json_schema_extra and read back by `about_of`. The engine's settings
models (trainer/engine/*_settings.py, composed by options.py's SyncOptions) and the run's
(autok/config.py, data_settings.py, training_settings.py) declare their fields with it;
trainer/engine/options.py re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

from autok.controllers.options import GROUP as POLICY_GROUP

# One place per setting (docs/design.md §3): a field's description is its `--help` line, and
# `about(...)`, its json_schema_extra, says the rest: its group in `autok train --help` (and
# docs/flags.md), why a bound is where it is (printed with the refusal, docs/design.md §9), and
# whether a resume may change it (docs/design.md §7), and under which values of another setting
# a run reads it. autok/cli.py and autok/flagdoc.py derive HELP, FLAG_GROUPS, RESUME_MAY_CHANGE
# and the flag tables from the fields; `describe` reads the reasons, `read_only_under` the rest.
# The K policies declare their options' fields themselves (controllers/options.py), group and
# all. The groups, in the order `--help` lists them:
GROUPS = (
    "distribution and synchronization",
    POLICY_GROUP,
    "link emulator",
    "optimization",
    "data and model",
    "stragglers",
    "run",
    "checkpoints and failures",
    "metrics",
)


class ReadOnlyUnder(NamedTuple):
    """A setting a run reads only under some values of another, the choosing setting. Given
    under another value, it is refused, not ignored: a run would report a setting that changed
    nothing (docs/design.md §6); sweeps draw it only where it is read, and a resume drops it
    where it never was (autok/space.py)."""

    chooser: str
    values: frozenset[str]  # the chooser's values under which a run reads the setting
    why: str  # why the chooser's other values do not read it


@dataclass(frozen=True)
class About:
    """What a setting's field says besides its type, bounds, default and help line."""

    group: str | None  # None: autok.Sync's alone, no `autok train` flag
    too_low: str | None = None  # why the lower bound (ge, gt) is where it is
    too_high: str | None = None  # why the upper bound (le, lt) is where it is
    resume: bool = False  # `autok train --resume` may change it
    before: str | None = None  # listed just before this setting of its group (else field order)
    read_only_under: ReadOnlyUnder | None = None  # None: read under every value of the others


_ABOUT_KEYS = frozenset(About.__dataclass_fields__)


def about(
    group: str | None,
    *,
    too_low: str | None = None,
    too_high: str | None = None,
    resume: bool = False,
    before: str | None = None,
    read_only_under: tuple[str, frozenset[str], str] | None = None,
) -> JsonDict:
    """A setting's `json_schema_extra`: see About; `read_only_under` is (the chooser, the values
    under which it is read, why the others do not read it). A group outside GROUPS fails at
    import."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"about: unknown group {group!r}; choose from {GROUPS}")
    said: dict[str, Any] = dict(
        group=group, too_low=too_low, too_high=too_high, resume=resume, before=before
    )
    if read_only_under is not None:
        chooser, values, why = read_only_under
        said["read_only_under"] = {"chooser": chooser, "values": sorted(values), "why": why}
    return {"autok": {k: v for k, v in said.items() if v not in (None, False)}}


def about_of(info: FieldInfo, name: str = "a setting") -> About:
    """What `about` put on a field (setting `name`); a field without it is refused: it would
    have no group, so no flag. So is a key `about` does not write (one the controllers' own
    `about` misspelled: controllers/options.py)."""
    extra = info.json_schema_extra
    data = extra.get("autok") if isinstance(extra, dict) else None
    if not isinstance(data, dict):
        raise TypeError(f"{name}: its Field has no json_schema_extra=about(...) (its group)")
    if unknown := sorted(set(data) - _ABOUT_KEYS):
        raise TypeError(f"{name}: its about(...) has {unknown}; it takes {sorted(_ABOUT_KEYS)}")

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) else None

    return About(
        group=text("group"),
        too_low=text("too_low"),
        too_high=text("too_high"),
        resume=data.get("resume") is True,
        before=text("before"),
        read_only_under=_read_only_under_of(data.get("read_only_under")),
    )


def _read_only_under_of(said: object) -> ReadOnlyUnder | None:
    """`about`'s JSON form of read_only_under (a dict of lists) as the ReadOnlyUnder it was."""
    if not isinstance(said, dict):
        return None
    values = said.get("values")
    return ReadOnlyUnder(
        str(said.get("chooser")),
        frozenset(str(v) for v in values) if isinstance(values, list) else frozenset(),
        str(said.get("why")),
    )
