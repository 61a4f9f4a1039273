"""A launched averaging (trainer/engine/averaging.py): its record, built at start() and applied
by finish(), and its save and restore for a checkpoint taken while a delayed one is in flight
(docs/design.md §2, delayed averaging): `pending_state` keeps it as plain tensors and numbers,
`pending_refusal` says in one line why a saved one does not fit this averager (checked before
anything is applied), `restore_pending` launches it again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from autok.trainer.engine.exact_sums import N_SCALARS
from autok.trainer.engine.fragments import WHOLE

if TYPE_CHECKING:
    from autok.trainer.engine.averaging import ParameterAverager


@dataclass(slots=True)
class Pending:
    """A boundary whose collective has been launched (built by keyword: 20 fields)."""

    avg_tensors: list[torch.Tensor]  # [parameter pieces | gradients | averaged extras]; the
    # pieces travel as θ_i − θ_ref with delta_form
    bc_tensors: list[torch.Tensor]
    n_grads: int
    n_avg: int
    n_bc: int
    lr: float
    overlap: bool
    fragment: int = WHOLE  # the fragment it moves (trainer/engine/fragments.py), or the whole model
    start: int = 0  # [start, end) of the flat parameter vector it moves
    end: int = 0
    n_pieces: int = 0  # parameter pieces at the head of avg_tensors
    delta_form: bool = False  # the pieces travel as θ_i − θ_ref (see ParameterAverager.start)
    decayed: bool = False  # start() took the outer step's μ·v (see outer_step_)
    # [lo, hi) of the flat vector taking the outer step where that is not all it moves: an
    # unscheduled sync (empty) or an epoch end where one fragment was due (docs/design.md §2)
    outer_at: tuple[int, int] | None = None
    # fused: (momentum buffers, their gradient views in the buffer), paired in start()
    momenta: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
    future: torch.futures.Future | None = None
    seconds: float = 0.0  # this rank's time spent in start()
    nbytes: int = 0  # what this rank put on the wire
    compressed: bool = False
    # how it lands, delayed (docs/design.md §2, the merge): lerp's α, or None: keep
    merge_alpha: float | None = None


def pending_state(averager: ParameterAverager, pending: Pending) -> dict:
    """A launched (delayed) averaging as plain tensors and numbers, for a checkpoint taken
    while it is in flight: waits for the collective and keeps its reduced buffer (a
    compressed one decoded already) and the snapshot of what this rank sent;
    `restore_pending` rebuilds it. The averaging itself is untouched: finish() applies it
    as if nothing had been saved."""
    if pending.future is not None:
        pending.future.wait()
    reduced = averager.flat.buf.clone()
    n = pending.n_avg + pending.n_bc
    return {
        "reduced": reduced,
        "snapshot": averager.flat.snapshot[:n].clone() if pending.overlap else None,
        "n_grads": pending.n_grads,
        "n_avg": pending.n_avg,
        "n_bc": pending.n_bc,
        "lr": pending.lr,
        "overlap": pending.overlap,
        "fragment": pending.fragment,
        "nbytes": pending.nbytes,
        "compressed": pending.compressed,
        "merge_alpha": pending.merge_alpha,  # how it lands: lerp's α, or None (keep)
    }


def pending_refusal(averager: ParameterAverager, state: object) -> str | None:
    """Why `restore_pending` cannot take this saved averaging (its keys, kinds and sizes
    against this model and these options), or None; checked before anything is applied."""
    keys = ("reduced", "snapshot", "n_grads", "n_avg", "n_bc", "lr", "overlap", "fragment")
    if not isinstance(state, dict) or (missing := [k for k in keys if k not in state]):
        return f"no {missing[0]!r}" if isinstance(state, dict) else "not a dict"
    ints = ("n_grads", "n_avg", "n_bc", "fragment", "nbytes")
    if any(type(state.get(k, 0)) is not int for k in ints):
        return f"{', '.join(ints)}: integers"
    if state["n_grads"]:
        return "a fused boundary is never delayed; this state is not one to resume"
    if not WHOLE <= state["fragment"] < len(averager.bounds):
        return f"fragment {state['fragment']} is beyond fragments {len(averager.bounds)}"
    if type(state["overlap"]) is not bool or type(state.get("compressed", False)) is not bool:
        return "overlap, compressed: booleans"
    if type(state["lr"]) not in (int, float):
        return f"lr: {state['lr']!r:.40} is not a number"
    saved = state.get("merge_alpha")  # (absent before the lerp merge: keep)
    if saved is not None and type(saved) not in (int, float):
        return f"merge_alpha: {saved!r:.40} is not a number"
    if saved != averager.merge_alpha:
        said = "keep" if saved is None else f"lerp with α = {saved!r:.20}"
        now = "keep" if averager.merge_alpha is None else f"lerp with α = {averager.merge_alpha:g}"
        return f"merge: saved in flight with --fragment-merge {said}; this Sync lands it with {now}"
    _, _, _, avg_tensors, bc_tensors = averager._moved(state["fragment"], [])
    n_avg, n_bc = state["n_avg"], state["n_bc"]
    if sum(t.numel() for t in avg_tensors) != n_avg or (sum(t.numel() for t in bc_tensors) != n_bc):
        return "the saved averaging does not fit this model and these options"
    for name, numel in (("reduced", n_avg + n_bc + N_SCALARS), ("snapshot", n_avg + n_bc)):
        t = state[name]
        if t is None and name == "snapshot" and not state["overlap"]:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != averager.ref.dtype or t.shape != (numel,):
            return f"{name}: not a {averager.ref.dtype} tensor of {numel} elements"
    return None


def restore_pending(averager: ParameterAverager, state: dict) -> Pending:
    """The averaging `pending_state` saved, ready for finish() (call after the parameters
    and load_state_dict)."""
    if why := pending_refusal(averager, state):
        raise ValueError(why)
    a, b, pieces, avg_tensors, bc_tensors = averager._moved(int(state["fragment"]), [])
    n_avg, n_bc = int(state["n_avg"]), int(state["n_bc"])
    reduced = state["reduced"].to(averager.ref.device)
    averager.flat.buffer(reduced.numel()).copy_(reduced)
    if state["snapshot"] is not None:
        averager.flat.keep_sent(state["snapshot"].to(averager.ref.device))
    return Pending(
        avg_tensors=avg_tensors,
        bc_tensors=bc_tensors,
        n_grads=0,
        n_avg=n_avg,
        n_bc=n_bc,
        lr=float(state["lr"]),
        overlap=bool(state["overlap"]),
        fragment=int(state["fragment"]),
        start=a,
        end=b,
        n_pieces=len(pieces),
        nbytes=int(state["nbytes"]),
        compressed=bool(state["compressed"]),  # Δ was sent; already decoded
        merge_alpha=averager.merge_alpha,  # what the saved one says (pending_refusal)
    )
