"""A language-model loop with autok, the idioms a user brings, in one file (public API only).

    torchrun --nproc-per-node 2 examples/lm_loop.py [--steps 60] [--out DIR] [--accumulation 4]
        [--micro-batch 8] [--sync-period 4] [--eval-every 20] [--save-every 20]
        [--stop-after N] [--resume]

The byte-level GPT of examples/tiny_gpt on each rank's own stream of windows, with:
- gradient accumulation: `accumulation_steps=N` micro-batches per optimizer step, only the last
  all-reducing; K counts optimizer steps;
- mixed precision: autocast to bfloat16 (on the CPU; float16 with a GradScaler on a GPU);
- gradient clipping by norm (with AdamW, autok's boundary is two-phase: the clipped gradient is
  the averaged one, as under DDP);
- a learning-rate schedule (linear warmup, cosine decay), stepped once per optimizer step;
- evaluation on synchronized replicas: `sync.sync_now()` first, so every rank holds the same
  weights and reports the same validation loss;
- the outer state (SlowMo's θ_ref and velocity) in host memory: on a GPU the device holds at
  most 2x the parameters for autok, the same results bit for bit;
- checkpoint and restart: each rank saves its model, optimizer, schedule, data stream and
  `sync.state_dict()`; --stop-after stops as a crash would, --resume continues bit for bit.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import autok
from examples.tiny_gpt import GPT, splits


def save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # a crash while saving leaves the previous checkpoint whole


def schedule(steps: int, warmup: int):
    """The LR factor at an optimizer step: linear warmup, then cosine to a tenth."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(t, 1.0)))

    return factor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps")
    ap.add_argument("--out", type=Path, default=Path("runs/lm-loop"))
    ap.add_argument("--accumulation", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--micro-batch", type=int, default=8, help="windows per micro-batch")
    ap.add_argument("--sync-period", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    for name in ("steps", "accumulation", "micro_batch", "eval_every", "save_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: give at least 1")

    dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank = dist.get_rank()
    ckpt = args.out / f"rank{rank}.pt"
    state = torch.load(ckpt, weights_only=True) if args.resume and ckpt.exists() else None
    if state is not None and state["steps"] != args.steps:  # the schedule spans --steps
        ap.error(f"--steps: the checkpoint is of a {state['steps']}-step run; resume with it")

    train, val = splits()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(args.steps, warmup=5))
    sync = autok.Sync(
        model,
        optimizer,
        strategy="cpdp",
        sync_period=args.sync_period,
        accumulation_steps=args.accumulation,
        outer_state_device="cpu",  # SlowMo's θ_ref and velocity off the device between boundaries
        out_dir=args.out if rank == 0 else None,
    )
    data = torch.Generator().manual_seed(1 + rank)  # this rank's stream of windows
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        data.set_state(state["data"])
        sync.load_state_dict(state["sync"])  # after the model's
        start = state["step"]

    def checkpoint(step: int) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        save(
            ckpt,
            {
                "step": step,
                "steps": args.steps,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "data": data.get_state(),
                "sync": sync.state_dict(),
            },
        )

    def evaluate() -> float:
        """The mean next-byte loss on the first validation windows. Called after sync_now():
        the replicas are identical, so every rank computes the same number."""
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            x, y = val[:64]
            loss = F.cross_entropy(sync.module(x).flatten(0, 1).float(), y.flatten())
        model.train()
        return loss.item()

    n = args.accumulation
    for step in range(start, args.steps):
        batch = torch.randint(len(train), (n * args.micro_batch,), generator=data)
        x, y = train[batch]
        with sync.step() as s:
            total = torch.zeros(())
            for xm, ym in zip(x.chunk(n), y.chunk(n), strict=True):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = sync.model(xm)
                # the loss in float32; divided by N, the step's gradient is the batch's mean
                loss = F.cross_entropy(logits.flatten(0, 1).float(), ym.flatten()) / n
                loss.backward()
                total += loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            s.loss = total
        scheduler.step()
        if (step + 1) % args.eval_every == 0:
            sync.sync_now()  # a boundary now: every rank evaluates the same weights
            val_loss = evaluate()
            if rank == 0:
                print(f"step {step + 1:4d}  val loss {val_loss:.4f}  K {sync.sync_period}")
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
        print(
            f"rank {rank}: done at step {args.steps}, val loss {evaluate():.4f}, "
            f"parameter sum {digest!r}",
            flush=True,
        )
    sync.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
