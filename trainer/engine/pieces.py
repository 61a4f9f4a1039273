"""The parameter pieces a boundary packs (trainer/engine/averaging.py, ParameterAverager.region):
the whole model's, cut once and kept across boundaries with what the pack and the replica
check read of them (docs/design.md §4, Per step: for a small model the cutting cost more than
the sums), or a fragment's 1-D views into the parameters (docs/design.md §2, fragments)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from autok.trainer.engine.digest import digest_words, one_copy
from autok.trainer.engine.exact_sums import Sums


class WholeCut(NamedTuple):
    """The whole model's parameters as a boundary reads them, cut from their storages once."""

    detached: list[torch.Tensor]  # the parameters, detached (views of their storages)
    # where every parameter is contiguous (else None): their replica digest words ...
    words: list[torch.Tensor] | None
    one_copy: bool  # ... taken as one copy laid end to end (digest.py, one_copy)
    digest_sums: Sums | None  # the kept copy and its sum, where that copy is small enough
    flats: list[torch.Tensor] | None  # ... and their 1-D views (the pack's)


def cut_whole(params: list[torch.Tensor], kept_max: int) -> WholeCut:
    """`params` cut for the boundaries to come. The digest's copy is kept for the run only where
    it is at most `kept_max` words, on the host (a many-tensor model's one copy can be large;
    it is then taken per boundary)."""
    detached = [p.detach() for p in params]
    contiguous = all(p.is_contiguous() for p in detached)
    words = digest_words(detached) if contiguous else None
    single = words is not None and one_copy(words)
    digest_sums = None
    total = sum(w.numel() for w in words) if words is not None and single else 0
    if 0 < total <= kept_max and words is not None and words[0].device.type == "cpu":
        digest_sums = Sums(torch.int32, torch.empty(total, dtype=words[0].dtype))
    flats = [p.view(-1) for p in detached] if contiguous else None
    return WholeCut(detached, words, single, digest_sums, flats)


def fragment_pieces(params: list[torch.Tensor], a: int, b: int) -> list[torch.Tensor]:
    """The pieces that hold [a, b) of the flat parameter vector, in order: 1-D views into the
    parameters (a cut may fall inside a tensor)."""
    pieces, offset = [], 0
    for p in params:
        lo, hi = max(a, offset), min(b, offset + p.numel())
        if lo < hi:
            pieces.append(p.detach().view(-1)[lo - offset : hi - offset])
        offset += p.numel()
    return pieces


def check_fragmentable(params: list[torch.Tensor]) -> None:
    """Refuse a parameter that is not contiguous: its fragment pieces are views of its storage,
    which a boundary writes in place."""
    for i, p in enumerate(params):
        if not p.is_contiguous():
            raise ValueError(
                f"--fragments: parameter {i} ({tuple(p.shape)}) is not contiguous; "
                "fragments slice the parameters in place"
            )
