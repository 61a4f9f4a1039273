"""The core install and its extras (pyproject.toml, autok/extras.py): `autok.Sync` and a training
of a user's --task need none of the extras' modules, and a command whose extra is missing is
refused in one line naming the extra to install, exit 2, nothing written.

A core install is imitated in subprocesses: a `sitecustomize` on PYTHONPATH marks the extras'
modules as not importable, as in an environment without them, in the command and in every
worker process it starts."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# every module that only an extra installs
EXTRAS_MODULES = (
    "optuna",
    "ray",
    "mnist1d",
    "sklearn",
    "scipy",
    "matplotlib",
    "tensorboard",
    "psycopg",
    "torchvision",
)
BLOCKER = """\
import sys

# None in sys.modules is Python's own mark of a module that cannot be imported: `import` raises
# ModuleNotFoundError, importlib.util.find_spec returns None, as for one not installed
for name in {blocked!r}:
    sys.modules[name] = None
"""


def _without(tmp: Path, modules: tuple[str, ...]) -> dict[str, str]:
    """The environment of a process (and its workers) in which `modules` are not installed."""
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(modules)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env["AUTOK_CACHE"] = str(tmp / "cache")  # no mnist1d cached: the package would make it
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300):
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def _tree(d: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(d)), p.stat().st_mtime_ns) for p in d.rglob("*"))


# ----- the core: no extra's module ---------------------------------------------------------------


def test_the_blocker_really_refuses_the_extras(tmp_path):
    """The imitation holds: in it, each extra's module fails to import (else the tests below
    would prove nothing)."""
    env = _without(tmp_path, EXTRAS_MODULES)
    code = (
        "import importlib\n"
        f"for m in {EXTRAS_MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise SystemExit(m + ' imported')\n"
    )
    res = _run([sys.executable, "-c", code], env, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]


@pytest.mark.dist
def test_sync_and_a_task_train_on_two_gloo_workers_without_any_extra(tmp_path):
    """`import autok; autok.Sync` and `autok train --task` (the built-in loop around autok.Sync,
    two gloo processes) need only the core: k_lr.png, a plot, is left out in one line."""
    env = _without(tmp_path, EXTRAS_MODULES)
    code = "import autok\nprint(autok.Sync.__name__)\n"
    res = _run([sys.executable, "-c", code], env, tmp_path)
    assert res.returncode == 0 and res.stdout == "Sync\n", res.stderr[-2000:]
    out = tmp_path / "run"
    argv = [
        str(VENV_BIN / "autok"), "train", "--task", "tests.task_fixtures:regression",
        "--workers", "2", "--link", "none", "--no-progress", "--optimizer", "sgd",
        "--epochs", "1", "--out", str(out),
    ]  # fmt: skip
    res = _run(argv, env, tmp_path, timeout=500)  # two workers start on 2 loaded cores
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert (out / "summary.json").is_file() and (out / "boundaries.jsonl").is_file()
    assert not (out / "k_lr.png").exists()
    said = [ln for ln in res.stdout.splitlines() if "k_lr.png not drawn" in ln]
    why = "matplotlib is missing (pip install 'autok[report]')"
    assert said == [f"autok: k_lr.png not drawn: {why}"], res.stdout[-2000:]


# ----- a missing extra: one line naming it, exit 2, nothing written ------------------------------


@pytest.mark.parametrize(
    "blocked, args, line",
    [
        (
            ("optuna",),
            ["sweep", "--task", "tests.task_fixtures:regression", "--out", "{tmp}/sweep"],
            "autok sweep needs optuna: pip install 'autok[sweep]'",
        ),
        (
            ("ray",),
            ["sweep", "--backend", "ray", "--out", "{tmp}/sweep"],
            "--backend ray needs ray: pip install 'autok[ray]'",
        ),
        (
            ("psycopg",),
            ["sweep", "--storage", "postgresql://u@localhost/db", "--out", "{tmp}/sweep"],
            "--storage postgresql needs psycopg: pip install 'autok[postgres]'",
        ),
        (
            ("matplotlib",),
            ["report", "{tmp}"],
            "autok report needs matplotlib: pip install 'autok[report]'",
        ),
        (
            ("mnist1d",),
            ["train", "--out", "{tmp}/run"],
            "--dataset mnist1d needs mnist1d: pip install 'autok[data]'",
        ),
        (
            ("sklearn",),
            ["train", "--dataset", "digits", "--out", "{tmp}/run"],
            "--dataset digits needs sklearn: pip install 'autok[data]'",
        ),
        (
            ("tensorboard",),
            [
                "train",
                "--task",
                "tests.task_fixtures:regression",
                "--tensorboard",
                "{tmp}/tb",
                "--out",
                "{tmp}/run",
            ],
            "--tensorboard needs tensorboard: pip install 'autok[tensorboard]'",
        ),
        (
            ("mnist1d",),
            ["experiment", "run", "k-sweep", "--out", "{tmp}/exp"],
            "--dataset mnist1d needs mnist1d: pip install 'autok[data]'",
        ),
    ],
    ids=["sweep", "ray", "postgres", "report", "mnist1d", "digits", "tensorboard", "experiment"],
)
def test_a_missing_extra_is_one_line_naming_it(tmp_path, blocked, args, line):
    env = _without(tmp_path, blocked)
    work = tmp_path / "work"
    work.mkdir()
    (work / "kept.txt").write_text("a user's file")
    before = _tree(work)
    argv = [str(VENV_BIN / "autok"), *(a.replace("{tmp}", str(work)) for a in args)]
    res = _run(argv, env, tmp_path, timeout=120)
    assert res.returncode == 2, res.stdout[-1000:] + res.stderr[-2000:]
    assert res.stderr == f"autok: error: {line}\n", res.stderr[-2000:]
    assert _tree(work) == before  # nothing created, nothing touched


def test_a_cached_mnist1d_needs_no_package(tmp_path, monkeypatch):
    """mnist1d is made once and cached (trainer/loop/data.py): a run whose data set is cached whole
    never imports the package, so it is not refused; another size still needs it."""
    from autok.trainer.loop.data import DATA_SEED, HELD_OUT_SEED, prepare_mnist1d

    env = _without(tmp_path, ("mnist1d",))
    monkeypatch.setenv("AUTOK_CACHE", env["AUTOK_CACHE"])
    prepare_mnist1d(500, DATA_SEED)
    code = (
        "from autok.config import ConfigError\n"
        "from autok.extras import require_run\n"
        "require_run({'mnist1d_samples': 500})\n"
        "for settings in ({'mnist1d_samples': 600},\n"
        "                 {'mnist1d_samples': 500, 'mnist1d_test_samples': 300}):\n"
        "    try:\n"
        "        require_run(settings)\n"
        "    except ConfigError as exc:\n"
        "        print(exc)\n"
    )
    res = _run([sys.executable, "-c", code], env, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout == "--dataset mnist1d needs mnist1d: pip install 'autok[data]'\n" * 2
    prepare_mnist1d(300, HELD_OUT_SEED)  # the held-out draw cached too: no package needed
    code = "from autok.extras import require_run\n"
    code += "require_run({'mnist1d_samples': 500, 'mnist1d_test_samples': 300})\n"
    res = _run([sys.executable, "-c", code], env, tmp_path)
    assert res.returncode == 0 and res.stdout == "", res.stderr[-2000:]


# ----- pyproject.toml: the core, the extras and autok/extras.py agree ----------------------------


def _requirement_names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in reqs}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_core_holds_no_extra_and_each_feature_names_an_extra_that_installs_it():
    from autok.extras import FEATURES

    project = _project()
    extras = project["optional-dependencies"]
    core = _requirement_names(project["dependencies"])
    assert core == {"torch", "numpy", "pydantic", "pyyaml", "prometheus-client", "tqdm"}
    dists = importlib.metadata.packages_distributions()
    for feature, (modules, extra) in FEATURES.items():
        names = _requirement_names(extras[extra])
        for module in modules:
            assert {d.lower() for d in dists[module]} & names, (feature, module, extra)
    # `all` is every extra but dev (what `make train` and `make test` install, with dev)
    for name, reqs in extras.items():
        if name not in ("all", "dev"):
            assert set(reqs) <= set(extras["all"]), name
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q -e '.[all,dev]'" in makefile


def test_torch_is_a_range_and_torchvision_keeps_its_cap():
    project = _project()
    torch_req = next(r for r in project["dependencies"] if r.startswith("torch"))
    assert torch_req == "torch>=2.6,<2.15"
    assert project["requires-python"] == ">=3.11"
    vision = [r for reqs in project["optional-dependencies"].values() for r in reqs]
    assert {r for r in vision if r.startswith("torchvision")} == {"torchvision>=0.21,<0.30"}
    import torch

    assert "2.6" <= torch.__version__ < "2.15"  # the tested one lies inside (TorchVersion order)
