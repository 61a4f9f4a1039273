"""A user's own training loop with autok: only the public API (`autok.Sync`).

    torchrun --nproc-per-node 2 examples/own_loop.py [--steps 200] [--out DIR]
        [--policy exposed-sync] [--save-every 50] [--stop-after N] [--resume]

A small regression network (not a classifier) fits y = sin(x·w) on a per-rank shard, with AdamW,
a GradScaler (on CPU it is a no-op that still exercises the skip path), a cosine LR schedule over
--steps and the user's own checkpoint files. autok decides which steps are boundaries (cpdp, K
from the exposed-sync controller on the emulated WAN). Every --save-every steps each rank saves
its model, optimizer, schedule, scaler, data stream and `sync.state_dict()` (which holds the open
interval: no boundary is forced to save). --stop-after N stops there as a crash would; --resume
continues from the last save to the same --steps. With --policy fixed the resumed run ends bit for
bit where an uninterrupted one does (exposed-sync picks K from measured times, which no two runs
share).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import autok


def save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # a crash while saving leaves the previous checkpoint whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("runs/own-loop"))
    ap.add_argument("--policy", default="exposed-sync")
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    if args.steps < 1 or args.save_every < 1:
        ap.error("--steps and --save-every: give at least 1")

    dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank = dist.get_rank()
    ckpt = args.out / f"rank{rank}.pt"
    state = torch.load(ckpt, weights_only=True) if args.resume and ckpt.exists() else None
    if state is not None and state["steps"] != args.steps:  # the cosine schedule spans --steps
        ap.error(f"--steps: the checkpoint is of a {state['steps']}-step run; resume with it")
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    scaler = torch.amp.GradScaler("cpu")
    sync = autok.Sync(
        model,
        optimizer,
        strategy="cpdp",
        sync_period=2,
        policy=args.policy,
        link="wan",
        out_dir=args.out if rank == 0 else None,
    )
    g = torch.Generator().manual_seed(1 + rank)  # this rank's shard

    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        g.set_state(state["data"])
        sync.load_state_dict(state["sync"])  # after the model
        start = state["step"]

    def checkpoint(step: int) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "steps": args.steps,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "data": g.get_state(),
            "sync": sync.state_dict(),
        }
        save(ckpt, state)

    w = torch.linspace(-1, 1, 16)
    for step in range(start, args.steps):
        x = torch.randn(64, 16, generator=g)
        y = torch.sin(x @ w).unsqueeze(1)
        with sync.step() as s:
            loss = nn.functional.mse_loss(sync.model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            s.loss = loss
        scheduler.step()
        if rank == 0 and s.is_boundary and sync.last_boundary.boundary % 10 == 0:
            b, why = sync.last_boundary, sync.last_decision.reason
            print(
                f"step {step:4d}  loss {b.train_loss:.4f}  K {b.sync_period} -> "
                f"{sync.sync_period}  exposed sync {b.sync_share:.0%}  ({why})",
                flush=True,
            )
        if (step + 1) % args.save_every == 0:
            checkpoint(step + 1)
        if args.stop_after is not None and step + 1 >= args.stop_after:
            print(f"rank {rank}: stopped after step {step + 1}", flush=True)
            break
    else:
        sync.sync_now()  # replicas identical at the end
        checkpoint(args.steps)
        with torch.no_grad():
            digest = float(sum(p.double().sum() for p in model.parameters()))
        print(f"rank {rank}: done at step {args.steps}, parameter sum {digest!r}", flush=True)
    sync.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
