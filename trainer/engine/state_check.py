"""A saved `Sync` state, checked whole before any of it is applied (`Sync.load_state_dict`).

A state is user data: a file edited, truncated or saved under other settings. Applied piece by
piece, a bad value either fails half way (a KeyError, a size mismatch), leaving the engine half
loaded, or loads and trains with it (K = 0, K = 10^30). So every value is checked here, for its
type, range and shape against this engine, and the first fault is named by its key path
(`counters.sync_period`), or by the option whose setting the state was saved under
(`fragments`, `compress`, `outer_optimizer`); only then does load_state_dict apply it.

The controller's and the guard's states are theirs to read: they are checked against the
structure of the engine's own (same keys, same kinds of value), then loaded into a copy.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import fields
from typing import Any

import torch

from autok.controllers.base import BoundaryStats
from autok.trainer.engine.fragments import WHOLE
from autok.trainer.engine.options import K_MAX
from autok.trainer.engine.pending import pending_refusal
from autok.trainer.engine.profiler import Interval

INT_MAX = 2**62  # counters: beyond any run, and within a C long
LIST_MAX = 1 << 20  # the longest list a state holds (a loss per step of an interval at K_MAX)
# BoundaryStats fields a delayed average's record gets when it lands (in_flight.finish_in_flight)
_FILLED_AT_FINISH = {
    "compute_seconds",
    "exposed_sync_seconds",
    "drift_norm",
    "update_norm",
    "drift_ratio",
    "train_loss",
    "bytes_communicated",
}


class BadState(Exception):
    """Why a saved state cannot load: `path: what is wrong` (caught by Sync.load_state_dict)."""


def whole_int(value: Any, path: str, lo: int = 0, hi: int = INT_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadState(f"{path}: {value!r:.40} is not an integer in [{lo}, {hi}]")
    return value


def number(value: Any, path: str, finite: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadState(f"{path}: {value!r:.40} is not a number")
    if finite and not (math.isfinite(value) and value >= 0):
        raise BadState(f"{path}: {value!r:.40} is not a finite number >= 0")
    return value


def mapping(value: Any, path: str, required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise BadState(f"{path}: a {type(value).__name__}, not a dict")
    if missing := [k for k in required if k not in value]:
        raise BadState(f"{path}: no {missing[0]!r}")
    return value


def tensor_like(value: Any, path: str, like: torch.Tensor) -> None:
    """A tensor of `like`'s shape and dtype (its device may differ: it is copied over)."""
    if not isinstance(value, torch.Tensor):
        raise BadState(f"{path}: a {type(value).__name__}, not a tensor")
    if value.shape != like.shape:
        raise BadState(
            f"{path}: shape {tuple(value.shape)}, this model's is {tuple(like.shape)} "
            "(saved from another model?)"
        )
    if value.dtype != like.dtype:
        raise BadState(f"{path}: {value.dtype}, this Sync averages in {like.dtype}")


def like(saved: Any, mine: Any, path: str) -> None:
    """`saved` has the structure of `mine` (the engine's own state of the same part): the same
    keys, and of each value the same kind. A None on either side is a value not set yet (a
    state saved early, or loaded into an engine that has run: a rollback), left to the part's
    own load_state_dict, which `loads_into_copy` tries."""
    if mine is None or saved is None:
        return
    if isinstance(mine, dict):
        mapping(saved, path, tuple(mine))
        if extra := [k for k in saved if k not in mine]:
            raise BadState(f"{path}: unknown key {str(extra[0])[:40]!r}")
        for k, v in mine.items():
            like(saved[k], v, f"{path}.{k}")
    elif isinstance(mine, bool):
        if not isinstance(saved, bool):
            raise BadState(f"{path}: {saved!r:.40} is not a boolean")
    elif isinstance(mine, int | float):  # (a count kept as an int may be a float later)
        number(saved, path)
    elif isinstance(mine, str):
        if not isinstance(saved, str):
            raise BadState(f"{path}: {saved!r:.40} is not a string")
    elif isinstance(mine, list | tuple):
        if not isinstance(saved, list | tuple) or len(saved) > LIST_MAX:
            raise BadState(f"{path}: not a list of at most {LIST_MAX} items")
    elif isinstance(mine, torch.Tensor):
        tensor_like(saved, path, mine)


def k_values(state: Any, path: str) -> None:
    """Every K a controller keeps (sync_period, max_sync_period), wherever it nests: an integer
    in [1, K_MAX], as the options bound K."""
    if isinstance(state, dict):
        for k, v in state.items():
            if k in ("sync_period", "max_sync_period"):
                whole_int(v, f"{path}.{k}", 1, K_MAX)
            else:
                k_values(v, f"{path}.{k}")


def loads_into_copy(obj: Any, state: Any, path: str, optional: tuple[str, ...] = ()) -> None:
    """`obj.load_state_dict(state)` tried on a copy: what it would raise, as a BadState.
    `optional`: keys of obj's state that older states lack (its load_state_dict defaults them)."""
    mine = obj.state_dict()
    if isinstance(state, dict):
        mine = {k: v for k, v in mine.items() if k in state or k not in optional}
    like(state, mine, path)
    try:
        copy.deepcopy(obj).load_state_dict(state)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise BadState(f"{path}: {type(exc).__name__}: {str(exc)[:80]}") from None


def check_counters(c: Any, strategy: str, fragments: int) -> None:
    c = mapping(
        c,
        "counters",
        (
            "sync_period",
            "global_step",
            "boundary",
            "grad_syncs",
            "param_syncs",
            "k_path",
            "interval",
        ),
    )
    k = whole_int(c["sync_period"], "counters.sync_period", 1, K_MAX)
    if strategy == "ddp" and k != 1:
        raise BadState(f"counters.sync_period: {k}; ddp synchronizes every step (K = 1)")
    if "fragment_position" in c:
        pos = c["fragment_position"]
        whole_int(pos, "counters.fragment_position", 1, INT_MAX)
        if pos > fragments:
            raise BadState(
                f"counters.fragment_position: {pos} is beyond fragments {fragments} (saved "
                "with more --fragments?)"
            )
    for name in ("global_step", "boundary", "grad_syncs", "param_syncs", "collectives"):
        if name in c:
            whole_int(c[name], f"counters.{name}")
    path = mapping(c["k_path"], "counters.k_path")
    if len(path) > K_MAX:
        raise BadState(f"counters.k_path: {len(path)} values of K; at most {K_MAX}")
    for key, at_k in path.items():
        where = f"counters.k_path[{str(key)[:20]!r}]"
        if not (isinstance(key, int) or (isinstance(key, str) and key.isdigit())):
            raise BadState(f"{where}: K is not an integer")
        whole_int(int(key), where, 1, K_MAX)
        at_k = mapping(at_k, where, ("seconds", "boundaries", "steps"))
        number(at_k["seconds"], f"{where}.seconds", finite=True)
        whole_int(at_k["boundaries"], f"{where}.boundaries")
        whole_int(at_k["steps"], f"{where}.steps")
    interval = mapping(c["interval"], "counters.interval")
    kinds = {f.name: type(f.default) for f in fields(Interval)}
    for name, value in interval.items():
        where = f"counters.interval.{name}"
        if name not in kinds:
            raise BadState(f"{where}: not a field of an interval")
        if name == "loss_sum":
            number(value, where)
        elif kinds[name] is int:
            whole_int(value, where, 0, K_MAX if name == "steps" else INT_MAX)
        else:
            number(value, where, finite=True)
    number(c.get("loss_sum", 0.0), "counters.loss_sum")
    held = c.get("loss_held", [])
    if not isinstance(held, list | tuple) or len(held) > LIST_MAX:
        raise BadState(f"counters.loss_held: not a list of at most {LIST_MAX} losses")
    for i, v in enumerate(held):
        number(v, f"counters.loss_held[{i}]")


def check_averager(s: Any, averager: Any, options: Any) -> None:
    """The averager's state against this averager: θ_ref, the velocity and the residual of this
    model, as this Sync's outer optimizer and compression keep them."""
    s = mapping(s, "averager", ("ref", "velocity", "boundaries"))
    tensor_like(s["ref"], "averager.ref", averager.ref)
    outer = options.outer
    if averager.velocity is None and s["velocity"] is not None:
        raise BadState(
            "averager.velocity: saved with an outer momentum (outer_optimizer, slowmo_beta, "
            f"outer_momentum); this Sync's outer step {outer.kind} with momentum "
            f"{outer.momentum:g} keeps none"
        )
    if averager.velocity is not None:
        if s["velocity"] is None:
            raise BadState(
                "averager.velocity: saved without an outer momentum (outer_optimizer, "
                f"slowmo_beta, outer_momentum); this Sync's {outer.kind} keeps one"
            )
        tensor_like(s["velocity"], "averager.velocity", averager.velocity)
    boundaries = whole_int(s["boundaries"], "averager.boundaries")
    if "digest" in s:
        whole_int(s["digest"], "averager.digest", 0, (1 << averager._bits) - 1)
    if "fragment" in s:
        fragment = whole_int(s["fragment"], "averager.fragment", WHOLE, INT_MAX)
        if fragment >= len(averager.bounds):
            raise BadState(
                f"averager.fragment: {fragment} is beyond fragments {len(averager.bounds)} "
                "(saved with more --fragments?)"
            )
    residual = s.get("residual")
    if residual is not None:
        if options.compress == "none":
            raise BadState(
                "averager.residual: saved with compression (compress); this Sync has "
                "compress 'none'"
            )
        tensor_like(residual, "averager.residual", averager.ref)
        if s.get("residual2") is not None:  # (absent before the quantized all-reduce: zero)
            tensor_like(s["residual2"], "averager.residual2", averager.ref)
    elif options.compress != "none" and boundaries > 0:
        raise BadState(
            f"averager.residual: none after {boundaries} boundaries: saved with compress "
            f"'none'; this Sync has compress {options.compress!r}"
        )


def check_pending(p: Any, averager: Any) -> None:
    """A delayed average in flight (Sync.state_dict's "pending")."""
    if averager is None:
        raise BadState("pending: an average in flight, but this Sync averages nothing")
    p = mapping(
        p,
        "pending",
        ("averager", "common", "grad_bytes", "sync_period", "steps", "delay", "age"),
    )
    if why := pending_refusal(averager, p["averager"]):
        raise BadState(f"pending.averager: {why}")
    common = mapping(p["common"], "pending.common")
    allowed = {f.name for f in fields(BoundaryStats)} - _FILLED_AT_FINISH
    for name, value in common.items():
        if name not in allowed:
            raise BadState(f"pending.common: unknown key {str(name)[:40]!r}")
        if not isinstance(value, int | float | str | bool):
            raise BadState(f"pending.common.{name}: a {type(value).__name__}")
    whole_int(p["grad_bytes"], "pending.grad_bytes")
    whole_int(p["sync_period"], "pending.sync_period", 1, K_MAX)
    whole_int(p["steps"], "pending.steps", 0, K_MAX)
    delay = whole_int(p["delay"], "pending.delay", 1, K_MAX)
    whole_int(p["age"], "pending.age", 0, delay - 1)


def check_link(state: Any) -> None:
    """The link clock's jitter stream: a state random.Random takes."""
    state = mapping(state, "link", ("rng",))
    try:
        random.Random().setstate(state["rng"])
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadState(f"link.rng: not a random generator's state ({str(exc)[:60]})") from None
