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

import math
import struct
import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from autok.trainer.engine.compress import Buffers, Layout, quantized_allreduce_
from autok.trainer.engine.fragments import WHOLE, fragment_bounds
from autok.trainer.engine.grad_watch import CHANGED, UNCHECKED
from autok.trainer.engine.link import LinkClock, allreduce_sum_, delayed, hold_until
from autok.trainer.engine.options import UNUSED_PARAMETERS_HINT, OptionError
from autok.trainer.engine.outer import OuterOptimizer, TorchOuter, outer_step_

# Scalar slots at the tail of the buffer. s = ||θ_i − θ_ref||² rides as S_PARTS float32 pieces.
# GRADS_CHECKED, GRADS_CHANGED: the ranks whose boundary step's gradients were checked, and found
# changed, between backward and the optimizer step (trainer/engine/grad_watch.py).
S_PARTS = 4
LOSS_SUM, STEPS, COMPUTE, EXPOSED, DIGEST, DIGEST0, GRADS_CHECKED, GRADS_CHANGED = range(
    S_PARTS, S_PARTS + 8
)
N_SCALARS = S_PARTS + 8


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


@dataclass
class _Pending:
    """A boundary whose collective has been launched."""

    avg_tensors: list[torch.Tensor]  # [parameter pieces | gradients | averaged extras]; the
    # pieces travel as θ_i − θ_ref with delta_form
    bc_tensors: list[torch.Tensor]
    n_grads: int
    n_avg: int
    n_bc: int
    lr: float
    overlap: bool
    fragment: int = WHOLE  # the fragment it moves (trainer/engine/fragments.py), or the whole model
    start: int = 0  # [start, end) of the flat parameter vector it moves
    end: int = 0
    n_pieces: int = 0  # parameter pieces at the head of avg_tensors
    delta_form: bool = False  # the pieces travel as θ_i − θ_ref (see ParameterAverager.start)
    decayed: bool = False  # start() took the outer step's μ·v (see outer_step_)
    # [lo, hi) of the flat vector taking the outer step where that is not all it moves: an
    # unscheduled sync (empty) or an epoch end where one fragment was due (docs/design.md §2)
    outer_at: tuple[int, int] | None = None
    # fused: (momentum buffers, their gradient views in the buffer), paired in start()
    momenta: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
    future: torch.futures.Future | None = None
    seconds: float = 0.0  # this rank's time spent in start()
    nbytes: int = 0  # what this rank put on the wire
    compressed: bool = False


def split_exact(x: float, world_size: int, parts: int = S_PARTS) -> list[float]:
    """A float64 as `parts` float32 pieces that sum back to it and survive a float32 SUM over
    `world_size` ranks exactly.

    A float32 holds 24 significant bits. Each piece keeps at most 24 − b of them, with
    b = ceil(log2 N) + 1 bits of headroom, so N pieces with one exponent add exactly in any
    order (partial sums included); four pieces cover float64's 53 bits for N up to 512.
    Replicas that agree have identical s_i, so their sum is exact and zero drift reads exactly
    0 (a plain hi/lo split rounds at the third addend: 3·hi needs 26 bits). Pieces of ranks
    whose s_i differ by more than 2^b add with a rounding of 2^-24 of the sum, but then the
    drift itself is of the order of s and that error is negligible.
    """
    keep = 24 - (max(1, world_size - 1).bit_length() + 1)
    out, rest = [], x
    for _ in range(parts - 1):
        if rest == 0.0 or not math.isfinite(rest):
            piece = rest
        else:
            m, e = math.frexp(rest)  # rest = m·2^e, 0.5 <= |m| < 1
            piece = math.ldexp(math.trunc(math.ldexp(m, keep)), e - keep)
        out.append(piece)
        rest = rest - piece if math.isfinite(rest) else 0.0
    out.append(rest)  # at most 53 − (parts − 1)·keep bits: within `keep` while N <= 512
    return out


# Where split_exact's pieces of x are all float32s as they are: each nonzero piece is a run of
# x's bits, so it is at least ulp(x) > 2^-53·x, a normal float32 (above 2^-126) from x >= 2^-73,
# and at most x, far below float32's overflow; its bits fit float32's 24 (the last piece has
# 53 − 3·keep, within 24 up to N = 8192; split_exact's own exactness is for N <= 512, the
# bound kept here). A margin on each side.
_EXACT_LO, _EXACT_HI, _EXACT_WORLD = 2.0**-64, 2.0**120, 512


def drift_sq_from(reduced_pieces: list[float], world_size: int, update_sq: float) -> float:
    """mean_i ||θ_i − θ_avg||² = mean_i s_i − ||θ_avg − θ_ref||², from the SUM of the ranks'
    split_exact pieces. update_sq goes through the same float32 pieces, so where s_i equals it
    (replicas that agree) the difference is exactly 0, also when tiny pieces round to subnormal
    float32s."""
    if world_size <= _EXACT_WORLD and (_EXACT_LO <= update_sq <= _EXACT_HI or update_sq == 0.0):
        # every piece is a normal float32 (or 0), so rounding it to float32 is exact and the
        # pieces sum back to update_sq: the split below would return it unchanged (that
        # Python runs after the collective's wait, on cold caches)
        update_q = update_sq
    else:
        pieces = split_exact(update_sq, world_size)
        form = f"{len(pieces)}f"  # each piece rounded to float32, as the buffer rounds s_i's
        update_q = math.fsum(struct.unpack(form, struct.pack(form, *pieces)))
    drift_sq = math.fsum(reduced_pieces) / world_size - update_q
    if not drift_sq > 0.0:  # rounding can dip below zero; NaN must stay NaN (divergence)
        drift_sq = 0.0 if math.isfinite(drift_sq) else math.nan
    return drift_sq


def param_digest(tensors: list[torch.Tensor], bits: int) -> int:
    """CRC32 of the raw bytes, cut to `bits`: the run summary's fingerprint of the weights
    (once per run; it copies every tensor to the host). Boundaries use `replica_digest`."""
    crc = 0
    for t in tensors:
        # the bytes viewed by torch: NumPy has no bfloat16 to view them as
        crc = zlib.crc32(t.detach().reshape(-1).view(torch.uint8).cpu().numpy(), crc)
    return crc & ((1 << bits) - 1)


# A tensor's bytes as integer words: 32-bit for 4- and 8-byte dtypes (an 8-byte element is two
# words), its own width for narrower ones; every word sum is kept modulo 2^32.
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}
_MIX = 0x9E3779B1  # odd: multiplying by it permutes Z/2^32 (Fibonacci hashing)

# Mean elements per tensor below which a boundary treats a list of tensors as one copy laid end
# to end (one op on the copy, as in the pack's θ_i − θ_ref and the digest) rather than one op
# per tensor: below it the ops' dispatch costs more than the pass the copy adds.
_PIECEWISE_MIN = 1 << 16


def replica_digest(tensors: list[torch.Tensor], bits: int) -> int:
    """The replica check's digest of the parameters, cut to `bits` so N of them sum exactly in
    float32.

    The wrap-around (mod 2^32) sum of the tensors' raw words, taken on their device (no copy to
    the host, one read of the bytes: about a tenth of a CRC32's cost on the CPU), then mixed
    into `bits` bits. Any change to one word, or to several whose changes do not cancel modulo
    2^32, changes the sum; the mix keeps 2^-bits odds of a collision, as the CRC cut to `bits`
    bits had. Unlike a CRC it does not see values that trade places (within or between
    tensors): replicas diverge through a faulty reduce or write-back, which changes values, not
    their order. Additive, so the same bytes give the same digest however they are split into
    tensors (the whole model, its fragments' pieces, one flat vector)."""
    return digest_of_words(digest_words(tensors), bits)


def digest_words(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """replica_digest's word views of `tensors` (a copy where a tensor is not contiguous)."""
    # 1-D first: an 8-byte element is two words, and a 0-dim tensor, or a strided last
    # dimension, refuses that view
    return [t.reshape(-1).view(_WORDS[t.element_size()]) for t in tensors if t.numel()]


def digest_of_words(
    words: list[torch.Tensor], bits: int, concat: bool | None = None, into: _Sums | None = None
) -> int:
    """replica_digest of the tensors whose `digest_words` these are. `concat`: whether to sum
    them as one copy (`one_copy`), if the caller keeps it with the list; `into`: where to take
    that copy and its sum, kept by the caller (on the CPU)."""
    if concat is None:
        concat = one_copy(words)
    if concat and into is not None:
        total = into.sum(torch.cat(words, out=into.copy))
    else:
        if concat:
            words = [torch.cat(words)]  # small tensors: one copy, one sum
        sums = [w.sum(dtype=torch.int32) for w in words]
        # one transfer to the host
        total = sum(torch.stack(sums).tolist()) if len(sums) > 1 else sum(int(t) for t in sums)
    return ((total * _MIX) % (1 << 32)) >> (32 - bits)


def one_copy(words: list[torch.Tensor]) -> bool:
    """Whether digest_of_words sums these words as one copy laid end to end: several small
    tensors of one width (below _PIECEWISE_MIN elements on average, the ops' dispatch costs
    more than the pass the copy adds)."""
    numel = sum(w.numel() for w in words)
    one_width = len({w.dtype for w in words}) == 1
    return len(words) > 1 and numel < _PIECEWISE_MIN * len(words) and one_width


class _Sums:
    """A 0-dim sum read through NumPy on the CPU, not by `item()`: a torch op fewer for each
    of a small model's boundary sums (after the collective's wait every op costs tens
    of µs on a shared VM). `copy`: a buffer for what is summed, if the caller needs one."""

    def __init__(self, dtype: torch.dtype, copy: torch.Tensor | None = None) -> None:
        self.out = torch.zeros((), dtype=dtype)
        self.host = self.out.numpy()
        self.copy = copy

    def sum(self, x: torch.Tensor) -> float | int:
        """x.sum() (in the dtype of `out`) as a Python number; x 1-D. Bit for bit `x.sum()`:
        the same reduction over the one dimension."""
        torch.sum(x, dim=0, dtype=self.out.dtype, out=self.out)
        return self.host.item()


# sq_norm: the row length of its one-pass form, and the size from which that form is cheaper
# than squaring into scratch and summing (below it, its extra ops cost more than the pass).
_NORM_ROW = 512
_NORM_ROWS_MIN = 1 << 16


def sq_norm(x: torch.Tensor, scratch: torch.Tensor, into: _Sums | None = None) -> float:
    """||x||² of a contiguous 1-D float tensor, for the drift, whose cancellation of two such
    sums needs them accurate: it keeps drift within 1e-5 wherever it is more than a few
    thousandths of the update. Deterministic: replicas that agree compute identical values, so
    zero drift still reads exactly 0.

    A large x is read once: the norms of rows of 512 elements in x's dtype (float32 for a
    float32 model; a sum that short is accurate per lane), squared and summed in float64.
    Measured on 3M and 30M float32 elements: 4e-10 relative error and about half the time of
    squaring into `scratch` and taking the cascade sum (6e-9 to 1e-7), the form used below
    _NORM_ROWS_MIN (summed `into` a kept 0-dim tensor where the caller has one). (One float32
    dot product or `vector_norm` of the whole vector sums sequentially per lane: 1e-5 to 3e-3
    relative error at 3M to 30M elements; a float64 norm pays a conversion pass.)"""
    n = x.numel()
    if n < _NORM_ROWS_MIN:  # (a slice is an op too: not taken where scratch already fits)
        squares = torch.mul(x, x, out=scratch if scratch.numel() == n else scratch[:n])
        return float(squares.sum()) if into is None else into.sum(squares)
    r = n - n % _NORM_ROW
    total = torch.linalg.vector_norm(x[:r].view(-1, _NORM_ROW), dim=1).double().square_().sum()
    if r < n:
        total += x[r:].double().square_().sum()
    return float(total)


def _sub_into(
    pieces: list[torch.Tensor],
    ref: torch.Tensor,
    out: torch.Tensor,
    flats: list[torch.Tensor] | None = None,
) -> None:
    """out = θ − ref, with θ the pieces laid end to end (bit for bit the same either way);
    `flats`: the pieces as 1-D views, if the caller keeps them."""
    if len(pieces) == 1 or out.numel() >= _PIECEWISE_MIN * len(pieces):
        views = ParameterAverager._views
        for p, r, o in zip(pieces, views(ref, pieces), views(out, pieces), strict=True):
            torch.sub(p, r, out=o)
    else:
        torch.cat(flats or [t.reshape(-1) for t in pieces], out=out)
        out.sub_(ref)


def _add_to_momentum(
    momenta: tuple[list[torch.Tensor], list[torch.Tensor]] | None, scale: float
) -> None:
    """m += scale · g over (momentum buffers, gradients). The fused boundary's correction
    m_i += ḡ − g_i, which leaves the buffer the synchronized step would have left, comes in two
    halves: start() adds −g_i before the collective overwrites it, finish() adds (1/N)·Σ g
    (local ops, one pass each). A boundary that raises in between (ReplicaMismatch: the
    replicas already differ) leaves m_i − g_i."""
    if momenta is not None:
        torch._foreach_add_(momenta[0], momenta[1], alpha=scale)


_FOLDABLE = (torch.float32, torch.float64)  # what the averaging works in (not complex)
_NUMPY = (torch.float32, torch.float64)  # buffer dtypes whose scalars are written through NumPy
_F32_MAX = float(np.finfo(np.float32).max)  # a float64 within it casts to float32 silently
_KEPT_COPY_MAX = 1 << 20  # words: the largest digest copy an averager keeps (4 MiB of int32)


def digest_bits(world_size: int) -> int:
    # float32 holds integers exactly up to 2^24; N digests must sum below it.
    return max(1, 24 - max(1, (world_size - 1).bit_length()))


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
        (refused with F > 1 by the options); float buffers ride with every sync."""
        self.params = params
        self.rank, self.world_size = rank, world_size
        if outer is None:
            outer = OuterOptimizer("slowmo", 1.0, beta, lr_aware)
        self.outer = outer
        self._torch_outer: TorchOuter | None = None  # use_outer(): a torch optimizer's step
        self.compress = compress
        # per buffer layout (fragments differ in size): the quantized all-reduce's plan, memory
        self._codecs: dict[tuple[tuple[int, ...], int], tuple[Layout, Buffers]] = {}
        self._residual: torch.Tensor | None = None  # error feedback: what quantization dropped
        # ... and what requantizing the summed share this rank owned dropped (compress.py)
        self._residual2: torch.Tensor | None = None
        self._averaged_extras, self._broadcast_extras = averaged_extras, broadcast_extras
        self.numel = sum(p.numel() for p in params)
        # The averaging works in at least float32 (its buffer, θ_ref, the velocity): the
        # buffer's scalars must carry N digests and the drift's exact pieces (24 bits each),
        # and the norms and SlowMo need more than bfloat16's 8 bits or float16's range. The
        # parameters themselves keep their dtype: θ_new is rounded to it as it is written back.
        work = torch.float32
        for p in params:
            work = torch.promote_types(work, p.dtype)
        flat = torch.cat([p.detach().reshape(-1) for p in params]).to(work)
        self._narrow = any(p.dtype != work for p in params)  # θ_new is rounded as written
        # `offload` (--outer-state-device cpu): θ_ref and the velocity live in host memory
        # (pinned, for a GPU's copies) and are staged on the device for a boundary only
        # (_stage): between boundaries the device holds the buffer alone (docs/design.md §4).
        # The boundary's arithmetic is the same ops on the same device: bit for bit.
        self._device, self._offload = flat.device, offload
        self._staged: tuple | None = None  # ((a, b), θ_ref, velocity, scratch) on the device
        self.ref = flat.clone() if not offload else _host_copy(flat)  # θ_ref, from θ_0
        # θ_ref as the parameters' shapes: the whole model's write-back source (θ_new is θ_ref)
        self._ref_views = self._views(self.ref, params)
        # the gradient segment: (the store it is cut from, the segment, its views)
        self._grad_views: tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] | None = None
        self._ptrs: list[int] | None = None  # _whole()'s cache: the storages it was cut from
        self._flats: list[torch.Tensor] | None = None  # _whole()'s 1-D views of the parameters
        self._cuts: dict[tuple[int, int, int, int], tuple] = {}  # _cut()'s views, per layout
        self.velocity = torch.zeros_like(self.ref) if outer.needs_velocity else None
        self._scratch = torch.empty_like(flat) if not offload else None  # (staged, offloaded)
        # The buffer is a prefix view of one allocation that only grows: fragment syncs and
        # whole-model syncs alternate sizes without reallocating.
        self._store: torch.Tensor | None = None
        self._buf: torch.Tensor | None = None
        self._snapshot: torch.Tensor | None = None  # overlap: what was sent
        self._bits = digest_bits(world_size)
        # finish()'s 1/N can ride in the outer step's factors (see there): N a power of two
        self._foldable = world_size & (world_size - 1) == 0 and flat.dtype in _FOLDABLE
        host = flat.device.type == "cpu"
        self._sums = _Sums(flat.dtype) if host and flat.dtype in _NUMPY else None  # the norms'
        self._digest_sums: _Sums | None = None  # the digest's copy and sum; set by _whole()
        self.last_digest = replica_digest(params, self._bits)
        self.last_fragment = WHOLE  # what the last boundary moved (the digest describes it)
        self.boundaries = 0
        self.bounds = [(0, self.numel)]
        if fragments > 1:
            self.bounds = fragment_bounds(self.numel, fragments)
            for i, p in enumerate(params):
                if not p.is_contiguous():  # its fragment pieces are views of its storage
                    raise ValueError(
                        f"--fragments: parameter {i} ({tuple(p.shape)}) is not contiguous; "
                        "fragments slice the parameters in place"
                    )
        self.fused_sgd = fused_sgd
        self._captured = False  # g_i of the fused boundary step is in the buffer
        if fused_sgd is not None:
            group = fused_sgd.param_groups[0]
            if group.get("dampening", 0) != 0:
                raise ValueError("the fused boundary needs SGD without dampening")

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
        self._ref_views = self._views(self.ref, self.params)
        self._cuts.clear()  # they hold slices of the old θ_ref
        self.outer, self._torch_outer, self.velocity = OuterOptimizer("torch"), outer, None

    def capture_boundary_grads(self) -> None:
        """Keep g_i as it enters the fused boundary's optimizer step. Called from an optimizer
        step pre-hook: the gradient must be read BEFORE the step, since torch's multi-tensor
        SGD (foreach, the default on CUDA) with Nesterov and no weight decay adds μ·buf into
        p.grad in place."""
        grads = [p.grad for p in self.params]
        seg, views = self._grads_segment()
        if all(g is not None and not g.requires_grad for g in grads):
            torch._foreach_copy_(views, grads)  # one op: a cat costs 2 per tensor
        else:  # a missing gradient is a zero; one kept with its graph (create_graph) detached
            pairs = enumerate(zip(grads, self.params, strict=True))
            if unused := [i for i, (g, p) in pairs if g is None and p.requires_grad]:
                # DDP, whose reduction this boundary stands in for, refuses an unused parameter
                # (the two-phase boundary with find_unused_parameters handles one; Sync)
                raise OptionError(
                    f"ddp_kwargs: parameter {unused[0]} got no gradient at a boundary (unused); "
                    f"{UNUSED_PARAMETERS_HINT}"
                )
            grads = [
                g.detach() if g is not None else torch.zeros_like(p)
                for g, p in zip(grads, self.params, strict=True)
            ]
            torch.cat([g.reshape(-1) for g in grads], out=seg)
        # A fused SGD (fused=True) under a GradScaler is handed the scale and found_inf by
        # scaler.step and unscales, or skips the step, inside its own kernel, after this hook:
        # g_i as it moves the weights is g / scale, or zeros for a step skipped on an inf
        # (as a plain SGD's skipped step, whose hook never runs). On the device: no host sync.
        opt = self.fused_sgd
        scale, found = getattr(opt, "grad_scale", None), getattr(opt, "found_inf", None)
        if scale is not None:
            seg.div_(scale.to(seg.device))  # as the kernel does (a division)
        if found is not None:
            seg.masked_fill_(found.to(seg.device) > 0, 0.0)
        self._captured = True

    def _grads_segment(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Where the fused boundary's g_i sit in the collective's buffer, [θ | g_i | averaged
        extras | broadcast extras | scalars]: captured there, they are not copied again. The
        segment and its views shaped as the parameters, cut once per allocation of the buffer
        (it may grow: optimizer state appears after the first step), not at every boundary."""
        extras = self._averaged_extras() + self._broadcast_extras()
        self._buffer(2 * self.numel + sum(t.numel() for t in extras) + N_SCALARS)
        if self._grad_views is None or self._grad_views[0] is not self._store:
            seg = self._store[self.numel : 2 * self.numel]
            self._grad_views = (self._store, seg, self._views(seg, self.params))
        return self._grad_views[1], self._grad_views[2]

    def _boundary_grads(self) -> list[torch.Tensor]:
        """g_i as views of the buffer's gradient segment, captured as it entered the boundary's
        step. A step that did not run on this rank (GradScaler skipped it: its gradient held an
        inf) carries zeros: it applied no gradient, and an inf must not reach the other ranks."""
        seg, views = self._grads_segment()
        if not self._captured:
            seg.zero_()
        self._captured = False
        return views

    def _buffer(self, n: int) -> torch.Tensor:
        if self._store is None or self._store.numel() < n:
            store = torch.empty(n, dtype=self.ref.dtype, device=self._device)
            if self._store is not None:  # keeps gradients captured into the old one
                store[: self._store.numel()].copy_(self._store)
            self._store = store
            self._cuts.clear()  # views of the old store
        if self._buf is None or self._buf.numel() != n:
            self._buf = self._store[:n]
        return self._buf

    def _cut(self, a: int, b: int, n_avg: int, n_bc: int) -> tuple:
        """The views a boundary moving [a, b) with this buffer layout works on: the buffer's
        averaged, broadcast and scalar segments, its head (the moved slice's place), and the
        slice of θ_ref, of the velocity (or None) and of scratch, and the scalars as NumPy
        (or None). Cut once per layout (each cut is a call; a small model's boundary is mostly
        calls), for the buffer as `_buffer` last sized it; dropped when the buffer is
        reallocated."""
        key = (a, b, n_avg, n_bc)
        cut = self._cuts.get(key)
        if cut is None:
            if len(self._cuts) >= len(self.bounds) + 4:  # F fragments' layouts, a few more
                self._cuts.clear()
            buf, n, end = self._store, b - a, n_avg + n_bc
            if self._offload:  # the boundary's own copies, cut for it (_stage)
                return self._stage(a, b, buf, n_avg, n_bc)
            velocity = self.velocity[a:b] if self.velocity is not None else None
            scalars = buf[end : end + N_SCALARS]
            cut = self._cuts[key] = (
                buf[:n_avg],
                buf[n_avg:end],
                scalars,
                buf[:n],
                self.ref[a:b],
                velocity,
                self._scratch[:n],
                # the scalars as a NumPy array where they can be (host memory, a dtype NumPy
                # has): written and read without a torch op, two fewer per boundary
                scalars.numpy() if scalars.device.type == "cpu" and buf.dtype in _NUMPY else None,
            )
        return cut

    def _stage(self, a: int, b: int, buf: torch.Tensor, n_avg: int, n_bc: int) -> tuple:
        """_cut's views with θ_ref[a:b], the velocity's and scratch as device copies, made once
        per boundary (start() and finish() both cut) and written home by _unstage()."""
        if self._staged is None or self._staged[0] != (a, b):
            ref = self.ref[a:b].to(self._device, copy=True, non_blocking=True)
            vel = self.velocity
            if vel is not None:
                vel = vel[a:b].to(self._device, copy=True, non_blocking=True)
            self._staged = ((a, b), ref, vel, torch.empty_like(ref))
        _, ref, vel, scratch = self._staged
        end = n_avg + n_bc
        scalars = buf[end : end + N_SCALARS]
        host = scalars.numpy() if scalars.device.type == "cpu" and buf.dtype in _NUMPY else None
        return buf[:n_avg], buf[n_avg:end], scalars, buf[: b - a], ref, vel, scratch, host

    def _unstage(self) -> None:
        """The boundary's θ_ref and velocity home (blocking: the host may read them next, a
        checkpoint), and the device copies freed."""
        if self._staged is not None:
            (a, b), ref, vel, _ = self._staged
            self._staged = None
            self.ref[a:b].copy_(ref)
            if vel is not None:
                self.velocity[a:b].copy_(vel)

    def region(self, fragment: int = WHOLE) -> tuple[int, int, list[torch.Tensor]]:
        """[start, end) of the flat parameter vector that `fragment` moves, and the parameter
        pieces that hold it, in order: the parameters themselves for the whole model, 1-D views
        into them for a fragment (a cut may fall inside a tensor)."""
        if fragment == WHOLE:
            return 0, self.numel, list(self._whole()[0])  # a copy: the cached list stays as is
        a, b = self.bounds[fragment]
        pieces, offset = [], 0
        for p in self.params:
            lo, hi = max(a, offset), min(b, offset + p.numel())
            if lo < hi:
                pieces.append(p.detach().view(-1)[lo - offset : hi - offset])
            offset += p.numel()
        return a, b, pieces

    def _whole(
        self,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """The parameters detached, and where every parameter is contiguous (so these are
        views) their digest words and their 1-D views (the pack's): cut once, not at every
        boundary (for a small model the cutting cost more than the sums). Cut again if
        a parameter's storage has moved, which DDP's own contract forbids once the model is
        wrapped."""
        ptrs = [p.data_ptr() for p in self.params]
        if ptrs != self._ptrs:
            self._ptrs = ptrs
            self._detached = [p.detach() for p in self.params]
            contiguous = all(p.is_contiguous() for p in self._detached)
            self._words = digest_words(self._detached) if contiguous else None
            self._one_copy = self._words is not None and one_copy(self._words)
            self._digest_sums = None
            total = sum(w.numel() for w in self._words) if self._one_copy else 0
            # the copy is kept for the run: only where it is small (a many-tensor model's
            # one copy can be large; it is then taken per boundary, as before)
            if 0 < total <= _KEPT_COPY_MAX and self._words[0].device.type == "cpu":
                copy = torch.empty(total, dtype=self._words[0].dtype)
                self._digest_sums = _Sums(torch.int32, copy)
            self._flats = [p.view(-1) for p in self._detached] if contiguous else None
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
        if self.outer.is_plain_average:
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
    ) -> _Pending:
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
        if self.fused_sgd is not None and fragment != WHOLE:
            raise ValueError("the fused boundary moves the whole model, not a fragment")
        if self.fused_sgd is not None and boundary_step:
            grads = self._boundary_grads()  # already in place in the buffer
        else:
            grads, self._captured = [], False
        a, b, pieces, avg_tensors, bc_tensors = self._moved(fragment, grads)
        n = b - a
        # [pieces | grads | extras]: the pieces hold the n moved elements and the gradients
        # (fused, whole model) n more; only the extras are summed (a Python pass over every
        # parameter costs a large model's boundary thousands of bytecodes)
        n_avg = n * (2 if grads else 1) + sum(
            t.numel() for t in avg_tensors[len(pieces) + len(grads) :]
        )
        n_bc = sum(t.numel() for t in bc_tensors)
        buf = self._buffer(n_avg + n_bc + N_SCALARS)
        avg_seg, bc_seg, scalars, head, ref, velocity, scratch, host = self._cut(a, b, n_avg, n_bc)
        outer_at = None if due == WHOLE else self._outer_at(a, b, due)  # WHOLE: all is due
        delta_form = (
            not overlap
            and self.compress == "none"
            and not self.outer.is_plain_average
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
        momenta = None
        if grads:  # m_i − g_i now, while g_i is here; finish() adds ḡ (see _add_to_momentum)
            momenta = self._momenta(grads)
            _add_to_momentum(momenta, -1.0)
        # The outer step's first op, μ·v, needs nothing the collective brings: taken here, where
        # the core is warm, not after the wait (on a shared VM each op after a long
        # wait costs tens of µs more). Only with delta_form: finish() follows at once. A boundary
        # that raises in between (ReplicaMismatch) leaves μ·v, as it leaves m_i − g_i.
        decayed = delta_form and velocity is not None
        if decayed:
            velocity.mul_(self.outer.momentum)
        values = [
            *split_exact(s, self.world_size),
            totals.loss_sum,
            totals.steps,
            totals.compute_seconds,
            totals.exposed_sync_seconds,
            self.last_digest,
            self.last_digest if self.rank == 0 else 0,
            int(totals.grads != UNCHECKED),
            int(totals.grads == CHANGED),
        ]
        if host is not None:  # each value rounded to the dtype as torch.tensor rounds it
            if min(values) >= -_F32_MAX and max(values) <= _F32_MAX:  # nothing can overflow
                host[:] = values  # (a NaN, which the guard may let through, casts silently)
            else:  # np.errstate costs a boundary tens of µs: only where a value may overflow
                with np.errstate(over="ignore"):  # a diverged s or loss becomes inf, as in torch
                    host[:] = values
        else:
            scalars.copy_(torch.tensor(values, dtype=buf.dtype))
        pending = _Pending(
            avg_tensors,
            bc_tensors,
            len(grads),
            n_avg,
            n_bc,
            lr,
            overlap,
            fragment,
            a,
            b,
            len(pieces),
            delta_form=delta_form,
            momenta=momenta,
            decayed=decayed,
            outer_at=outer_at,
        )
        if overlap:
            # What this rank held when the average was taken: the local step taken meanwhile
            # is kept on top of the average when it arrives.
            if self._snapshot is None or self._snapshot.numel() < n_avg + n_bc:
                self._snapshot = torch.empty(n_avg + n_bc, dtype=buf.dtype, device=buf.device)
            self._snapshot[: n_avg + n_bc].copy_(buf[: n_avg + n_bc])
        if n_bc and self.rank != 0:
            bc_seg.zero_()  # rank 0's values alone survive the SUM: a broadcast
        pending.nbytes = buf.numel() * buf.element_size()
        if self.compress != "none":
            self._start_compressed(buf, pending, clock)
        elif overlap:
            fut = dist.all_reduce(buf, async_op=True).get_future()
            if clock is not None:
                nbytes = buf.numel() * buf.element_size()
                fut = delayed(fut, clock.reserve(nbytes), device=buf.device)
            pending.future = fut
        else:
            allreduce_sum_(buf, clock)
        pending.seconds = time.perf_counter() - t0
        return pending

    def _start_compressed(self, buf: torch.Tensor, pending: _Pending, clock) -> None:
        """Send [Δ_i, g_i] quantized and the rest as float32: the quantized all-reduce of
        trainer/engine/compress.py, after which the buffer holds the SUM, as an uncompressed
        all-reduce leaves it. A fragment sends its slice of Δ_i, with the error feedback of that
        slice. Delayed (overlap), the two dependent phases run now and the link's modelled time
        is what overlaps the local steps that follow (docs/design.md §2, Compression)."""
        a, b = pending.start, pending.end
        n = b - a
        # Δ and the fused gradients are separate segments: a scale never spans both
        segments = (n, n) if pending.n_grads else (n,)
        n_raw = buf.numel() - sum(segments)
        key = (segments, n_raw)
        if key not in self._codecs:
            layout = Layout(self.compress, segments, n_raw, self.world_size)
            self._codecs[key] = (layout, Buffers(layout, buf.device))
        layout, mem = self._codecs[key]
        if self._residual is None:
            self._residual = torch.zeros_like(self.ref)
        if self._residual2 is None:
            self._residual2 = torch.zeros_like(self.ref)
        buf[:n].sub_(self.ref[a:b])  # Δ_i: small values (θ_i itself is in the snapshot)
        deadline = quantized_allreduce_(
            buf, layout, mem, self.rank, self._residual[a:b], self._residual2[a:b], clock
        )
        pending.compressed, pending.nbytes = True, layout.nbytes
        if not pending.overlap:
            hold_until(deadline)
        elif clock is not None:
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(None)
            pending.future = delayed(done, deadline, device=buf.device)

    def finish(self, pending: _Pending, settle: bool = False) -> Reconciled:
        """Apply a launched averaging. `settle`: no local step was taken since it was launched
        (an overlapped average finished by sync_now), so θ_new is written as is: adding
        (θ_new − θ_sent) to θ_sent would round differently on each rank."""
        t0 = time.perf_counter()
        if pending.future is not None:
            pending.future.wait()
        n, n_avg, n_bc = self.world_size, pending.n_avg, pending.n_bc
        a, b = pending.start, pending.end
        m = b - a  # parameter elements moved
        avg_seg, bc_seg, scalars, head, ref, velocity, scratch, host = self._cut(a, b, n_avg, n_bc)
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
            if self.outer.is_plain_average:
                theta_avg, delta = delta.add_(ref), None
        else:
            theta_avg = avg_seg[:m]
            update_sq = sq_norm(torch.sub(theta_avg, ref, out=scratch), scratch, self._sums)
            if not self.outer.is_plain_average:  # its squares took its place: Δ once more
                delta = torch.sub(theta_avg, ref, out=scratch)
        drift_sq = drift_sq_from(red[:S_PARTS], n, update_sq)
        if pending.overlap:  # θ_ref must be the reference the packed θ_i were measured against
            theta_now = self._snapshot[:m]
        if pending.outer_at is not None:  # unscheduled: θ_avg, no outer momentum injected
            theta_new = self._unscheduled_(pending, ref, velocity, theta_avg, delta)
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
        pieces = pending.avg_tensors[: pending.n_pieces]
        rest_tensors = pending.avg_tensors[pending.n_pieces + pending.n_grads :]
        rest = m * (2 if pending.n_grads else 1)
        self.last_fragment = pending.fragment
        if pending.overlap and not settle:
            # Delayed averaging: add (target − what was sent) to what the rank holds now.
            torch.sub(theta_new, theta_now, out=scratch)
            self._add_back(pieces, scratch)
            if rest_tensors:
                self._add_back(rest_tensors, avg_seg[rest:].sub_(self._snapshot[rest:n_avg]))
            if n_bc:
                self._add_back(pending.bc_tensors, bc_seg.sub_(self._snapshot[n_avg:]))
            # Replicas now differ by their step since the boundary; what they agree on is θ_new.
            self.last_digest = replica_digest([theta_new], self._bits)
        else:
            if pending.fragment == WHOLE and not self._offload and pending.outer_at is None:
                # θ_new is θ_ref, cut already (an unscheduled sync's is a buffer)
                self._copy_into(pieces, self._ref_views)
            else:
                self._write_back(pieces, theta_new)
            if self._narrow:  # θ_ref as the replicas hold it: rounding θ_new to the parameters'
                # dtype is no update of theirs (the next Δ_i, and SlowMo's velocity, would carry it)
                self._copy_into(self._views(theta_new, pieces), pieces)
                if pending.outer_at is not None:  # θ_new is a buffer: its stepped slice home
                    lo, hi = (i - a for i in pending.outer_at)
                    ref[lo:hi].copy_(theta_new[lo:hi])
            if pending.momenta is not None:  # the gradient views hold Σ g now
                _add_to_momentum(pending.momenta, 1.0 / n)
            if rest_tensors:
                self._write_back(rest_tensors, avg_seg[rest:])
            if n_bc:
                self._write_back(pending.bc_tensors, bc_seg)
            # of the parameters as written, not of θ_new: a faulty write-back is caught too.
            # start() has just cut their words (a boundary whose average lands later may have
            # waited past a change of storage: cut again)
            whole = pending.fragment == WHOLE
            words = (self._words if not pending.overlap else self._whole()[1]) if whole else None
            if words is None:
                self.last_digest = digest_of_words(digest_words(pieces), self._bits)
            else:
                self.last_digest = digest_of_words(
                    words, self._bits, self._one_copy, self._digest_sums
                )
        if self._staged is not None:  # (after the narrow copy above: it rounds the staged θ_ref)
            self._unstage()

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

    def _unscheduled_(
        self,
        pending: _Pending,
        ref: torch.Tensor,
        velocity: torch.Tensor | None,
        theta_avg: torch.Tensor | None,
        delta: torch.Tensor,
    ) -> torch.Tensor:
        """θ_new of an unscheduled sync over the moved [start, end), in a buffer (not θ_ref):
        θ_avg, with θ_ref and the velocity (or a torch optimizer's state) untouched, so the
        next scheduled boundary's Δ spans everything since the last one, as if this sync had
        not been (docs/design.md §2, "Unscheduled syncs"). Only [lo, hi) of `outer_at` (the
        fragment due at an epoch end) takes the outer step. `theta_avg` is None where the
        buffer holds Δ̄ = θ_avg − θ_ref (`delta`, compressed); the θ_i were sent otherwise, so
        θ_avg is their mean, and identical replicas stay as they are bit for bit (N = 2)."""
        assert pending.outer_at is not None and not pending.delta_form  # (scale 1: no fold)
        lo, hi = (i - pending.start for i in pending.outer_at)
        if lo < hi:  # (a torch optimizer moves the whole model: never a slice of it)
            assert self._torch_outer is None
            vel = velocity[lo:hi] if velocity is not None else None
            avg = theta_avg[lo:hi] if theta_avg is not None else None
            outer_step_(self.outer, ref[lo:hi], vel, avg, pending.lr, delta=delta[lo:hi])
        if theta_avg is None:  # θ_ref + Δ̄ (the stepped slice is overwritten just below)
            theta_avg = delta.add_(ref)
        theta_avg[lo:hi].copy_(ref[lo:hi])
        return theta_avg

    def pending_state(self, pending: _Pending) -> dict:
        """A launched (delayed) averaging as plain tensors and numbers, for a checkpoint taken
        while it is in flight: waits for the collective and keeps its reduced buffer (a
        compressed one decoded already) and the snapshot of what this rank sent;
        `restore_pending` rebuilds it. The averaging itself is untouched: finish() applies it
        as if nothing had been saved."""
        if pending.future is not None:
            pending.future.wait()
        reduced = self._buf.clone()
        n = pending.n_avg + pending.n_bc
        return {
            "reduced": reduced,
            "snapshot": self._snapshot[:n].clone() if pending.overlap else None,
            "n_grads": pending.n_grads,
            "n_avg": pending.n_avg,
            "n_bc": pending.n_bc,
            "lr": pending.lr,
            "overlap": pending.overlap,
            "fragment": pending.fragment,
            "nbytes": pending.nbytes,
            "compressed": pending.compressed,
        }

    def pending_refusal(self, state: object) -> str | None:
        """Why `restore_pending` cannot take this saved averaging (its keys, kinds and sizes
        against this model and these options), or None; checked before anything is applied."""
        keys = ("reduced", "snapshot", "n_grads", "n_avg", "n_bc", "lr", "overlap", "fragment")
        if not isinstance(state, dict) or (missing := [k for k in keys if k not in state]):
            return f"no {missing[0]!r}" if isinstance(state, dict) else "not a dict"
        ints = ("n_grads", "n_avg", "n_bc", "fragment", "nbytes")
        if any(type(state.get(k, 0)) is not int for k in ints):
            return f"{', '.join(ints)}: integers"
        if state["n_grads"]:
            return "a fused boundary is never delayed; this state is not one to resume"
        if not WHOLE <= state["fragment"] < len(self.bounds):
            return f"fragment {state['fragment']} is beyond fragments {len(self.bounds)}"
        if type(state["overlap"]) is not bool or type(state.get("compressed", False)) is not bool:
            return "overlap, compressed: booleans"
        if type(state["lr"]) not in (int, float):
            return f"lr: {state['lr']!r:.40} is not a number"
        _, _, _, avg_tensors, bc_tensors = self._moved(state["fragment"], [])
        n_avg, n_bc = state["n_avg"], state["n_bc"]
        if sum(t.numel() for t in avg_tensors) != n_avg or (
            sum(t.numel() for t in bc_tensors) != n_bc
        ):
            return "the saved averaging does not fit this model and these options"
        for name, numel in (("reduced", n_avg + n_bc + N_SCALARS), ("snapshot", n_avg + n_bc)):
            t = state[name]
            if t is None and name == "snapshot" and not state["overlap"]:
                continue
            if not isinstance(t, torch.Tensor) or t.dtype != self.ref.dtype or t.shape != (numel,):
                return f"{name}: not a {self.ref.dtype} tensor of {numel} elements"
        return None

    def restore_pending(self, state: dict) -> _Pending:
        """The averaging `pending_state` saved, ready for finish() (call after the parameters
        and load_state_dict)."""
        if why := self.pending_refusal(state):
            raise ValueError(why)
        a, b, pieces, avg_tensors, bc_tensors = self._moved(int(state["fragment"]), [])
        n_avg, n_bc = int(state["n_avg"]), int(state["n_bc"])
        reduced = state["reduced"].to(self.ref.device)
        self._buffer(reduced.numel()).copy_(reduced)
        if state["snapshot"] is not None:
            snap = state["snapshot"].to(self.ref.device)
            if self._snapshot is None or self._snapshot.numel() < snap.numel():
                self._snapshot = torch.empty(  # the averaging's dtype (a saved one may be older)
                    snap.numel(), dtype=self.ref.dtype, device=self.ref.device
                )
            self._snapshot[: snap.numel()].copy_(snap)
        pending = _Pending(
            avg_tensors,
            bc_tensors,
            0,
            n_avg,
            n_bc,
            float(state["lr"]),
            bool(state["overlap"]),
            int(state["fragment"]),
            a,
            b,
            len(pieces),
        )
        pending.nbytes = int(state["nbytes"])
        pending.compressed = bool(state["compressed"])  # Δ was sent; already decoded
        return pending

    @staticmethod
    def _add_back(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
        with torch.no_grad():
            torch._foreach_add_(
                [t.detach() for t in tensors], ParameterAverager._views(flat, tensors)
            )

    def _momenta(
        self, grads: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """The fused SGD's momentum buffers and, paired with them, the gradient views of their
        parameters (a parameter without a buffer has no momentum to correct); None if none."""
        get = self.fused_sgd.state.get  # one lookup a parameter: a tensor hashes in Python
        bufs, gs = [], []
        for p, g in zip(self.params, grads, strict=True):
            st = get(p)
            buf = st.get("momentum_buffer") if st else None
            if buf is not None:
                bufs.append(buf)
                gs.append(g)
        return (bufs, gs) if bufs else None

    @staticmethod
    def _views(flat: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        chunks = flat.split([t.numel() for t in tensors])
        return [c.view_as(t) for c, t in zip(chunks, tensors, strict=True)]

    @staticmethod
    def _write_back(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
        ParameterAverager._copy_into(tensors, ParameterAverager._views(flat, tensors))

    @staticmethod
    def _copy_into(tensors: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        with torch.no_grad():  # in place on parameters, outside autograd
            torch._foreach_copy_(tensors, values)

    def state_dict(self) -> dict:
        return {
            "ref": self.ref,
            "velocity": self.velocity,
            "boundaries": self.boundaries,
            "digest": self.last_digest,
            "fragment": self.last_fragment,  # what the digest describes
            "residual": self._residual,  # error feedback (compression), or None
            "residual2": self._residual2,  # ... of the requantized sums this rank owned
            # a torch optimizer's own state (use_outer), under its own key: absent otherwise
            **({"outer": self._torch_outer.optimizer.state_dict()} if self._torch_outer else {}),
        }

    def load_state_dict(self, state: dict, recompute_digest: bool = True) -> None:
        """Call after the parameters themselves are loaded. By default the replica check's
        digest is recomputed from them, so replicas that resumed from differing files are caught
        at the first boundary (a digest kept from before the load would describe other
        weights); a state saved between boundaries restores the last boundary's digest."""
        self._staged = None  # a boundary that raised may have left its copies
        self.ref.copy_(state["ref"])
        if self.velocity is not None and state["velocity"] is not None:
            self.velocity.copy_(state["velocity"])
        if self._torch_outer is not None:  # (autok.Sync checked it on a copy first)
            self._torch_outer.optimizer.load_state_dict(state["outer"])
        self.boundaries = int(state["boundaries"])
        if state.get("residual") is not None:
            self._residual = state["residual"].to(self.ref.device, self.ref.dtype, copy=True)
            # absent from states saved before the quantized all-reduce (an all-gather, which
            # requantized nothing): zero is then exact, nothing requantized is owed
            second = state.get("residual2")
            self._residual2 = (
                torch.zeros_like(self.ref)
                if second is None
                else second.to(self.ref.device, self.ref.dtype, copy=True)
            )
        self.last_fragment = int(state.get("fragment", WHOLE))
        if recompute_digest or "digest" not in state:
            # of what the last boundary left identical: its fragment (or the whole model)
            self.last_digest = replica_digest(self.region(self.last_fragment)[2], self._bits)
        else:
            self.last_digest = int(state["digest"])


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
    ParameterAverager._write_back(buffers, flat)
    return seconds


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in host memory: pinned where it comes from a GPU, so that staging it for
    a boundary (ParameterAverager._stage) is a direct DMA."""
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
    return out.copy_(t)
