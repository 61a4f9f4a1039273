"""`exposed-sync`: the K at which waiting for the network is a target share of the time; back off
on drift or a rising loss.

The study's practical rule ("increase K until exposed synchronization no longer dominates the
epoch, then stop before accuracy degrades") made online. Over a window of boundaries since the
last change, the network share f = Σnetwork / Σ(compute + network), where network time is the
exposed sync less the wait for a slower peer (`BoundaryStats.peer_wait_seconds`): a slow rank
makes every K wait alike, so its wait says nothing about K (in the controller panel's slow-rank
and stragglers regimes the whole exposed share raised K to 32 where K = 1 was best).

Predicting f at another K assumes the per-boundary sync cost s is constant and compute grows
with K: f = s/(Kc + s), so with r = f/(1 − f) = s/(Kc), f(K/g) = g·r / (1 + g·r), and the K that
brings the share to the target is K* = s/(c·r_t) = K·r/r_t (r_t = target/(1 − target)). The K
there is the length of the rounds the share was measured over: the window's mean steps a round,
K̄, which is below K where rounds were cut short. Every epoch ends with a boundary, so on the
controller panel's flip-wan (32-step epochs) a window at K = 28 (the skew-power check's power
arm) held rounds of 8, 28, 4 and 28 steps (K̄ = 17), and K·r/r_t read the slow WAN's K* as 103
where s/(c·r_t) is 62.5. With one sync a round K̄·r/r_t is exact under the model whatever cut
the rounds; with F > 1 fragments a cut round pays its fragments' syncs and a whole-model one, so
s is not one round's constant there.

`rule="direct"` (the default) jumps to K*: at the first post-warmup boundary, or the second
without warmup (the link model's K from that boundary's measured times, rather than a window at
the starting K: "The first boundary", below), then once per
window when K* is more than `margin` away (hysteresis), up or down, so a new link is met in one
window rather than log2 of the gap. With `lower` (the default) K may fall to 1 (or `k_floor`), a
fast link's best K in the panel; without it, not below the starting K (the floor). Unless told
otherwise it starts at its floor, K = 1 under SGD (trainer/engine/options.py): the first boundary
is then one step, and where K = 1 is best the run is K = 1's bit for bit. Started at 4, its first
four steps alone made the panel's straggler runs cross the target at 0.71-1.15x fixed K = 1's
time, seed by seed.

The first boundary: the run's first round (boundary 0) never enters the link's measurement. A
record is packed before its own averaging runs, so it holds the previous boundary's averaging
(controllers/base.py, BoundaryStats), and boundary 0 has none before it: its exposed time is the
gradient all-reduce of a two-phase boundary step alone (half the sync under AdamW: on the GPT
workload 0.062 s against 0.124 s at every later boundary, so the first K* read 12.4 where the
next window read 25.7), and nothing at all on a fused boundary or under `localsgd` (a share of 0,
so K held at its floor for a whole window). The first estimate is therefore the second
boundary's record (after warmup, the first post-warmup one, which holds warmup's last averaging).
With F fragments the whole first round (boundaries 0 to F − 1) is left out, so that the first
estimate comes a round in at any F: its other records each hold a fragment's averaging, but at
F = 1 the first round is boundary 0 alone. A round is the run's first where it holds every record
since boundary 0 (warmup's are in no round).

`rule="double"` steps instead: f > target: K ← min(K·growth, ceiling); f ≤ target: hold, or with
`lower`, K ← K/growth when even that keeps the share well under target (predicted f(K/g) <
target·(1 − margin)).

Under either rule the guard (drift ratio or loss, controllers/guard.py) judges its own window of
at least `window` rounds and GUARD_MIN_STEPS steps; when it fires, K ← max(K/growth, k_floor), and
K may not exceed that value until `cooldown` rounds pass without it firing again (on skewed
data, for the rest of the run: below). A raise by
more than `margin` re-baselines the loss guard once: its next judged window sets the level
instead of being compared with the best window at the smaller K. A larger K runs at a higher
training loss from its first window (each replica's steps start further from the average), and
compared across the raise the guard backed off every raise on a link that had just slowed (the
panel's flip-link and flip-wan: K 8 → 4 → 2 → 1 within three windows of the WAN's start). A rise
at one K still fires it; a K raised again in every judged window (a link that swings by more than
the margin each window) leaves only the drift guard.

A back-off on skewed data (below) holds for the rest of the run: once the data is judged skewed,
the ceiling a back-off sets does not lift when the cooldown ends. There the soft cap, not the
link, bounds K, and a back-off says the shards do not bear the K it left; the K a drift-bound run
bears falls as its loss falls (AdaComm's τ* ∝ √F), so K does not go back to it. On the panel's
seeds 253–262 two skew-wan runs of ten diverged within an epoch of K going back from 3 to the
cap's 6, the K the guard had left three epochs before (accuracy 0.81 → 0.35 and 0.89 → 0.53);
held, every seed reached the target; on new seeds 263–272 no run diverged under either rule,
and held it reached the target in every seed, as the old rule did, at 0.974× (0.940–1.009) its
time (docs/design.md §6, "a back-off on skewed data"). The costs: a run held low for its last
epochs takes longer to end (a second back-off holds K at the floor: five of those ten skew-wan
runs ended at K = 1), and a slower link after such a back-off is not followed above the ceiling.

Heterogeneous data: on label-skewed shards the replicas disagree far more than on iid shards at
the same K, and that drift grows with K (FedAvg, SCAFFOLD), so the link's K* can miss the quality
target altogether (the controller panel's skew-wan regime: at K* ≈ 11 no seed reached it). The
first `window` rounds (and 32 steps) in a row at K ≥ 2 give the mean drift ratio once (a round at
K = 1 starts the count again; a non-finite mean does not judge): above `skew_drift` the data
counts as heterogeneous for the rest of the run, at or under it as iid. On the panel's pilot
seeds the first 32 steps at fixed K gave 0.7–0.8 (K = 4) and 0.55–0.65 (K = 16) on iid shards,
2.0–2.4 (K = 4) and 1.3–1.7 (K = 16) on Dirichlet shards (α = 1 and 0.1): 1.4 lies between. A
round at K = 1 does not judge: the replicas start every step together, and the ratio reads 0.9
on the same Dirichlet shards. The drift ratio falls with K on skewed data (a larger K's averaged
update is longer), so with a first judged K far above 16 mild skew may go undetected; a later
window would mix skew with the rise of drift late in any run, so it is judged once.

Until it is judged, the soft cap bounds any rise above the current K, as if the data were
skewed: a jump from K = 1 to the WAN's K* ≈ 8–12 on skewed shards (the panel's flip-link, where
the LAN phase ran at K = 1 and left skew unjudged) dropped test accuracy from 0.76–0.80 to
0.43–0.62 within an epoch in three of five seeds, while on iid data the provisional cap costs a
window or two below K* (the panel's iid-wan: K = 6 for the first 46 steps, then 12).

Cleared early (`skew_clear`): a run whose first rounds already run at K >= 2 (the floor of 2
under Adam's family, or a starting K of 2 or more) reads them before its first decision: where
the first CLEAR_ROUNDS rounds at K >= 2 in a row read a mean drift ratio at or under
`skew_clear` (0.5) of `skew_drift` (0.7 at 1.4), the data is judged iid there, and K goes to the
link's K* rather than through the provisional cap. The two rounds are read once, as the second
closes. Any other reading, and any run whose first decision follows rounds at K = 1 or a warmup
(its first decision is the first round after it: one round at K >= 2), waits for the full window
as before, so skewed data is judged as it was. On the GPT workload on the WAN the rule before it
went K 2 → 9 for three epochs at two syncs each, then 15, where the best fixed K syncs once an
epoch; cleared, 2 → 15 at the first decision, 0.935× that rule's time to the target on seeds
293–302 (0.855–1.024), 9 seeds reaching it against 8. It is read before the first decision only:
on iid mnist1d shards, clearing the rounds after the first raise (at boundary 3 or 4, K 6 → 11
at 5 rather than 9) read 1.011× (0.953–1.074), and raising at the full window's judgement 1.048×
(0.999–1.100): an earlier raise there bought nothing. On the controller panel's runs the first
two rounds at K >= 2 read 0.42–0.54 on the GPT workload, 0.58–0.74 on iid mnist1d shards and
1.02 or more on every Dirichlet shard (docs/design.md §6, "skew cleared early";
docs/controller-panel/skew-clear-check/).

The soft cap: with the link's K* (K̄·r/r_t, from the last window) at or under `skew_cap`, K
follows the link; above it, K ≤ ⌊√(skew_cap · K*)⌋. When drift costs steps in proportion to K,
the time to a target is least at a K proportional to √(sync time / compute time) rather than to
the ratio itself (AdaComm's τ*, Wang and Joshi 2019), and the link's K* is proportional to the
ratio: so K grows as the square root of the link's K* from the point where drift starts to
count. A hard cap at `skew_cap` (this rule's first form) held K at 4 on a slow link (100 ms
RTT), where K = 16 reached the target in 0.6 of the time (docs/results.md).

How strong the skew is (`skew_strong`, off by default): on Dirichlet 0.1 shards the soft cap's
K = 6 on the WAN (⌊√(4 · 11)⌋) is too large where the best fixed K is 4, and two runs of ten blew
up there in one install; on α = 1 shards it is not. The first judging window cannot tell them
apart (drift ratio 1.79–2.75 and 1.34–1.93 at K = 6 on the panel's seeds 75–84, run in a
recorded install), but the ratio over the first GRADE_WINDOWS such windows (12 rounds and 96
steps at K >= 2 in a row) reads 2.54–2.89 and 1.39–2.08 (docs/design.md §6, "the skew grade").
Read once on skewed data (once it is finite), above `skew_strong` the soft cap scales with half
of `skew_cap` (⌊√(2 · 11)⌋ = 4 on the WAN); the boundary where it is read says so in its reason.

The cap's exponent (`skew_power`, 0.5 by default): K ≤ ⌊scale^(1 − p) · K*^p⌋ above the scale
(at 0.5 the committed rule's to the bit). One square root does not fit the panel's Dirichlet 1
regimes at once: on flip-wan (constant LR) K set per phase in hindsight was best at 8–16 on the
WAN (K* 10) and 32 on the slow WAN (K* 81, read at K; 62.5 at K̄), on skew-decay (the same
shards and WAN, the LR decayed where the target is crossed) at 8. flip-wan's pilot crossed the
target after epochs that grow about linearly in K (8.9, 9.4, 10.2, 12.4 at K = 4, 8, 16, 32),
whose least time falls near ⌊√(17 · K*)⌋ (13 and 37; 32 at 62.5); skew-decay's 8 is
⌊√(6.4 · K*)⌋. A law through 8 at K* 10 and 32 at K* 81 has p = log 4 / log 8 ≈ 2/3, at a
scale of 6: a fit to two levels, not derived, and an option under test (docs/design.md §6, "the
cap's exponent"). The 81 was read at K over rounds that epoch ends cut short; at their mean
length the slow WAN's K* is 62.5, where this law gives 28 (two syncs an epoch, as 16 gives), not
32.

The grade on one scale (`skew_grade_gamma`, off by default): the drift ratio falls with K (as
K^−0.28 on the panel's shards, within each seed), so a grading window read at K = 8 puts
Dirichlet 0.1 shards near where one at K = 6 put Dirichlet 1 (2.11–2.23 and 1.39–2.08): with
gamma the grade reads the window's mean ratio × (K/4)^gamma, K its steps a round (the mean K of
its rounds, an epoch's short last round included; the scale of the mean, not of each round's
ratio by its own K), as a window at K = 4 would read it, so that one threshold may serve several
caps (checked at K 8 and 11 on the seeds it was set on; not adopted: docs/design.md §6).

Epoch rounds (`epoch_rounds`, off by default; under the direct rule): K* and the soft cap are
periods, steps a sync, and where a boundary cuts every E steps (an epoch's end: `Sync.period_cap`,
which the engine tells the controller) a K that does not divide E leaves a short round that pays a
whole sync, so K's mean round is E/⌈E/K⌉, not K. Rounded as a K, the WAN's soft cap √(4 · 10.1) =
6.36 is 6, rounds of 6, 6, 6, 6, 6 and 2 (six syncs an epoch of 32), and the slow WAN's √(4 · 62.5)
= 15.8 is 15 (15, 15 and 2: three); with epoch rounds each is met by the K whose mean round is
nearest it in ratio, the smallest K of that mean (its rounds balanced): 7 (five syncs, a mean of
6.4) and 16 (two). Scheduled at those levels on the controller panel's flip-wan, 6/15/6 read 1.139×
the best fixed K, 6/16/6 1.057× and 8/16/8 0.976× (docs/design.md §6, "epoch rounds"). The mean
round may exceed the period by up to √2 on a 32-step epoch (22.7 is met by 32): the cap bounds
steps a sync on average, as AdaComm's τ is, not the longest round. Only K* and the cap are met so:
a back-off halves K, and the margin reads K, not its mean round.

A changed link (`link_shift`, `link_drop`): a window is closed SHIFT_ROUNDS rounds after the link
changes rather than a window later, by a check of its own (controllers/link_check.py).

The guard stays silent on a window whose boundaries were all at K <= `k_floor` (at 1:
synchronous SGD, whose loss no K raised): there is no smaller K to back off to, and its ceiling
would only have held K there for `cooldown` rounds (on skewed data, for good) against the link
(a non-finite loss still fires it). It reads the K in force, not steps per boundary: with F
fragments at K = F a boundary is one step apart, and that is local SGD. On the panel's flip-link
seed 75 the training loss of the last LAN epoch before the WAN rose from 0.85 to 1.19 (noise at
LR 0.1), the guard fired, and K stayed at 1 through the WAN's first epoch at 72% of the time in
sync.

Adam's family (`k_floor`): after a phase at K = 1, where every step is one synchronized step on
the averaged gradient, each rank's second-moment estimate v measures the averaged gradient, with a
quarter of a local gradient's variance on 4 ranks. When K then rises, the local steps divide by a
√v that is too small, and with β2 = 0.999 v needs about a thousand steps to catch up: on the
GPT workload (AdamW, 180 steps) K raised from 1 to 15 at step 60 ended at validation loss 2.83,
from 2 or 4 at 2.55 and 2.69, and with β2 = 0.95 from 1 at 2.55 (docs/controller-panel/
gpt-floor-check/experiment.yaml). `k_floor` (1 here; autok's settings make it 2 under Adam's
family: trainer/engine/k_floor.py) is the lowest K the controller chooses, whatever chose it
(lowering, a back-off, a cap, composite's too, a rollback's halving); under the direct rule with
lowering the run starts there too, and where K would start at 4 it starts at the floor if that is
higher. Warmup, where the engine forces K = 1, is the one exception. 2 keeps v measured on local
gradients where K may rise later.

With `--fragments F` a boundary syncs one fragment; the windows, the first estimate and the
cooldown count rounds (`BoundaryStats.closes_round`: F fragment boundaries, or a whole-model
sync) rather than boundaries, and K changes only where a round ends, so a window spans the same
steps at any F and the guard's drift is compared over like intervals. With F = 1 a round is a
boundary.

K does not follow the LR: with the link rule's K times η_peak/η (STL-SGD) or its square (QSR),
the controller panel's skew-decay pilot reached the target later (docs/results.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision
from autok.controllers.guard import Guard
from autok.controllers.link_check import LinkCheck
from autok.controllers.window import (
    Window,
    saved_flag,
    saved_number,
    saved_window,
    window_state,
)


def share_at(share: float, factor: float) -> float:
    """Predicted exposed-sync share if K were multiplied by `factor`."""
    if share >= 1.0:
        return 1.0
    r = share / (1.0 - share) / factor
    return r / (1.0 + r)


def link_k(steps: float, share: float, target: float) -> float:
    """The link model's K*: the K at which the share measured over rounds of `steps` steps (a
    window's mean steps a round, which is K only where no round was cut short) would be the
    target."""
    if share >= 1.0:
        return math.inf
    return steps * (share / (1.0 - share)) / (target / (1.0 - target))


def soft_cap(scale: int, link_k: float, power: float = 0.5, cut: int | None = None) -> int:
    """⌊scale^(1 − power) · K*^power⌋: at 0.5 ⌊√(scale · K*)⌋, the committed rule's to the bit;
    with `cut` (epoch rounds) the K whose mean round is nearest that period (`epoch_k`)."""
    if cut is not None:
        return epoch_k(scale ** (1.0 - power) * link_k**power, cut)
    # K* is a ratio of measured sums: 16 may read 15.999999999999993, whose root is not 8 when
    # floored
    if power == 0.5:
        return math.floor(math.sqrt(scale * link_k) + 1e-9)
    return math.floor(scale ** (1.0 - power) * link_k**power + 1e-9)


def rounds_of(k: int, cut: int) -> float:
    """The mean round of K where a boundary cuts every `cut` steps (an epoch's end): cut/⌈cut/K⌉,
    below K where K does not divide the cut (rounds of 15, 15 and 2 at K = 15 of 32: 10.7)."""
    return cut / math.ceil(cut / k)


def epoch_k(value: float, cut: int) -> int:
    """The K whose mean round (`rounds_of`) is nearest `value` in ratio, the smallest K of that
    mean (its rounds balanced), where a boundary cuts every `cut` steps: the rule's K* or cap is
    a period, steps a sync, and an epoch holds only whole syncs (the module's docstring, "epoch
    rounds"). 15.8 of 32 gives 16 (two syncs an epoch), 6.36 gives 7 (five: a mean of 6.4)."""
    if not math.isfinite(value) or value >= cut:
        return cut
    if value <= 1.0:
        return 1
    # the mean round never falls as K grows: the smallest K whose mean reaches the period, and
    # the K below it, hold the nearest mean on either side
    lo, hi = 1, cut
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if rounds_of(mid, cut) >= value else (mid + 1, hi)
    k = lo
    if k > 1 and math.log(value / rounds_of(k - 1, cut)) <= math.log(rounds_of(k, cut) / value):
        k -= 1  # as near or nearer: the more syncs, the side of the rule
    return math.ceil(cut / math.ceil(cut / k))  # the smallest K of that mean: rounds balanced


def syncs_of(k: int, cut: int | None) -> str:
    """What a decision's reason adds under epoch rounds: the syncs an epoch K gives."""
    if cut is None:
        return ""
    n = math.ceil(cut / k)
    return f" (K {k}: {n} sync{'s' if n > 1 else ''} per {cut} steps)"


def next_sync_period(
    k: int,
    share: float,
    *,
    target: float,
    growth: int,
    max_k: int,
    margin: float = 0.25,
    lower: bool = False,
    guard_reason: str | None = None,
    ceiling: int | None = None,
    steps: float | None = None,
) -> tuple[int, str]:
    """The rule, as a pure function of the current K and one window's measurements; `steps`: the
    window's mean steps a round (K where None), which the share was measured over."""
    top = min(max_k, ceiling) if ceiling is not None else max_k
    if guard_reason is not None:  # within any ceiling, the skew cap's included
        return max(1, min(top, k // growth)), f"back off: {guard_reason}"
    if share > target:
        new = min(top, k * growth)
        if new > k:
            return new, f"raise: sync share {share:.0%} > target {target:.0%}"
        return min(k, top), f"hold: sync share {share:.0%} > target, K at its cap {top}"
    predicted = share_at(share, (k / growth) / (steps or k))
    if lower and k > 1 and predicted < target * (1.0 - margin):
        return max(1, min(top, k // growth)), (
            f"lower: share {share:.0%}, predicted {predicted:.0%} at K/{growth}"
        )
    return min(k, top), f"hold: sync share {share:.0%} <= target {target:.0%}"


def direct_sync_period(
    k: int,
    share: float,
    *,
    target: float,
    max_k: int,
    margin: float = 0.25,
    guard_reason: str | None = None,
    ceiling: int | None = None,
    floor: int = 1,
    growth: int = 2,
    steps: float | None = None,
    cut: int | None = None,
) -> tuple[int, str]:
    """The direct rule, as a pure function: K* = K̄·r/r_t (K̄ = `steps`, the window's mean steps
    a round; K where None), applied when it is > margin away from K; lowering stops at `floor`.
    The guard backs off by `growth`, as under the doubling rule. With `cut` (epoch rounds: a
    boundary every `cut` steps) K* is met by the K whose mean round is nearest it (`epoch_k`),
    else K* rounded up to raise and down to lower. The margin and a back-off read K, not its
    mean round: a K the rule did not meet so (a start, a back-off) stays until K* moves by the
    margin (docs/design.md §6, "epoch rounds")."""
    top = min(max_k, ceiling) if ceiling is not None else max_k
    if guard_reason is not None:  # within any ceiling, the skew cap's included
        return max(1, min(top, k // growth)), f"back off: {guard_reason}"
    want = link_k(steps or k, share, target)
    # the hold where the mean round nearest K* is K's own (epoch rounds), either way
    held = f"hold: sync share {share:.0%}, K* {want:.3g}: as at K={k}{syncs_of(k, cut)}"
    if want > k * (1.0 + margin):
        if not math.isfinite(want):  # the share was all sync: no K* to meet, the cap
            up = top
        else:
            up = epoch_k(want, cut) if cut is not None else math.ceil(want)
        new = min(top, up)
        if new > k:
            return new, (
                f"raise: sync share {share:.0%} > target {target:.0%}: K* {want:.3g}"
                f"{syncs_of(new, cut)}"
            )
        if up <= k <= top:  # the mean round nearest K* is K's own (epoch rounds)
            return k, held
        return min(k, top), f"hold: sync share {share:.0%} > target, K at its cap {top}"
    if want < k * (1.0 - margin):
        low = max(1, min(floor, top))
        if k <= low:
            return min(k, top), f"hold: sync share {share:.0%} < target {target:.0%} at K={k}"
        down = epoch_k(want, cut) if cut is not None else math.floor(want)
        # a period nearest K's own mean round (K cut short by the epoch's end): as many syncs
        same = down >= k or (cut is not None and rounds_of(down, cut) == rounds_of(k, cut))
        if same and k <= top:
            return k, held
        new = max(low, min(top, down if want >= 1 else 1))
        return new, (
            f"lower: sync share {share:.0%} < target {target:.0%}: K* {want:.3g}"
            f"{syncs_of(new, cut)}"
        )
    return min(k, top), f"hold: sync share {share:.0%}, K* {want:.3g} near K"


# The guard judges the loss over windows of at least this many optimizer steps: at K = 1 a window
# of 4 boundaries is 4 steps, whose mean loss is noise, and the best window of many such is
# biased low, so the guard fired on noise and held K at 1 (the es-lowering K path on flip-link
# in the controller panel's first run). A non-finite loss is judged once its window closes.
GUARD_MIN_STEPS = 32
# Strong skew is read over this many judging windows (rounds and steps): on the controller
# panel's first judging window (4 rounds, 32 steps at K = 6) Dirichlet 0.1 and 1 shards overlap
# (drift ratio 1.79-2.75 and 1.34-1.93), and the ratio of both rises over the first epochs
# (docs/design.md §6: `python -m benchmarks.skew_signal DIR --judge-rounds 12 --judge-steps 96`)
GRADE_WINDOWS = 3
# rounds at K >= 2 in a row over which a drift ratio at or under `skew_clear` judges the data iid
# before the full window (the module's docstring, "cleared early"): one round's reading
# overlapped between iid and Dirichlet shards on the panel's runs (0.68-0.89 against 0.85 up)
CLEAR_ROUNDS = 2
# the grade's one scale (`skew_grade_gamma`): the drift ratio as a window at K = 4 would read it
GRADE_K = 4
STRONG_CUT = "strong skew"  # the reason of the boundary where the grade cut K
# The rule's revision: moved whenever the same settings and seed may give another K path, so that
# runs of two revisions are not compared or continued as one (docs/design.md §6, "the rule's
# revision"). A run records it (config.json's `policy_revision`); 1 is the rule as it stood when
# runs began to record it, a back-off held on skewed data; one recording none counts as 0. 2 is
# spent: runs of a rule tried and dropped recorded it (docs/controller-panel/iid-lift-check/). 3
# clears skew at the first decision where the rounds before it read far under the threshold
# (`skew_clear`, the module's docstring, "cleared early").
RULE_REVISION = 3


@dataclass
class ExposedSyncController:
    sync_period: int
    target: float = 0.2
    max_sync_period: int = 64
    window: int = 4
    growth: int = 2
    margin: float = 0.25
    lower: bool = False
    rule: str = "double"  # or "direct"
    cooldown: int = 32
    guard: Guard = field(default_factory=Guard)
    ceiling: int | None = None
    since_fire: int = 0
    floor: int | None = None  # direct rule: lowest K; default the starting K (1 with lower)
    # the lowest K chosen for any reason (lowering, a back-off, a cap): 2 keeps Adam's second
    # moment measured on local gradients (the module's docstring, "Adam's family")
    k_floor: int = 1
    # direct rule: the first measured round already decides (the link model's K* from its times:
    # the first post-warmup boundary, or boundary 1), instead of a whole window at the starting K
    estimated: bool = False
    skew_drift: float = 1.4  # the first judged window's drift ratio above which data is skewed
    skew_cap: int = 4  # on skewed data, the link K* above which K grows as its square root
    # on skewed data, a drift ratio above `skew_strong` (> 0) over the longer grading window is
    # strong skew: the soft cap scales with half of `skew_cap`
    skew_strong: float = 0.0
    # the soft cap's exponent: K <= scale^(1 - p) * K*^p above the scale (0.5: the square root;
    # the module's docstring, "the cap's exponent")
    skew_power: float = 0.5
    # the grade reads the drift ratio x (K/4)^gamma, K the grading window's steps a round: one
    # scale at any K (0: as measured; the module's docstring, "the grade on one scale")
    skew_grade_gamma: float = 0.0
    # the fraction of `skew_drift` at or under which the first CLEAR_ROUNDS rounds at K >= 2,
    # read at the first decision, judge the data iid before the full window (0: off; the
    # module's docstring, "cleared early")
    skew_clear: float = 0.5
    skew_ratio: float | None = None  # the grading window's drift ratio, once read
    cleared: float | None = None  # the drift ratio that cleared the data early, once read
    # None until a window at K >= 2 judges it (held under the soft cap meanwhile); False with
    # skew_drift = 0 (off)
    skewed: bool | None = None
    link_k: float | None = None  # the link's K* from the last window (inf: sync was all of it)
    rebaseline: bool = False  # a raise since the guard last judged: its loss is the new level
    # a round whose network time is over this many times the window's level (or under the
    # level divided by it where `link_drop` is 0), SHIFT_ROUNDS in a row, closes the window from
    # those rounds (0: off)
    link_shift: float = 0.0
    # a faster link: rounds under the level divided by this close the window early (0: off,
    # or `link_shift` reads both ways)
    link_drop: float = 0.0
    # epoch rounds: K* and the soft cap are periods, met by the K whose mean round is nearest
    # them where a boundary cuts every `cut` steps (an epoch's end); the engine tells `cut`
    # (set_cut: `Sync.period_cap`). Under the direct rule only; off: K* and the cap rounded.
    epoch_rounds: bool = False
    cut: int | None = None
    _win: Window = field(default_factory=Window)
    _round: Window = field(default_factory=Window)  # the round being closed (fragments)
    _link: LinkCheck = field(init=False)  # the rounds off the window's level, and that level
    _guard_win: Window = field(default_factory=Window)
    _skew_win: Window = field(default_factory=Window)  # rounds at K >= 2 only
    _grade_win: Window = field(default_factory=Window)  # the same rounds, for the grade

    def __post_init__(self) -> None:
        self._link = LinkCheck(shift=self.link_shift, drop=self.link_drop)
        if self.floor is None:
            self.floor = 1 if self.lower else self.sync_period
        self.floor = max(self.floor, self.k_floor)
        if self.skew_drift <= 0:
            self.skewed = False  # off: never judged, never capped

    def set_cut(self, steps: int | None) -> None:
        """The steps between the boundaries the engine forces (an epoch's; None: none)."""
        self.cut = steps

    def cut_every(self) -> int | None:
        """The cut K* and the cap are met on (`epoch_k`), or None: epoch rounds off, or under the
        doubling rule, or no cut told."""
        return self.cut if self.epoch_rounds and self.rule == "direct" else None

    def _judge_guard(self) -> str | None:
        """The guard's verdict on its own window, once it spans `window` rounds and
        GUARD_MIN_STEPS steps (any length on a non-finite loss); None before."""
        g = self._guard_win
        if g.rounds < self.window or (g.steps < GUARD_MIN_STEPS and math.isfinite(g.loss)):
            return None
        self._guard_win = Window()
        if self.rebaseline:  # the first window since a raise: the new K's level, not a rise
            self.rebaseline = False
            self.guard.best_loss = math.inf
        verdict = self.guard.check(g.drift_ratio / g.n, g.loss / g.n)
        if verdict is not None and g.top <= self.k_floor and math.isfinite(g.loss):
            # every boundary at the floor (K = 1: synchronous SGD, whose loss no K raised):
            # there is no K to back off to, and its ceiling would only hold K there against the
            # link (the module's docstring)
            return None
        return verdict

    def _add_to_skew_window(self, stats: BoundaryStats) -> None:
        """Until skew is judged (and graded): rounds at K >= 2 in a row (one at K = 1 starts
        them again)."""
        grading = self.skew_strong > 0 and self.skewed is not False and self.skew_ratio is None
        if stats.sync_period < 2:
            self._skew_win, self._grade_win = Window(), Window()
            return
        if self.skewed is None:
            self._skew_win.add(stats)
        if grading:
            self._grade_win.add(stats)

    def _judge_skew(self) -> None:
        """Once: the mean drift ratio over the first `window` rounds and GUARD_MIN_STEPS steps
        at K >= 2 in a row; a non-finite ratio does not judge. Before the first decision, iid
        where the first CLEAR_ROUNDS rounds, read once they close, are at or under
        `clear_below()` (the module's docstring, "cleared early")."""
        w = self._skew_win
        if self.skewed is not None:
            return
        if w.rounds < self.window or w.steps < GUARD_MIN_STEPS:
            early = w.drift_ratio / max(1, w.n)
            if (
                self.skew_clear > 0
                and self.link_k is None  # before the first decision only (docstring)
                and w.rounds == CLEAR_ROUNDS
                and early <= self.clear_below()
            ):
                self.skewed, self.cleared = False, early
                self._skew_win, self._grade_win = Window(), Window()
            return
        self._skew_win = Window()
        ratio = w.drift_ratio / w.n
        if math.isfinite(ratio):
            self.skewed = ratio > self.skew_drift
            if not self.skewed:
                self._grade_win = Window()  # iid: nothing to grade

    def clear_below(self) -> float:
        """The drift ratio at or under which the first decision's rounds clear the data."""
        return self.skew_clear * self.skew_drift

    def _grade_skew(self) -> bool:
        """Once, on skewed data with `skew_strong` set: the mean drift ratio over the first
        GRADE_WINDOWS × (`window` rounds, GUARD_MIN_STEPS steps) at K >= 2 in a row (the module's
        docstring: a longer window than the judgement's). True when it was read just now."""
        g = self._grade_win
        if not self.skewed or self.skew_strong <= 0 or self.skew_ratio is not None:
            return False
        if g.rounds < GRADE_WINDOWS * self.window or g.steps < GRADE_WINDOWS * GUARD_MIN_STEPS:
            return False
        self._grade_win = Window()
        ratio = g.drift_ratio / g.n
        if self.skew_grade_gamma > 0:  # on the scale of K = 4 (the module's docstring)
            ratio *= ((g.round_steps or GRADE_K) / GRADE_K) ** self.skew_grade_gamma
        if not math.isfinite(ratio):
            return False
        self.skew_ratio = ratio
        return True

    def _grade_scale(self) -> str:
        """What a grade's reason adds where the ratio was put on one scale."""
        return f" (on K = {GRADE_K}'s scale)" if self.skew_grade_gamma > 0 else ""

    def strong(self) -> bool:
        """Whether the grading window read strong skew."""
        ratio = self.skew_ratio
        return (
            self.skew_strong > 0
            and self.skewed is True
            and ratio is not None
            and (ratio > self.skew_strong)
        )

    def cap_scale(self) -> int:
        """The soft cap's scale: half of `skew_cap` where the grading window read strong skew,
        else `skew_cap` (before it is read too: the milder cap until then)."""
        return max(1, self.skew_cap // 2) if self.strong() else self.skew_cap

    def skew_ceiling(self) -> int | None:
        """On skewed data K's soft cap: its scale (`cap_scale()`) until the link's K* is known,
        then ⌊√(scale · K*)⌋ where K* exceeds the scale (the module's docstring); until a window
        has judged the data, the same bound on a rise above the current K."""
        if self.skewed is False:
            return None
        scale = self.cap_scale()
        if self.link_k is None or self.link_k <= scale:
            cap = scale
        elif not math.isfinite(self.link_k):
            cap = self.max_sync_period  # the share was all sync: no K* to scale
        else:
            cap = max(scale, soft_cap(scale, self.link_k, self.skew_power, self.cut_every()))
        # unjudged, it only stops a rise: a K the user started above it is theirs until judged
        return cap if self.skewed else max(cap, self.sync_period)

    def k_ceiling(self) -> int | None:
        """The lowest of the guard's ceiling (until its cooldown ends; on skewed data for good)
        and, on skewed data, the soft cap."""
        caps = [c for c in (self.ceiling, self.skew_ceiling()) if c is not None]
        return min(caps) if caps else None

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        graded_before = self.skew_ratio is not None
        judged_before = self.skewed is not None
        d = self._floored(self._decide(stats))
        if not judged_before and self.cleared is not None:  # cleared just now: the record says so
            return SyncDecision(
                d.next_sync_period,
                f"skew cleared: drift ratio {self.cleared:.3g} <= {self.clear_below():.3g} "
                f"({self.skew_clear:g} of {self.skew_drift:g}) over {CLEAR_ROUNDS} rounds at "
                f"K >= 2; {d.reason}",
            )
        if self.skew_ratio is None or graded_before or d.reason.startswith(STRONG_CUT):
            return d
        # read just now and K not cut: the boundary's record says so (boundaries.jsonl)
        grade = "strong" if self.strong() else "mild"
        sign = ">" if self.strong() else "<="
        return SyncDecision(
            d.next_sync_period,
            f"skew graded {grade}: drift ratio {self.skew_ratio:.3g} {sign} "
            f"{self.skew_strong:g}{self._grade_scale()}; {d.reason}",
        )

    def _floored(self, d: SyncDecision) -> SyncDecision:
        """No K below `k_floor`, whatever chose it (a back-off, a cap under it)."""
        if d.next_sync_period >= self.k_floor:
            return d
        self.set_sync_period(self.k_floor)
        if self.ceiling is not None:
            self.ceiling = max(self.ceiling, self.k_floor)
        return SyncDecision(self.k_floor, f"{d.reason}; K held at its floor {self.k_floor}")

    def _decide(self, stats: BoundaryStats) -> SyncDecision:
        if stats.warmup:  # K is forced to 1 in warmup; the share there says nothing about K
            return SyncDecision(self.sync_period, "warmup")
        self._round.add(stats)
        self._guard_win.add(stats)
        self._add_to_skew_window(stats)
        if not stats.closes_round:  # windows and the cooldown count whole rounds
            return SyncDecision(self.sync_period, f"measuring (fragment {stats.fragment})")
        needed = self.window if self.estimated or self.rule != "direct" else 1
        # every record since boundary 0: the run's first round, which is not measured (the
        # module's docstring, "the first boundary")
        first_round = self._round.n == stats.boundary + 1
        shift = self._take_round(needed, measured=not first_round)
        if self.ceiling is not None:
            self.since_fire += 1
            # on skewed data a back-off's ceiling holds for the rest of the run (the module's
            # docstring, "a back-off on skewed data")
            if self.since_fire >= self.cooldown and not self.skewed:
                self.ceiling = None
        judged = self._skew_win.drift_ratio / max(1, self._skew_win.n)
        was_skewed = self.skewed
        self._judge_skew()
        graded = self._grade_skew()
        reason = self._judge_guard()
        cap = self.skew_ceiling()
        if (
            ((self.skewed and was_skewed is None) or (graded and self.strong()))
            and reason is None  # a back-off goes below the cap anyway, and starts a cooldown
            and cap is not None
            and self.sync_period > cap
        ):
            if shift is not None:  # the new link's level, not the old one's
                self._link.level = self._link.held.level()
            self._new_window()
            self.sync_period = cap  # a K known too large: now
            link = "" if self.link_k is None else f", link K* {self.link_k:.3g}"
            scale = self.cap_scale()
            why = (
                f"{STRONG_CUT}: drift ratio {self.skew_ratio:.3g} > {self.skew_strong:g}"
                f"{self._grade_scale()}"
                if graded and self.strong()
                else f"skewed data: drift ratio {judged:.3g} > {self.skew_drift:g}"
            )
            return SyncDecision(cap, f"{why}: K capped at {cap} (soft cap {scale}{link})")
        off_level = self._link.held.rounds
        held = self._win.rounds + off_level
        waits = off_level and self._win.rounds < needed
        if reason is None and shift is None and (held < needed or waits):
            # a round off the level waits for the next, which says whether the link changed
            off = f", {off_level} off its level" if off_level else ""
            if first_round:
                off = ": the run's first round, no averaging before it"
            return SyncDecision(self.sync_period, f"measuring ({held}/{needed}{off})")
        w = self._link.held if shift is not None else self._win
        if shift is None:  # a full window or the guard: rounds held apart are its too
            self._link.rejoin(self._win)
        self._new_window()
        self._link.decided(w)
        self.estimated = True
        # the share was measured over the window's rounds, which an epoch's end may cut short
        # of K: the model's K is their mean length (the module's docstring); K where the window
        # counts no steps (no rounds, or rounds saved before windows counted steps)
        steps = w.round_steps or float(self.sync_period)
        self.link_k = link_k(steps, w.share, self.target)
        if self.rule == "direct":
            k, why = direct_sync_period(
                self.sync_period,
                w.share,
                target=self.target,
                max_k=self.max_sync_period,
                margin=self.margin,
                guard_reason=reason,
                ceiling=self.k_ceiling(),
                floor=self.floor or 1,
                growth=self.growth,
                steps=steps,
                cut=self.cut_every(),
            )
            if reason is not None:
                self.ceiling, self.since_fire = k, 0
            self.set_sync_period(k)
            return SyncDecision(k, why if shift is None else f"{shift}; {why}")
        k, why = next_sync_period(
            self.sync_period,
            w.share,
            target=self.target,
            growth=self.growth,
            max_k=self.max_sync_period,
            margin=self.margin,
            lower=self.lower,
            guard_reason=reason,
            ceiling=self.k_ceiling(),
            steps=steps,
        )
        if reason is not None:
            self.ceiling, self.since_fire = k, 0
        self.set_sync_period(k)
        return SyncDecision(k, why if shift is None else f"{shift}; {why}")

    def _new_window(self) -> None:
        """A decision's window starts afresh, with no rounds pending as off its level."""
        self._win = Window()
        self._link.held = Window()

    def _take_round(self, needed: int, measured: bool = True) -> str | None:
        """The round just closed, to the window or held apart by the link check (dropped where
        not `measured`): what a changed link says, else None."""
        rnd, self._round = self._round.closed(), Window()
        return self._link.take(rnd, self._win, needed) if measured else None

    def set_sync_period(self, k: int, was: int | None = None) -> None:
        """Move to K from `was` (default: the K in force); a raise by more than the margin
        makes the guard's next judged window the loss's new level (the module's docstring)."""
        if k > (self.sync_period if was is None else was) * (1.0 + self.margin):
            self.rebaseline = True
        self.sync_period = k

    def rollback(self, sync_period: int) -> None:
        """After a divergence rollback: continue from the halved K (not under the floor),
        capped there for a cooldown (on skewed data for the rest of the run, as a back-off)."""
        self.sync_period = max(sync_period, self.k_floor)
        self.ceiling, self.since_fire = self.sync_period, 0
        self._new_window()
        self._round, self._guard_win, self._skew_win = Window(), Window(), Window()
        self._grade_win = Window()

    def state_dict(self) -> dict[str, Any]:
        return {
            "sync_period": self.sync_period,
            "ceiling": self.ceiling,
            "since_fire": self.since_fire,
            "guard": self.guard.state_dict(),
            "window": window_state(self._win),
            "guard_window": window_state(self._guard_win),
            "estimated": self.estimated,
            "skewed": self.skewed,
            "skew_ratio": self.skew_ratio,
            "skew_cleared": self.cleared,
            "link_k": self.link_k,
            "rebaseline": self.rebaseline,
            "skew_window": window_state(self._skew_win),
            "grade_window": window_state(self._grade_win),
            "round": window_state(self._round),
            **self._link.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
        self.ceiling = state["ceiling"]
        self.since_fire = int(state["since_fire"])
        self.guard.load_state_dict(state["guard"])
        self._win = saved_window(state["window"])
        # a state saved before the guard had its own window: it starts one, the estimate made
        self._guard_win = saved_window(state.get("guard_window", {}))
        self.estimated = bool(state.get("estimated", True))
        skewed = state.get("skewed", False)  # a state saved before the skew cap: False
        if skewed is not None and type(skewed) is not bool:
            raise ValueError(
                f"exposed-sync state: skewed must be true, false or null, not {skewed!r}"
            )
        if skewed is False and "link_k" not in state and self.guard.calibrated_drift is None:
            skewed = None  # saved before the soft cap, before its one window: not judged yet
        self.skewed = False if self.skew_drift <= 0 else skewed
        self.skew_ratio = saved_number(state, "skew_ratio")  # saved before it was kept: None
        self.cleared = saved_number(state, "skew_cleared")  # saved before clearing: None
        # a state saved before the soft cap: unknown, the cap holds; inf: sync was all of it
        self.link_k = saved_number(state, "link_k", inf=True)
        self.rebaseline = saved_flag(state, "rebaseline")
        self._skew_win = saved_window(state.get("skew_window", {}))
        self._grade_win = saved_window(state.get("grade_window", {}))
        # saved before the link-shift check: the round was in the window, none held apart
        self._round = saved_window(state.get("round", {}))
        self._link.load_state_dict(state)
