"""examples/tiny_gpt on the emulated WAN: `--policy exposed-sync` against fixed K (K = 1 is
plain DDP), one seed, the same job otherwise. Run from the repository root:

    python -m benchmarks.tiny_gpt_wan [--epochs 3] [--ks 1,2,4,8,16] [--out DIR]

Prints, per method: training wall-clock, exposed sync (its share of compute + exposed), the
final and best validation loss (log perplexity) and perplexity, the K path; and writes the table
to DIR/table.md. Every figure is read from the runs' own summary.json and epochs.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = [
    "--task", "examples.tiny_gpt:task", "--workers", "2", "--link", "wan",
    "--optimizer", "adamw", "--lr", "3e-3", "--weight-decay", "0.01", "--batch-size", "16",
    "--warmup-epochs", "0", "--no-progress", "--seed", "1",
]  # fmt: skip


def run(name: str, extra: list[str], epochs: int, out: Path) -> dict:
    d = out / name
    cmd = [sys.executable, "-m", "autok.cli", "train", *JOB, "--epochs", str(epochs), *extra]
    subprocess.run([*cmd, "--out", str(d)], check=True, capture_output=True)
    s = json.loads((d / "summary.json").read_text())
    rows = list(csv.DictReader((d / "epochs.csv").open()))
    losses = [float(r["test_loss"]) for r in rows]
    busy = s["compute_seconds"] + s["exposed_sync_seconds"]
    path = " → ".join(f"{p['sync_period']}" for p in s["k_path"])
    return {
        "method": name,
        "wall": s["wall_seconds"],
        "exposed": s["exposed_sync_seconds"],
        "share": s["exposed_sync_seconds"] / busy if busy else math.nan,
        "final_loss": losses[-1],
        "best_loss": min(losses),
        "final_ppl": s["final_test_metric"],
        "k_path": path,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--ks", default="1,2,4,8,16")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tiny-gpt-wan-"))
    methods = [("ddp", ["--strategy", "ddp"])]
    methods += [
        (f"cpdp K={k}", ["--strategy", "cpdp", "--sync-period", k])
        for k in args.ks.split(",")
        if k != "1"
    ]
    methods.append(("cpdp exposed-sync", ["--strategy", "cpdp", "--policy", "exposed-sync"]))
    lines = [
        "| method | wall (s) | exposed sync (s, share) | final val loss | best val loss | "
        "final perplexity | K path |",
        "|---|---|---|---|---|---|---|",
    ]
    print(lines[0], lines[1], sep="\n", flush=True)
    for name, extra in methods:
        r = run(name.replace(" ", "_").replace("=", ""), extra, args.epochs, out)
        line = (
            f"| {name} | {r['wall']:.1f} | {r['exposed']:.1f} ({r['share']:.0%}) | "
            f"{r['final_loss']:.4f} | {r['best_loss']:.4f} | {r['final_ppl']:.3f} | "
            f"{r['k_path']} |"
        )
        lines.append(line)
        print(line, flush=True)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print(f"\nruns and table.md in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
