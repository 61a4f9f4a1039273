"""What each per-step mechanism of `autok.Sync` costs, side by side (docs/design.md §4, Per step):

    python -m benchmarks.step_parts [--rounds 7] [--steps 400]

World 2, link none, the cnn1d on mnist1d, ranks pinned as `autok bench` pins them. Every
variant is a plain DDP step (zero_grad, forward, backward, SGD step) with one mechanism added;
all variants take turns step by step on the same batch (in a seeded random order, the same on
every rank), and a round's
figure is each variant's median step. Printed: each variant's median over rounds and its excess
over the plain step in µs, with the spread (min-max) of the per-round excess.

- `comm hook`: autok's Python DDP comm hook (with no link on the CPU: the path for unused
  parameters, its future completed by a done-callback, trainer/engine/grad_hook.py `_first_of`),
  against DDP's built-in C++ one;
- `torch allreduce_hook`: torch's own Python hook, its future a `then` callback's;
- `end-of-compute hook`: the built-in path's timing: one hook on a parameter's gradient
  accumulation that queues an autograd callback (trainer/engine/grad_hook.py, GradSyncState.arm);
- `end-of-compute tensor hook`: the same callback from a tensor hook on that parameter, as the
  built-in path had it before (torch hands a tensor hook a new gradient tensor to wrap);
- `module forward hook`: a forward hook on the model, as `sync.model` used to time forwards;
- `forward override`: a DDP subclass whose forward reports its end (`sync.model` now);
- `optimizer hooks`: a step pre- and post-hook, as `Sync` registers;
- `Sync ddp`: the whole `with sync.step()` ddp step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from autok.config import TrainConfig
from autok.launch import prepare_data
from autok.trainer.engine.grad_hook import GradSyncState, emulated_allreduce_hook
from autok.trainer.loop.data import build_splits
from autok.trainer.loop.models import build_model
from benchmarks.engine import RESULTS, _workers

VARIANTS = (
    "plain",
    "comm hook",
    "torch allreduce_hook",
    "end-of-compute hook",
    "end-of-compute tensor hook",
    "module forward hook",
    "forward override",
    "optimizer hooks",
    "Sync ddp",
)


class _Override(DistributedDataParallel):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        self.ended = time.perf_counter()
        return out


def _variant(name: str, model: nn.Module, world: int):
    """A step function for one variant, on its own copy of the model and optimizer."""
    import autok

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    crit = nn.CrossEntropyLoss()
    if name == "Sync ddp":
        sync = autok.Sync(model, opt, strategy="ddp", link="none")

        def sync_step(x, y):
            with sync.step() as s:
                opt.zero_grad(set_to_none=True)
                loss = crit(sync.model(x), y)
                loss.backward()
                opt.step()
                s.loss = loss

        return sync_step
    ddp = (_Override if name == "forward override" else DistributedDataParallel)(model)
    if name == "comm hook":
        ddp.register_comm_hook(GradSyncState(world, None), emulated_allreduce_hook)
    if name == "torch allreduce_hook":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        ddp.register_comm_hook(None, allreduce_hook)
    if name == "end-of-compute hook":
        state = GradSyncState(world, None, builtin=True)
        state.params = [p for p in model.parameters() if p.requires_grad]
        state.arm()
    if name == "end-of-compute tensor hook":
        state = GradSyncState(world, None, builtin=True)
        next(model.parameters()).register_hook(lambda grad: state._on_grad(None))
    clock = []  # hooks record a time and return None (a value would replace the output)
    if name == "module forward hook":
        model.register_forward_hook(lambda module, args, out: clock.append(time.perf_counter()))
    if name == "optimizer hooks":
        opt.register_step_pre_hook(lambda o, a, k: clock.append(time.perf_counter()))
        opt.register_step_post_hook(lambda o, a, k: clock.append(time.perf_counter()))

    def step(x, y):
        clock.clear()
        opt.zero_grad(set_to_none=True)
        crit(ddp(x), y).backward()
        opt.step()

    return step


def _worker(rank: int, world: int, cfg_json: str, rounds: int, steps: int) -> dict:
    cfg = TrainConfig.model_validate_json(cfg_json)
    splits = build_splits(cfg.dataset, mnist1d_samples=cfg.mnist1d_samples)
    sampler = DistributedSampler(splits.train, world, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(splits.train, batch_size=cfg.batch_size, sampler=sampler)
    fns = {}
    for name in VARIANTS:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, splits.meta.input_shape, splits.meta.num_classes)
        fns[name] = _variant(name, model, world)
    per_round: dict[str, list[float]] = {name: [] for name in VARIANTS}
    rng = random.Random(cfg.seed)  # the same order on every rank: DDP's collectives pair up
    epoch = 0
    for r in range(rounds + 1):  # round 0 pays one-off set-up
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        while len(times["plain"]) < steps:
            sampler.set_epoch(epoch)
            epoch += 1
            for x, y in loader:
                order = list(VARIANTS)
                rng.shuffle(order)  # no variant always follows the same one
                for name in order:
                    t0 = time.perf_counter()
                    fns[name](x, y)
                    times[name].append(time.perf_counter() - t0)
                if len(times["plain"]) >= steps:
                    break
        if r:
            for name in VARIANTS:
                per_round[name].append(statistics.median(times[name]))
    return per_round


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.step_parts")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=400, help="steps per variant per round")
    args = ap.parse_args(argv)
    cfg = TrainConfig(strategy="ddp", link="none", workers=2, progress=False)
    prepare_data(cfg)
    res = _workers(_worker, 2, None, cfg.model_dump_json(), args.rounds, args.steps)[0]
    plain = res["plain"]
    lines = [
        "# Per-step mechanisms (python -m benchmarks.step_parts)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')}, world 2, cnn1d, link none, {args.rounds} rounds x "
        f"{args.steps} steps per variant. Excess: the variant's median step minus the plain "
        "step's, per round; median (min to max over the rounds).",
        "",
        "| variant | median step | excess over plain DDP |",
        "|---|---|---|",
    ]
    for name in VARIANTS:
        excess = [(a - b) * 1e6 for a, b in zip(res[name], plain, strict=True)]
        lines.append(
            f"| {name} | {statistics.median(res[name]) * 1e3:.3f} ms | "
            f"{statistics.median(excess):+.1f} µs ({min(excess):+.1f} to {max(excess):+.1f}) |"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / "step_parts.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
