"""K policies: pure decision logic. Nothing here imports torch.distributed.

Each policy is registered by name with a factory taking the starting K and a `PolicyOptions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from autok.controllers.adacomm import AdaCommController
from autok.controllers.base import BoundaryStats, Controller, SyncDecision
from autok.controllers.composite import CompositeController
from autok.controllers.exposed_sync import ExposedSyncController
from autok.controllers.fixed import FixedController
from autok.controllers.guard import Guard
from autok.controllers.inverse_lr import InverseLRController
from autok.controllers.post_local import PostLocalController
from autok.controllers.qsr import QSRController, default_alpha
from autok.controllers.random_k import RandomController


@dataclass(frozen=True)
class PolicyOptions:
    peak_lr: float = 0.1
    target_sync_share: float = 0.2
    max_sync_period: int = 64
    sync_window: int = 4
    k_growth: int = 2
    drift_limit: float = 3.0
    loss_rise: float = 0.1
    guard_cooldown: int = 32
    k_lowering: bool = False
    k_rule: str = "double"
    qsr_base: int | None = None  # default: the starting K
    qsr_alpha: float | None = None  # default: peak LR * sqrt(K_base)
    random_mean: float | None = None  # default: the starting K
    seed: int = 42


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
    )


def _qsr(k: int, o: PolicyOptions) -> QSRController:
    base = o.qsr_base or k
    alpha = o.qsr_alpha if o.qsr_alpha is not None else default_alpha(o.peak_lr, base)
    return QSRController(base=base, alpha=alpha, max_sync_period=o.max_sync_period)


REGISTRY: dict[str, Callable[[int, PolicyOptions], Controller]] = {
    "fixed": lambda k, o: FixedController(k),
    "exposed-sync": _share,
    "qsr": _qsr,
    # AdaComm's τ_0 is a large start that shrinks (controllers/adacomm.py): the cap, not K
    "adacomm": lambda k, o: AdaCommController(
        k0=o.max_sync_period, window=o.sync_window, max_sync_period=o.max_sync_period
    ),
    "post-local": lambda k, o: PostLocalController(
        local_period=k, max_sync_period=o.max_sync_period
    ),
    "inverse-lr": lambda k, o: InverseLRController(
        base=k, peak_lr=o.peak_lr, max_sync_period=o.max_sync_period
    ),
    "composite": lambda k, o: CompositeController(share=_share(k, o), qsr=_qsr(k, o)),
    "random": lambda k, o: RandomController(
        mean=o.random_mean if o.random_mean is not None else k,
        max_sync_period=o.max_sync_period,
        seed=o.seed,
    ),
}


# The PolicyOptions each policy reads (peak_lr and seed are the run's, set for every policy).
# An option the chosen policy does not read is refused when given (trainer/engine/options.py), not
# silently ignored; tests/test_controllers.py checks these sets against the factories above.
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
    }
)
_QSR_READS = frozenset({"qsr_base", "qsr_alpha", "max_sync_period"})
READS: dict[str, frozenset[str]] = {
    "fixed": frozenset(),
    "exposed-sync": _SHARE_READS,
    "qsr": _QSR_READS,
    "adacomm": frozenset({"sync_window", "max_sync_period"}),
    "composite": _SHARE_READS | _QSR_READS,
    "random": frozenset({"random_mean", "max_sync_period"}),
    "post-local": frozenset({"max_sync_period"}),
    "inverse-lr": frozenset({"max_sync_period"}),
}
RUN_OPTIONS = frozenset({"peak_lr", "seed"})  # not policy options: every policy gets them
# A bound on K under every policy: `fixed` does not read it, but its K is checked against it
# where it is given (a fixed K above 64 has always been given with it raised), so it is never
# refused as unread.
CAPS = frozenset({"max_sync_period"})
# The K-policy options, in PolicyOptions' order (each is also a setting of the same name).
POLICY_OPTIONS = tuple(f.name for f in fields(PolicyOptions) if f.name not in RUN_OPTIONS)


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
    "POLICY_OPTIONS",
    "READS",
    "REGISTRY",
    "RUN_OPTIONS",
    "BoundaryStats",
    "Controller",
    "PolicyOptions",
    "SyncDecision",
    "build_controller",
]
