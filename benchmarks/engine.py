"""Engine measurements, side by side in one run, printed as ratios.

    python -m benchmarks.engine [--rounds 3] [--skip-default-job]

(a) overhead: autok `ddp` step time / a plain hand-written torch DDP loop (same model, data,
    optimizer, schedule, world size; link `none`), interleaved rounds, median of per-epoch times;
(b) WAN: exposed sync and wall-clock of `ddp` vs `cpdp` K=4 on the emulated `wan` link;
(c) the default job (`make train`): wall-clock and peak accuracy.
Writes benchmarks/results/engine.{json,md} with a machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from autok.config import TrainConfig
from autok.launch import prepare_data, run_workers
from trainer.data import build_splits
from trainer.models import build_model
from trainer.optim import build_scheduler

RESULTS = Path(__file__).parent / "results"


def _plain_ddp(rank: int, world: int, cfg_json: str) -> dict:
    """The loop a user would write by hand with torch DDP."""
    cfg = TrainConfig.model_validate_json(cfg_json)
    splits = build_splits(cfg.dataset, mnist1d_samples=cfg.mnist1d_samples)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, splits.meta.input_shape, splits.meta.num_classes)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    sampler = DistributedSampler(splits.train, world, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(splits.train, batch_size=cfg.batch_size, sampler=sampler)
    sched = build_scheduler(opt, cfg.epochs * len(loader), len(loader), cfg.lr_schedule)
    criterion = nn.CrossEntropyLoss()
    epoch_seconds = []
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = criterion(ddp(x), y)
            loss.backward()
            opt.step()
            sched.step()
        epoch_seconds.append(time.perf_counter() - t0)
    return {"epoch_seconds": epoch_seconds, "steps": len(loader)}


def _autok(rank: int, world: int, cfg_json: str) -> dict:
    from trainer.loop import Trainer

    cfg = TrainConfig.model_validate_json(cfg_json)
    rows = []

    class Rows:
        def on_epoch(self, row):
            rows.append(row)

    tr = Trainer(cfg, rank, world, None, observers=[Rows()])
    summary = tr.run()
    return {
        "epoch_seconds": [r["epoch_seconds"] for r in rows],
        "steps": tr.steps_per_epoch,
        "summary": summary,
        "rows": rows,
    }


def _step_time(result: dict) -> float:
    """Median per-step time over epochs after the first (which pays one-off set-up)."""
    return statistics.median(result["epoch_seconds"][1:]) / result["steps"]


def overhead(rounds: int, world: int = 2) -> dict:
    cfg = TrainConfig(
        strategy="ddp", link="none", epochs=4, workers=world, progress=False, warmup_epochs=1
    )
    prepare_data(cfg)
    plain, ours = [], []
    for _ in range(rounds):  # interleaved, so drift in machine load hits both alike
        plain.append(_step_time(run_workers(_plain_ddp, world, cfg.model_dump_json())[0]))
        ours.append(_step_time(run_workers(_autok, world, cfg.model_dump_json())[0]))
    p, o = statistics.median(plain), statistics.median(ours)
    return {
        "world_size": world,
        "plain_step_s": p,
        "autok_step_s": o,
        "ratio": o / p,
        "plain_rounds": plain,
        "autok_rounds": ours,
    }


def wan(world: int = 4, epochs: int = 4) -> dict:
    out = {}
    for name, strategy, k in (("ddp", "ddp", 1), ("cpdp K=4", "cpdp", 4)):
        cfg = TrainConfig(
            strategy=strategy,
            sync_period=k,
            link="wan",
            epochs=epochs,
            workers=world,
            progress=False,
        )
        prepare_data(cfg)
        res = run_workers(_autok, world, cfg.model_dump_json())[0]
        s = res["summary"]
        # After warmup (K=1 for both) the per-epoch exposed sync shows the steady state.
        post = [r["sync_seconds"] for r in res["rows"] if r["epoch"] >= cfg.warmup_epochs]
        out[name] = {"post_warmup_sync_per_epoch": statistics.mean(post)} | {
            k2: s[k2]
            for k2 in (
                "wall_seconds",
                "compute_seconds",
                "exposed_sync_seconds",
                "peak_test_accuracy",
                "boundaries",
                "grad_syncs",
                "param_syncs",
            )
        }
    out["exposed_ratio"] = (
        out["cpdp K=4"]["exposed_sync_seconds"] / out["ddp"]["exposed_sync_seconds"]
    )
    out["post_warmup_exposed_ratio"] = (
        out["cpdp K=4"]["post_warmup_sync_per_epoch"] / out["ddp"]["post_warmup_sync_per_epoch"]
    )
    out["wall_ratio"] = out["cpdp K=4"]["wall_seconds"] / out["ddp"]["wall_seconds"]
    out["world_size"], out["epochs"] = world, epochs
    return out


def default_job() -> dict:
    cfg = TrainConfig(progress=False)
    prepare_data(cfg)
    t0 = time.perf_counter()
    s = run_workers(_autok, cfg.workers, cfg.model_dump_json())[0]["summary"]
    return {
        "wall_seconds": s["wall_seconds"],
        "process_seconds": time.perf_counter() - t0,
        "peak_test_accuracy": s["peak_test_accuracy"],
        "final_test_accuracy": s["final_test_accuracy"],
        "exposed_sync_seconds": s["exposed_sync_seconds"],
        "compute_seconds": s["compute_seconds"],
        "epochs": cfg.epochs,
    }


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def render(res: dict) -> str:
    o, w = res["overhead"], res["wan"]
    lines = [
        "# Engine benchmark",
        "",
        f"Machine: {res['machine']['cpus']} CPUs, {res['machine']['platform']}, "
        f"torch {res['machine']['torch']}, {res['machine']['date']}",
        "",
        "| measure | value |",
        "|---|---|",
        f"| (a) step time, plain torch DDP (world {o['world_size']}, link none) "
        f"| {o['plain_step_s'] * 1e3:.2f} ms |",
        f"| (a) step time, autok ddp | {o['autok_step_s'] * 1e3:.2f} ms |",
        f"| (a) **overhead ratio** autok / plain | **{o['ratio']:.3f}** |",
    ]
    for name in ("ddp", "cpdp K=4"):
        r = w[name]
        lines.append(
            f"| (b) {name} on wan, {w['world_size']} workers, {w['epochs']} epochs: wall / "
            f"exposed sync / peak acc | {r['wall_seconds']:.1f} s / "
            f"{r['exposed_sync_seconds']:.1f} s / {r['peak_test_accuracy']:.3f} |"
        )
    lines += [
        f"| (b) **exposed-sync ratio** cpdp K=4 / ddp | **{w['exposed_ratio']:.3f}** |",
        f"| (b) exposed-sync ratio per epoch after warmup | {w['post_warmup_exposed_ratio']:.3f} |",
        f"| (b) wall-clock ratio cpdp K=4 / ddp | {w['wall_ratio']:.3f} |",
    ]
    if "default_job" in res:
        d = res["default_job"]
        lines.append(
            f"| (c) default job ({d['epochs']} epochs): wall / peak acc | "
            f"{d['wall_seconds']:.1f} s ({d['process_seconds']:.1f} s with start-up) / "
            f"{d['peak_test_accuracy']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-default-job", action="store_true")
    args = ap.parse_args()
    res = {"machine": machine(), "overhead": overhead(args.rounds), "wan": wan()}
    if not args.skip_default_job:
        res["default_job"] = default_job()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine.json").write_text(json.dumps(res, indent=2) + "\n")
    text = render(res)
    (RESULTS / "engine.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
