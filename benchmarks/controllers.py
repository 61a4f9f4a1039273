"""Adaptive K against fixed K on the emulated WAN, the default job, one table from one run.

    python -m benchmarks.controllers [--epochs 30] [--policies exposed-sync qsr composite]

Runs cpdp with fixed K in {1, 2, 4, 8, 16} and the adaptive policies (starting from K=4), all
else the default job (mnist1d, 4 workers, `wan`, beta 0.3, LR 0.1 cosine, seed 42), and writes
benchmarks/results/controllers.{json,md}.
"""

from __future__ import annotations

import argparse
import json

from autok.config import TrainConfig
from autok.launch import prepare_data, run_workers
from benchmarks.engine import RESULTS, _autok, machine

FIXED_K = (1, 2, 4, 8, 16)


def run(policy: str, k: int, epochs: int, seed: int) -> dict:
    cfg = TrainConfig(policy=policy, sync_period=k, epochs=epochs, seed=seed, progress=False)
    prepare_data(cfg)
    s = run_workers(_autok, cfg.workers, cfg.model_dump_json())[0]["summary"]
    return {
        "label": f"fixed K={k}" if policy == "fixed" else f"{policy} (from K={k})",
        **{
            key: s[key]
            for key in (
                "wall_seconds",
                "peak_test_accuracy",
                "final_test_accuracy",
                "exposed_sync_seconds",
                "compute_seconds",
                "boundaries",
                "final_sync_period",
                "k_path",
            )
        },
    }


def render(rows: list[dict], meta: dict) -> str:
    best = max(
        (r for r in rows if r["label"].startswith("fixed")), key=lambda r: r["peak_test_accuracy"]
    )
    lines = [
        "# Adaptive K vs fixed K on the emulated WAN (default job)",
        "",
        f"Machine: {meta['cpus']} CPUs, torch {meta['torch']}, {meta['date']}. "
        f"Best fixed K by peak accuracy: {best['label']}.",
        "",
        "| run | wall (s) | peak acc | final acc | exposed sync (s) | wall / best fixed | "
        "K path (time at K) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        path = " → ".join(f"{p['sync_period']}: {p['seconds']:.0f}s" for p in r["k_path"])
        lines.append(
            f"| {r['label']} | {r['wall_seconds']:.1f} | {r['peak_test_accuracy']:.3f} | "
            f"{r['final_test_accuracy']:.3f} | {r['exposed_sync_seconds']:.1f} | "
            f"{r['wall_seconds'] / best['wall_seconds']:.2f} | {path} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--policies", nargs="*", default=["exposed-sync", "qsr", "composite"])
    args = ap.parse_args()
    rows = [run("fixed", k, args.epochs, args.seed) for k in FIXED_K]
    rows += [run(p, 4, args.epochs, args.seed) for p in args.policies]
    meta = machine()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "controllers.json").write_text(
        json.dumps({"machine": meta, "runs": rows}, indent=2) + "\n"
    )
    text = render(rows, meta)
    (RESULTS / "controllers.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
