"""The data files autok ships: the named experiment grids and search spaces, and the dashboards.

In the repository they stay at the top level (`experiments/`, `dashboards/`). pyproject.toml maps
them into the package as `autok.experiments` and `autok.dashboards` (setuptools `package-dir`),
so a wheel carries them inside `autok/`, and an editable install's finder maps the same names
onto the checkout's directories. Either way `importlib.resources` finds them by package name,
whatever the current directory; nothing is located relative to this file.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

EXPERIMENTS_PACKAGE = "autok.experiments"
DASHBOARDS_PACKAGE = "autok.dashboards"


def _directory(package: str) -> Path:
    """The package's directory on disk. pip installs wheels unpacked, so `files()` is a real
    directory; a zip import would not be, and is refused with a clear message."""
    root = files(package)
    path = Path(str(root))
    if not (isinstance(root, Path) and path.is_dir()):
        raise RuntimeError(f"{package} is not a directory on disk ({root}); install autok unzipped")
    return path


def experiments_dir() -> Path:
    """`experiments/`: the named grids (`NAME.yaml`) and `spaces/`."""
    return _directory(EXPERIMENTS_PACKAGE)


def default_space() -> Path:
    """The default search space of `autok sweep`."""
    return experiments_dir() / "spaces" / "default.yaml"


def dashboards_dir() -> Path:
    """`dashboards/`: the Grafana dashboard, its provisioning, prometheus.yml, docker-compose."""
    return _directory(DASHBOARDS_PACKAGE)
