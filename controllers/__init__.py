"""K policies: pure decision logic. Nothing here imports torch.distributed.

Each policy is registered by name with a factory taking the starting K and a `PolicyOptions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autok.controllers.adacomm import AdaCommController
from autok.controllers.base import BoundaryStats, Controller, SyncDecision
from autok.controllers.composite import CompositeController
from autok.controllers.exposed_sync import RULE_REVISION, ExposedSyncController
from autok.controllers.fixed import FixedController
from autok.controllers.guard import Guard
from autok.controllers.inverse_lr import InverseLRController
from autok.controllers.options import (
    POLICY_OPTIONS,
    RUN_OPTIONS,
    PolicyOptions,
    PolicySettings,
)
from autok.controllers.post_local import PostLocalController
from autok.controllers.qsr import QSRController, default_alpha
from autok.controllers.random_k import RandomController
from autok.controllers.scheduled import ScheduledController, parse_k_schedule


def _share(k: int, o: PolicyOptions) -> ExposedSyncController:
    return ExposedSyncController(
        sync_period=k,
        target=o.target_sync_share,
        max_sync_period=o.max_sync_period,
        window=o.sync_window,
        growth=o.k_growth,
        cooldown=o.guard_cooldown,
        lower=o.k_lowering,
        rule=o.k_rule,
        guard=Guard(drift_limit=o.drift_limit, loss_rise=o.loss_rise),
        skew_drift=o.skew_drift,
        skew_clear=o.skew_clear,
        skew_cap=o.skew_cap,
        skew_strong=o.skew_strong,
        skew_power=o.skew_power,
        skew_grade_gamma=o.skew_grade_gamma,
        link_shift=o.link_shift,
        link_drop=o.link_drop,
        epoch_rounds=o.epoch_rounds,
        k_floor=o.k_floor or 1,  # None: not resolved (no optimizer named): no floor
    )


def _qsr(k: int, o: PolicyOptions) -> QSRController:
    base = o.qsr_base or k
    alpha = o.qsr_alpha if o.qsr_alpha is not None else default_alpha(o.peak_lr, base)
    return QSRController(base=base, alpha=alpha, max_sync_period=o.max_sync_period)


@dataclass(frozen=True)
class Policy:
    """A K policy as registered: its factory, and the PolicyOptions the factory reads besides
    RUN_OPTIONS, and what `--policy`'s help line says of it besides its name. An option the
    chosen policy does not read is refused when given (trainer/engine/options.py), not silently
    ignored; a sweep draws it only under the policies that read it (autok/space.py);
    tests/test_controllers.py checks `reads` against what the factory reads."""

    build: Callable[[int, PolicyOptions], Controller]
    reads: frozenset[str] = frozenset()
    note: str | None = None
    # moved whenever the same settings may give another K path (exposed_sync.RULE_REVISION); a
    # run records it, and none recorded counts as 0: the rule every policy had then
    revision: int = 0

    def __post_init__(self) -> None:
        if unknown := sorted(self.reads - set(POLICY_OPTIONS)):
            raise ValueError(f"Policy: {unknown} are not PolicyOptions fields of a policy")


# The exposed-sync controller's options and its guard's (composite steers with it too).
_SHARE_READS = frozenset(
    {
        "target_sync_share",
        "max_sync_period",
        "sync_window",
        "k_growth",
        "guard_cooldown",
        "k_lowering",
        "k_rule",
        "drift_limit",
        "loss_rise",
        "skew_drift",
        "skew_clear",
        "skew_cap",
        "skew_strong",
        "skew_power",
        "skew_grade_gamma",
        "link_shift",
        "link_drop",
        "epoch_rounds",
        "k_floor",
    }
)
_QSR_READS = frozenset({"qsr_base", "qsr_alpha", "max_sync_period"})


def _scheduled(k: int, o: PolicyOptions) -> ScheduledController:
    # without a schedule (a factory called directly): K as given, throughout; a run needs
    # --k-schedule (trainer/engine/options.py), whose first K is then its --sync-period
    schedule = parse_k_schedule(o.k_schedule) if o.k_schedule else ((0, k),)
    return ScheduledController(schedule, max_sync_period=o.max_sync_period)


_CAPPED = frozenset({"max_sync_period"})  # reads only the cap on K

POLICIES: dict[str, Policy] = {
    "fixed": Policy(lambda k, o: FixedController(k)),
    "exposed-sync": Policy(_share, _SHARE_READS, revision=RULE_REVISION),
    "qsr": Policy(_qsr, _QSR_READS),
    # AdaComm's τ_0 is a large start that shrinks (controllers/adacomm.py): the cap, not K
    "adacomm": Policy(
        lambda k, o: AdaCommController(
            k0=o.max_sync_period, window=o.sync_window, max_sync_period=o.max_sync_period
        ),
        frozenset({"sync_window"}) | _CAPPED,
    ),
    "composite": Policy(
        lambda k, o: CompositeController(share=_share(k, o), qsr=_qsr(k, o)),
        _SHARE_READS | _QSR_READS,
        revision=RULE_REVISION,  # it steers with exposed-sync's rule
    ),
    "post-local": Policy(
        lambda k, o: PostLocalController(local_period=k, max_sync_period=o.max_sync_period),
        _CAPPED,
    ),
    "inverse-lr": Policy(
        lambda k, o: InverseLRController(
            base=k, peak_lr=o.peak_lr, max_sync_period=o.max_sync_period
        ),
        _CAPPED,
    ),
    "scheduled": Policy(
        _scheduled,
        frozenset({"k_schedule"}) | _CAPPED,
        note="K set in advance by step: --k-schedule",
    ),
    "random": Policy(
        lambda k, o: RandomController(
            mean=o.random_mean if o.random_mean is not None else k,
            max_sync_period=o.max_sync_period,
            seed=o.seed,
        ),
        frozenset({"random_mean"}) | _CAPPED,
        note="a baseline: K drawn with a given mean",
    ),
}
# Read from POLICIES: each policy's factory, and the options it reads.
REGISTRY: dict[str, Callable[[int, PolicyOptions], Controller]] = {
    name: policy.build for name, policy in POLICIES.items()
}
READS: dict[str, frozenset[str]] = {name: policy.reads for name, policy in POLICIES.items()}
# K-policy options whose default moved, and what a run saved before each was a setting ran with:
# no floor (1), a faster link met after a whole window (0), skew judged by the full window only
# (0). Read where the run's policy reads the option: a saved config.json resumed, a kept
# experiment run, a resumed sweep, an engine state.
RAN_BEFORE: dict[str, float] = {"k_floor": 1, "link_drop": 0.0, "skew_clear": 0.0}


def reads(policy: object, option: str) -> bool:
    """Whether `policy` (a name; anything else reads nothing) reads the K-policy `option`."""
    return isinstance(policy, str) and option in READS.get(policy, frozenset())


def revision(policy: object) -> int:
    """The revision of `policy`'s rule (a name; anything else, or a name no longer registered:
    0), as a run records it in config.json's `policy_revision`."""
    found = POLICIES.get(policy) if isinstance(policy, str) else None
    return found.revision if found is not None else 0


def revision_problem(policy: object, recorded: object) -> str | None:
    """Why a run of `policy` that recorded `recorded` (config.json's `policy_revision`; None
    where it recorded none, which counts as 0) was not made by this version's rule, in words
    ("exposed-sync's rule revision 0, this autok runs 1"), or None where it was."""
    now = revision(policy)
    was = 0 if recorded is None else recorded
    if was == now and type(was) is int:
        return None
    shown = "0 (none recorded)" if recorded is None else repr(recorded)[:40]
    return f"{policy}'s rule revision {shown}, this autok runs {now}"


def ran_before(policy: object, saved: dict) -> dict[str, float]:
    """The options of RAN_BEFORE a run of `policy` read but `saved` (its settings) lacks, with
    the values it ran with."""
    return {k: v for k, v in RAN_BEFORE.items() if reads(policy, k) and k not in saved}


def read_drop(link_drop: object, config: dict) -> object:
    """The ratio a run read a faster link at: its `link_drop`, or where that is 0 its
    `link_shift` (docs/design.md §6, "a faster link"): a run saved with `--link-shift 3` before
    `--link-drop` existed read it as `--link-drop 3` does. A value that is not a number is
    returned as it is (it matches no ratio)."""
    shift = config.get("link_shift", 0.0)
    if link_drop == 0 and isinstance(shift, int | float) and not isinstance(shift, bool):
        return float(shift)
    return link_drop


# A bound on K under every policy: `fixed` does not read it, but its K is checked against it
# where it is given (a fixed K above 64 has always been given with it raised), so it is never
# refused as unread.
CAPS = frozenset({"max_sync_period"})


def build_controller(
    name: str, sync_period: int, options: PolicyOptions | None = None
) -> Controller:
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(REGISTRY)}") from None
    return factory(sync_period, options or PolicyOptions())


__all__ = [
    "CAPS",
    "POLICIES",
    "POLICY_OPTIONS",
    "RAN_BEFORE",
    "READS",
    "REGISTRY",
    "RUN_OPTIONS",
    "BoundaryStats",
    "Controller",
    "Policy",
    "PolicyOptions",
    "PolicySettings",
    "SyncDecision",
    "ran_before",
    "read_drop",
    "reads",
    "revision",
    "revision_problem",
    "build_controller",
]
