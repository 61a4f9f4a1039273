"""How a boundary's θ_new lands on the parameters (trainer/engine/averaging.py,
ParameterAverager.finish; docs/design.md §2): written back with what rode along (the averaged
and broadcast extras, the fused boundary's momentum correction), or, for a delayed average,
merged onto the local steps taken since it was sent (the merge: keep or lerp). Each returns
the replica digest of what the ranks now agree on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from autok.trainer.engine.digest import digest_of_words, digest_words, replica_digest
from autok.trainer.engine.flat_buffer import Cut, add_back, views_of, write_back
from autok.trainer.engine.fragments import WHOLE

if TYPE_CHECKING:
    from autok.trainer.engine.averaging import ParameterAverager
    from autok.trainer.engine.pending import Pending

CopyInto = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


def add_to_momentum(
    momenta: tuple[list[torch.Tensor], list[torch.Tensor]] | None, scale: float
) -> None:
    """m += scale · g over (momentum buffers, gradients). The fused boundary's correction
    m_i += ḡ − g_i, which leaves the buffer the synchronized step would have left, comes in two
    halves: start() adds −g_i before the collective overwrites it, finish() adds (1/N)·Σ g
    (local ops, one pass each). A boundary that raises in between (ReplicaMismatch: the
    replicas already differ) leaves m_i − g_i."""
    if momenta is not None:
        torch._foreach_add_(momenta[0], momenta[1], alpha=scale)


def merge_(
    pieces: list[torch.Tensor],
    theta_new: torch.Tensor,
    theta_sent: torch.Tensor,
    scratch: torch.Tensor,
    alpha: float | None,
    copy_into: CopyInto,
) -> None:
    """A delayed average's θ_new (θ_global) written into the parameter pieces that took
    local steps since it was sent (docs/design.md §2, the merge). keep (`alpha` None):
    θ_i + (θ_new − θ_sent), the local steps on top of θ_global. lerp: (1 − α)·θ_global +
    α·θ_i as torchft's θ_global.lerp_(θ_i, α), so α = 0 is θ_global exactly. `copy_into`: the
    averager's (a test puts a faulty one in its place)."""
    if alpha is None:
        torch.sub(theta_new, theta_sent, out=scratch)
        add_back(pieces, scratch)
        return
    copy_into(views_of(scratch, pieces), pieces)  # θ_i, in the averaging's dtype
    torch.lerp(theta_new, scratch, alpha, out=scratch)
    write_back(pieces, scratch)


def land_delayed_(
    averager: ParameterAverager, pending: Pending, theta_new: torch.Tensor, cut: Cut
) -> int:
    """Delayed averaging: θ_new lands on what the rank holds now (the merge); what rides along
    (buffers, optimizer state) keeps its steps: (target − what was sent) added. Replicas now
    differ by their step since the boundary; what they agree on, and the digest describes,
    is θ_new."""
    m, n_avg, snapshot = pending.end - pending.start, pending.n_avg, averager.flat.snapshot
    pieces = pending.avg_tensors[: pending.n_pieces]
    # what this rank sent: θ_ref's slice is the reference the packed θ_i were measured against
    merge_(pieces, theta_new, snapshot[:m], cut.scratch, pending.merge_alpha, averager._copy_into)
    rest_tensors = pending.avg_tensors[pending.n_pieces + pending.n_grads :]
    if rest_tensors:
        rest = m * (2 if pending.n_grads else 1)
        add_back(rest_tensors, cut.avg[rest:].sub_(snapshot[rest:n_avg]))
    if pending.n_bc:
        add_back(pending.bc_tensors, cut.bc.sub_(snapshot[n_avg:]))
    return replica_digest([theta_new], averager._bits)


def land_(
    averager: ParameterAverager, pending: Pending, theta_new: torch.Tensor, cut: Cut, n: int
) -> int:
    """θ_new written back as is, with the averaged extras (their mean), the broadcast ones
    (rank 0's) and the fused boundary's momentum correction (its second half, 1/N·Σ g);
    returns the digest of the parameters as written, not of θ_new: a faulty write-back is
    caught too."""
    pieces = pending.avg_tensors[: pending.n_pieces]
    outer_at = pending.outer_at
    whole = pending.fragment == WHOLE
    if whole and not averager._offload and outer_at is None:
        # θ_new is θ_ref, cut already (an unscheduled sync's is a buffer)
        averager._copy_into(pieces, averager._ref_views)
    else:
        write_back(pieces, theta_new)
    if averager._narrow:  # θ_ref as the replicas hold it: rounding θ_new to the parameters'
        # dtype is no update of theirs (the next Δ_i, and SlowMo's velocity, would carry it)
        averager._copy_into(views_of(theta_new, pieces), pieces)
        if outer_at is not None:  # θ_new is a buffer: its stepped slice home
            lo, hi = (i - pending.start for i in outer_at)
            cut.ref[lo:hi].copy_(theta_new[lo:hi])
    if pending.momenta is not None:  # the gradient views hold Σ g now
        add_to_momentum(pending.momenta, 1.0 / n)
    rest_tensors = pending.avg_tensors[pending.n_pieces + pending.n_grads :]
    if rest_tensors:
        m = pending.end - pending.start
        write_back(rest_tensors, cut.avg[m * (2 if pending.n_grads else 1) :])
    if pending.n_bc:
        write_back(pending.bc_tensors, cut.bc)
    # start() has just cut their words (a boundary whose average lands later may have waited
    # past a change of storage: cut again)
    words = (averager._words if not pending.overlap else averager._whole()[1]) if whole else None
    if words is None:
        return digest_of_words(digest_words(pieces), averager._bits)
    return digest_of_words(words, averager._bits, averager._one_copy, averager._digest_sums)
