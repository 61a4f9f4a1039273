"""Digests of the parameters (trainer/engine/averaging.py): the replica check's additive digest,
summed inside the averaging buffer at every boundary, and the run summary's CRC of the weights.
Pure functions of tensors: tested without a process group."""

from __future__ import annotations

import zlib

import torch

from autok.trainer.engine.exact_sums import Sums


def param_digest(tensors: list[torch.Tensor], bits: int) -> int:
    """CRC32 of the raw bytes, cut to `bits`: the run summary's fingerprint of the weights
    (once per run; it copies every tensor to the host). Boundaries use `replica_digest`."""
    crc = 0
    for t in tensors:
        # the bytes viewed by torch: NumPy has no bfloat16 to view them as
        crc = zlib.crc32(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().data, crc)
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
    words: list[torch.Tensor], bits: int, concat: bool | None = None, into: Sums | None = None
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


def digest_bits(world_size: int) -> int:
    # float32 holds integers exactly up to 2^24; N digests must sum below it.
    return max(1, 24 - max(1, (world_size - 1).bit_length()))
