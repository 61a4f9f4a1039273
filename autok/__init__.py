"""autok: Controlled Periodic Data Parallelism with an online sync period K.

The library is `autok.Sync` (see autok/api.py); `autok train` is one client of it. Names load
lazily, so `autok --help` does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ACCURACY",
    "PERPLEXITY",
    "BaseObserver",
    "Metric",
    "Observer",
    "OptionError",
    "StepHandle",
    "StepInfo",
    "StepTimes",
    "Sync",
    "Task",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from autok import api

        return getattr(api, name)
    raise AttributeError(f"module 'autok' has no attribute {name!r}")
