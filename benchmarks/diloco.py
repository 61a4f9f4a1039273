"""The DiLoCo family against today's cpdp and DDP (`autok bench --only diloco`, issue 16).

On the emulated `wan`, mnist1d, world 2, one seed: bytes per boundary (what one rank puts on the
wire for the averaging, plus the gradient buckets of a two-phase boundary), wall-clock training
time and peak test accuracy for ddp; cpdp K=4 (today's default: fused boundary, SlowMo 0.3); and
localsgd/cpdp K=4 with --compress none|fp16|int8 and DiLoCo's outer Nesterov. Fragments
(`--fragments`) are not among its cases yet (F = 1 only), so the peak bytes per sync equal the
bytes per boundary; tests/test_fragments.py checks a fragment sync's bytes.
Writes benchmarks/results/diloco.{json,md}.
"""

from __future__ import annotations

import json
import statistics

from benchmarks.engine import RESULTS, _run, machine

COMMAND = "autok bench --only diloco"
BASE = dict(link="wan", epochs=3, warmup_epochs=1, mnist1d_samples=2000, seed=0)
CASES: dict[str, dict] = {
    "ddp": dict(strategy="ddp"),
    "cpdp K=4 (today)": dict(strategy="cpdp", sync_period=4),
    "cpdp K=4 int8": dict(strategy="cpdp", sync_period=4, compress="int8"),
    "localsgd K=4": dict(strategy="localsgd", sync_period=4),
    "localsgd K=4 fp16": dict(strategy="localsgd", sync_period=4, compress="fp16"),
    "localsgd K=4 int8": dict(strategy="localsgd", sync_period=4, compress="int8"),
    "localsgd K=4 nesterov (DiLoCo)": dict(
        strategy="localsgd", sync_period=4, outer_optimizer="nesterov"
    ),
    "localsgd K=4 nesterov int8": dict(
        strategy="localsgd", sync_period=4, outer_optimizer="nesterov", compress="int8"
    ),
}


def diloco(world: int = 2) -> dict:
    out: dict = {"world_size": world, "settings": BASE, "command": COMMAND, "runs": {}}
    for name, options in CASES.items():
        res = _run(world, **BASE, **options)
        after = [r for r in res["records"] if r.epoch >= BASE["warmup_epochs"]]
        bytes_ = [r.bytes_communicated for r in after]
        s = res["summary"]
        out["runs"][name] = {
            "bytes_per_boundary": statistics.median(bytes_),
            "peak_bytes_per_sync": max(bytes_),
            "boundaries": s["boundaries"],
            "wall_seconds": s["wall_seconds"],
            "exposed_sync_seconds": s["exposed_sync_seconds"],
            "peak_test_accuracy": s["peak_test_accuracy"],
        }
    fp32 = out["runs"]["localsgd K=4"]["bytes_per_boundary"]
    for name in ("localsgd K=4 fp16", "localsgd K=4 int8"):
        out["runs"][name]["bytes_vs_fp32"] = out["runs"][name]["bytes_per_boundary"] / fp32
    return out


def render(res: dict) -> str:
    m = res["machine"]
    d = res["diloco"]
    lines = [
        "# DiLoCo family: outer optimizers and compressed pseudo-gradients",
        "",
        f"Machine: {m['cpus']} CPUs, {m['platform']}, torch {m['torch']}, {m['date']}",
        "",
        f"Command: `{d['command']}`: mnist1d ({d['settings']['mnist1d_samples']} samples), "
        f"world {d['world_size']}, link `{d['settings']['link']}`, {d['settings']['epochs']} "
        f"epochs ({d['settings']['warmup_epochs']} at K = 1), seed {d['settings']['seed']}, "
        "one run each. Bytes are per rank, after warmup. Fragments (F = 4) are not measured here.",
        "",
        "| run | bytes / boundary | peak bytes / sync | vs fp32 | boundaries | wall s "
        "| exposed sync s | peak acc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in d["runs"].items():
        ratio = f"{r['bytes_vs_fp32']:.3f}" if "bytes_vs_fp32" in r else ""
        lines.append(
            f"| {name} | {r['bytes_per_boundary']:.0f} | {r['peak_bytes_per_sync']:.0f} | "
            f"{ratio} | {r['boundaries']} | {r['wall_seconds']:.1f} | "
            f"{r['exposed_sync_seconds']:.1f} | {r['peak_test_accuracy']:.3f} |"
        )
    lines += [
        "",
        f"int8 carries {d['runs']['localsgd K=4 int8']['bytes_vs_fp32']:.3f}x and fp16 "
        f"{d['runs']['localsgd K=4 fp16']['bytes_vs_fp32']:.3f}x the fp32 averaging bytes "
        "(the issue asks <= 0.27x "
        "for int8); on cpdp the fused boundary's gradients ride compressed too. DiLoCo's outer "
        "defaults (α 0.7, μ 0.9) over this inner SGD with momentum 0.9 at K = 4 lose accuracy in "
        "3 epochs; DiLoCo pairs them with inner AdamW and K in the hundreds, not measured here. "
        "The tiny GPT task and F = 4 were not run.",
    ]
    return "\n".join(lines) + "\n"


def main() -> dict:
    res = {"machine": machine(), "diloco": diloco()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "diloco.json").write_text(json.dumps(res, indent=2) + "\n")
    text = render(res)
    (RESULTS / "diloco.md").write_text(text)
    print(text)
    return res
