"""Packaging and the CLI's shell: the data files ship inside the package, a wheel
works outside the checkout, `--help` and `--version` start without torch, the train flags are
grouped, a Ray sweep whose trials cannot fit is refused, and the documented `ray job submit`
path runs. Wheel, venv and Ray-cluster tests are marked slow (`pytest -m slow`)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
HEAVY = ("torch", "torchvision", "numpy", "sklearn", "scipy", "optuna", "ray", "matplotlib")
# A sweep small enough for a test (one trial, one epoch, 2 workers, no emulated link).
TINY_SWEEP = [
    "--trials", "1", "--epochs", "1", "--workers", "2", "--mnist1d-samples", "500",
    "--link", "none",
]  # fmt: skip


# ----- the shell of the CLI: no torch for --help and --version ----------------------------------


def test_help_and_version_do_not_import_torch_or_other_heavy_packages():
    code = (
        "import sys, contextlib, io\n"
        "import autok.cli\n"
        "autok.cli.build_parser()\n"
        "for argv in (['--help'], ['train', '--help'], ['sweep', '--help'], ['--version']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        autok.cli.main(argv)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]", res.stdout


def test_bench_help_and_its_refusals_start_without_torch_and_list_every_part():
    """`autok bench --help` parses in benchmarks/bench_cli.py: torch comes with the measurements
    only; `--only`'s help names every part, each with what it measures."""
    code = (
        "import sys, contextlib, io, json\n"
        "import autok.cli\n"
        "out, err, codes = io.StringIO(), io.StringIO(), []\n"
        "for argv in (['bench', '--help'], ['bench', '--only', 'z']):\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        codes.append(autok.cli.main(argv))\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps([heavy, codes, out.getvalue(), err.getvalue()]))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-2000:]
    heavy, codes, help_text, err = json.loads(res.stdout)
    assert heavy == [] and codes == [0, 2], (heavy, codes)
    from benchmarks.bench_cli import PART_HELP, PARTS

    assert set(PART_HELP) == set(PARTS)
    assert "{" + ",".join(PARTS) + "}" in " ".join(help_text.split())
    for part, what in PART_HELP.items():
        assert f"\n  {part:7} {what}\n" in help_text, part
    assert err.startswith("autok: error: --only: unknown part 'z'") and err.count("\n") == 1


def test_version_is_the_installed_distributions(capsys):
    from autok.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code in (0, None)
    assert capsys.readouterr().out == f"autok {importlib.metadata.version('autok')}\n"


def _train_parser():
    import argparse

    from autok.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"], sub.choices["sweep"]


def test_train_flags_are_grouped_as_the_readme_tours_them():
    from autok.cli import FLAG_GROUPS, OTHER_GROUP
    from autok.config import LIBRARY_ONLY, TrainConfig, flag

    flagged = [n for n in TrainConfig.model_fields if n not in LIBRARY_ONLY]
    train, sweep = _train_parser()
    groups = {
        g.title: [o for a in g._group_actions for o in a.option_strings if o.startswith("--")]
        for g in train._action_groups
        if g.title not in ("positional arguments", "options")  # argparse's own: -h
    }
    assert list(groups) == list(FLAG_GROUPS), list(groups)  # every group, in the README's order
    assert OTHER_GROUP not in groups, f"flags without a group: {groups.get(OTHER_GROUP)}"
    # each setting has exactly one flag, in the group FLAG_GROUPS names for it
    for title, names in FLAG_GROUPS.items():
        for name in names:
            if name in TrainConfig.model_fields:
                assert flag(name) in groups[title], (name, title)
    flat = [o for opts in groups.values() for o in opts if not o.startswith("--no-")]
    assert len(flat) == len(set(flat))
    assert {flag(n) for n in flagged} | {"--config", "--resume"} == set(flat)
    assert "--workers" in groups["distribution and synchronization"]
    assert "--policy" in groups["K policy"] and "--link" in groups["link emulator"]
    assert "--resume" in groups["run"] and "--config" in groups["run"]
    # the sweep takes every train flag too (the process-group backend renamed), in the same groups
    sweep_flags = {o for a in sweep._actions for o in a.option_strings}
    assert {flag(n) for n in flagged if n != "backend"} <= sweep_flags
    assert "--dist-backend" in sweep_flags


def test_train_help_shows_every_flag_with_its_default():
    from autok.config import LIBRARY_ONLY, TrainConfig, flag

    train, _ = _train_parser()
    text = " ".join(train.format_help().split())
    for name, field in TrainConfig.model_fields.items():
        if name in LIBRARY_ONLY:  # autok.Sync's alone: the built-in loop cannot honour it
            assert flag(name) not in text, name
            continue
        assert flag(name) in text, name
        helptext = next(a.help for a in train._actions if a.dest == name)
        assert "(default" in helptext, name
        if field.default is not None and not isinstance(field.default, bool):
            assert str(field.default) in helptext, name


# ----- the data files ship inside the package ---------------------------------------------------


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _shipped(pattern_root: Path, patterns: list[str]) -> set[Path]:
    return {p for pat in patterns for p in pattern_root.glob(pat) if p.is_file()}


def test_the_data_directories_are_resources_of_the_package():
    from autok.experiment import available
    from autok.resources import dashboards_dir, default_space, experiments_dir

    assert experiments_dir().samefile(ROOT / "experiments")  # the editable checkout's own
    assert dashboards_dir().samefile(ROOT / "dashboards")
    assert default_space().is_file()
    assert available() == sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml"))
    assert "paper-wan" in available()


def test_pyproject_ships_every_package_and_every_data_file():
    """A new subpackage or data file that the wheel would leave out fails here, not for a user."""
    tool = _pyproject()["tool"]["setuptools"]
    packages, mapped, data = tool["packages"], tool["package-dir"], tool["package-data"]
    inits = ROOT.glob("autok/**/__init__.py")
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in inits}
    assert on_disk <= set(packages), on_disk - set(packages)
    # every installed name lives under autok; benchmarks/ is not installed (`autok bench` runs
    # from a checkout)
    assert {p.split(".")[0] for p in packages} == {"autok"}
    assert mapped == {
        "autok.experiments": "experiments",
        "autok.dashboards": "dashboards",
        "autok.examples": "examples",
        "autok.trainer": "trainer",
        "autok.controllers": "controllers",
    }
    shipped_code = {  # a mapped folder's subpackages ship under its package's name
        f"{package}.{'.'.join(p.parent.relative_to(ROOT / folder).parts)}".rstrip(".")
        for package, folder in mapped.items()
        for p in (ROOT / folder).rglob("__init__.py")
    }
    assert shipped_code <= set(packages), shipped_code - set(packages)
    for package, folder in mapped.items():
        assert package in packages
        files = {
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts
        }
        assert files, folder
        # the package's own modules ship as code (e.g. dashboards/build.py), as do those of its
        # subpackages (each listed above); the rest as data
        code = {p for p in files if p.suffix == ".py" and (p.parent / "__init__.py").is_file()}
        missing = files - code - _shipped(ROOT / folder, data.get(package, []))
        assert not missing, f"not in package-data[{package!r}]: {sorted(map(str, missing))}"


def test_the_tasks_the_shipped_experiments_name_import_from_any_directory(tmp_path):
    """The README says experiments work from any directory: every `task` a shipped experiment
    names imports outside the checkout (autok.examples ships examples/), and controller-panel's
    forms expand there, each task built and probed before any run would start."""
    code = (
        "import json\n"
        "from autok.experiment import available, expand, load_experiment\n"
        "from autok.trainer.loop.tasks import resolve\n"
        "def tasks(node):\n"
        "    if isinstance(node, dict):\n"
        "        yield from ([node['task']] if isinstance(node.get('task'), str) else [])\n"
        "        node = list(node.values())\n"
        "    if isinstance(node, list):\n"
        "        for v in node:\n"
        "            yield from tasks(v)\n"
        "named = sorted({t for name in available() for t in tasks(load_experiment(name))})\n"
        "for spec in named:\n"
        "    resolve(spec)\n"
        "panel = load_experiment('controller-panel')\n"
        "runs = [len(expand(panel, form)) for form in ('quick', 'full')]\n"
        "print(json.dumps([named, runs]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's shell
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    named, runs = json.loads(res.stdout)
    assert named and all(t.startswith("autok.examples.") for t in named), named
    assert runs[0] > 0 and runs[1] > 0


def test_ray_dependency_has_the_jobs_cli_and_the_dashboard():
    deps = _pyproject()["project"]["optional-dependencies"]["ray"]  # an extra (autok/extras.py)
    ray = next(d for d in deps if d.startswith("ray["))
    extras = set(ray[4 : ray.index("]")].split(","))
    assert {"default", "tune"} <= extras, ray
    import ray.dashboard  # noqa: F401 - ray[default] installed: the dashboard and jobs CLI
    from ray.job_submission import JobSubmissionClient  # noqa: F401


# ----- a Ray sweep whose trials cannot fit is refused --------------------------------------------


def _autok_lines(err: str) -> list[str]:
    return [ln for ln in err.strip().splitlines() if ln.startswith("autok")]  # not Ray's own


def test_ray_sweep_refuses_trials_larger_than_any_node_before_submitting(
    tmp_path, capsys, monkeypatch
):
    """A cluster of two 2-CPU nodes (4 CPUs in all) and --workers 3: a trial is one bundle on one
    node, so none could ever start and Tune would wait forever. Ray's calls are stand-ins here;
    the slow test below does the same on a real Ray."""
    ray = pytest.importorskip("ray")
    tune = pytest.importorskip("ray.tune")
    from autok.cli import main

    calls = []
    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}] * 2 + [{"Alive": False, "Resources": {}}]
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(("init", kw["address"])))
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("shutdown",)))

    def tripwire(*args, **kwargs):
        raise AssertionError("a trial was submitted")

    monkeypatch.setattr(tune, "Tuner", tripwire)
    out = tmp_path / "sweeps" / "s1"
    rc = main(
        ["sweep", "--backend", "ray", "--address", "auto", *TINY_SWEEP, "--workers", "3",
         "--out", str(out)]
    )  # fmt: skip
    err = _autok_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("autok: error: --workers: each trial reserves 3 CPUs on one node")
    assert "largest node has 2" in err[0] and "--workers 2 or fewer" in err[0], err
    assert calls == [("init", "auto"), ("shutdown",)]  # it let go of the cluster it joined
    assert not (tmp_path / "sweeps").exists()  # the directories it made are gone again


@pytest.mark.slow
def test_ray_sweep_on_a_one_cpu_ray_refuses_two_workers(tmp_path, capsys):
    ray = pytest.importorskip("ray")
    from autok.cli import main

    out = tmp_path / "sweeps" / "s1"
    temp = tempfile.mkdtemp(prefix="autok-ray-", dir="/tmp")  # short: Ray's unix sockets
    try:
        ray.init(
            address="local",  # never a cluster someone else started on this machine
            num_cpus=1,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=temp,
        )
        rc = main(["sweep", "--backend", "ray", *TINY_SWEEP, "--out", str(out)])
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    err = _autok_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("autok: error: --workers: each trial reserves 2 CPUs"), err
    assert "has 1" in err[0] and "--workers 1 or fewer" in err[0], err
    assert not (tmp_path / "sweeps").exists()


# ----- slow: a wheel in a fresh venv, outside the checkout --------------------------------------

IGNORED = (".git", ".venv", "build", "dist", "runs", "sweeps", "__pycache__", "*.egg-info")
IGNORED += (".pytest_cache", ".ruff_cache", ".hypothesis")


def build_wheel(dest: Path) -> Path:
    """The wheel of a copy of the source tree (the checkout gets no build/ directory), built
    with this venv's setuptools (no download)."""
    src = dest / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*IGNORED))
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dest / "dist"), str(src)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = (dest / "dist").glob("autok-*.whl")
    return wheel


def site_packages(python: Path) -> Path:
    res = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(res.stdout.strip())


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A new venv holding the wheel; the heavy dependencies (torch...) come from this venv's
    site-packages through a .pth line, so nothing is downloaded. A path added by a .pth is
    searched after the venv's own site-packages and its own .pth files are not run, so the
    editable install's finder stays out: autok can only come from the wheel."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    (site_packages(python) / "deps-from-dev-venv.pth").write_text(
        f"{site_packages(Path(sys.executable))}\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return python


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_runs_experiments_and_sweeps(tmp_path):
    wheel = build_wheel(tmp_path / "build")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "autok/experiments/spaces/default.yaml",
        "autok/experiments/paper-wan.yaml",
        "autok/dashboards/autok.json",
        "autok/dashboards/prometheus.yml",
        "autok/dashboards/provisioning/dashboards/autok.yml",
        "autok/resources.py",
        "autok/examples/tiny_gpt/__init__.py",  # the task controller-panel names
        "autok/trainer/engine/sync.py",
        "autok/trainer/loop/run.py",
        "autok/controllers/__init__.py",
    ):
        assert needed in names, needed
    # nothing beside autok on the user's import path: a user's own `trainer` module stays theirs
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "autok"
    }
    python = fresh_venv(tmp_path / "venv", wheel)
    bindir = python.parent
    elsewhere = tmp_path / "elsewhere"  # not the checkout: nothing is found by relative path
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": f"{bindir}:{env.get('PATH', '')}", "AUTOK_CACHE": str(tmp_path / "cache")}

    def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv), capture_output=True, text=True, cwd=elsewhere, env=env, timeout=timeout
        )

    probe = run(
        str(python),
        "-c",
        "import json, autok, autok.resources as r, autok.trainer as trainer;"
        "import importlib.metadata as m;"
        "print(json.dumps([autok.__file__, trainer.__file__, str(r.default_space()),"
        " str(r.dashboards_dir() / 'autok.json'), m.version('autok')]))",
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    autok_file, trainer_file, space, dashboard, version = json.loads(probe.stdout)
    venv = (tmp_path / "venv").resolve()
    for path in (autok_file, trainer_file, space, dashboard):
        assert Path(path).resolve().is_relative_to(venv), path  # the wheel's, not the checkout's
    assert Path(space).is_file() and json.loads(Path(dashboard).read_text())

    res = run(str(python), "-c", "import trainer")
    assert res.returncode == 1 and "No module named 'trainer'" in res.stderr
    res = run(str(bindir / "autok"), "bench")  # the benchmarks ship with the repository only
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "from a checkout" in res.stderr
    assert res.stderr.startswith("autok: error: bench: ")
    res = run(str(bindir / "autok"), "--version")
    assert res.returncode == 0 and res.stdout.strip() == f"autok {version}", res
    res = run(str(bindir / "autok"), "experiment", "list")
    assert res.returncode == 0, res.stderr[-2000:]
    # an experiment's line, then an indented one with its runs and times
    assert {line.split()[0] for line in res.stdout.splitlines() if line[:1] != " "} == {
        p.stem for p in (ROOT / "experiments").glob("*.yaml")
    }
    out = tmp_path / "sweep"
    res = run(str(bindir / "autok"), "sweep", *TINY_SWEEP, "--out", str(out), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = (out / "trials.csv").read_text().splitlines()
    assert len(rows) == 2 and "COMPLETE" in rows[1], rows  # the default space, one trial


# ----- slow: the README's `ray job submit` on a real local head ----------------------------------


def free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def stop_session(head: subprocess.Popen) -> None:
    """Stop the head started below: SIGTERM to `ray start --block` stops the processes it
    started; anything left in its session is ended by process id. (`ray stop` would end every
    Ray process of this user on the machine, other people's clusters included.)"""
    with contextlib.suppress(ProcessLookupError):
        head.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=60)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            # field 6 of /proc/PID/stat is the session id (after the parenthesised name)
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == head.pid and int(proc.name) != head.pid:
                os.kill(int(proc.name), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        head.kill()
        head.wait(timeout=10)


@pytest.mark.slow
def test_ray_job_submit_runs_a_sweep_on_a_local_head(tmp_path):
    gcs, dashboard, client, agent, agent_grpc, runtime_env, metrics, node, objects = free_ports(9)
    # `ray start` records its cluster in TEMP/ray_current_cluster, where every later ray.init()
    # on this machine looks: the head gets a temp dir of its own, and /tmp/ray is left as it was.
    shared = Path("/tmp/ray/ray_current_cluster")
    shared_before = shared.read_text() if shared.exists() else None
    temp = Path(tempfile.mkdtemp(prefix="autok-ray-", dir="/tmp"))  # short: Ray's unix sockets
    # Token authentication on, with a token of this test's own (Ray turns it on by itself when
    # ~/.ray/auth_token exists, and then the submitting shell needs the token too).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {
        "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "AUTOK_CACHE": str(tmp_path / "cache"),
    }
    with open(tmp_path / "head.log", "w") as head_log:
        head = subprocess.Popen(
            [str(VENV_BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2",
             "--port", str(gcs), "--include-dashboard=true", "--dashboard-port", str(dashboard),
             "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
             "--dashboard-agent-grpc-port", str(agent_grpc),
             "--runtime-env-agent-port", str(runtime_env), "--metrics-export-port", str(metrics),
             "--node-manager-port", str(node), "--object-manager-port", str(objects),
             "--min-worker-port", "0", "--max-worker-port", "0", "--temp-dir", str(temp),
             "--disable-usage-stats"],
            stdout=head_log, stderr=subprocess.STDOUT, env=env,
            cwd=tmp_path, start_new_session=True,
        )  # fmt: skip
    out = tmp_path / "sweep"
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 300
        while True:  # the dashboard's job API takes a while to come up on 2 cores
            up = subprocess.run(
                [str(VENV_BIN / "ray"), "job", "list", "--address", address],
                capture_output=True, text=True, env=env, timeout=120,
            )  # fmt: skip
            if up.returncode == 0 or head.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(2)
        head_tail = (tmp_path / "head.log").read_text()[-3000:]
        assert up.returncode == 0, up.stderr[-2000:] + head_tail
        res = subprocess.run(
            [str(VENV_BIN / "ray"), "job", "submit", "--address", address, "--",
             "autok", "sweep", "--backend", "ray", "--address", "auto", *TINY_SWEEP,
             "--out", str(out)],
            capture_output=True, text=True, env=env, timeout=900,
        )  # fmt: skip
        log = (res.stdout + res.stderr)[-4000:]
        assert res.returncode == 0 and "succeeded" in log, log
    finally:
        stop_session(head)
        shutil.rmtree(temp, ignore_errors=True)
    rows = (out / "trials.csv").read_text().splitlines()
    assert len(rows) == 2 and "COMPLETE" in rows[1], rows
    assert (out / "best.yaml").is_file()
    assert (shared.read_text() if shared.exists() else None) == shared_before


def test_bench_runs_a_checkout_only_where_its_pyproject_names_autok_as_its_project(tmp_path):
    """`autok bench` imports benchmarks/ from a checkout: another project's folder is never
    taken for one, whatever else its pyproject holds, and an unreadable one is skipped."""
    from autok.cli import _names_autok

    def folder(name: str, text: bytes) -> Path:
        d = tmp_path / name
        (d / "benchmarks").mkdir(parents=True)
        (d / "benchmarks" / "bench_cli.py").write_text("raise SystemExit('ran')\n")
        (d / "pyproject.toml").write_bytes(text)
        return d

    assert _names_autok(ROOT)
    assert _names_autok(folder("autok", b'[project]\nname = "autok"\n'))
    poetry = b'[project]\nname = "other"\n[tool.poetry]\nname = "autok"\n'
    assert not _names_autok(folder("poetry", poetry))
    assert not _names_autok(folder("binary", b'[project]\nname = "\xff\xfe"\n'))
    assert not _names_autok(folder("broken", b"[project\n"))
    assert not _names_autok(tmp_path)  # no pyproject at all
