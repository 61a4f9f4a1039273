"""exposed-sync's and composite's K floor where --k-floor is not given: the optimizer's
(docs/design.md §6, "the floor").

An optimizer that divides by a running second moment of the gradient (Adam's family) measures, at
K = 1, the averaged gradient: on W ranks 1/W of a local gradient's variance. When K then rises,
its local steps divide by a moment too small for them, for as long as the moment takes to catch
up (about 1/(1 - β2) steps: 1000 under AdamW's default, in a GPT run of 180). So under it K
stays at 2 or above unless told otherwise; under any other optimizer (SGD) the floor is 1.
`autok train` names its optimizer (TrainConfig's `named_second_moment`), so its config resolves
the floor and records it; `autok.Sync` resolves it from the optimizer it is given
(`with_optimizer_floor`). A floor given is kept as given; a --sync-period given under the
optimizer's floor is refused (starting at K = 1 is the phase the floor is there to avoid), not
met by a lower floor. Torch-free: the CLI's settings import this before torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from autok.controllers import reads

if TYPE_CHECKING:
    from autok.trainer.engine.options import SyncOptions

Options = TypeVar("Options", bound="SyncOptions")  # autok.Sync's own settings subclass them
FAMILY_FLOOR = 2  # judged: docs/controller-panel/gpt-floor-check/ (with --link-shift 3)
SECOND_MOMENT_KEY = "second_moment"  # the validation context's key: the optimizer Sync was given


def default_floor(second_moment: bool, cap: int) -> int:
    """The floor under an optimizer that does (or does not) divide by a second moment: 2, or 1
    where K may not exceed 1 (a cap of 1 leaves nothing to choose)."""
    return min(FAMILY_FLOOR, cap) if second_moment else 1


def resolve_floor(opts: SyncOptions, second_moment: bool | None) -> None:
    """In the options' validator, before the start K is derived: the optimizer's floor, where
    the policy reads a floor, none is given and the optimizer is known (None: not yet; autok.Sync
    validates again with it). A --sync-period given under it is refused in one line."""
    if opts.k_floor is not None or not reads(opts.policy, "k_floor") or second_moment is None:
        return
    if opts.strategy == "ddp":  # K is 1 there, and an adaptive policy is refused for it first
        return
    floor = default_floor(second_moment, opts.max_sync_period)
    if opts.sync_period is not None and opts.sync_period < floor:
        raise ValueError(
            f"--sync-period: {opts.sync_period} is under the K floor {floor} that {opts.policy} "
            'keeps under Adam\'s family (docs/design.md §6, "the floor"); give --k-floor 1 to '
            f"start at {opts.sync_period}, or a --sync-period of {floor} or more"
        )
    opts.k_floor = floor


def with_optimizer_floor(opts: Options, second_moment: bool) -> Options:
    """The options validated again with the floor of the optimizer `Sync` was given (the start
    K derived again where it was not given); the options as they are where the policy reads no
    floor or one is set."""
    from pydantic import ValidationError

    from autok.trainer.engine.options import OptionError, describe  # (it imports this module)

    if opts.k_floor is not None or not reads(opts.policy, "k_floor"):
        return opts
    # given where the validator saw it given, or where it differs from what the options derive
    # (set on a copy or by assignment since: options.py's record is of the validation; a start
    # set so to the very K they derive reads as derived, and follows the floor)
    start = opts._given_start  # (its pair: options.py)
    if start is None and opts.sync_period != opts._default_sync_period():
        start = opts.sync_period
    data = opts.model_dump() | {"sync_period": start}
    try:
        return type(opts).model_validate(data, context={SECOND_MOMENT_KEY: second_moment})
    except ValidationError as exc:  # a --sync-period given under the floor
        raise OptionError(describe(exc, type(opts))) from None


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
