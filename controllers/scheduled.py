"""`scheduled`: K set in advance by step (`--k-schedule 16,32@step=160,16@step=352`).

For a run whose phases are known beforehand (a link that changes at a known time, an LR that
decays at a milestone), and for the controller panel's bound on what any policy could do there:
the best K per phase in hindsight is the best such schedule, and an online policy that follows
the phases can at most match it (docs/design.md §6, Judging a policy).

Exact by construction: K changes where the schedule says, not at the first boundary after it.
The boundary closing step g decides the interval from step g + 1, so K there is the segment's,
cut short where the next segment starts (16 from step 150 with a change at 160: 10), and the
last interval before a change ends on the step before it. That needs the decision before the
interval starts: a delayed average (--fragment-delay, --overlap-boundary) decides it steps
late, and a fragment boundary syncs part of the model, so those are refused with it
(trainer/engine/options.py). Steps, not epochs: a policy sees the steps the engine counts, and a
loop's epochs are its own (with N steps an epoch, epoch e starts at step e·N).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision

SCHEDULE_MAX_SEGMENTS = 64  # as a link schedule's (trainer/engine/link.py)
STEP_DIGITS = 12  # a step beyond 10^12 is never reached; bounds what a config can make us parse
K_DIGITS = 7  # K_MAX = 2^20 has 7 digits

Schedule = tuple[tuple[int, int], ...]  # (first step, K), the first at step 0, steps increasing


def parse_k_schedule(text: str) -> Schedule:
    """`16,32@step=160,16@step=352`: K from step 0, then K from each step; a ValueError says
    what is wrong (without the flag: the caller names it)."""
    parts = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in parts):
        raise ValueError("give K,K@step=N,... (e.g. 16,32@step=160,16@step=352)")
    if len(parts) > SCHEDULE_MAX_SEGMENTS:
        raise ValueError(f"at most {SCHEDULE_MAX_SEGMENTS} segments (got {len(parts)})")
    out: list[tuple[int, int]] = []
    for i, part in enumerate(parts):
        k_text, at, where = part.partition("@")
        k = _digits(k_text.strip(), K_DIGITS)
        if k is None or k < 1:
            raise ValueError(f"{part[:60]!r}: K must be a whole number >= 1")
        if i == 0:
            if at:
                raise ValueError(f"the first K applies from step 0: drop @{where[:40]}")
            out.append((0, k))
            continue
        unit, _, n_text = where.partition("=")
        if unit.strip() == "epoch":
            raise ValueError(
                f"{part[:60]!r}: a K schedule counts steps (a policy sees the engine's steps, "
                "not a loop's epochs): give K@step=N, with N = epoch x steps per epoch"
            )
        n = _digits(n_text.strip(), STEP_DIGITS)
        if unit.strip() != "step" or n is None:
            raise ValueError(f"{part[:60]!r}: give K@step=N")
        if n <= out[-1][0]:
            raise ValueError(f"{part[:60]!r}: steps must increase, starting above 0")
        out.append((n, k))
    return tuple(out)


def _digits(text: str, most: int) -> int | None:
    # ASCII digits only: str.isdigit() also takes '٣' (which int() reads as 3) and '²'
    if not text or len(text) > most or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def segment_at(schedule: Schedule, step: int) -> tuple[int, int, int | None]:
    """(the first step of the segment holding `step`, its K, the next segment's first step or
    None)."""
    first, k = schedule[0]
    for start, seg_k in schedule:
        if start > step:
            return first, k, start
        first, k = start, seg_k
    return first, k, None


def k_at(schedule: Schedule, step: int) -> tuple[int, int]:
    """(K for the interval that starts at `step`, the segment's first step): the segment's K,
    cut short so that the interval ends where the next segment starts."""
    first, k, nxt = segment_at(schedule, step)
    return cut(k, nxt, step), first


def cut(k: int, nxt: int | None, step: int) -> int:
    """A segment's K for the interval from `step`, cut short to end before `nxt` (if any)."""
    return k if nxt is None else min(k, nxt - step)


def never_applies(schedule: Schedule, steps: int) -> str | None:
    """What a run of `steps` steps never reaches of the schedule, in words, or None: no error
    (a loop's length is its own, and a resumed run with more epochs would reach it), but a user
    should not find out from the K path."""
    late = [f"K {k} from step {step}" for step, k in schedule if step >= steps]
    if not late:
        return None
    verb = "never applies" if len(late) == 1 else "never apply"
    return f"{', '.join(late)} {verb}: the run has {steps} steps"


@dataclass
class ScheduledController:
    schedule: Schedule
    max_sync_period: int = 64
    sync_period: int = field(init=False)
    step: int = 0  # the first step of the interval the last decision was for

    def __post_init__(self) -> None:
        self.sync_period = min(k_at(self.schedule, 0)[0], self.max_sync_period)

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        self.step = step = stats.global_step + 1  # the next interval's first step
        first, seg_k, nxt = segment_at(self.schedule, step)
        k = cut(seg_k, nxt, step)
        self.sync_period = min(k, self.max_sync_period)
        why = f"scheduled: K {seg_k} from step {first}"
        if k < seg_k:
            why += f", {k} to end before step {nxt}"
        if self.sync_period < k:
            why += f", capped at {self.max_sync_period}"
        return SyncDecision(self.sync_period, why)

    def rollback(self, sync_period: int) -> None:
        """After a divergence rollback, for the rest of the run: K at most the halved K (the
        trainer's), or half the segment's where the K in force was cut short to end it (a cut
        to 2 would otherwise hold every later segment at 1)."""
        seg_k = segment_at(self.schedule, self.step)[1]
        self.max_sync_period = max(1, sync_period, min(self.max_sync_period, seg_k) // 2)
        self.sync_period = min(sync_period, self.max_sync_period)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sync_period": self.sync_period,
            "max_sync_period": self.max_sync_period,
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
        self.max_sync_period = int(state["max_sync_period"])
        self.step = int(state.get("step", 0))
