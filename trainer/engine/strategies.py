"""Sync strategies: what a local step and a boundary step do (docs/design.md §2).

| strategy | local step                     | boundary step                                     |
|----------|--------------------------------|---------------------------------------------------|
| ddp      | — (every step is a boundary)   | gradient AllReduce in backward, optimizer step    |
| localsgd | no_sync() backward, local step | local step, parameter average (+ SlowMo if β > 0) |
| cpdp     | no_sync() backward, local step | grad AllReduce, synced step, average, SlowMo      |

The engine asks a strategy its flags and its backward context, and never branches on its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.nn.parallel import DistributedDataParallel


class _NoSync:
    """`DDP.no_sync()` as a class: the same flag turned off and restored, without the generator
    and frames a `@contextmanager` costs on every local step (docs/design.md §4, Per step). The flag
    is a plain attribute, so it is written to the instance dict directly: nn.Module.__setattr__
    would only check that it is no parameter, buffer or submodule first."""

    __slots__ = ("model", "old")

    def __init__(self, model: DistributedDataParallel) -> None:
        self.model = model

    def __enter__(self) -> None:
        attrs = self.model.__dict__
        self.old = attrs["require_backward_grad_sync"]
        attrs["require_backward_grad_sync"] = False

    def __exit__(self, *exc: object) -> None:  # None: an exception propagates
        self.model.__dict__["require_backward_grad_sync"] = self.old


@dataclass(frozen=True)
class SyncStrategy:
    name: str
    grad_sync_at_boundary: bool  # DDP's gradient AllReduce runs in the boundary step's backward
    averages_parameters: bool  # the boundary ends with parameter averaging (+ SlowMo)
    # cpdp's gradient AllReduce rides inside the averaging collective (one latency, not two)
    fused_gradients: bool = False

    def backward_context(self, model: DistributedDataParallel, is_boundary: bool) -> _NoSync | None:
        """The context of a step's backward: DDP all-reduces gradients inside backward unless
        no_sync() suppresses its hooks; local steps keep their gradients local, so the optimizer
        step that follows is a local one. None where the backward all-reduces (a boundary, where
        the strategy syncs gradients in it): nothing to enter, where a null context's two frames
        were paid at every synchronized step."""
        return None if is_boundary and self.grad_sync_at_boundary else _NoSync(model)


def fused(strategy: SyncStrategy) -> SyncStrategy:
    """The fused cpdp boundary: a local step in the boundary's backward, gradients averaged
    with the parameters afterwards (trainer/engine/averaging.py derives why that is exact for
    SGD)."""
    return SyncStrategy(
        strategy.name, grad_sync_at_boundary=False, averages_parameters=True, fused_gradients=True
    )


STRATEGIES: dict[str, SyncStrategy] = {
    "ddp": SyncStrategy("ddp", grad_sync_at_boundary=True, averages_parameters=False),
    "localsgd": SyncStrategy("localsgd", grad_sync_at_boundary=False, averages_parameters=True),
    "cpdp": SyncStrategy("cpdp", grad_sync_at_boundary=True, averages_parameters=True),
}
