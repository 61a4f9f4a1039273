"""Start-up: local workers are forked from a server that imported torch and the workers' modules
once (autok/launch.py, start_workers), and see the launcher as a spawned worker would.

This module imports no trainer code at its top: a worker imports it to find the functions it
runs, and the first test reads which modules a worker already had."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.dist import run_dist

pytestmark = pytest.mark.dist

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _what_a_worker_had(rank: int, world_size: int) -> dict:
    parent = os.getppid()
    return {
        "preloaded": "autok.trainer.loop.run" in sys.modules,  # nothing here imported it
        "parent": parent,
        "parent_cmd": Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode(),
    }


@linux_only
def test_workers_are_forked_from_a_server_that_imported_the_worker_modules():
    got = run_dist(_what_a_worker_had, 2)
    for worker in got:
        assert worker["preloaded"], "the worker imported its modules itself: not forked"
        assert worker["parent"] != os.getpid()
        assert "multiprocessing.forkserver" in worker["parent_cmd"]
        assert "autok.trainer.loop.run" in worker["parent_cmd"]  # the server's preload list
    assert got[0]["parent"] == got[1]["parent"]  # one server for both


def _say(rank: int, world_size: int) -> str:
    print(f"rank {rank} says {os.environ['AUTOK_TEST_WORD']}", flush=True)
    return os.getcwd()


def test_a_forked_worker_has_the_launchers_environment_stdout_and_cwd_of_now(tmp_path, monkeypatch):
    """The server started earlier, with another environment, stdout and working directory
    (an earlier launch in this process); a worker sees the launcher's as they are now."""
    run_dist(_what_a_worker_had, 2)  # the server is up (or was already)
    word = uuid.uuid4().hex
    monkeypatch.setenv("AUTOK_TEST_WORD", word)
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "stdout.txt"
    saved = os.dup(1)
    with log.open("wb") as f:
        sys.stdout.flush()
        os.dup2(f.fileno(), 1)
        try:
            cwds = run_dist(_say, 2)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    text = log.read_text()
    assert f"rank 0 says {word}" in text and f"rank 1 says {word}" in text
    assert cwds == [str(tmp_path), str(tmp_path)]


JOB = ["train", "--workers", "2", "--epochs", "1", "--mnist1d-samples", "500", "--seed", "3"]
JOB += ["--link", "wan", "--clock", "virtual", "--compute-ms", "5", "--no-progress"]
TIMES = {"wall_seconds", "startup_seconds", "total_seconds", "out_dir"}


def test_two_cli_runs_with_forked_workers_give_the_same_results_bit_for_bit(tmp_path):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        res = subprocess.run(
            [sys.executable, "-m", "autok.cli", *JOB, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert "start-up took" in (out / "train.log").read_text()
        runs.append(out)
    a, b = (json.loads((r / "summary.json").read_text()) for r in runs)
    assert 0 < a["startup_seconds"] <= a["total_seconds"]
    assert {k: v for k, v in a.items() if k not in TIMES} == {
        k: v for k, v in b.items() if k not in TIMES
    }
    assert (runs[0] / "model.pt").read_bytes() == (runs[1] / "model.pt").read_bytes()
    assert (runs[0] / "boundaries.jsonl").read_text() == (runs[1] / "boundaries.jsonl").read_text()


def _descendants(pid: int) -> list[int]:
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        out += [int(child), *_descendants(int(child))]
    return out


def _alive(pid: int) -> bool:
    try:  # state, after the parenthesised name: a zombie has ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@linux_only
def test_a_killed_launcher_takes_its_worker_server_and_workers_along(tmp_path):
    """The workers' parent is the fork server: a SIGKILLed launcher ends it (its pipe from the
    launcher closes), and the workers' parent-death signal ends them."""
    out = tmp_path / "run"
    argv = ["train", "--workers", "2", "--epochs", "1000", "--mnist1d-samples", "500"]
    argv += ["--link", "none", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "autok.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 600  # a bound for a loaded machine, not a timing assumption
        log = out / "train.log"
        while not (log.exists() and "start-up took" in log.read_text()):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.1)
        family = _descendants(proc.pid)
        assert len(family) >= 2  # two workers, and their server (and multiprocessing's helper)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        while any(_alive(p) for p in family):
            assert time.time() < deadline, [p for p in family if _alive(p)]
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
