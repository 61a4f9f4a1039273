"""Engine measurements, side by side in one run, printed as ratios (`autok bench`).

    autok bench [--rounds 3] [--only a,b,c,d,e,f,job]      (or python -m benchmarks.engine)

(a) overhead: autok `ddp` step time / a plain hand-written torch DDP loop (same model, data,
    optimizer, schedule, world size; link `none`), interleaved rounds, median of per-epoch times;
(b) boundary cost: median exposed sync per `cpdp` K=4 boundary / per `ddp` step on a
    latency-bound link (20 ms RTT, 10 Gbit/s), fused and two-phase;
(c) WAN: training time of `cpdp` K=4 / `ddp` on `wan`, beside the ideal
    (compute + comm/K) / (compute + comm) from the ddp run's own compute and comm per step;
(d) scaling: step time against world size (2, 4, 8) and model size (link `none`);
(e) overlap: exposed sync per boundary and accuracy with and without --overlap-boundary;
(f) the plain WAN comparison of the engine issue (4 workers, with warmup);
(job) the default job (`make train`): wall-clock and peak accuracy;
(diloco) outer optimizers and compression against cpdp and ddp (benchmarks/diloco.py, its own
    results file).
Writes benchmarks/results/engine.{json,md} with a machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
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


def _median_exposed(records: list, warmup: int) -> float:
    return statistics.median(r.exposed_sync_seconds for r in records if r.epoch >= warmup)


def _records(rank: int, world: int, cfg_json: str) -> dict:
    from trainer.loop import Trainer

    cfg = TrainConfig.model_validate_json(cfg_json)
    records, rows = [], []

    class Keep:
        def on_boundary(self, stats, decision):
            records.append(stats)

        def on_epoch(self, row):
            rows.append(row)

    tr = Trainer(cfg, rank, world, None, observers=[Keep()])
    summary = tr.run()
    return {"records": records, "rows": rows, "summary": summary, "steps": tr.steps_per_epoch}


def _run(world: int = 2, **kw) -> dict:
    cfg = TrainConfig(workers=world, progress=False, **kw)
    prepare_data(cfg)
    return run_workers(_records, world, cfg.model_dump_json())[0]


def boundary_cost(world: int = 2) -> dict:
    link = dict(link="none", link_rtt_ms=20.0, link_bandwidth_gbps=10.0)
    base = dict(epochs=3, warmup_epochs=1, mnist1d_samples=2000, **link)
    ddp = _median_exposed(_run(world, strategy="ddp", **base)["records"], 1)
    out = {"ddp_step_s": ddp, "world_size": world, "link": "20 ms RTT, 10 Gbit/s"}
    for mode in ("fused", "two-phase"):
        cp = _run(world, strategy="cpdp", sync_period=4, boundary=mode, **base)
        out[f"cpdp_{mode}_boundary_s"] = _median_exposed(cp["records"], 1)
        out[f"ratio_{mode}"] = out[f"cpdp_{mode}_boundary_s"] / ddp
    return out


def wan_vs_ideal(world: int = 4, k: int = 4) -> dict:
    base = dict(link="wan", epochs=4, warmup_epochs=0)
    ddp = _run(world, strategy="ddp", **base)
    cpdp = _run(world, strategy="cpdp", sync_period=k, **base)
    steps = ddp["steps"] * base["epochs"]

    def per_step(res: dict, key: str) -> float:
        return sum(r[key] for r in res["rows"]) / steps

    compute = sum(per_step(ddp, key) for key in ("forward_seconds", "backward_seconds"))
    compute += per_step(ddp, "overhead_seconds")
    comm = per_step(ddp, "sync_seconds")
    train = {
        n: sum(r["epoch_seconds"] for r in res["rows"]) for n, res in (("ddp", ddp), ("cpdp", cpdp))
    }
    ideal = (compute + comm / k) / (compute + comm)
    measured = train["cpdp"] / train["ddp"]
    return {
        "world_size": world,
        "k": k,
        "ddp_train_s": train["ddp"],
        "cpdp_train_s": train["cpdp"],
        "compute_per_step_s": compute,
        "comm_per_step_s": comm,
        "measured_ratio": measured,
        "ideal_ratio": ideal,
        "measured_over_ideal": measured / ideal,
        "ddp_peak": ddp["summary"]["peak_test_accuracy"],
        "cpdp_peak": cpdp["summary"]["peak_test_accuracy"],
    }


def scaling() -> list[dict]:
    rows = []
    for model in ("cnn1d", "mlp"):
        for world in (2, 4, 8):
            res = _run(world, strategy="ddp", link="none", epochs=3, warmup_epochs=1, model=model)
            step = statistics.median(r["epoch_seconds"] for r in res["rows"][1:]) / res["steps"]
            rows.append({"model": model, "world_size": world, "step_s": step})
    return rows


def overlap(world: int = 2) -> dict:
    # A link whose allreduce (2 ranks: rtt + S/bw, about 1.05 ms here) one local step (about
    # 2 ms of compute on this model) can cover: the case overlap is for.
    base = dict(
        strategy="localsgd",
        sync_period=4,
        link="none",
        link_rtt_ms=1.0,
        link_bandwidth_gbps=10.0,
        epochs=30,
        warmup_epochs=1,
    )
    out = {"world_size": world, "link": "1 ms RTT, 10 Gbit/s", "strategy": "localsgd K=4"}
    for name, flag in (("sync", False), ("overlap", True)):
        res = _run(world, overlap_boundary=flag, **base)
        post = [r for r in res["records"] if r.epoch >= 1]
        out[name] = {
            "exposed_per_boundary_s": statistics.median(r.exposed_sync_seconds for r in post),
            "compute_per_step_s": statistics.median(
                r.compute_seconds / r.interval_steps for r in post
            ),
            "peak_test_accuracy": res["summary"]["peak_test_accuracy"],
            "wall_seconds": res["summary"]["wall_seconds"],
        }
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
    lines = [
        "# Engine benchmark",
        "",
        f"Machine: {res['machine']['cpus']} CPUs, {res['machine']['platform']}, "
        f"torch {res['machine']['torch']}, {res['machine']['date']}",
        "",
        "| measure | value |",
        "|---|---|",
    ]
    if "overhead" in res:
        o = res["overhead"]
        lines += [
            f"| (a) step time, plain torch DDP (world {o['world_size']}, link none) "
            f"| {o['plain_step_s'] * 1e3:.2f} ms |",
            f"| (a) step time, autok ddp | {o['autok_step_s'] * 1e3:.2f} ms |",
            f"| (a) **overhead ratio** autok / plain | **{o['ratio']:.3f}** |",
        ]
    if "wan" in res:
        w = res["wan"]
        for name in ("ddp", "cpdp K=4"):
            r = w[name]
            lines.append(
                f"| (f) {name} on wan, {w['world_size']} workers, {w['epochs']} epochs: wall / "
                f"exposed sync / peak acc | {r['wall_seconds']:.1f} s / "
                f"{r['exposed_sync_seconds']:.1f} s / {r['peak_test_accuracy']:.3f} |"
            )
        lines += [
            f"| (f) exposed-sync ratio cpdp K=4 / ddp | {w['exposed_ratio']:.3f} |",
            f"| (f) exposed-sync ratio per epoch after warmup | "
            f"{w['post_warmup_exposed_ratio']:.3f} |",
            f"| (f) wall-clock ratio cpdp K=4 / ddp | {w['wall_ratio']:.3f} |",
        ]
    if "boundary_cost" in res:
        b = res["boundary_cost"]
        lines += [
            f"| (b) exposed per ddp step, {b['link']}, world {b['world_size']} "
            f"| {b['ddp_step_s'] * 1e3:.1f} ms |",
            f"| (b) exposed per cpdp K=4 boundary, fused / two-phase "
            f"| {b['cpdp_fused_boundary_s'] * 1e3:.1f} / "
            f"{b['cpdp_two-phase_boundary_s'] * 1e3:.1f} ms |",
            f"| (b) **boundary-cost ratio** cpdp / ddp, fused (two-phase) "
            f"| **{b['ratio_fused']:.3f}** ({b['ratio_two-phase']:.3f}) |",
        ]
    if "wan_vs_ideal" in res:
        c = res["wan_vs_ideal"]
        lines += [
            f"| (c) wan, world {c['world_size']}: ddp per step compute / comm "
            f"| {c['compute_per_step_s'] * 1e3:.1f} / {c['comm_per_step_s'] * 1e3:.1f} ms |",
            f"| (c) **training-time ratio** cpdp K={c['k']} / ddp, measured vs ideal "
            f"| **{c['measured_ratio']:.3f}** vs {c['ideal_ratio']:.3f} "
            f"({c['measured_over_ideal']:.3f}x the ideal) |",
        ]
    if "scaling" in res:
        for r in res["scaling"]:
            lines.append(
                f"| (d) ddp step time, {r['model']}, world {r['world_size']} "
                f"(link none) | {r['step_s'] * 1e3:.2f} ms |"
            )
    if "overlap" in res:
        o = res["overlap"]
        for name in ("sync", "overlap"):
            v = o[name]
            lines.append(
                f"| (e) {o['strategy']} {o['link']}, {name}: exposed per boundary / compute "
                f"per step / peak acc | {v['exposed_per_boundary_s'] * 1e3:.2f} ms / "
                f"{v['compute_per_step_s'] * 1e3:.2f} ms / {v['peak_test_accuracy']:.3f} |"
            )
    if "default_job" in res:
        d = res["default_job"]
        lines.append(
            f"| (c) default job ({d['epochs']} epochs): wall / peak acc | "
            f"{d['wall_seconds']:.1f} s ({d['process_seconds']:.1f} s with start-up) / "
            f"{d['peak_test_accuracy']:.3f} |"
        )
    return "\n".join(lines) + "\n"


PARTS = {
    "a": "overhead",
    "b": "boundary_cost",
    "c": "wan_vs_ideal",
    "d": "scaling",
    "e": "overlap",
    "f": "wan",
    "job": "default_job",
    "diloco": "diloco",  # benchmarks/diloco.py: writes results/diloco.{json,md}
}


MAX_ROUNDS = 100


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line naming the flag, exit 2, as every autok command
        print(f"autok: error: {message}", file=sys.stderr)
        sys.exit(2)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(prog="autok bench", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds for (a)")
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated parts to run")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        ap.error(f"--rounds: {args.rounds} is not in 1..{MAX_ROUNDS} (each round runs both loops)")
    unknown = [p for p in args.only.split(",") if p.strip() not in PARTS]
    if unknown:
        ap.error(f"--only: unknown part {unknown[0]!r}; choose from {','.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # A partial run (--only) updates the saved results instead of replacing them.
    saved = RESULTS / "engine.json"
    res: dict = json.loads(saved.read_text()) if saved.exists() else {}
    res["machine"] = machine()
    names = [PARTS[part.strip()] for part in args.only.split(",")]
    if "diloco" in names:  # its own results file
        from benchmarks.diloco import main as run_diloco

        run_diloco()
        names.remove("diloco")
        if not names:
            return
    for name in names:
        res[name] = overhead(args.rounds) if name == "overhead" else globals()[name]()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine.json").write_text(json.dumps(res, indent=2) + "\n")
    text = render(res)
    (RESULTS / "engine.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
