"""Streaming fragment sync (`--fragments F`, `--fragment-delay τ`): *which* part of the model a
boundary moves, and *when*. Pure functions; the engine (trainer/engine/sync.py) follows them and the
averager (trainer/engine/averaging.py) moves the slice.

**The split.** The parameters, flattened in `model.parameters()` order (the averager's flat
vector of N elements), are cut into F contiguous fragments of near-equal element count:
fragment j is [⌊j·N/F⌋, ⌊(j+1)·N/F⌋), so sizes differ by at most one element and a cut may
fall inside a tensor. F ≤ N (an empty fragment would sync nothing). That is `--fragment-by
element`; `module` cuts only between parameter tensors (near-equal bytes), and `strided` gives
fragment j every F-th tensor from j, laid out fragment by fragment (`fragment_plan`): F ≤ T, the
number of parameter tensors, for both.

**The schedule.** Counting p = 1, 2, ... the optimizer steps since the last sync of the whole
model (an epoch end, `sync_now()`), fragment j syncs at the steps where p − o_j is a multiple
of K, with offsets o_j = ⌊j·K/F⌋ (the floor when K/F is not an integer; o_0 = 0, so fragment 0
syncs at p = K, 2K, ... exactly as the whole model does with F = 1). This needs K ≥ F: the
offsets are then distinct, each step syncs at most one fragment, and the gap between two
consecutive fragment syncs is ⌊K/F⌋ or ⌈K/F⌉ steps. Fragments sync in the cyclic order
1, 2, ..., F−1, 0, 1, ...; position q = 1..F of a round syncs fragment q mod F after
gap(q) = o_q − o_{q−1} steps (o_F = K).

The engine walks the round by gaps (`fragment_gap`), never by p mod K: when the controller
changes K at a boundary, the *next* gap is measured with the new K, and every fragment still
syncs once per F fragment boundaries, in the same order. With K constant the walk gives exactly
the formula above (`tests/test_fragments.py`). Whenever the K in force is below F (warmup's
K = 1, a controller's lower K, the epoch-length cap) a boundary syncs the whole model, as
F = 1 would, and the next round starts from position 1.

Those are scheduled syncs, and take the outer step on what they move. A whole-model sync the
schedule did not make due (`sync_now()`, an epoch end) averages and takes none, except on the
fragment due at that step, if any (docs/design.md §2, "Unscheduled syncs"): a fragment synced
a step before moves no further than the replicas' mean.
"""

from __future__ import annotations

import bisect
from typing import Any

FRAGMENTS_MAX = 1024  # more fragments only add per-sync latency; every built-in model is larger
WHOLE = -1  # the fragment id of a boundary that synced the whole model (records: "fragment")


def fragment_bounds(numel: int, fragments: int) -> list[tuple[int, int]]:
    """[start, end) of each fragment of a flat vector of `numel` elements."""
    if not 1 <= fragments <= numel:
        raise ValueError(f"{fragments} fragments of {numel} elements: need 1 <= F <= N")
    cuts = [j * numel // fragments for j in range(fragments + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


FRAGMENT_BY = ("element", "module", "strided")


def tensor_bounds(nbytes: list[int], fragments: int) -> list[int]:
    """Cuts c_0 = 0 < c_1 < ... < c_F = T between whole tensors (tensors [c_j, c_{j+1}) form
    fragment j), each c_j the tensor boundary nearest j·B/F bytes (B the total) that leaves
    every fragment at least one tensor. Needs 1 <= F <= T."""
    count = len(nbytes)
    if not 1 <= fragments <= count:
        raise ValueError(f"{fragments} fragments of {count} parameter tensors: need 1 <= F <= T")
    ends = [0]
    for size in nbytes:
        ends.append(ends[-1] + size)
    total, cuts = ends[-1], [0]
    for j in range(1, fragments):
        target = j * total / fragments
        lo, hi = cuts[-1] + 1, count - (fragments - j)  # room for the fragments still to come
        c = bisect.bisect_left(ends, target)  # ends rise: the nearest is c − 1 or c, clamped
        near = min((c - 1, c), key=lambda i: abs(ends[min(max(i, 0), count)] - target))
        cuts.append(min(max(near, lo), hi))
    return [*cuts, count]


def fragment_plan(
    numels: list[int], element_sizes: list[int], fragments: int, by: str = "element"
) -> tuple[list[int], list[tuple[int, int]]]:
    """The order in which the averager lays the parameter tensors into its flat vector (a
    permutation of 0..T−1), and [start, end) of each fragment in that vector, by `by`:
    element: model order, fragment_bounds (near-equal element counts, a cut may fall inside a
    tensor). module: model order, cut only between tensors (tensor_bounds, near-equal bytes).
    strided: fragment j holds tensors j, j + F, j + 2F, ... (the papers' interleaving, by
    parameter tensor), laid out fragment after fragment so each is still one slice of the
    flat vector: the averager moves slices only."""
    numel = sum(numels)
    identity = list(range(len(numels)))
    if by == "element":
        return identity, fragment_bounds(numel, fragments)
    if by == "module":
        cuts = tensor_bounds([n * e for n, e in zip(numels, element_sizes, strict=True)], fragments)
        order = identity
    elif by == "strided":
        if not 1 <= fragments <= len(numels):
            raise ValueError(
                f"{fragments} fragments of {len(numels)} parameter tensors: need 1 <= F <= T"
            )
        groups = [identity[j::fragments] for j in range(fragments)]
        order = [i for g in groups for i in g]
        cuts = [0]
        for g in groups:
            cuts.append(cuts[-1] + len(g))
    else:
        raise ValueError(f"fragments by {by!r}: choose from {FRAGMENT_BY}")
    starts = [0]
    for i in order:
        starts.append(starts[-1] + numels[i])
    bounds = [(starts[a], starts[b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    return order, bounds


def fragment_offsets(sync_period: int, fragments: int) -> list[int]:
    """o_j = ⌊j·K/F⌋, j = 0..F−1: fragment j syncs where (p − o_j) is a multiple of K."""
    return [j * sync_period // fragments for j in range(fragments)]


def fragment_at(step: int, sync_period: int, fragments: int) -> int | None:
    """The fragment that syncs at the `step`-th step (from 1) after a whole-model sync, with K
    constant and K ≥ F; None where no fragment syncs. The schedule's definition."""
    if sync_period < fragments:
        raise ValueError(f"K = {sync_period} < F = {fragments}: no fragment schedule")
    r = step % sync_period
    offsets = fragment_offsets(sync_period, fragments)
    return offsets.index(r) if r in offsets else None


def fragment_gap(position: int, sync_period: int, fragments: int) -> int:
    """Steps from the previous sync to the sync at `position` q (1..F) of a round, which syncs
    fragment q mod F: o_q − o_{q−1} with o_F = K. Needs K ≥ F (every gap is then ≥ 1)."""
    if not 1 <= position <= fragments <= sync_period:
        raise ValueError(f"position {position} of F = {fragments} fragments with K = {sync_period}")
    return position * sync_period // fragments - (position - 1) * sync_period // fragments


def walk(steps: int, sync_periods: list[int] | int, fragments: int) -> list[int | None]:
    """What the engine does over `steps` steps with no epoch end: per step, the fragment synced
    (WHOLE for the whole model, None for a local step). `sync_periods` is K per step (the K in
    force when the step starts), or one K for all. For tests and planning."""
    ks = [sync_periods] * steps if isinstance(sync_periods, int) else sync_periods
    out: list[int | None] = []
    since, position = 0, 1
    for k in ks[:steps]:
        since += 1
        if k < fragments or fragments == 1:
            due, frag = since >= k, WHOLE
        else:
            due, frag = since >= fragment_gap(position, k, fragments), position % fragments
        if not due:
            out.append(None)
            continue
        out.append(frag)
        since = 0
        position = 1 if frag == WHOLE else position % fragments + 1
    return out


def tensors_refusal(model: Any, fragments: int, by: str) -> str | None:
    """Why `fragments` fragments by `by` cannot cut this model, or None: module and strided
    fragments hold whole parameter tensors, so F is at most their count T
    (`fragment_plan`). `model`: an nn.Module (this module imports no torch: the CLI's checks
    read it before torch is needed)."""
    count = sum(1 for _ in model.parameters())
    if by == "element" or fragments <= count:
        return None
    return (
        f"--fragments: {fragments} fragments by {by} of a model with {count} parameter "
        f"tensors; give at most {count}, or --fragment-by element"
    )
