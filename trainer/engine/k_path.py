"""`Sync.k_path`: the seconds, boundaries and steps spent at each K, in the order K was first used
(the run summary's `k_path`, docs/design.md §7). Counted at every boundary's close; ddp's fast
close (trainer/engine/ddp_path.py) keeps its K = 1 sums as two numbers of the Sync instead, folded
in when the path is read (docs/design.md §4, Per step)."""

from __future__ import annotations

KPath = dict[int, dict[str, float]]  # K -> {"seconds", "boundaries", "steps"}


def add_to_path(path: KPath, k: int, seconds: float, boundaries: int, steps: int) -> None:
    """Count boundaries at K into a K path, K added where it is new."""
    at_k = path.get(k)
    if at_k is None:
        at_k = path[k] = {"seconds": 0.0, "boundaries": 0, "steps": 0}
    at_k["seconds"] += seconds
    at_k["boundaries"] += boundaries
    at_k["steps"] += steps
