"""Compressed averaging (`--compress fp16|int8`): what one rank puts on the wire at a boundary.

The averaging collective carries the pseudo-gradient Δᵢ = θᵢ − θ_ref rather than θᵢ: its values
are small (the distance moved in K steps), so a per-chunk scale keeps their precision. Each chunk
of CHUNK values is sent as (value / scale) in int8 (scale = max|x| / 127) or in fp16 (scale =
max|x| / 2^15: no chunk can overflow fp16's range, and values down to 2^-29 of the chunk's
largest stay normal, with fp16's full relative precision), with its scale as one float32.

**Error feedback.** Each rank keeps what quantization dropped, e = x − decode(encode(x)), and adds
it to its next Δᵢ, so nothing is lost for good: after any number of boundaries the sum of what
a rank sent equals the sum of its Δᵢ minus its current e, and |e| stays within half a
quantization step of its chunk (`tests/test_compress.py`). The fused cpdp boundary's gradients
ride compressed too but WITHOUT error feedback (each boundary's gᵢ is used once, by the momentum
correction m ← m + ḡ − gᵢ, which is then approximate to the quantization of ḡ; the parameters
are not affected, since each rank's local boundary step is already in its Δᵢ).

What stays exact: optimizer state and float buffers (their values are not small; they ride as
float32), the broadcast segment and the scalar tail (loss, times, the drift pieces sᵢ, the
replica digests), so every statistic is reduced exactly as without compression. The update norm
and drift use the decoded mean, i.e. the update actually applied.

**The reduction: an all-gather of the compressed payloads, then a local sum.** Gloo cannot sum
int8 chunks with per-rank scales, and a SUM in a wider type needs one shared scale per chunk,
which costs another collective (another WAN latency) first and sends 32-bit sums, saving nothing.
So every rank gathers all N payloads (one `all_gather`) and decodes and sums them in rank order
in float32: the same operations on the same bytes, hence the same result on every rank. Cost per
rank: it receives (N − 1)·P bytes for a payload P ≈ S/4 (int8) or S/2 (fp16) of the fp32 size S,
against 2(N − 1)/N·S for a ring all-reduce of the fp32 buffer: int8 moves N/8 of the ring's bytes
(less for N < 8, more beyond), fp16 N/4; and a ring all-gather pays N − 1 latencies, not
2(N − 1). `bytes_communicated` and the link emulator count P, the size each rank contributes,
as they count the buffer's size without compression; the emulator models the all-gather's time
(`LinkProfile.allgather_seconds`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Compress = Literal["none", "fp16", "int8"]
CHUNK = 2048  # values per scale: 4 bytes of scale per 2 KiB of int8 (0.05%)
# fp16 chunks are scaled to ±2^15, not ±1: its normal range starts at 2^-14, so values under
# 2^-14·max|x| of a chunk scaled to ±1 would be subnormal, with fewer significant bits the
# smaller they are; at ±2^15 only those under 2^-29·max|x| are (and 2^15 < 65504 cannot overflow)
_QMAX = {"int8": 127.0, "fp16": 32768.0}


class Codec:
    """Encode a flat float32 tensor into a byte payload; decode and sum N such payloads.

    Payload layout (uint8, every segment 4-byte aligned where it needs to be):
        [ scales: float32 × chunks ][ raw: float32 × n_raw ][ values: int8|fp16 × n_comp ]
    `raw` rides uncompressed (summed exactly, as float32)."""

    def __init__(self, kind: Compress, n_comp: int, n_raw: int) -> None:
        if kind not in _QMAX:
            raise ValueError(f"unknown compression {kind!r}")
        self.kind, self.n_comp, self.n_raw = kind, n_comp, n_raw
        self.chunks = max(1, math.ceil(n_comp / CHUNK))
        self.itemsize = 1 if kind == "int8" else 2
        self._values_at = 4 * (self.chunks + n_raw)
        # rounded up to 4 bytes: the all-gather's rows must each start 4-byte aligned
        self.nbytes = -(-(self._values_at + self.itemsize * n_comp) // 4) * 4
        self._padded: torch.Tensor | None = None  # persistent: chunks·CHUNK float32

    def _parts(self, payload: torch.Tensor):
        import torch

        scales = payload[: 4 * self.chunks].view(torch.float32)
        raw = payload[4 * self.chunks : self._values_at].view(torch.float32)
        dtype = torch.int8 if self.kind == "int8" else torch.float16
        end = self._values_at + self.itemsize * self.n_comp
        values = payload[self._values_at : end].view(dtype)
        return scales, raw, values

    def _work(self, device) -> torch.Tensor:
        """chunks·CHUNK float32, zero past n_comp (a partial last chunk is padded with zeros)."""
        import torch

        if self._padded is None or self._padded.device != device:
            self._padded = torch.zeros(self.chunks * CHUNK, dtype=torch.float32, device=device)
        return self._padded

    def encode(
        self,
        x: torch.Tensor,
        raw: torch.Tensor,
        payload: torch.Tensor,
        residual: torch.Tensor | None = None,
        feedback: slice | None = None,
    ) -> None:
        """Write x (n_comp values) and raw (n_raw, uncompressed) into `payload`. With `residual`
        (the length of `feedback`, a slice of x), error feedback: residual is added to
        x[feedback] first and then holds what this encoding dropped there. x is overwritten."""
        import torch

        if residual is not None:
            x[feedback].add_(residual)
        scales, raw_out, values = self._parts(payload)
        raw_out.copy_(raw)
        padded = self._work(x.device)
        padded[: self.n_comp] = x
        chunks = padded.view(self.chunks, CHUNK)
        amax = chunks.abs().amax(dim=1)
        qmax = _QMAX[self.kind]
        # an all-zero chunk (or one whose scale underflows) keeps scale 1: no division by zero;
        # a non-finite one stays non-finite, so the divergence guard sees it
        scale = amax / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(amax))
        scales.copy_(scale)
        scaled = chunks.div_(scale[:, None]).view(-1)[: self.n_comp]
        if self.kind == "int8":
            scaled = scaled.round_().clamp_(-qmax, qmax)
        values.copy_(scaled)
        if residual is not None:
            decoded = self._decode(scales, values)
            torch.sub(x[feedback], decoded[feedback], out=residual)

    def _decode(self, scales: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The n_comp decoded values (a view of the work buffer, valid until its next use)."""
        padded = self._work(values.device)
        padded[: self.n_comp].copy_(values)
        padded[self.n_comp :].zero_()
        return padded.view(self.chunks, CHUNK).mul_(scales[:, None]).view(-1)[: self.n_comp]

    def decode_sum(self, gathered: list[torch.Tensor], out: torch.Tensor) -> None:
        """out[:n_comp] = Σ decode(payload_r); out[n_comp:] = Σ raw_r, summed in rank order in
        float32: identical on every rank."""
        for r, payload in enumerate(gathered):
            scales, raw, values = self._parts(payload)
            decoded = self._decode(scales, values)
            if r == 0:
                out[: self.n_comp].copy_(decoded)
                out[self.n_comp :].copy_(raw)
            else:
                out[: self.n_comp].add_(decoded)
                out[self.n_comp :].add_(raw)
