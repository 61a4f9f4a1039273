"""exposed-sync's and composite's K floor where --k-floor is not given: the optimizer's
(docs/design.md §6, "the floor").

An optimizer that divides by a running second moment of the gradient (Adam's family) measures, at
K = 1, the averaged gradient: on W ranks 1/W of a local gradient's variance. When K then rises,
its local steps divide by a moment too small for them, for as long as the moment takes to catch
up (about 1/(1 - β2) steps: 1000 under AdamW's default, in a GPT run of 180). So under it K
stays at 2 or above unless told otherwise; under any other optimizer (SGD) the floor is 1.
`autok train` names its optimizer (--optimizer), so its config resolves the floor and records
it; `autok.Sync` resolves it from the optimizer it is given (`with_optimizer_floor`). A floor
given is kept as given. Torch-free: the CLI's settings import this before torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autok.controllers import READS as POLICY_READS

if TYPE_CHECKING:
    from autok.trainer.engine.options import SyncOptions

FAMILY_FLOOR = 2  # measured: docs/controller-panel/gpt-floor-check/, optimizer-floor-check/
# `autok train`'s --optimizer choices: whether each divides by a second moment (its torch class
# is checked against torch's family by tests/test_k_floor.py)
TRAIN_OPTIMIZERS = {"sgd": False, "adamw": True}


def default_floor(second_moment: bool, start: int | None, cap: int) -> int:
    """The floor under an optimizer that does (or does not) divide by a second moment: 2, or
    less where the run is told to start below it (--sync-period 1) or K may not reach it (a
    cap of 1): a floor the run could not keep would refuse a run nobody asked a floor of."""
    if not second_moment:
        return 1
    return min(FAMILY_FLOOR, cap, FAMILY_FLOOR if start is None else start)


def resolve_named(opts: SyncOptions) -> None:
    """In the options' validator, before the start K is derived: the floor of the optimizer
    the settings name (TrainConfig's --optimizer), where the policy reads a floor and none is
    given. SyncOptions names none: `autok.Sync` resolves it (with_optimizer_floor)."""
    named: Any = getattr(opts, "optimizer", None)
    if opts.k_floor is None and "k_floor" in POLICY_READS[opts.policy] and named is not None:
        opts.k_floor = default_floor(
            TRAIN_OPTIMIZERS[named], opts.sync_period, opts.max_sync_period
        )


def with_optimizer_floor(opts: SyncOptions, second_moment: bool) -> SyncOptions:
    """The options with the floor of the optimizer `Sync` was given, validated again (the start
    K follows the floor where it was not given); the options as they are where the policy reads
    no floor or one is set."""
    if opts.k_floor is not None or "k_floor" not in POLICY_READS[opts.policy]:
        return opts
    start = opts.given_sync_period
    data = opts.model_dump() | {"sync_period": start}
    data["k_floor"] = default_floor(second_moment, start, opts.max_sync_period)
    return type(opts).model_validate(data)


def check_floor(opts: SyncOptions) -> None:
    """A floor is a K the policy may run at: not above the cap, and the run starts at or above
    it (a start below it would be the one K under the floor)."""
    if opts.k_floor is None:
        return
    if opts.k_floor > opts.max_sync_period:
        raise ValueError(
            f"--k-floor: {opts.k_floor} is above --max-sync-period {opts.max_sync_period}"
        )
    if opts.sync_period is not None and opts.sync_period < opts.k_floor:
        raise ValueError(
            f"--k-floor: {opts.k_floor} is above --sync-period {opts.sync_period}, the K "
            "the run starts at; raise --sync-period or drop it"
        )
