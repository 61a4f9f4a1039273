"""A search space over `autok train` settings, read from YAML, usable by Optuna and Ray Tune."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autok.config import ConfigError, TrainConfig, read_yaml

DEFAULT_SPACE = Path(__file__).resolve().parents[1] / "experiments" / "spaces" / "default.yaml"


@dataclass(frozen=True)
class Dim:
    name: str
    kind: str  # int | float | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple | None = None

    def suggest(self, trial) -> Any:
        """Optuna's define-by-run suggestion."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)


def load_enqueue(path: Path | None, space: list[Dim]) -> tuple[dict, ...]:
    """A YAML list of {setting: value} over the space's dimensions, to evaluate first."""
    if path is None:
        return ()
    raw = read_yaml(path, "--enqueue")
    names = {d.name for d in space}
    if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
        raise ConfigError(f"--enqueue: {path} must be a list of mappings")
    out = []
    for p in raw:
        p = {str(k).replace("-", "_"): v for k, v in p.items()}
        if unknown := set(p) - names:
            raise ConfigError(f"--enqueue: {sorted(unknown)} not in the search space")
        out.append(p)
    return tuple(out)


def load_space(path: Path | None) -> list[Dim]:
    """Parse and validate a space file; every problem is a ConfigError naming --space."""
    path = path or DEFAULT_SPACE
    raw = read_yaml(path, "--space")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"--space: {path} must map setting names to ranges")
    dims = []
    for key, spec in raw.items():
        name = str(key).replace("-", "_")
        where = f"--space: {path.name}: {key}"
        if name not in TrainConfig.model_fields:
            raise ConfigError(f"{where}: not an `autok train` setting")
        if name in ("out", "workers"):
            raise ConfigError(f"{where}: fixed per sweep, cannot be searched")
        if not isinstance(spec, dict) or spec.get("type") not in ("int", "float", "categorical"):
            raise ConfigError(f"{where}: needs type: int, float or categorical")
        kind = spec["type"]
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices:
                raise ConfigError(f"{where}: categorical needs a non-empty list `choices`")
            dims.append(Dim(name, kind, choices=tuple(choices)))
            continue
        low, high, log = spec.get("low"), spec.get("high"), bool(spec.get("log", False))
        if not all(isinstance(v, (int, float)) for v in (low, high)) or low > high:
            raise ConfigError(f"{where}: needs numbers low <= high")
        if log and low <= 0:
            raise ConfigError(f"{where}: log scale needs low > 0")
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise ConfigError(f"{where}: int bounds must be integers")
        dims.append(Dim(name, kind, float(low), float(high), log))
    return dims
