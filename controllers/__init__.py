"""K policies: pure decision logic. Nothing here imports torch.distributed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controllers.base import BoundaryStats, Controller, SyncDecision
from controllers.fixed import FixedController

# name -> factory(sync_period, **policy options). Later policies register here.
REGISTRY: dict[str, Callable[..., Controller]] = {
    "fixed": lambda sync_period, **_: FixedController(sync_period),
}


def build_controller(name: str, sync_period: int, **options: Any) -> Controller:
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(REGISTRY)}") from None
    return factory(sync_period, **options)


__all__ = ["REGISTRY", "BoundaryStats", "Controller", "SyncDecision", "build_controller"]
