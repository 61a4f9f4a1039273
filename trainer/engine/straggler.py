"""Injected stragglers (`--straggler`, `--straggler-ms`, `--straggler-prob`): which rank is slow
at a step, for the regime where a large K hides a slow peer: its peers wait for it once per K
steps instead of at every step (docs/design.md §2, Regimes).

- `slow-rank`: the last rank takes `ms` longer at every step (a slower machine);
- `random`: at each step, with probability `prob`, one rank drawn at random takes `ms` longer
  (a transient slowdown: a noisy neighbour, a garbage collection).

The draw is a pure function of the seed and the global step, so every rank computes the same
schedule with no collective, and a resumed run continues it exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def straggler_rank(mode: str, prob: float, seed: int, step: int, world_size: int) -> int | None:
    """The rank that is slow at global step `step` (0-based), or None."""
    if mode == "slow-rank":
        return world_size - 1
    if mode == "random":
        # a string seed is hashed with SHA-512: the same draw in every process (PYTHONHASHSEED
        # does not enter), independent of every other generator of the run
        rng = random.Random(f"autok-straggler:{seed}:{step}")
        if rng.random() < prob:
            return rng.randrange(world_size)
    return None


@dataclass(frozen=True)
class Straggler:
    """The schedule as one rank sees it: `seconds(step)` is this rank's extra delay."""

    mode: str
    ms: float
    prob: float
    seed: int
    rank: int
    world_size: int

    def seconds(self, step: int) -> float:
        slow = straggler_rank(self.mode, self.prob, self.seed, step, self.world_size)
        return self.ms / 1000.0 if slow == self.rank else 0.0
