"""A user's own training loop with autok: only the public API (`autok.Sync`).

    torchrun --nproc-per-node 2 examples/own_loop.py [--steps 200] [--out DIR] [--resume]

A small regression network (not a classifier) fits y = sin(x·w) on a per-rank shard, with AdamW,
a GradScaler (on CPU it is a no-op that still exercises the skip path), a cosine LR schedule and
the user's own checkpoint file. autok decides which steps are boundaries (cpdp, K from the
exposed-sync controller on the emulated WAN), and the checkpoint holds `sync.state_dict()` next
to the model's, so `--resume` continues exactly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import autok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("runs/own-loop"))
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()

    dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank = dist.get_rank()
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
        policy="exposed-sync",
        link="wan",
        out_dir=args.out if rank == 0 else None,
    )

    ckpt = args.out / f"rank{rank}.pt"
    start = 0
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        sync.load_state_dict(state["sync"])  # after the model
        start = state["step"]

    g = torch.Generator().manual_seed(1 + rank)  # this rank's shard
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
    sync.sync_now()  # replicas identical before saving
    args.out.mkdir(parents=True, exist_ok=True)
    state = {
        "step": args.steps,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "sync": sync.state_dict(),
    }
    torch.save(state, ckpt)
    digest = float(sum(p.double().sum() for p in model.parameters()))
    print(f"rank {rank}: done at step {args.steps}, parameter sum {digest:.6f}", flush=True)
    sync.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
