"""The virtual clock (`--clock virtual`, docs/design.md §4): every time a run records is modelled,
never measured, and nothing sleeps.

`wall` is the engine as it is: times are read from the host (and device events) and the link
emulator holds collectives (trainer/engine/link.py). Under `virtual` the link is physically ideal
(no
hold) and this clock books what the link model says instead; the records, controllers, sinks
and reports read the booked figures, so a run is a pure function of its seed and settings.

The model, per rank r, in seconds on a virtual time line t[r] that every rank keeps for every
rank (the straggler schedule is a seeded function of the step, trainer/engine/straggler.py, so each
rank knows every rank's compute without a collective):

- compute of an optimizer step: c_r = compute_ms (+ r's injected straggler delay), split as
  forward c/3 and backward 2c/3 (backward costs about twice forward); the optimizer step is
  folded into them (0 s of its own).
- the gradient all-reduce of a synchronized backward (DDP): its B buckets of S/B bytes each
  become ready evenly through backward (bucket i at 1/B, 2/B, .. of it) on every rank; bucket
  i's ring starts once every rank has it and the link is free, and takes T(S/B, N) (latency
  counted per collective). DDP overlaps the buckets with backward; what is left after the
  slowest rank's backward is every rank's exposed wait (a fast rank also waits for the slow).
- any other collective (an averaging, trainer/engine/averaging.py): it starts once every rank has
  issued it and the link is free, and costs T(S, N) (where compressed: an all-to-all of its
  payload S and an all-gather of S/N, each (N − 1)/N·S per rank, trainer/engine/compress.py);
  a rank that waits for it is exposed for the rest (`wait`); a delayed average (τ > 0)
  overlaps the steps taken before its wait.
- `byte_scale` (--model-bytes over the model's parameter bytes) scales every collective's
  bytes, so a small model stands for a large one on the modelled link.
- jitter: drawn as LinkClock draws it (seeded, one draw per collective, in the same order on
  every rank).
- peer wait: the part of a rank's exposed wait spent before the slowest rank reached the
  collective (the last bucket ready, the averaging issued), the rest being the network's. Every
  rank knows every rank's time, so the mean over ranks is known without a collective; the
  records carry it (`peer_wait_seconds`) so that a K policy can tell a slow peer, which no K
  hides, from a slow link, which a larger K amortizes (docs/design.md §6, the exposed-sync
  policy).
"""

from __future__ import annotations

import math
import random
from typing import Any

from autok.trainer.engine.link import LinkProfile, LinkSchedule, phases
from autok.trainer.engine.straggler import Straggler, straggler_rank

CLOCKS = ("wall", "virtual")
FORWARD_SHARE = 1.0 / 3.0  # of a step's compute; the rest is backward (overlapped by buckets)
_PEER_KEYS = frozenset({"issued", "peer_wait", "own_peer_wait"})  # absent from older states


class VirtualClock:
    """One rank's copy of the run's modelled time line (identical on every rank)."""

    def __init__(
        self,
        plan: LinkSchedule,
        world_size: int,
        rank: int,
        seed: int,
        compute_ms: float,
        byte_scale: float = 1.0,
    ) -> None:
        self.schedule = plan
        self.profile: LinkProfile = plan.segments[0][1]
        self.world_size, self.rank = world_size, rank
        self.compute_seconds = compute_ms / 1e3
        self.byte_scale = byte_scale
        self.straggler: Straggler | None = None  # the loop's injected delays (booked, not slept)
        self._rng = random.Random(seed)
        self._t = [0.0] * world_size  # each rank's time
        self._link_free = 0.0
        self.booked = 0.0  # the completion of the last collective booked (an averaging)
        self._issued = 0.0  # when the last rank issued it (the slowest rank's time at book)
        self.peer_wait = 0.0  # mean over ranks, since take_peer_wait() last emptied it
        self.own_peer_wait = 0.0  # this rank's, likewise (ddp's records are this rank's own)

    def now(self) -> float:
        """This rank's virtual time (seconds since the run started)."""
        return self._t[self.rank]

    def latest(self) -> float:
        """The latest rank's time: the same on every rank, each keeping every rank's line,
        where `now()` differs between ranks until they next wait for one another."""
        return max(self._t)

    def advance(self, seconds: float) -> None:
        """Move the whole time line `seconds` on: after a divergence rollback restored the clock
        with the rest of a checkpoint, the time the discarded attempt took has still passed
        (docs/design.md §7, "a rollback's time"). The link's draws are not touched."""
        self._t = [x + seconds for x in self._t]
        self._link_free += seconds
        self.booked += seconds
        self._issued += seconds

    def move_to(self, step: int, epoch: int) -> LinkProfile:
        """The profile of the collectives booked from now on (as LinkClock.move_to)."""
        self.profile = self.schedule.at(step, epoch)
        return self.profile

    def _compute(self, step: int) -> list[float]:
        """Each rank's compute at global step `step`: compute_ms, plus the straggler's delay."""
        c = [self.compute_seconds] * self.world_size
        s = self.straggler
        if s is not None:
            slow = straggler_rank(s.mode, s.prob, s.seed, step, self.world_size)
            if slow is not None:
                c[slow] += s.ms / 1e3
        return c

    def _ring(self, nbytes: float, quantized: bool = False) -> float:
        """One collective's modelled duration (a quantized all-reduce's two phases: what
        crosses, trainer/engine/compress.py), jitter drawn per phase as LinkClock draws it."""
        p = self.profile
        duration = 0.0
        for seconds in phases(p, nbytes * self.byte_scale, self.world_size, quantized):
            duration += seconds
            if p.jitter_ms > 0:
                duration += self._rng.uniform(0.0, p.jitter_ms) / 1e3
        return duration

    def step(self, step: int, grad_bytes: int, buckets: int) -> tuple[float, float, float]:
        """Advance every rank by optimizer step `step`; `buckets` > 0: its backward all-reduced
        `grad_bytes` in that many collectives (DDP), else a local step. Returns this rank's
        (forward, backward, exposed gradient wait)."""
        c = self._compute(step)
        t = self._t
        me = self.rank
        forward, backward = c[me] * FORWARD_SHARE, c[me] * (1.0 - FORWARD_SHARE)
        if buckets <= 0:
            for r in range(self.world_size):
                t[r] += c[r]
            return forward, backward, 0.0
        free = self._link_free
        for i in range(1, buckets + 1):
            ready = max(t[r] + c[r] * (FORWARD_SHARE + (1 - FORWARD_SHARE) * i / buckets)
                        for r in range(self.world_size))  # fmt: skip
            free = max(ready, free) + self._ring(grad_bytes / buckets)
        self._link_free = free
        done = [t[r] + c[r] for r in range(self.world_size)]
        self._add_peer_wait([max(done) - x for x in done])  # ≤ each rank's wait: free ≥ ready
        wait = free - (t[me] + c[me])
        for r in range(self.world_size):
            t[r] = free  # every rank's optimizer step needs the last bucket
        return forward, backward, max(0.0, wait)

    def book(self, nbytes: int, quantized: bool = False) -> float:
        """A collective every rank issues now (an averaging; `quantized`: compressed, its two
        phases): its modelled completion time."""
        self._issued = max(self._t)
        start = max(self._issued, self._link_free)
        self._link_free = self.booked = start + self._ring(nbytes, quantized)
        return self.booked

    def wait(self, end: float) -> float:
        """Every rank waits for a collective booked to complete at `end`; this rank's exposed
        seconds."""
        # a rank's wait until the last rank issued it is for that peer, not for the link
        self._add_peer_wait([min(max(0.0, end - x), max(0.0, self._issued - x)) for x in self._t])
        exposed = max(0.0, end - self._t[self.rank])
        self._t = [max(x, end) for x in self._t]
        return exposed

    def _add_peer_wait(self, per_rank: list[float]) -> None:
        self.peer_wait += sum(per_rank) / self.world_size
        self.own_peer_wait += per_rank[self.rank]

    def take_peer_wait(self, own: bool = False) -> float:
        """The peer wait booked since the last take (one record's interval): the mean over
        ranks, as averaging records hold their times, or `own`, this rank's, as ddp's do."""
        seconds = self.own_peer_wait if own else self.peer_wait
        self.peer_wait = self.own_peer_wait = 0.0
        return seconds

    def state_dict(self) -> dict[str, Any]:
        return {
            "t": list(self._t),
            "link_free": self._link_free,
            "booked": self.booked,
            "rng": self._rng.getstate(),
            "issued": self._issued,
            "peer_wait": self.peer_wait,
            "own_peer_wait": self.own_peer_wait,
        }

    def check_state(self, state: Any) -> None:
        """A ValueError naming the first fault of a saved state; applies nothing. A state saved
        before the peer wait was booked (no `issued`, `peer_wait`) continues with them 0."""
        keys = {"t", "link_free", "booked", "rng"}
        if not isinstance(state, dict) or not keys <= set(state) <= keys | _PEER_KEYS:
            raise ValueError("virtual: not a virtual clock's state")
        t = state["t"]
        if not isinstance(t, list) or len(t) != self.world_size:
            raise ValueError(f"virtual.t: not {self.world_size} ranks' times")
        peer = [state[k] for k in sorted(_PEER_KEYS) if k in state]
        for x in [*t, state["link_free"], state["booked"], *peer]:
            if isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x < math.inf:
                raise ValueError(f"virtual: {x!r:.40} is not a time")
        rng = state["rng"]
        if not isinstance(rng, list | tuple) or len(rng) != 3:
            raise ValueError("virtual.rng: not a random.Random state")
        try:
            random.Random().setstate((rng[0], tuple(rng[1]), rng[2]))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"virtual.rng: {exc}") from None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self._t = [float(x) for x in state["t"]]
        self._link_free = float(state["link_free"])
        self.booked = float(state["booked"])
        self._issued = float(state.get("issued", 0.0))
        self.peer_wait = float(state.get("peer_wait", 0.0))
        self.own_peer_wait = float(state.get("own_peer_wait", 0.0))
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))


def training_seconds(summary: dict[str, Any]) -> float:
    """A run's training time on the clock its records read (summary.json): virtual_seconds
    under --clock virtual, else wall_seconds. Time objectives and reports rank by it, so a
    virtual sweep's front ranks the modelled time, not the machine's noise (docs/design.md §4)."""
    virtual = summary.get("virtual_seconds")
    return float(summary["wall_seconds"] if virtual is None else virtual)
