"""Compressed averaging (`--compress fp16|int8`): a quantized all-reduce of the boundary's buffer.

The averaging collective carries the pseudo-gradient Δᵢ = θᵢ − θ_ref rather than θᵢ: its values
are small (the distance moved in K steps), so a per-block scale keeps their precision. Each block
of at most CHUNK values is sent as (value / scale) in int8 (scale = max|x| / 127) or in fp16
(scale = max|x| / 2^15: no block can overflow fp16's range, and values down to 2^-29 of the
block's largest stay normal, with fp16's full relative precision), with its scale as one float32.

**The reduction** (`quantized_allreduce_`, as torchft's `allreduce_quantized`): the buffer
[compressed | raw] is cut into N contiguous shares, one per rank. Each rank quantizes every share
with its own scales and sends share r to rank r (one all-to-all); rank r decodes the N copies of
its share and sums them in rank order in float32, quantizes that sum again (its own scales) and
sends it to every rank (one all-gather); every rank decodes the N summed shares. Every rank
decodes the same bytes, so the result is identical on every rank. Per rank, each phase sends and
receives (N − 1)/N·P bytes for a payload P ≈ S/4 (int8) or S/2 (fp16) of the fp32 size S: a ring
all-reduce of P, whatever N (docs/design.md §2, Compression). `bytes_communicated` counts P,
as it counts the buffer's size S of an uncompressed all-reduce, and the link emulator books the
two phases (`LinkProfile.quantized_allreduce_seconds`). The averaged segments' shares are cut at
their seams (`segments`): the fused cpdp boundary's Δ and gradients never share a scale.

The second error-feedback term (`residual2`) is held where each rank's share lies in the layout
in force; where the layout changes (the fused boundary's [Δ | g] against Δ alone), a rank keeps
what it owes for positions it no longer owns until that layout returns (never, if it does not).
Each block owes at most half a quantization step of its sum, so what is held back is bounded and
does not grow.

**Error feedback, twice.** Each rank keeps what its quantization of Δᵢ dropped,
e = x − decode(encode(x)), and adds it to its next Δᵢ (`residual`); rank r keeps what its
requantization of the summed share r dropped the same way (`residual2`: nonzero only where r
owned the share). So nothing is lost for good: after any number of boundaries the sum of what
every rank applied equals Σᵢ Σ Δᵢ minus the current residuals, and each residual stays within
half a quantization step of its block (`tests/test_compress.py`). The fused cpdp boundary's
gradients ride compressed too but WITHOUT error feedback (each boundary's gᵢ is used once, by the
momentum correction m ← m + ḡ − gᵢ, which is then approximate to the quantization of ḡ; the
parameters are not affected, since each rank's local boundary step is already in its Δᵢ).

What stays exact: optimizer state and float buffers (their values are not small; they ride as
float32), the broadcast segment and the scalar tail (loss, times, the drift pieces sᵢ, the
replica digests), so every statistic is reduced exactly as without compression. The update norm
and drift use the decoded mean, i.e. the update actually applied.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from autok.trainer.engine.handoff import hand

if TYPE_CHECKING:
    import torch

    from autok.trainer.engine.link import LinkClock

Compress = Literal["none", "fp16", "int8"]
CHUNK = 2048  # values per scale: 4 bytes of scale per 2 KiB of int8 (0.05%)
# fp16 blocks are scaled to ±2^15, not ±1: its normal range starts at 2^-14, so values under
# 2^-14·max|x| of a block scaled to ±1 would be subnormal, with fewer significant bits the
# smaller they are; at ±2^15 only those under 2^-29·max|x| are (and 2^15 < 65504 cannot overflow)
_QMAX = {"int8": 127.0, "fp16": 32768.0}


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) as `parts` contiguous near-equal ranges (some empty when n < parts)."""
    return [(n * r // parts, n * (r + 1) // parts) for r in range(parts)]


class Layout:
    """Where rank r's share of [compressed (n_comp) | raw (n_raw)] lies, and how one share is
    packed: a row of `row_bytes` uint8,

        [ scales: float32 × blocks ][ raw: float32 × its raw share ][ values: int8|fp16 ]

    padded to the largest share's size, 4-byte aligned, so the N rows are one all-to-all and
    one all-gather. `segments` are the compressed part's pieces in order (Δ, and the fused
    boundary's gradients): a block never straddles two, so each keeps its own scales."""

    def __init__(self, kind: str, segments: tuple[int, ...], n_raw: int, world_size: int) -> None:
        if kind not in _QMAX:
            raise ValueError(f"unknown compression {kind!r}")
        self.kind, self.world_size, self.n_raw = kind, world_size, n_raw
        self.n_comp = sum(segments)
        self.itemsize = 1 if kind == "int8" else 2
        seams = [sum(segments[:i]) for i in range(1, len(segments))]
        self.comp = _split(self.n_comp, world_size)
        self.raw = _split(n_raw, world_size)
        # per rank: its share's pieces (cut at the seams) and each piece's first scale
        self.pieces: list[list[tuple[int, int, int]]] = []
        rows = []
        for (lo, hi), (rlo, rhi) in zip(self.comp, self.raw, strict=True):
            cuts = [lo, *(s for s in seams if lo < s < hi), hi]
            pieces, blocks = [], 0
            for a, b in zip(cuts, cuts[1:], strict=False):
                if b > a:
                    pieces.append((a, b, blocks))
                    blocks += math.ceil((b - a) / CHUNK)
            self.pieces.append(pieces)
            rows.append((blocks, 4 * (blocks + rhi - rlo) + self.itemsize * (hi - lo)))
        self.blocks = [b for b, _ in rows]
        self.row_bytes = -(-max(size for _, size in rows) // 4) * 4
        # P: what each rank contributes; each phase moves (N − 1)/N of it per rank, each way
        self.nbytes = world_size * self.row_bytes
        self.work_numel = max(
            [math.ceil((b - a) / CHUNK) * CHUNK for ps in self.pieces for a, b, _ in ps] or [0]
        )

    def parts(self, row: torch.Tensor, r: int):
        """Rank r's share in `row` (uint8): its scales, raw values and quantized values."""
        import torch

        (lo, hi), (rlo, rhi), blocks = self.comp[r], self.raw[r], self.blocks[r]
        at = 4 * (blocks + rhi - rlo)
        dtype = torch.int8 if self.kind == "int8" else torch.float16
        return (
            row[: 4 * blocks].view(torch.float32),
            row[4 * blocks : at].view(torch.float32),
            row[at : at + self.itemsize * (hi - lo)].view(dtype),
        )


def _quantize(
    layout: Layout, r: int, x: torch.Tensor, row: torch.Tensor, work: torch.Tensor
) -> None:
    """Rank r's share of the compressed values `x` (its length) into `row`, a scale per block."""
    import torch

    scales, _, values = layout.parts(row, r)
    lo = layout.comp[r][0]
    qmax = _QMAX[layout.kind]
    for a, b, first in layout.pieces[r]:
        blocks = math.ceil((b - a) / CHUNK)
        padded = work[: blocks * CHUNK]
        padded[b - a :].zero_()  # a partial last block is padded with zeros
        padded[: b - a].copy_(x[a - lo : b - lo])
        grid = padded.view(blocks, CHUNK)
        # an all-zero block (or one whose scale underflows) keeps scale 1: no division by zero;
        # a non-finite one keeps its nan or inf scale, so the whole block decodes non-finite
        # and the divergence guard sees it (a `scale > 0` test would reset a nan scale to 1)
        scale = grid.abs().amax(dim=1).div_(qmax)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        scales[first : first + blocks].copy_(scale)
        grid.div_(scale[:, None])
        if layout.kind == "int8":
            padded.round_().clamp_(-qmax, qmax)
        values[a - lo : b - lo].copy_(padded[: b - a])


def _decode(
    layout: Layout, r: int, row: torch.Tensor, out: torch.Tensor, work: torch.Tensor, add: bool
) -> None:
    """Rank r's share in `row` decoded into `out` ([compressed | raw] of the share), or added."""
    scales, raw, values = layout.parts(row, r)
    lo, hi = layout.comp[r]
    for a, b, first in layout.pieces[r]:
        blocks = math.ceil((b - a) / CHUNK)
        padded = work[: blocks * CHUNK]
        padded[: b - a].copy_(values[a - lo : b - lo])
        padded.view(blocks, CHUNK).mul_(scales[first : first + blocks, None])
        _put(out[a - lo : b - lo], padded[: b - a], add)
    _put(out[hi - lo : hi - lo + raw.numel()], raw, add)


def _put(dest: torch.Tensor, src: torch.Tensor, add: bool) -> None:
    if add:
        dest.add_(src)
    else:
        dest.copy_(src)


def _feedback(
    layout: Layout,
    r: int,
    x: torch.Tensor,
    row: torch.Tensor,
    residual: torch.Tensor,
    at: int,
    work: torch.Tensor,
    sent: torch.Tensor,
) -> None:
    """Quantize share r of `x` (which starts at compressed index `at`) into `row`, with error
    feedback on the part of it that `residual` covers (the compressed prefix of its length):
    the residual is added first and then holds what this quantization dropped there."""
    import torch

    lo, hi = layout.comp[r]
    fb = slice(max(lo, at) - at, min(hi, at + len(x), residual.numel()) - at)
    if fb.stop > fb.start:
        x[fb].add_(residual[fb.start + at : fb.stop + at])
    _quantize(layout, r, x[lo - at : hi - at], row, work)
    if fb.stop > fb.start:
        _decode(layout, r, row, sent, work, add=False)
        d = slice(fb.start + at - lo, fb.stop + at - lo)
        torch.sub(x[fb], sent[d], out=residual[fb.start + at : fb.stop + at])


class Buffers:
    """The quantized all-reduce's working memory for one layout, kept across boundaries."""

    def __init__(self, layout: Layout, device: torch.device) -> None:
        import torch

        n, c = layout.world_size, layout.row_bytes
        self.send = torch.zeros(n, c, dtype=torch.uint8, device=device)
        self.recv = torch.empty(n, c, dtype=torch.uint8, device=device)
        self.mine = torch.zeros(c, dtype=torch.uint8, device=device)
        self.gathered = torch.empty(n, c, dtype=torch.uint8, device=device)
        self.work = torch.empty(layout.work_numel, dtype=torch.float32, device=device)
        shares = zip(layout.comp, layout.raw, strict=True)
        widest = max(hi - lo + rhi - rlo for (lo, hi), (rlo, rhi) in shares)
        self.share = torch.empty(widest, dtype=torch.float32, device=device)
        self.sent = torch.empty(widest, dtype=torch.float32, device=device)


def quantized_allreduce_(
    buf: torch.Tensor,
    layout: Layout,
    mem: Buffers,
    rank: int,
    residual: torch.Tensor,
    residual2: torch.Tensor,
    clock: LinkClock | None = None,
) -> float:
    """buf = [compressed | raw] (float32, n_comp + n_raw) becomes its SUM over the ranks, the
    compressed part quantized as the module says, identical on every rank. `residual` and
    `residual2` (the same length, a prefix of the compressed part: Δᵢ) are this rank's two error
    feedback terms, updated in place. Returns the link's modelled completion time (0.0 without a
    clock): the caller holds until then, now or when the average is applied."""
    import torch
    import torch.distributed as dist

    n, nc = layout.world_size, layout.n_comp
    deadline = clock.reserve(layout.nbytes, quantized=True) if clock is not None else 0.0
    # phase 1: every share quantized with this rank's scales, share r to rank r
    x = buf[:nc]
    for r in range(n):
        lo, hi = layout.comp[r]
        _feedback(layout, r, x, mem.send[r], residual, 0, mem.work, mem.sent)
        rlo, rhi = layout.raw[r]
        layout.parts(mem.send[r], r)[1].copy_(buf[nc + rlo : nc + rhi])
    recv, send = mem.recv.view(-1), mem.send.view(-1)
    hand(recv, send)  # the backend's thread may drop them after this returns (handoff.py)
    dist.all_to_all_single(recv, send)
    # phase 2: this rank's share summed in rank order in float32, quantized again (with its own
    # error feedback), and sent to every rank
    lo, hi = layout.comp[rank]
    rlo, rhi = layout.raw[rank]
    share = mem.share[: hi - lo + rhi - rlo]
    for i in range(n):
        _decode(layout, rank, mem.recv[i], share, mem.work, add=i > 0)
    _feedback(layout, rank, share[: hi - lo], mem.mine, residual2, lo, mem.work, mem.sent)
    layout.parts(mem.mine, rank)[1].copy_(share[hi - lo :])
    rows = list(mem.gathered.unbind(0))
    hand(*rows, mem.mine)
    dist.all_gather(rows, mem.mine)
    # every rank decodes the same N rows: the same sum everywhere
    for r in range(n):
        lo, hi = layout.comp[r]
        rlo, rhi = layout.raw[r]
        share = mem.share[: hi - lo + rhi - rlo]
        _decode(layout, r, mem.gathered[r], share, mem.work, add=False)
        buf[lo:hi].copy_(share[: hi - lo])
        buf[nc + rlo : nc + rhi].copy_(share[hi - lo :])
    if buf.is_cuda:
        torch.cuda.synchronize(buf.device)
    return deadline
