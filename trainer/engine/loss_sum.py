"""The loss sum of one boundary interval: what the loop gave as `s.loss`, step by step, summed
in float64 with no host sync and as few ops per step as the device allows (docs/design.md §4).

- A CPU scalar tensor is kept, detached (a view: no copy), with its version, and read at the
  boundary: on a busy 2-core machine even a CPU `.item()` cost about 10 µs right after a step,
  a detach about 4. A tensor written over in place before the boundary (a reused loss buffer)
  no longer holds its step's value: reading it raises instead of summing the wrong number.
  At most LOSSES_HELD are held; then they are read (bounded memory at any K).
- Anything else is reduced at once: a CPU vector or a view (whose base the hold would keep
  alive) is read and summed; on an accelerator every loss is added into one float64 tensor on
  the device, in the stream, which reads its value at the step (CUDA graphs that overwrite
  their outputs stay correct) and syncs with the host only when the sum is read.
- Plain numbers are added as they come.
"""

from __future__ import annotations

import torch

LOSSES_HELD = 256


class LossSum:
    __slots__ = ("number", "held", "device_sum")

    def __init__(self) -> None:
        self.number = 0.0  # plain numbers and what has been read already
        self.held: list[tuple[torch.Tensor, int]] = []  # CPU scalars and their versions
        self.device_sum: torch.Tensor | None = None  # float64, on the losses' accelerator

    def add(self, loss: object) -> None:
        if not isinstance(loss, torch.Tensor):
            if loss is not None:
                self.number += float(loss)  # type: ignore[arg-type]
            return
        if loss.is_cpu:
            # a scalar that is no view: held (ddp_path.close_ddp_lazily holds ddp's loss alike)
            if not loss.dim() and loss._base is None:
                t = loss.detach()
                self.held.append((t, t._version))
                if len(self.held) >= LOSSES_HELD:
                    self.number += self._read_held()
            else:
                self.number += float(loss.detach().sum(dtype=torch.float64))
            return
        t = loss.detach()
        if t.dim():
            t = t.sum(dtype=torch.float64)
        acc = self.device_sum
        if acc is None or acc.device != t.device:
            if acc is not None:
                self.number += float(acc)
            self.device_sum = t.to(torch.float64, copy=True)  # never the loop's own tensor
            if self.number:
                # the sum so far goes first, as an uninterrupted device sum would have added it
                # (a resumed state's, read from one): (a + b) + c, not (a + b) + (c + d)
                self.device_sum.add_(self.number)  # (addition commutes, bit for bit)
                self.number = 0.0
        else:
            acc.add_(t)

    def _read_held(self) -> float:
        """The held scalars' sum, read now; they are dropped."""
        held, self.held = self.held, []
        return read_held(held)

    def _not_held(self) -> float:
        """What is summed already: the numbers and the device sum (read: a host sync)."""
        if self.device_sum is None:
            return self.number
        return self.number + float(self.device_sum)

    def total(self) -> float:
        """The sum so far, left in place."""
        return self._not_held() + read_held(self.held)

    def state_dict(self) -> dict:
        """The sum so far as plain numbers: what has been read, and each held value, so that a
        resumed sum adds them in the order the uninterrupted one would (bit for bit)."""
        _check(self.held)
        return {"loss_sum": self._not_held(), "loss_held": [t.item() for t, _ in self.held]}

    def load_state_dict(self, state: dict) -> None:
        self.number = float(state["loss_sum"])
        self.device_sum = None
        # float64 holds each value exactly; stacked with later float32 ones they promote alike
        held = [torch.tensor(float(v), dtype=torch.float64) for v in state.get("loss_held", ())]
        self.held = [(t, t._version) for t in held]

    def take(self) -> float:
        """The sum, read once (one host sync on an accelerator); the sum starts again at 0."""
        value = self.total()
        self.number, self.held, self.device_sum = 0.0, [], None
        return value


def _check(held: list[tuple[torch.Tensor, int]]) -> None:
    """Refuse held values written over since they were given."""
    for t, version in held:
        if t._version != version:
            raise RuntimeError(
                "s.loss was written over in place after its sync.step() closed, before the "
                "boundary read it; give a value that stays: loss.detach().clone() or loss.item()"
            )


def read_held(held: list[tuple[torch.Tensor, int]]) -> float:
    """The sum of held (tensor, version) pairs, read now; refused if one was written over."""
    _check(held)
    if len(held) <= 1:
        return held[0][0].item() if held else 0.0
    return torch.stack([t for t, _ in held]).sum(dtype=torch.float64).item()
