"""The virtual clock against the wall clock: the same small WAN job run both ways (docs/design.md
§4; trainer/engine/clock.py).

    python -m benchmarks.virtual_vs_wall [--epochs 3] [--sync-periods 4] [--rounds 1] [--out DIR]

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
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = [
    "--workers", "2", "--mnist1d-samples", "2000", "--no-progress", "--link", "wan",
    "--strategy", "cpdp", "--policy", "fixed", "--seed", "1",
]  # fmt: skip
MAX_ROUNDS = 20


def _run(out: Path, epochs: int, k: int, *extra: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "autok.cli", "train", *JOB, "--epochs", str(epochs)]
    cmd += ["--sync-period", str(k)]
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


def _pair(root: Path, epochs: int, k: int) -> dict[str, float]:
    """One K both ways; the ratios virtual / wall, printed as they come."""
    wall = _run(root / "wall", epochs, k)
    compute_ms = 1e3 * (wall["training"] - wall["exposed"]) / wall["steps"]
    virtual = _run(root / "virtual", epochs, k, "--clock", "virtual", "--compute-ms",
                   f"{compute_ms:.6f}")  # fmt: skip
    print(f"K {k}: steps {wall['steps']:.0f}, compute per step (from the wall run) "
          f"{compute_ms:.3f} ms")  # fmt: skip
    ratios = {}
    for name in ("training", "exposed"):
        w, v = wall[name], virtual[name]
        ratios[name] = v / w
        print(f"{name:>9}: wall {w:8.3f} s  virtual {v:8.3f} s  virtual/wall {v / w:.3f}")
    print(f"the virtual run took {virtual['wall']:.2f} s of wall clock to train ({root})")
    return ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sync-periods", default="4", help="comma-separated K, e.g. 1,4,16")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="keep the runs here")
    args = p.parse_args()
    try:
        ks = [int(k) for k in args.sync_periods.split(",")]
    except ValueError:
        p.error(f"--sync-periods: not a list of integers: {args.sync_periods!r}")
    if not ks or min(ks) < 1 or not 1 <= args.rounds <= MAX_ROUNDS or args.epochs < 1:
        p.error(f"--sync-periods must be >= 1, --rounds in 1..{MAX_ROUNDS}, --epochs >= 1")
    root = args.out or Path(tempfile.mkdtemp(prefix="autok-virtual-vs-wall-"))
    seen: dict[int, list[dict[str, float]]] = {k: [] for k in ks}
    for r in range(args.rounds):
        for k in ks:
            seen[k].append(_pair(root / f"round{r}" / f"k{k}", args.epochs, k))
    for k in ks:
        for name in ("training", "exposed"):
            vals = sorted(x[name] for x in seen[k])
            print(
                f"K {k} {name}: virtual/wall median {statistics.median(vals):.3f} "
                f"(min-max {vals[0]:.3f}-{vals[-1]:.3f}, {len(vals)} rounds)"
            )


if __name__ == "__main__":
    main()
