"""Which optional dependencies (pyproject.toml's extras) a command or a setting needs.

`pip install autok` is the library core (`autok.Sync`, the controllers, the link emulator, the
exporter and the built-in loop around a user's `--task`: docs/design.md §3). Everything else is an
extra; a command whose extra is missing is refused in one line naming it, before anything is
launched or written, instead of failing mid-run with an ImportError's traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from autok.config import ConfigError, TrainConfig

# feature -> (the import names it needs, the extra that installs them). Keep the extras' lists in
# pyproject.toml in step: tests/test_extras.py checks every module here is in its extra there.
FEATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "autok sweep": (("optuna", "matplotlib"), "sweep"),  # matplotlib: pareto.png
    "--backend ray": (("ray", "optuna"), "ray"),  # Ray Tune drives Optuna's sampler
    "--storage postgresql": (("psycopg",), "postgres"),  # SQLAlchemy 2's default driver
    "autok report": (("matplotlib", "scipy"), "report"),  # plots; scipy: confidence intervals
    "--tensorboard": (("tensorboard",), "tensorboard"),  # torch.utils.tensorboard writes with it
    "--dataset mnist1d": (("mnist1d",), "data"),
    "--dataset digits": (("sklearn",), "data"),
    "--dataset cifar100": (("torchvision",), "data"),
    "--dataset tinyimagenet": (("torchvision",), "data"),
    "--dataset imagefolder": (("torchvision",), "data"),
    "--model resnet18": (("torchvision",), "data"),
    "--model resnet50": (("torchvision",), "data"),
    "--model vit-s": (("torchvision",), "data"),
}


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules that cannot be imported here (looked up, not imported: optuna or ray would
    cost seconds before the command itself runs)."""
    absent = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it; a broken parent package
            found = False
        if not found:
            absent.append(name)
    return absent


def require(feature: str) -> None:
    """ConfigError naming the extra to install when `feature` (a key of FEATURES) lacks one of
    its modules; nothing otherwise."""
    modules, extra = FEATURES[feature]
    if absent := missing(modules):
        raise ConfigError(f"{feature} needs {absent[0]}: pip install 'autok[{extra}]'")


def require_run(settings: TrainConfig | Mapping[str, Any]) -> None:
    """What one run's settings need beyond the core: the built-in data set and model (a --task
    brings its own) and --tensorboard. `settings`: a TrainConfig, or an experiment run's mapping
    (absent keys take TrainConfig's defaults)."""
    if isinstance(settings, Mapping):
        fields = TrainConfig.model_fields

        def get(name: str) -> Any:
            return settings.get(name, fields[name].default)
    else:

        def get(name: str) -> Any:
            return getattr(settings, name)

    if get("task") is None:
        for feature in (f"--dataset {get('dataset')}", f"--model {get('model')}"):
            if feature not in FEATURES or not missing(FEATURES[feature][0]):
                continue
            sizes = (get("mnist1d_samples"), get("mnist1d_test_samples"))
            if not _cached(feature, *sizes):  # read only when it matters
                require(feature)
    if get("tensorboard") is not None:
        require("--tensorboard")


def _cached(feature: str, mnist1d_samples: int, test_samples: int | None = None) -> bool:
    """mnist1d is generated once and cached: a run that finds the cache whole (and the held-out
    draw's, when it tests on one) never imports the package, so it is not refused for lacking it."""
    if feature != "--dataset mnist1d":
        return False
    from autok.trainer.loop.data import mnist1d_ready

    return mnist1d_ready(mnist1d_samples, test_samples)


def require_storage(url: str | None) -> None:
    """A PostgreSQL --storage needs its driver (SQLAlchemy names it after `+`; psycopg if none).
    Another database's driver is the user's own choice: SQLAlchemy names it if it is missing."""
    if url is None:
        return
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgresql+psycopg"):
        require("--storage postgresql")
