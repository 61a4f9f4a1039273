"""Start-up of a small `autok train` job, before and after, in interleaved rounds.

    python -m benchmarks.startup [--rounds 3] [--base-ref HEAD | --base DIR] [--json FILE]

Two variants run the same job (JOB: 4 workers, mnist1d, 1 epoch, the virtual clock, so training
is short and the same every time): `after`, this checkout, and `before`, a git worktree of
`--base-ref` made for the run (`git worktree add --detach`, removed at the end), or `--base`, a
copy of the code to measure as it is (e.g. this working tree with one change undone). Each
round runs before then after, so drift in a shared machine's load hits both alike; the claim is
the median of the per-round ratios after / before with their min–max (benchmarks/stats.py).

Read per run: the whole command's wall time (measured here), the run's own `startup_seconds`
and `total_seconds` (summary.json, docs/design.md §7), and phases from timestamps that a
`sitecustomize` written here takes in every process of the run (launcher, worker server,
workers): it wraps a few functions by name, which both variants have, and changes nothing else.

  parent       launcher start to launch(): interpreter, CLI imports, validation, torch import
  data         launch() to the workers' start: the data set made or read once (prepare_data)
  workers      workers' start to the last one entering init_process_group: interpreters, imports
  group        the process group's init (the last rank in to the last one out)
  build        the group up to rank 0's first step: data sets, model, DDP, engine
  training     rank 0's first step to its summary (the run's own total_seconds)
  outputs      the summary to rank 0 leaving run(): summary.json, k_lr.png (rank 0's on_end)
  teardown     to launch() returning: model.pt, the group's teardown, the workers' exit and join
  exit         to the command's exit: the launcher's interpreter shutting down

The phases sum to the command's wall time; `parent`..`build` is the run's startup_seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.stats import fmt, ratios, summarize

REPO = Path(__file__).resolve().parents[1]
JOB = [
    "train", "--dataset", "mnist1d", "--workers", "4", "--link", "wan", "--clock", "virtual",
    "--compute-ms", "20", "--strategy", "cpdp", "--sync-period", "4", "--epochs", "1",
    "--no-progress",
]  # fmt: skip
PHASES = ("parent", "data", "workers", "group", "build", "training", "outputs", "teardown", "exit")
MAX_ROUNDS = 50

# The tracer: a sitecustomize on PYTHONPATH, so every interpreter of the run loads it (spawned
# workers and the worker server inherit PYTHONPATH). It appends one JSON line per event.
SITECUSTOMIZE = r'''
import json, os, sys, time

_TRACE = os.environ.get("AUTOK_STARTUP_TRACE")


def _mark(event, **extra):
    line = json.dumps({"pid": os.getpid(), "event": event, "t": time.time(), **extra})
    fd = os.open(_TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _wrap(owner, name, before, after=None):
    fn = getattr(owner, name)

    def wrapped(*args, **kwargs):
        _mark(before)
        try:
            return fn(*args, **kwargs)
        finally:
            if after:
                _mark(after)

    setattr(owner, name, wrapped)


def _patch_launch(m):
    _wrap(m, "launch", "launch", "launch_end")
    _wrap(m.mp, "start_processes", "start_processes")
    worker = m.worker

    def traced_worker(*args, **kwargs):
        import torch.distributed as dist
        if not getattr(dist.init_process_group, "_traced", False):
            _wrap(dist, "init_process_group", "group", "group_end")
            dist.init_process_group._traced = True
        _mark("worker", rank=args[0])
        try:
            return worker(*args, **kwargs)
        finally:
            _mark("worker_end", rank=args[0])

    m.worker = traced_worker


def _patch_loop(m):
    _wrap(m.Trainer, "run", "run", "run_end")


_PATCH = {"autok.launch": _patch_launch, "autok.trainer.loop.run": _patch_loop}


class _AfterImport:
    """Finds the module as the other finders would, and patches it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCH:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    _PATCH[name](module)

                spec.loader.exec_module = exec_module
                return spec
        return None


if _TRACE:
    _mark("interpreter", argv=sys.argv[:3])
    sys.meta_path.insert(0, _AfterImport())
'''


def run_once(variant: str, root: Path, work: Path, trace_dir: Path) -> dict:
    """One run of JOB with the code under `root`; its figures and phases."""
    out = work / f"{variant}-{time.time_ns()}"
    trace = out.with_suffix(".trace")
    env = {
        **os.environ,
        # the tracer, then the variant's code, ahead of the editable install's finder (which
        # sys.meta_path asks after the path); cwd is a scratch folder, so '' finds nothing
        "PYTHONPATH": f"{trace_dir}{os.pathsep}{root}",
        "AUTOK_STARTUP_TRACE": str(trace),
    }
    cmd = [sys.executable, "-m", "autok.cli", *JOB, "--out", str(out)]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
    t1 = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"startup: {variant} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    return {
        "variant": variant,
        "command_seconds": t1 - t0,
        "startup_seconds": summary["startup_seconds"],
        "total_seconds": summary["total_seconds"],
        "phases": phases(events, t0, t1, summary),
        "final_test_accuracy": summary.get("final_test_accuracy"),
    }


def phases(events: list[dict], t0: float, t1: float, summary: dict) -> dict[str, float]:
    """Seconds per phase (module docstring) from the trace's events; they sum to t1 - t0."""

    def times(name: str) -> list[float]:
        found = [e["t"] for e in events if e["event"] == name]
        if not found:
            raise SystemExit(f"startup: no '{name}' event in the trace")
        return found

    launched, started = times("launch")[0], times("start_processes")[0]
    group_in, group_out = max(times("group")), max(times("group_end"))
    rank0 = next(e["pid"] for e in events if e["event"] == "worker" and e["rank"] == 0)
    # rank 0 measures its start-up on entering run(): its summary's times count from there
    first_step = next(e["t"] for e in events if e["event"] == "run" and e["pid"] == rank0)
    summary_at = first_step + summary["total_seconds"] - summary["startup_seconds"]
    run_end = next(e["t"] for e in events if e["event"] == "run_end" and e["pid"] == rank0)
    launched_end = times("launch_end")[0]
    marks = [t0, launched, started, group_in, group_out, first_step, summary_at, run_end]
    marks += [launched_end, t1]
    return {p: b - a for p, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True)}


def check_variant(root: Path, trace_dir: Path, work: Path) -> None:
    """The variant's modules really come from `root` (not the editable install's checkout)."""
    env = {**os.environ, "PYTHONPATH": f"{trace_dir}{os.pathsep}{root}"}
    probe = (
        "import autok.launch, autok.trainer.loop.run as run; "
        "print(autok.launch.__file__, run.__file__)"
    )
    files = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=work, capture_output=True, text=True, check=True
    ).stdout.split()
    if not all(Path(f).resolve().is_relative_to(root.resolve()) for f in files):
        raise SystemExit(f"startup: {root} is shadowed: the modules load from {files}")


def make_base(ref: str, where: Path) -> Path:
    base = where / "base"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), ref],
        check=True,
        capture_output=True,
    )
    return base


def report(runs: list[dict]) -> dict:
    before = [r for r in runs if r["variant"] == "before"]
    after = [r for r in runs if r["variant"] == "after"]
    out: dict = {"rounds": len(after), "runs": runs}
    for key in ("command_seconds", "startup_seconds"):
        out[key] = summarize(ratios([a[key] for a in after], [b[key] for b in before]))
    out["phases"] = {
        p: {
            "before": statistics.median(r["phases"][p] for r in before),
            "after": statistics.median(r["phases"][p] for r in after),
        }
        for p in PHASES
    }
    return out


def print_report(rep: dict) -> None:
    print(f"{'phase (median s)':<18} {'before':>8} {'after':>8}")
    for p, v in rep["phases"].items():
        print(f"{p:<18} {v['before']:8.2f} {v['after']:8.2f}")
    for key in ("startup_seconds", "command_seconds"):
        runs = rep["runs"]
        b = statistics.median(r[key] for r in runs if r["variant"] == "before")
        a = statistics.median(r[key] for r in runs if r["variant"] == "after")
        print(f"{key:<18} {b:8.2f} {a:8.2f}   after/before {fmt(rep[key])}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__)
    ap.add_argument("--rounds", type=int, default=3, help=f"interleaved rounds (1-{MAX_ROUNDS})")
    ap.add_argument("--base-ref", default="HEAD", help="the git ref measured as `before`")
    ap.add_argument("--base", type=Path, help="a checkout measured as `before` (not --base-ref)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ns = ap.parse_args(argv)
    if not 1 <= ns.rounds <= MAX_ROUNDS:
        ap.error(f"--rounds: between 1 and {MAX_ROUNDS}")
    if ns.base is not None and not (ns.base / "autok" / "launch.py").is_file():
        ap.error(f"--base: {ns.base} holds no autok/launch.py")
    with tempfile.TemporaryDirectory(prefix="autok-startup-") as tmp:
        work = Path(tmp)
        trace_dir = work / "trace"
        trace_dir.mkdir()
        (trace_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        base = ns.base.resolve() if ns.base else make_base(ns.base_ref, work)
        try:
            variants = {"before": base, "after": REPO}
            for root in variants.values():
                check_variant(root, trace_dir, work)
            runs = []
            for i in range(ns.rounds):
                for name, root in variants.items():  # interleaved: before, after, before, ...
                    runs.append(run_once(name, root, work, trace_dir))
                    r = runs[-1]
                    print(
                        f"round {i + 1} {name:<6} command {r['command_seconds']:.2f} s, "
                        f"start-up {r['startup_seconds']:.2f} s",
                        flush=True,
                    )
        finally:
            if not ns.base:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)])
                shutil.rmtree(base, ignore_errors=True)
    rep = report(runs)
    print_report(rep)
    if ns.json:
        ns.json.write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
