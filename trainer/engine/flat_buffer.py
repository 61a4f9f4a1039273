"""The averager's flat buffer and the views a boundary works on (trainer/engine/averaging.py).

One allocation that only grows holds the collective's buffer as a prefix view, so fragment syncs
and whole-model syncs alternate sizes without reallocating. A boundary's views of it (its
averaged, broadcast and scalar segments, the moved slice of θ_ref, the velocity and scratch) are
cut once per layout and kept as a named `Cut`: a small model's boundary is mostly calls, and each
cut is one. Every field is allocated from the start (empty where nothing is held yet), so the
boundary's path tests no None (docs/design.md §4, Per step).

With `offload` (--outer-state-device cpu) θ_ref and the velocity live in host memory and a
boundary works on device copies of its slice (`Staged`), written home by `unstage`: the same ops
on the same device, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from autok.trainer.engine.exact_sums import N_SCALARS

_NUMPY = (torch.float32, torch.float64)  # buffer dtypes whose scalars are written through NumPy


class Cut(NamedTuple):
    """The views a boundary moving [a, b) works on, for one buffer layout. A tuple: the
    boundary unpacks it in one bytecode, where each named read is one more."""

    avg: torch.Tensor  # the averaged segment [pieces | gradients | averaged extras]
    bc: torch.Tensor  # the broadcast segment (rank 0's values survive the SUM)
    scalars: torch.Tensor  # the N_SCALARS tail
    head: torch.Tensor  # the moved slice's place at the buffer's head
    ref: torch.Tensor  # θ_ref[a:b] (a device copy where offloaded)
    velocity: torch.Tensor | None  # the velocity's slice, where the outer step has one
    scratch: torch.Tensor  # b − a elements of scratch
    # the scalars as a NumPy array where they can be (host memory, a dtype NumPy has): written
    # and read without a torch op, two fewer per boundary
    host: np.ndarray | None


class Staged(NamedTuple):
    """An offloaded boundary's device copies of its slice [a, b), made once per boundary."""

    bounds: tuple[int, int]
    ref: torch.Tensor
    velocity: torch.Tensor | None
    scratch: torch.Tensor


class FlatBuffer:
    """The collective's buffer, what an overlapped boundary sent, and the cut views."""

    def __init__(
        self,
        ref: torch.Tensor,
        velocity: torch.Tensor | None,
        device: torch.device,
        offload: bool,
        layouts: int,
    ) -> None:
        self.ref, self.velocity = ref, velocity  # θ_ref and the velocity, flat (the averager's)
        self.device, self.offload = device, offload
        self.store = torch.empty(0, dtype=ref.dtype, device=device)  # the one allocation
        self.buf = self.store  # the collective's buffer: a prefix of store
        self.snapshot = self.store  # overlap: what this rank sent (a prefix of it)
        # (offloaded: the boundary's scratch is staged with θ_ref's slice)
        self.scratch = torch.empty_like(ref, device=device) if not offload else self.store
        self.cuts: dict[tuple[int, int, int, int], Cut] = {}
        self.max_cuts = layouts + 4  # F fragments' layouts, a few more
        self.staged: Staged | None = None

    def retarget(self, ref: torch.Tensor, velocity: torch.Tensor | None) -> None:
        """θ_ref and the velocity replaced (the averager's use_outer): the cuts held slices."""
        self.ref, self.velocity = ref, velocity
        self.cuts.clear()

    def buffer(self, n: int) -> torch.Tensor:
        """The collective's buffer of n elements (a prefix of the store, grown if needed)."""
        if self.store.numel() < n:
            store = torch.empty(n, dtype=self.ref.dtype, device=self.device)
            if self.store.numel():  # keeps gradients captured into the old one
                store[: self.store.numel()].copy_(self.store)
            self.store = store
            self.cuts.clear()  # views of the old store
        if self.buf.numel() != n:
            self.buf = self.store[:n]
        return self.buf

    def cut(self, a: int, b: int, n_avg: int, n_bc: int) -> Cut:
        """The views a boundary moving [a, b) with this buffer layout works on, for the buffer
        as `buffer` last sized it; dropped when the buffer is reallocated."""
        key = (a, b, n_avg, n_bc)
        cut = self.cuts.get(key)
        if cut is None:
            if len(self.cuts) >= self.max_cuts:
                self.cuts.clear()
            buf, n, end = self.store, b - a, n_avg + n_bc
            if self.offload:  # the boundary's own copies, cut for it (stage)
                return self.stage(a, b, buf, n_avg, n_bc)
            velocity = self.velocity[a:b] if self.velocity is not None else None
            scalars = buf[end : end + N_SCALARS]
            cut = self.cuts[key] = Cut(
                avg=buf[:n_avg],
                bc=buf[n_avg:end],
                scalars=scalars,
                head=buf[:n],
                ref=self.ref[a:b],
                velocity=velocity,
                scratch=self.scratch[:n],
                host=_host_view(scalars, buf.dtype),
            )
        return cut

    def stage(self, a: int, b: int, buf: torch.Tensor, n_avg: int, n_bc: int) -> Cut:
        """cut's views with θ_ref[a:b], the velocity's and scratch as device copies, made once
        per boundary (start() and finish() both cut) and written home by unstage()."""
        if self.staged is None or self.staged.bounds != (a, b):
            ref = self.ref[a:b].to(self.device, copy=True, non_blocking=True)
            vel = self.velocity
            if vel is not None:
                vel = vel[a:b].to(self.device, copy=True, non_blocking=True)
            self.staged = Staged((a, b), ref, vel, torch.empty_like(ref))
        _, ref, vel, scratch = self.staged
        end = n_avg + n_bc
        scalars = buf[end : end + N_SCALARS]
        host = _host_view(scalars, buf.dtype)
        return Cut(buf[:n_avg], buf[n_avg:end], scalars, buf[: b - a], ref, vel, scratch, host)

    def unstage(self) -> None:
        """The boundary's θ_ref and velocity home (blocking: the host may read them next, a
        checkpoint), and the device copies freed."""
        if self.staged is not None:
            (a, b), ref, vel, _ = self.staged
            self.staged = None
            self.ref[a:b].copy_(ref)
            if vel is not None and self.velocity is not None:
                self.velocity[a:b].copy_(vel)

    def keep_sent(self, sent: torch.Tensor) -> None:
        """Keep what this rank sent (a delayed average adds the local steps taken meanwhile on
        top of the average when it arrives)."""
        n = sent.numel()
        if self.snapshot.numel() < n:  # the averaging's dtype (a saved one may be older)
            self.snapshot = torch.empty(n, dtype=self.ref.dtype, device=self.device)
        self.snapshot[:n].copy_(sent)


def views_of(flat: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """`flat` cut into views shaped as `tensors`, laid end to end."""
    chunks = flat.split([t.numel() for t in tensors])
    return [c.view_as(t) for c, t in zip(chunks, tensors, strict=True)]


def write_back(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """tensors ← `flat` laid end to end."""
    copy_into(tensors, views_of(flat, tensors))


def copy_into(tensors: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    with torch.no_grad():  # in place on parameters, outside autograd
        torch._foreach_copy_(tensors, values)


def add_back(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """tensors += `flat` laid end to end."""
    with torch.no_grad():
        torch._foreach_add_([t.detach() for t in tensors], views_of(flat, tensors))


def _host_view(scalars: torch.Tensor, dtype: torch.dtype) -> np.ndarray | None:
    return scalars.numpy() if scalars.device.type == "cpu" and dtype in _NUMPY else None


def working_copy(params: list[torch.Tensor]) -> torch.Tensor:
    """The parameters laid end to end in the dtype the averaging works in (its buffer, θ_ref,
    the velocity): at least float32, as the buffer's scalars must carry N digests and the
    drift's exact pieces (24 bits each), and the norms and SlowMo need more than bfloat16's 8
    bits or float16's range. The parameters themselves keep their dtype: θ_new is rounded to
    it as it is written back."""
    work = torch.float32
    for p in params:
        work = torch.promote_types(work, p.dtype)
    return torch.cat([p.detach().reshape(-1) for p in params]).to(work)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in host memory: pinned where it comes from a GPU, so that staging it for
    a boundary (FlatBuffer.stage) is a direct DMA."""
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
    return out.copy_(t)
