"""auto's boundary form (--boundary auto; docs/design.md, "What the fused boundary needs
unchanged"): a cpdp boundary is two-phase until a boundary step has shown, on every rank, that the
loop leaves the gradients as backward gave them, then fused; two-phase for good where a rank
changed them. Functions of the Sync: its `_fused`, `_probing` and `_watch` are read at every step
and stay its attributes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autok.trainer.engine.grad_watch import GradWatch
from autok.trainer.engine.strategies import STRATEGIES, fused

if TYPE_CHECKING:
    from autok.trainer.engine.averaging import Reconciled
    from autok.trainer.engine.sync import Sync

BOUNDARY_FORMS = ("fused", "probing", "two-phase")  # boundary_form's answers


def choose_boundary_form(sync: Sync, rec: Reconciled) -> None:
    """auto's choice, from a two-phase boundary step whose gradients some rank checked (the
    sums are every rank's, so every rank chooses alike): the fused boundary from the next
    one where every rank checked and none found them changed after backward; two-phase for
    good where one did (docs/design.md, "What the fused boundary needs unchanged")."""
    if rec.grads_changed:
        sync._probing, sync._watch = False, None
    elif rec.grads_checked == sync.world_size:
        sync._probing = False
        sync.strategy = fused(sync.strategy)
        sync._fused = True


def boundary_form(sync: Sync) -> str:
    """The cpdp boundary taken now: auto's choice, so a resume continues on the same path."""
    return "fused" if sync._fused else "probing" if sync._probing else "two-phase"


def restore_boundary_form(sync: Sync, form: str) -> None:
    """auto's choice as saved (an explicit --boundary is the user's and stays)."""
    sync._probing, sync._fused = form == "probing", form == "fused"
    base = STRATEGIES[sync.options.strategy]
    sync.strategy = fused(base) if sync._fused else base
    if form == "two-phase":
        sync._watch = None
    elif sync._watch is None:
        sync._watch = GradWatch(sync._params)
