"""Parameter averaging as ONE flat all-reduce, with the boundary's statistics riding along.

Layout of the persistent buffer (float32, reused across boundaries):

    [ averaged: params | gradients** | optim state* | buffers* ][ broadcast: buffers* ][ scalars ]

(** the fused cpdp boundary, below.) The params travel as θ_i − θ_ref where the outer step is not
a plain average (see ParameterAverager.start).

(* only when the options ask for it). Rank 0 writes the broadcast segment and the others write
zeros, so a SUM all-reduce broadcasts it inside the same collective. The scalars carry what the
profiler and the replica check need, so a boundary costs one latency on a WAN (docs/design.md §4).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autok.trainer.engine.averager_state import averager_state, load_averager_state
from autok.trainer.engine.compress import Buffers, Layout
from autok.trainer.engine.compressed import start_compressed
from autok.trainer.engine.digest import (
    _PIECEWISE_MIN,
    digest_bits,
    replica_digest,
)
from autok.trainer.engine.exact_sums import (
    COMPUTE,
    DIGEST,
    DIGEST0,
    EXPOSED,
    GRADS_CHANGED,
    GRADS_CHECKED,
    LOSS_SUM,
    N_SCALARS,
    S_PARTS,
    STEPS,
    Sums,
    drift_sq_from,
    sq_norm,
    write_scalars,
)
from autok.trainer.engine.flat_buffer import (
    FlatBuffer,
    copy_into,
    host_copy,
    views_of,
    working_copy,
    write_back,
)
from autok.trainer.engine.fragments import WHOLE, fragment_plan
from autok.trainer.engine.fused_grads import FusedGrads
from autok.trainer.engine.grad_watch import UNCHECKED
from autok.trainer.engine.handoff import hand
from autok.trainer.engine.landing import add_to_momentum, land_, land_delayed_
from autok.trainer.engine.link import LinkClock, allreduce_sum_, delayed
from autok.trainer.engine.options import OptionError
from autok.trainer.engine.outer import OuterOptimizer, TorchOuter, outer_step_, unscheduled_
from autok.trainer.engine.pending import Pending
from autok.trainer.engine.pieces import check_fragmentable, cut_whole, fragment_pieces

__all__ = [
    "IntervalTotals",
    "ParameterAverager",
    "Reconciled",
    "ReplicaMismatch",
    "reconcile_buffers",
]


@dataclass(frozen=True)
class IntervalTotals:
    """One rank's local totals for the interval being closed."""

    loss_sum: float
    steps: int
    compute_seconds: float
    exposed_sync_seconds: float
    # the boundary step's autok.trainer.engine.grad_watch verdict (UNCHECKED where none was taken)
    grads: int = UNCHECKED


@dataclass(frozen=True)
class Reconciled:
    """What one averaging collective returns; identical on every rank except `wall_seconds`."""

    drift_norm: float
    update_norm: float
    train_loss: float
    compute_seconds: float  # mean over ranks
    exposed_sync_seconds: float  # mean over ranks
    nbytes: int
    wall_seconds: float  # this rank's time in reconcile(): collective + SlowMo + write-back
    grads_checked: int = 0  # ranks whose boundary step's gradients were checked (grad_watch)
    grads_changed: int = 0  # ... and found changed between backward and the optimizer step


class ReplicaMismatch(RuntimeError):
    pass


def _no_fused_boundary() -> None:
    raise ValueError("capture_boundary_grads: this averager has no fused boundary")


def _sub_into(
    pieces: list[torch.Tensor],
    ref: torch.Tensor,
    out: torch.Tensor,
    flats: list[torch.Tensor] | None = None,
) -> None:
    """out = θ − ref, with θ the pieces laid end to end (bit for bit the same either way);
    `flats`: the pieces as 1-D views, if the caller keeps them."""
    if len(pieces) == 1 or out.numel() >= _PIECEWISE_MIN * len(pieces):
        views = views_of
        for p, r, o in zip(pieces, views(ref, pieces), views(out, pieces), strict=True):
            torch.sub(p, r, out=o)
    else:
        torch.cat(flats or [t.reshape(-1) for t in pieces], out=out)
        out.sub_(ref)


_FOLDABLE = (torch.float32, torch.float64)  # what the averaging works in (not complex)
_NUMPY = (torch.float32, torch.float64)  # buffer dtypes whose scalars are written through NumPy
_KEPT_COPY_MAX = 1 << 20  # words: the largest digest copy an averager keeps (4 MiB of int32)
_DATA_PTR = torch.Tensor.data_ptr


class ParameterAverager:
    def __init__(
        self,
        params: list[torch.Tensor],
        *,
        rank: int,
        world_size: int,
        beta: float = 0.0,
        lr_aware: bool = False,
        outer: OuterOptimizer | None = None,
        compress: str = "none",
        averaged_extras=lambda: [],  # -> list of tensors averaged with the params
        broadcast_extras=lambda: [],  # -> list of tensors taken from rank 0
        fused_sgd: torch.optim.SGD | None = None,
        fragments: int = 1,
        offload: bool = False,
        fragment_by: str = "element",
        merge_alpha: float | None = None,
    ) -> None:
        """With `fused_sgd`, a cpdp boundary is one collective (docs/design.md §2): the step was
        a *local* SGD step with the local gradient g_i; its gradients ride with the parameters,
        and each momentum buffer is corrected by (ḡ − g_i). For an optimizer linear in the
        gradient this gives the parameters of gradient AllReduce + synchronized step +
        averaging: the synchronized step differs from the local one by η·c·(ḡ − g_i) on rank i,
        which averages to zero, and the buffers differ by exactly ḡ − g_i.

        `outer` is the outer step (trainer/engine/outer.py); without it, SlowMo with `beta` and
        `lr_aware` (the `--slowmo-beta` spelling). `compress` (fp16, int8) sends Δ_i = θ_i − θ_ref
        quantized, with error feedback (trainer/engine/compress.py).

        `fragments` F splits the flat parameter vector into F contiguous slices
        (trainer/engine/fragments.py); start(fragment=j) moves slice j only, and the outer step and
        the error feedback act on that slice of θ_ref, the velocity and the residual, which are
        kept for the whole vector. Optimizer state and fused gradients are whole-model
        (refused with F > 1 by the options); float buffers ride with every sync. `fragment_by`
        says what a fragment is (fragments.py, fragment_plan): strided lays the tensors out
        fragment by fragment, so θ_ref and the velocity follow that order, not the model's.

        `merge_alpha`: how a delayed average lands (docs/design.md §2, the merge): None keeps
        the local steps taken meanwhile on top of θ_global; α mixes (1 − α)·θ_global + α·θ_local
        (torchft's lerp)."""
        order, bounds = fragment_plan(
            [p.numel() for p in params], [p.element_size() for p in params], fragments, fragment_by
        )
        params = [params[i] for i in order]
        self.merge_alpha = merge_alpha
        self.params = params
        self.rank, self.world_size = rank, world_size
        if outer is None:
            outer = OuterOptimizer("slowmo", 1.0, beta, lr_aware)
        self.outer = outer  # set here or by use_outer() only: _plain caches its property
        self._plain = outer.is_plain_average  # (a boundary reads it up to three times)
        self._torch_outer: TorchOuter | None = None  # use_outer(): a torch optimizer's step
        self.compress = compress
        # per buffer layout (fragments differ in size): the quantized all-reduce's plan, memory
        self._codecs: dict[tuple[tuple[int, ...], int], tuple[Layout, Buffers]] = {}
        self._residual: torch.Tensor | None = None  # error feedback: what quantization dropped
        # ... and what requantizing the summed share this rank owned dropped (compress.py)
        self._residual2: torch.Tensor | None = None
        self._averaged_extras, self._broadcast_extras = averaged_extras, broadcast_extras
        self.numel = sum(p.numel() for p in params)
        flat = working_copy(params)  # θ_0 in the averaging's dtype (flat_buffer.py)
        self._narrow = any(p.dtype != flat.dtype for p in params)  # θ_new is rounded as written
        # `offload` (--outer-state-device cpu): θ_ref and the velocity live in host memory
        # (pinned, for a GPU's copies) and are staged on the device for a boundary only
        # (flat_buffer.py): between boundaries the device holds the buffer alone
        # (docs/design.md §4).
        # The boundary's arithmetic is the same ops on the same device: bit for bit.
        self._offload = offload
        self.ref = flat.clone() if not offload else host_copy(flat)  # θ_ref, from θ_0
        # θ_ref as the parameters' shapes: the whole model's write-back source (θ_new is θ_ref)
        self._ref_views = views_of(self.ref, params)
        self._ptrs: list[int] | None = None  # _whole()'s cache: the storages it was cut from
        self._flats: list[torch.Tensor] | None = None  # _whole()'s 1-D views of the parameters
        self.velocity = torch.zeros_like(self.ref) if outer.needs_velocity else None
        self._bits = digest_bits(world_size)
        # finish()'s 1/N can ride in the outer step's factors (see there): N a power of two
        self._foldable = world_size & (world_size - 1) == 0 and flat.dtype in _FOLDABLE
        host = flat.device.type == "cpu"
        self._sums = Sums(flat.dtype) if host and flat.dtype in _NUMPY else None  # the norms'
        self._digest_sums: Sums | None = None  # the digest's copy and sum; set by _whole()
        self.last_digest = replica_digest(params, self._bits)
        self.last_fragment = WHOLE  # what the last boundary moved (the digest describes it)
        self.boundaries = 0
        self.bounds = [(0, self.numel)]
        if fragments > 1:
            check_fragmentable(params)
            self.bounds = bounds
        # the collective's buffer and the views a boundary cuts from it (flat_buffer.py)
        self.flat = FlatBuffer(self.ref, self.velocity, flat.device, offload, len(self.bounds))
        self.fused_sgd = fused_sgd
        # the fused boundary's g_i, captured into the buffer's gradient segment
        self.fused = (
            FusedGrads(fused_sgd, params, self.flat, averaged_extras, broadcast_extras)
            if fused_sgd is not None
            else None
        )
        # g_i kept as it enters the fused boundary's optimizer step (FusedGrads.capture), for
        # the optimizer step pre-hook (Sync): bound once, so that call adds no frame
        self.capture_boundary_grads: Callable[[], None] = (
            self.fused.capture if self.fused is not None else _no_fused_boundary
        )

    def use_outer(self, outer: TorchOuter) -> None:
        """Take a torch optimizer as the outer step (autok.Sync's `outer_optimizer=FACTORY`),
        before any boundary: its flat parameter becomes θ_ref (this θ_ref's values). Its
        parameters are views of the whole θ_ref, so the step moves the whole model: refused
        with fragments (a slice's step) and an offloaded θ_ref (staged copies), by the caller."""
        if self.boundaries or len(self.bounds) > 1 or self._offload:
            raise ValueError("use_outer: before any boundary, on a whole, non-offloaded θ_ref")
        flat = outer.flat
        if flat.shape != self.ref.shape or flat.dtype != self.ref.dtype:
            raise ValueError(f"use_outer: θ_ref is {self.ref.dtype} x {self.ref.numel()}")
        flat.copy_(self.ref)
        self.ref = flat
        self._ref_views = views_of(self.ref, self.params)
        self.outer, self._torch_outer, self.velocity = OuterOptimizer("torch"), outer, None
        self._plain = self.outer.is_plain_average  # (False: a torch optimizer's step rounds)
        self.flat.retarget(self.ref, None)  # the cuts held slices of the old θ_ref

    def region(self, fragment: int = WHOLE) -> tuple[int, int, list[torch.Tensor]]:
        """[start, end) of the flat parameter vector that `fragment` moves, and the parameter
        pieces that hold it, in order: the parameters themselves for the whole model, 1-D views
        into them for a fragment (a cut may fall inside a tensor; pieces.py)."""
        if fragment == WHOLE:
            return 0, self.numel, list(self._whole()[0])  # a copy: the cached list stays as is
        a, b = self.bounds[fragment]
        return a, b, fragment_pieces(self.params, a, b)

    def _whole(
        self,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """The parameters detached, and where every parameter is contiguous (so these are
        views) their digest words and their 1-D views (the pack's): cut once, not at every
        boundary (for a small model the cutting cost more than the sums). Cut again if
        a parameter's storage has moved, which DDP's own contract forbids once the model is
        wrapped (pieces.py)."""
        ptrs = list(map(_DATA_PTR, self.params))  # (in C: no bytecodes a parameter)
        if ptrs != self._ptrs:
            self._ptrs = ptrs
            whole = cut_whole(self.params, _KEPT_COPY_MAX)
            self._detached, self._words, self._one_copy, self._digest_sums, self._flats = whole
        return self._detached, self._words, self._flats

    def _moved(self, fragment: int, grads: list[torch.Tensor]):
        """What a boundary moving `fragment` packs: its [start, end), the parameter pieces, the
        averaged tensors [pieces | grads | averaged extras] and the broadcast extras."""
        a, b, pieces = self.region(fragment)
        return a, b, pieces, pieces + grads + self._averaged_extras(), self._broadcast_extras()

    def _outer_at(self, a: int, b: int, due: int | None) -> tuple[int, int] | None:
        """[lo, hi) of the moved [a, b) that takes the outer step, where that is not all of it
        (None: all, a scheduled boundary). An unscheduled sync injects no outer momentum
        (docs/design.md §2, "Unscheduled syncs"): nothing takes the step (empty), or only the
        fragment the schedule made due at a whole-model epoch end. A plain average has no
        outer state: θ_avg either way, kept on its one path (bit for bit ddp at K = 1)."""
        if self._plain:
            return None
        if due is None:
            return a, a
        lo, hi = self.bounds[due] if due != WHOLE else (0, self.numel)
        lo, hi = max(lo, a), min(hi, b)
        if lo >= hi:
            return a, a
        return None if (lo, hi) == (a, b) else (lo, hi)

    def reconcile(self, totals: IntervalTotals, lr: float, clock: LinkClock | None) -> Reconciled:
        """One boundary, synchronously: pack, all-reduce, SlowMo, write back."""
        return self.finish(self.start(totals, lr, clock, overlap=False))

    def start(
        self,
        totals: IntervalTotals,
        lr: float,
        clock: LinkClock | None,
        overlap: bool,
        fragment: int = WHOLE,
        boundary_step: bool = True,
        due: int | None = WHOLE,
    ) -> Pending:
        """Pack this rank's part and launch the collective; with `overlap` it runs in the
        background and finish() applies it later (delayed averaging). `fragment`: the slice of
        the parameters to move (trainer/engine/fragments.py), or the whole model. `boundary_step`:
        False for a boundary outside any step (sync_now): with no boundary step, no fused
        gradients ride along (every rank knows they would be zero: a smaller collective, and
        no momentum correction). `due`: what the schedule syncs at this boundary, WHOLE or a
        fragment, or None for an unscheduled sync (docs/design.md §2, "Unscheduled syncs"):
        the outer step acts on what is both moved and due; the rest is set to θ_avg, with its
        θ_ref and velocity untouched.

        Where the outer step is not a plain average (and the average is taken at once,
        uncompressed), the parameters travel as Δ_i = θ_i − θ_ref: their mean is the outer
        step's Δ and the update norm's vector, so finish() subtracts nothing, and packing them
        is the subtraction that s_i needs anyway. A plain average sends θ_i, so that θ_new is
        the mean of the θ_i bit for bit (cpdp K=1 reproduces ddp)."""
        t0 = time.perf_counter()
        fused = self.fused
        if fused is not None and fragment != WHOLE:
            raise ValueError("the fused boundary moves the whole model, not a fragment")
        if fused is not None and boundary_step:
            grads = fused.boundary_grads()  # already in place in the buffer
            momenta = fused.momenta(grads)  # (paired only: corrected below)
        else:
            grads, momenta = [], None
            if fused is not None:  # a boundary outside any step: nothing captured rides
                fused.captured = False
        a, b, pieces, avg_tensors, bc_tensors = self._moved(fragment, grads)
        n = b - a
        # [pieces | grads | extras]: the pieces hold the n moved elements and the gradients
        # (fused, whole model) n more; only the extras are summed (a Python pass over every
        # parameter costs a large model's boundary thousands of bytecodes)
        n_avg = n * (2 if grads else 1) + sum(
            t.numel() for t in avg_tensors[len(pieces) + len(grads) :]
        )
        n_bc = sum(t.numel() for t in bc_tensors)
        buf = self.flat.buffer(n_avg + n_bc + N_SCALARS)
        avg_seg, bc_seg, scalars, head, ref, velocity, scratch, host = self.flat.cut(
            a, b, n_avg, n_bc
        )
        outer_at = None if due == WHOLE else self._outer_at(a, b, due)  # WHOLE: all is due
        delta_form = (
            not overlap
            and self.compress == "none"
            and not self._plain
            and outer_at is None  # (θ_avg of an unscheduled sync is the mean of the θ_i)
        )

        flats = self._flats if fragment == WHOLE else None  # cut by region() just now
        if delta_form:
            _sub_into(pieces, ref, head, flats)
        else:
            torch.cat(flats or [t.reshape(-1) for t in pieces], out=head)
        extras = avg_tensors[len(pieces) + len(grads) :]
        if extras:
            torch.cat([t.reshape(-1) for t in extras], out=avg_seg[n * (2 if grads else 1) :])
        if n_bc:  # this rank's own values first: the overlap snapshot must hold what it has
            torch.cat([t.reshape(-1) for t in bc_tensors], out=bc_seg)

        # s_i = ||θ_i − θ_ref||²; see drift in finish().
        s = sq_norm(head if delta_form else torch.sub(head, ref, out=scratch), scratch, self._sums)
        if momenta is not None:  # m_i − g_i now, while g_i is here; finish() adds ḡ
            add_to_momentum(momenta, -1.0)  # (landing.py)
        # The outer step's first op, μ·v, needs nothing the collective brings: taken here, where
        # the core is warm, not after the wait (on a shared VM each op after a long
        # wait costs tens of µs more). Only with delta_form: finish() follows at once. A boundary
        # that raises in between (ReplicaMismatch) leaves μ·v, as it leaves m_i − g_i.
        decayed = False
        if delta_form and velocity is not None:
            velocity.mul_(self.outer.momentum)
            decayed = True
        write_scalars(scalars, host, s, self.world_size, totals, self.last_digest, self.rank)
        # the tensors by position: a call with more than 15 keywords (CPython 3.11: positional
        # + 2 x keywords > 30) builds a dict instead, two bytecodes a keyword on this path
        pending = Pending(
            avg_tensors,
            bc_tensors,
            n_grads=len(grads),
            n_avg=n_avg,
            n_bc=n_bc,
            lr=lr,
            overlap=overlap,
            fragment=fragment,
            start=a,
            end=b,
            n_pieces=len(pieces),
            delta_form=delta_form,
            momenta=momenta,
            decayed=decayed,
            outer_at=outer_at,
            merge_alpha=self.merge_alpha,
        )
        if overlap:
            # What this rank held when the average was taken: the local step taken meanwhile
            # is kept on top of the average when it arrives.
            self.flat.keep_sent(buf[: n_avg + n_bc])
        if n_bc and self.rank != 0:
            bc_seg.zero_()  # rank 0's values alone survive the SUM: a broadcast
        pending.nbytes = buf.numel() * buf.element_size()
        if self.compress != "none":
            start_compressed(self, buf, pending, clock)
        elif overlap:
            hand(buf)  # the backend's thread may drop it after the wait (handoff.py)
            fut = dist.all_reduce(buf, async_op=True).get_future()
            if clock is not None:
                nbytes = buf.numel() * buf.element_size()
                fut = delayed(fut, clock.reserve(nbytes), device=buf.device)
            pending.future = fut
        else:
            allreduce_sum_(buf, clock)
        pending.seconds = time.perf_counter() - t0
        return pending

    def finish(self, pending: Pending, settle: bool = False) -> Reconciled:
        """Apply a launched averaging. `settle`: no local step was taken since it was launched
        (an overlapped average finished by sync_now), so θ_new is written as is: adding
        (θ_new − θ_sent) to θ_sent would round differently on each rank."""
        t0 = time.perf_counter()
        if pending.future is not None:
            pending.future.wait()
        n, n_avg, n_bc = self.world_size, pending.n_avg, pending.n_bc
        a, b = pending.start, pending.end
        m = b - a  # parameter elements moved
        cut = self.flat.cut(a, b, n_avg, n_bc)
        avg_seg, _, scalars, head, ref, velocity, scratch, host = cut
        red = (host if host is not None else scalars).tolist()
        if red[DIGEST] != n * red[DIGEST0]:
            when = f"after boundary {self.boundaries - 1}" if self.boundaries else "at the start"
            raise ReplicaMismatch(
                f"replicas differ {when}: parameter digests sum to {red[DIGEST]:.0f}, "
                f"expected {n} x {red[DIGEST0]:.0f}"
            )
        if pending.n_grads and red[GRADS_CHANGED]:
            # Refused before anything is written back: every rank sees the same sum
            # (docs/design.md, "What the fused boundary needs unchanged").
            raise OptionError(
                f"--boundary: the loop changed the gradients between backward and "
                f"optimizer.step() on {red[GRADS_CHANGED]:.0f} rank(s) (clipping, noise, a "
                "scaling of its own): the fused boundary applies that to each rank's gradient "
                'where DDP applies it to the averaged one; pass boundary="two-phase"'
            )
        self.boundaries += 1
        # The mean Δ's 1/n rides in the outer step's factors where that is exact: with n a power
        # of two every product with it is exact, so the step is bit-identical to one on Σ/n and
        # the division's pass over the parameters is saved. Only a subnormal Σ/n could
        # round differently (where the add is a fused multiply-add): below 1.2e-38 in float32,
        # the narrowest dtype the averaging works in.
        fold = pending.delta_form and self._foldable
        scale = 1.0 / n if fold else 1.0
        if not fold:
            head.div_(n)
        # the averaged extras (buffers, optimizer state) after the parameters and any gradients,
        # whose 1/n rides in the momentum correction's add
        extras_at = 2 * m if pending.n_grads else m
        if n_avg > extras_at:
            avg_seg[extras_at:].div_(n)
        # mean_i ||θ_i − θ_avg||² = mean_i s_i − ||θ_avg − θ_ref||²: no extra collective, and
        # shifting by θ_ref keeps both terms small (no catastrophic cancellation).
        theta_avg = delta = None
        if pending.delta_form or pending.compressed:  # the mean Δ = θ_avg − θ_ref was sent
            delta = head  # scale·Δ̄
            update_sq = sq_norm(delta, scratch, self._sums) * scale * scale
            if self._plain:
                theta_avg, delta = delta.add_(ref), None
        else:
            theta_avg = avg_seg[:m]
            update_sq = sq_norm(torch.sub(theta_avg, ref, out=scratch), scratch, self._sums)
            if not self._plain:  # its squares took its place: Δ once more
                delta = torch.sub(theta_avg, ref, out=scratch)
        drift_sq = drift_sq_from(red[:S_PARTS], n, update_sq)
        if pending.outer_at is not None:  # unscheduled: θ_avg, no outer momentum injected
            # never delta_form (scale 1: no fold), never a plain average (Δ was taken above)
            assert not pending.delta_form and delta is not None
            stepped = (pending.outer_at[0] - a, pending.outer_at[1] - a)
            theta_new = unscheduled_(
                self.outer, stepped, pending.lr, ref, velocity, theta_avg, delta
            )
        elif self._torch_outer is None:
            theta_new = outer_step_(
                self.outer,
                ref,
                velocity,
                theta_avg,
                pending.lr,
                delta=delta,
                scale=scale,
                decayed=pending.decayed,
            )
        else:  # a torch optimizer's step on θ_ref (whole: use_outer), Δ its gradient
            assert delta is not None  # never a plain average (OuterOptimizer("torch"))
            theta_new = self._torch_outer.step_(delta, scale)
        self.last_fragment = pending.fragment
        if pending.overlap and not settle:  # delayed: the merge (landing.py)
            self.last_digest = land_delayed_(self, pending, theta_new, cut)
        else:
            self.last_digest = land_(self, pending, theta_new, cut, n)
        if self._offload:  # (after land_'s narrow copy: it rounds the staged θ_ref)
            self.flat.unstage()

        steps = max(1.0, red[STEPS])
        return Reconciled(
            drift_norm=drift_sq**0.5,
            update_norm=update_sq**0.5,
            train_loss=red[LOSS_SUM] / steps,
            compute_seconds=red[COMPUTE] / n,
            exposed_sync_seconds=red[EXPOSED] / n,
            nbytes=pending.nbytes,
            wall_seconds=pending.seconds + time.perf_counter() - t0,
            grads_checked=int(red[GRADS_CHECKED]),
            grads_changed=int(red[GRADS_CHANGED]),
        )

    # flat_buffer.py's, looked up on the averager: a test puts a faulty write-back in its place
    _copy_into = staticmethod(copy_into)

    def state_dict(self) -> dict:
        """What a resume needs (averager_state.py)."""
        return averager_state(self)

    def load_state_dict(self, state: dict, recompute_digest: bool = True) -> None:
        """Call after the parameters themselves are loaded (averager_state.py)."""
        load_averager_state(self, state, recompute_digest)


def reconcile_buffers(
    buffers: list[torch.Tensor], policy: str, rank: int, world_size: int, clock: LinkClock | None
) -> float:
    """Average or broadcast (from rank 0) float buffers in one collective; return its wall time.
    Used where no parameter averaging runs to carry them (ddp, at each epoch end)."""
    flat = torch.cat([b.reshape(-1) for b in buffers])
    flat = flat.to(torch.promote_types(flat.dtype, torch.float32))  # a bfloat16 mean: in float32
    if policy == "broadcast" and rank != 0:
        flat.zero_()
    seconds = allreduce_sum_(flat, clock)
    if policy == "average":
        flat.div_(world_size)
    write_back(buffers, flat)
    return seconds
