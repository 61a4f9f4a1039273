"""The averager's compressed boundary (--compress fp16, int8; trainer/engine/averaging.py,
ParameterAverager.start): Δ_i = θ_i − θ_ref sent through the quantized all-reduce of
trainer/engine/compress.py, with the error feedback of the slice it moves, and the plan and
memory of that all-reduce kept per buffer layout (docs/design.md §2, Compression)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from autok.trainer.engine.compress import Buffers, Layout, quantized_allreduce_
from autok.trainer.engine.link import LinkClock, delayed, hold_until

if TYPE_CHECKING:
    from autok.trainer.engine.averaging import ParameterAverager
    from autok.trainer.engine.pending import Pending


def start_compressed(
    averager: ParameterAverager, buf: torch.Tensor, pending: Pending, clock: LinkClock | None
) -> None:
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
    if key not in averager._codecs:
        layout = Layout(averager.compress, segments, n_raw, averager.world_size)
        averager._codecs[key] = (layout, Buffers(layout, buf.device))
    layout, mem = averager._codecs[key]
    if averager._residual is None:
        averager._residual = torch.zeros_like(averager.ref)
    if averager._residual2 is None:
        averager._residual2 = torch.zeros_like(averager.ref)
    buf[:n].sub_(averager.ref[a:b])  # Δ_i: small values (θ_i itself is in the snapshot)
    deadline = quantized_allreduce_(
        buf, layout, mem, averager.rank, averager._residual[a:b], averager._residual2[a:b], clock
    )
    pending.compressed, pending.nbytes = True, layout.nbytes
    if not pending.overlap:
        hold_until(deadline)
    elif clock is not None:
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(None)
        pending.future = delayed(done, deadline, device=buf.device)
