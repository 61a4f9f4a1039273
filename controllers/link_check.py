"""A changed link met SHIFT_ROUNDS rounds after it changes, not a window later: the check the
exposed-sync controller runs on each closed round (controllers/exposed_sync.py).

A changed link (`link_shift`, off by default; docs/design.md §6, "a changed link"): a window of
`window` rounds decides once it is full, so a link that changes in its middle is first judged on
a mix of both links and met a window later, and at K = 15 a window of 4 rounds is 60 steps, the
whole of the GPT flip-link regime's last LAN phase (K stayed 15 there). Each closed round's
network time is compared with the window's level, the median of its rounds so far (after a
decision, the median of the window that made it): a round more than `link_shift` times above it,
or below it by `link_drop` (by `link_shift` where that is 0), is held apart, and SHIFT_ROUNDS
such rounds in a row, one way, are a changed link: the window closes there, from those rounds
alone (its reason says "link changed").
A round back at the level (or off it the other way) puts the held rounds into the window's sums
(not into its level: one spike does not move a median), so where no two rounds in a row leave the
level the decisions are the ones the check off would make, but that a window holds `window`
rounds at its level before it closes (held rounds do not count until they rejoin it): one round
off the level delays it by a round. On the virtual clock a static link's rounds all cost the
same: there the check never fires, and the panel's static regimes are what they were, bit for bit.
On the wall clock, where the wait for a slow rank is not told apart from the network's and grows
with K, a move of K by more than `link_shift` can read as a changed link: the window then closes
two rounds into the new K, from those rounds, rather than after `window` of them. A level of 0
(sync all hidden) reads nothing. It is off by default: on the panel's flip-link (α = 1 shards)
K reached the WAN's soft cap two rounds sooner, the skew judgement's first window then sat right
after the LAN phase at K = 1, where the local momenta have not yet diverged, and read α = 1 as
iid in some seeds (1.32 against the 1.4 threshold on seed 79), so K rose past the cap: 0.88 of the
best fixed K's time against 0.83 with the check off; on flip-wan it gained (1.15 against 1.21),
on the GPT's flip-link it was neutral (docs/controller-panel/link-follow-check/).

A faster link (`link_drop`; autok's settings make it 3): the check's downward half alone. A link
that got faster is met SHIFT_ROUNDS rounds after it changes, and a slower one a window after, as
without the check. The two directions differ in what a late answer costs: a K kept too small on a
link that slowed costs time, and the panel's flip-link lost its win where K met the WAN sooner
(above); a K kept too large on a link that got faster buys nothing (the sync it saves is nearly
free there) and costs quality: on the GPT flip-link regime (AdamW) K = 15 ran the whole last LAN
phase, where K = 2 is best, and seed 83 ended 0.01 over the target it missed; with the check on
both ways it reached it (docs/design.md §6, "a faster link"). On the wall clock the caveat above
holds for this half too: a K lowered by more than `link_drop` can close the next window two rounds
into the new K, from those rounds, which measure the new K's own share.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from autok.controllers.window import Window, saved_flag, saved_number, saved_window, window_state

# A changed link is read from this many rounds in a row whose network time is off the window's
# level, in the same direction, by more than `link_shift` (slower) or `link_drop` (faster)
# (docs/design.md §6, "a changed link", "a faster link"): one round alone may be a spike of the
# network, which the window averages over as before
SHIFT_ROUNDS = 2


@dataclass
class LinkCheck:
    """The rounds held apart as off the window's level, their direction, and the level the last
    decision left; `shift` reads a slower link, `drop` a faster one (`shift` where it is 0)."""

    shift: float = 0.0  # `link_shift`: over the level by this (0: off)
    drop: float = 0.0  # `link_drop`: under it by this (0: by `shift`)
    held: Window = field(default_factory=Window)  # rounds in a row off the window's level
    held_up: bool = False  # their direction
    # network seconds a round in the last decision's window: the level a new window's first
    # rounds are compared with (a spike that opened a window would otherwise set its level)
    level: float | None = None

    def rejoin(self, win: Window) -> None:
        """The rounds held apart go back into the window's sums, not into its level (one spike
        does not move a median)."""
        self.held.per_round = []
        win.merge(self.held)
        self.held = Window()

    def decided(self, w: Window) -> None:
        """A decision was made on `w`: its rounds' median is the level the next window's first
        rounds are compared with (where it had rounds)."""
        self.level = w.level() if w.per_round else self.level

    def take(self, rnd: Window, win: Window, needed: int) -> str | None:
        """The closed round `rnd` joins `win`, or, where its network time is over the window's
        level by more than `shift` or under it by more than `drop` (by `shift` where `drop` is
        0), the rounds held apart; SHIFT_ROUNDS of those in a row in one direction are a
        changed link: what that says, else None. A round back at the level (or off it the other
        way) puts the ones held apart back in the window's sums (not its level), which then
        hold what they would have without this check. `needed`: the rounds `win` closes at."""
        level = self.level_now(win)
        drop = self.drop if self.drop > 0 else self.shift
        timed = math.isfinite(rnd.exposed - rnd.peer)
        if not timed:
            rnd.per_round = []  # no time to compare, nor to set a level with
        if drop <= 0 or not level or needed <= SHIFT_ROUNDS or not timed:
            # off, nothing to compare with (no level, or none: sync all hidden), a window this
            # short, which the check would not close sooner, or a round without a measured time
            # (read as no network time, it is no faster link); any held rounds rejoin it
            self.rejoin(win)
            win.merge(rnd)
            return None
        up = self.shift > 0 and rnd.network > level * self.shift
        down = rnd.network * drop < level
        if (not up and not down) or (self.held.rounds and up != self.held_up):
            self.rejoin(win)
            if not up and not down:
                win.merge(rnd)
                return None
        self.held.merge(rnd)
        self.held_up = up
        if self.held.rounds < SHIFT_ROUNDS:
            return None
        now = self.held.level() or 0.0
        return (
            f"link changed: network {now * 1e3:.3g} ms a round over {self.held.rounds} "
            f"rounds, {level * 1e3:.3g} ms before"
        )

    def level_now(self, win: Window) -> float | None:
        """The level a closed round is compared with. With `shift` a round off it either way is
        held apart, so the window's rounds are at its level: their median (the last decision's
        level before the first). With `drop` alone a slower round joins the window, and a spike
        that opens one would set its level, so that the rounds after it read as a faster link:
        the last decision's level votes with the window's rounds, and the lower median of them
        is the level (one spike, or half the rounds, cannot lift it)."""
        if self.shift > 0:
            return win.level() if win.per_round else self.level
        rounds = win.per_round + ([self.level] if self.level else [])
        return statistics.median_low(rounds) if rounds else None

    def state_dict(self) -> dict[str, Any]:
        """Its part of the controller's state (keys as the controller saved them before)."""
        return {"shifted": window_state(self.held), "shift_up": self.held_up, "level": self.level}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From the controller's state; one saved before the check held nothing apart."""
        self.held = saved_window(state.get("shifted", {}))
        self.held_up = saved_flag(state, "shift_up")
        self.level = saved_number(state, "level")
