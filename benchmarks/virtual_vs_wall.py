"""The virtual clock against the wall clock: the same small WAN job run both ways (docs/design.md
§4; trainer/engine/clock.py).

    python -m benchmarks.virtual_vs_wall [--epochs 3] [--out DIR]

1. `--clock wall`: the link emulator sleeps; training time is measured.
2. `--clock virtual` with `--compute-ms` set to what the wall run spent per step off the link
   (its training time less its exposed sync, over its steps): the link and the overlap are
   modelled, nothing sleeps.

Printed: each run's training time (the epochs' seconds) and exposed sync, and the ratio virtual /
wall of each. The model is judged on the exposed sync and the total: within 10% on a quiet
machine is its fidelity goal. A loaded machine stretches the wall run's compute, which the
virtual run takes from it, and its link holds (late wake-ups), which the model does not have.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = [
    "--workers", "2", "--mnist1d-samples", "2000", "--no-progress", "--link", "wan",
    "--strategy", "cpdp", "--policy", "fixed", "--sync-period", "4", "--seed", "1",
]  # fmt: skip


def _run(out: Path, epochs: int, *extra: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "autok.cli", "train", *JOB, "--epochs", str(epochs)]
    res = subprocess.run([*cmd, *extra, "--out", str(out)], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"autok train failed: {res.stderr.strip()[-500:]}")
    with open(out / "epochs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    summary = json.loads((out / "summary.json").read_text())
    steps = sum(
        json.loads(line)["interval_steps"]
        for line in (out / "boundaries.jsonl").read_text().splitlines()
    )
    return {
        "training": sum(float(r["epoch_seconds"]) for r in rows),
        "exposed": sum(float(r["sync_seconds"]) for r in rows),
        "steps": float(steps),
        "wall": float(summary["wall_seconds"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="keep the two runs here")
    args = p.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="autok-virtual-vs-wall-"))
    wall = _run(root / "wall", args.epochs)
    compute_ms = 1e3 * (wall["training"] - wall["exposed"]) / wall["steps"]
    virtual = _run(root / "virtual", args.epochs, "--clock", "virtual", "--compute-ms",
                   f"{compute_ms:.6f}")  # fmt: skip
    print(f"steps {wall['steps']:.0f}, compute per step (from the wall run) {compute_ms:.3f} ms")
    for name in ("training", "exposed"):
        w, v = wall[name], virtual[name]
        print(f"{name:>9}: wall {w:8.3f} s  virtual {v:8.3f} s  virtual/wall {v / w:.3f}")
    print(f"the virtual run took {virtual['wall']:.2f} s of wall clock to train ({root})")


if __name__ == "__main__":
    main()
