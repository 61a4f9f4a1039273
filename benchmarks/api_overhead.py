"""The built-in loop on the public `autok.Sync` against the loop it replaced: the same job, two
source trees, interleaved rounds, ratios with their spread.

    git worktree add /tmp/autok-before eaac730     # the last commit before the rebuild
    python -m benchmarks.api_overhead --baseline /tmp/autok-before [--rounds 5]

Each round runs `autok train` on the job in this tree and in the baseline tree, one after the
other (which goes first alternates), and reads each run's own files: the median epoch time
after the warmup epoch (epochs.csv) and the training wall-clock (summary.json). Printed: each
round's ratio (this tree / baseline), their median and min-max. Both trees run with this
Python, its torch and the same seed, so they train the same model on the same data.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
JOB = [
    "--workers", "2", "--epochs", "3", "--warmup-epochs", "1", "--mnist1d-samples", "40000",
    "--strategy", "cpdp", "--sync-period", "4", "--link", "none", "--seed", "7", "--no-progress",
]  # fmt: skip


def run(tree: Path, out: Path, job: list[str]) -> tuple[float, float]:
    """(median post-warmup epoch seconds, training wall-clock seconds) of one run in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # spawned workers import from `tree` too
    subprocess.run(
        [sys.executable, "-m", "autok.cli", "train", *job, "--out", str(out)],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
    )
    rows = list(csv.DictReader((out / "epochs.csv").open()))
    epochs = [float(r["epoch_seconds"]) for r in rows[1:]]
    summary = json.loads((out / "summary.json").read_text())
    return statistics.median(epochs), summary["wall_seconds"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, required=True, help="a checkout of the old loop")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if not (args.baseline / "trainer" / "loop.py").is_file():
        print(f"--baseline: {args.baseline} is not an autok checkout", file=sys.stderr)
        return 2
    ratios_epoch, ratios_wall = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = [("api", HERE), ("baseline", args.baseline)]
            if i % 2:
                order.reverse()
            got = {name: run(tree, Path(tmp) / f"{name}-{i}", JOB) for name, tree in order}
            (ea, wa), (eb, wb) = got["api"], got["baseline"]
            ratios_epoch.append(ea / eb)
            ratios_wall.append(wa / wb)
            print(
                f"round {i}: epoch {ea:.3f} s vs {eb:.3f} s ({ea / eb:.3f}x); "
                f"training wall-clock {wa:.2f} s vs {wb:.2f} s ({wa / wb:.3f}x)",
                flush=True,
            )
    for name, r in (("epoch time", ratios_epoch), ("training wall-clock", ratios_wall)):
        print(
            f"{name}: api / baseline = {statistics.median(r):.3f}x median over {len(r)} rounds "
            f"(min {min(r):.3f}, max {max(r):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
