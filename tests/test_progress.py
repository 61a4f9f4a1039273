"""`autok experiment run --jobs N`: the `[i/N]` line of each run as it ends, runs ending
together on the pool's threads (autok/experiment.py, Progress)."""

from __future__ import annotations

import io
import re
import threading
import time

from autok.experiment import Progress, Run, Tally, run_experiment

LINE = re.compile(r"^\[(\d+)/(\d+)\] a seed (\d+): (done|FAILED: no|diverged at 3)( \(.*\))?$")


class SlowStream(io.StringIO):
    """A stream that hands the GIL to another thread at every character it takes: lines written
    by two threads without a lock are all but certain to interleave."""

    def write(self, s: str) -> int:
        for ch in s:
            super().write(ch)
            time.sleep(0)
        return len(s)


def test_runs_ending_together_get_one_number_each_and_a_line_each():
    threads, each = 8, 12
    total = threads * each
    tally, stream = Tally(), SlowStream()
    progress = Progress(total, tally, stream)
    start = threading.Barrier(threads)
    hows = ["done", "FAILED: no", "diverged at 3"]

    def worker(t: int) -> None:
        start.wait()
        for i in range(each):
            progress.ended(Run("a", t * each + i, {}), hows[i % 3], " (0 s)")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    lines = stream.getvalue().split("\n")
    assert lines[-1] == ""  # every line ends with its newline
    matches = [LINE.match(line) for line in lines[:-1]]
    assert all(matches), [line for line, m in zip(lines[:-1], matches, strict=True) if not m][:3]
    assert [int(m[1]) for m in matches if m] == list(range(1, total + 1))  # in order, once each
    assert {int(m[2]) for m in matches if m} == {total}
    assert sorted(int(m[3]) for m in matches if m) == list(range(total))  # every run's line
    assert (tally.finished, tally.failed, tally.diverged) == (total // 3,) * 3


def test_a_grid_run_two_at_a_time_numbers_its_lines_one_to_n(tmp_path, monkeypatch):
    """Through run_experiment with --jobs 2: the training itself stood in for by a function
    that ends two runs at once (this test is about the lines, not about training), on a stdout
    that hands the GIL over at every character."""
    import sys

    import autok.experiment as experiment

    stdout = SlowStream()
    monkeypatch.setattr(sys, "stdout", stdout)
    together = threading.Barrier(2)

    def train(run: Run, out, secret) -> tuple[str, float]:
        together.wait(timeout=30)
        return ("FAILED: no" if run.seed == 3 else "done"), 0.0

    monkeypatch.setattr(experiment, "_train", train)
    runs = [Run("a", seed, {}) for seed in range(6)]
    tally = run_experiment(runs, tmp_path / "out", jobs=2)
    lines = stdout.getvalue().splitlines()
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m[1]) for m in matches if m] == [1, 2, 3, 4, 5, 6]
    assert sorted(int(m[3]) for m in matches if m) == list(range(6))
    assert (tally.finished, tally.failed, tally.diverged) == (5, 1, 0)
