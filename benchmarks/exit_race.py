"""Does a process exit cleanly right after its collectives? (docs/design.md §5, At exit;
trainer/engine/handoff.py)

    python -m benchmarks.exit_race [--pairs 20] [--probe 2000]

gloo's worker thread drops a collective's tensors after the caller's wait has returned; if that
drop is the last C++ reference but the Python object's, the thread takes the GIL, and during
the interpreter's finalization that aborts the process ("terminate called without an active
exception"). Two measurements:

- the probe: world 2, `--probe` blocking all-reduces of a fresh tensor; how often the worker
  still held it just after `dist.all_reduce` returned (its use count above what it was before);
- the exit: `--pairs` pairs of processes, each doing 50 all-reduces of fresh tensors and
  exiting at once, (a) with `torch.distributed.all_reduce` as a user would call it, (b) through
  autok's `allreduce_sum_`, which hands each tensor to handoff.py; the pairs take turns, (a)
  then (b). Printed: the pairs in which a process did not exit with 0, per side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import os, sys, torch, torch.distributed as dist
rank, store, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
held = 0
for _ in range(n):
    t = torch.zeros(4)
    before = t._use_count()
    dist.all_reduce(t)
    held += t._use_count() > before
print(f"held {held} of {n}", flush=True)
dist.destroy_process_group()
"""

EXIT = """
import atexit, sys, torch, torch.distributed as dist
rank, store, side = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
if side == "autok":
    from autok.trainer.engine import handoff
    from autok.trainer.engine.link import allreduce_sum_
    # registered before autok's wait, so it runs after it: what is held as finalization begins
    atexit.register(lambda: print(f"held at exit: {handoff.held()}", flush=True))
    for _ in range(50):
        allreduce_sum_(torch.zeros(4), None)
else:
    for _ in range(50):
        dist.all_reduce(torch.zeros(4))
"""


def pair(script: Path, store: Path, *args: str) -> list[subprocess.CompletedProcess]:
    """Two processes, ranks 0 and 1, running `script` joined by a file store; their results."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(store), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="process pairs per side")
    ap.add_argument("--probe", type=int, default=2000, help="all-reduces the probe times")
    args = ap.parse_args(argv)
    if not 1 <= args.pairs <= 1000:
        ap.error("--pairs: give 1 to 1000")
    if not 1 <= args.probe <= 10**6:
        ap.error("--probe: give 1 to 1000000")
    with tempfile.TemporaryDirectory() as d:
        probe, exit_ = Path(d) / "probe.py", Path(d) / "exit.py"
        probe.write_text(_PROBE)
        exit_.write_text(EXIT)
        runs = pair(probe, Path(d) / "probe-store", str(args.probe))
        held = [r.stdout.strip() for r in runs]
        print(f"probe: just after dist.all_reduce returned, gloo's thread still {', '.join(held)}")
        failed = {"torch": 0, "autok": 0}
        t0 = time.monotonic()
        for i in range(args.pairs):
            for side in failed:
                runs = pair(exit_, Path(d) / f"store-{side}-{i}", side)
                if any(r.returncode != 0 for r in runs):
                    failed[side] += 1
                    why = next(r.stderr.strip().splitlines()[-1:] for r in runs if r.returncode)
                    print(f"  pair {i} ({side}): exit {[r.returncode for r in runs]} {why}")
        print(
            f"exit right after 50 all-reduces of fresh tensors, {args.pairs} pairs per side "
            f"({time.monotonic() - t0:.0f} s): torch's all_reduce {failed['torch']} failed, "
            f"autok's allreduce_sum_ {failed['autok']} failed"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
