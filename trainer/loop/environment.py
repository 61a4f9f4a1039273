"""What a run's numbers depend on besides its settings and seed: the Python and the packages that
compute them (summary.json's `environment`).

On the virtual clock a run is a function of its seed and settings on one installation
(docs/design.md §4), not across installations: the same code and settings, in a fresh
install whose packages pip resolved anew (the machine perhaps another), gave the controller
panel's iid-wan best fixed K on seed 75 a final accuracy of 0.9461 where the committed panel had
0.93175 (docs/controller-panel/phase-oracle/README.md). Which difference did it is not known:
the panel's runs recorded none. So a run records what it ran with (config.json at its start,
summary.json at its end), and a run is not continued or kept where that is not this one:
`autok train --resume` (autok/cli.py), `autok experiment run` (autok/experiment.py),
`autok sweep --resume` (autok/sweep.py).
"""

from __future__ import annotations

import platform
from functools import cache
from importlib import metadata

# The distributions whose versions can change a run's numbers: the tensor library, the array
# library and what the built-in data sets are generated or read with (mnist1d, scipy under it,
# scikit-learn's digits, torchvision's image sets). One not installed is recorded as None.
PACKAGES = ("torch", "numpy", "scipy", "mnist1d", "scikit-learn", "torchvision")


def environment() -> dict[str, str | None]:
    """{"python": "3.11.7", "torch": "2.14.1", ..., "cpu": "AVX512"}: this process's, as
    config.json and summary.json record it (a fresh dict each call). `cpu` is the instruction
    set torch's CPU kernels were chosen for: the same versions on another machine may sum in
    another order."""
    return dict(_read())


@cache
def _read() -> tuple[tuple[str, str | None], ...]:
    """Read once a process: it cannot change while it runs, and `autok experiment run` compares
    it with every kept run's."""
    import torch  # here, not at import: `autok experiment` reads this before it needs torch

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["cpu"] = torch.backends.cpu.get_cpu_capability()
    return tuple(out.items())


def difference(recorded: object, now: dict[str, str | None]) -> str | None:
    """The first way a recorded environment differs from `now`, as words ("numpy 2.4.5, this
    environment has 2.4.6"), or None where they agree. A record that is not a mapping of
    names to versions (a run made before autok recorded it) differs."""
    if not isinstance(recorded, dict):
        return "no record of its package versions (made before autok recorded them)"
    for name, version in now.items():
        was = recorded.get(name)
        if was != version:
            return f"{name} {str(was)[:40]}, this environment has {version}"
    return None
