"""Engine measurements, side by side in one run, printed as ratios (`autok bench`).

    autok bench [--rounds 7] [--cpus 0-3] [--only a,g,h,i,b,c,d,e,f,job]
    (or python -m benchmarks.engine with the same flags)

Every ratio is taken once per round (both sides run in each round, which one first alternates)
and reported as the median of the per-round ratios with their spread (min-max) and, where a
part has a goal, a verdict: met, not met, or not resolved (the spread crosses the goal, or
fewer than 7 rounds); see benchmarks/stats.py. Each rank of both sides runs pinned to the same
cores (--cpus, default: every core this process may use).

(a) overhead: a `ddp` step under `autok.Sync` / a plain torch DDP step (same model, data,
    optimizer, schedule, world size; link `none`), both in one process pair taking turns step
    by step; per round 1 + median paired difference / median plain step; goal <= 1.02.
    Beside it, without a goal, the ratio of the two sides' median steps (unpaired), and the
    built-in loop (`autok train`) against a hand-written loop in separate runs (the fastest
    epoch after the first of each), and the Python bytecodes per step of each side, counted
    (benchmarks/bytecodes.py: the same on every run);
(g) local step: a step under `autok.Sync` (cpdp, K=8, link `none`) / a hand-written `no_sync()`
    step of the same model and data, both in one process pair taking turns step by step,
    boundary steps not counted, paired as in (a), with the bytecodes as in (a); goal <= 1.02;
(h) boundary fixed cost: a boundary step's sync time (cpdp K=1, fused, link `none`: pack, replica
    check, norms, the collective, outer step, unpack, momentum correction) / one bare
    `all_reduce` of the same flat buffer, world 2, on cnn1d and a ~3M-parameter MLP;
    goal <= 1.2. Beside it, as references without a goal, what averaging the parameters alone
    costs over a bare all_reduce of their size: the floor (pack, all_reduce, unpack) and
    torch's own `average_parameters`;
(i) emulated link: median exposed sync per cpdp K=4 boundary on `wan` / the modelled
    T(S, N) for its bytes, world 2 and 4; goal <= 1.05;
(b) boundary cost: median exposed sync per `cpdp` K=4 boundary / per `ddp` step on a
    latency-bound link (20 ms RTT, 10 Gbit/s), fused and two-phase;
(c) WAN: training time of `cpdp` K=4 / `ddp` on `wan`, beside the ideal
    (compute + comm/K) / (compute + comm) from the ddp run's own compute and comm per step;
(d) scaling: step time against world size (2, 4, 8) and model size (link `none`);
(e) overlap: exposed sync per boundary and accuracy with and without --overlap-boundary;
(f) the plain WAN comparison of the engine (4 workers, with warmup);
(job) the default job (`make train`): wall-clock and peak accuracy;
(diloco) outer optimizers and compression against cpdp and ddp (benchmarks/diloco.py, its own
    results file).
Writes benchmarks/results/engine.{json,md} with a machine description.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from autok.config import TrainConfig
from autok.launch import prepare_data, run_workers
from autok.trainer.engine.optim import build_scheduler
from autok.trainer.loop.data import build_splits
from autok.trainer.loop.models import build_model
from benchmarks import bytecodes
from benchmarks.bench_cli import PARTS, all_cpus, parse, parse_cpus  # noqa: F401 - re-exported
from benchmarks.stats import MIN_ROUNDS, fmt, paired_round, ratios, spread, summarize

RESULTS = Path(__file__).parent / "results"
# (a), (g): per round, what _interleaved_steps keeps of paired_round's figures
PAIRED_FIELDS = (
    ("paired", "ratio"),
    ("excess", "excess"),
    ("trimmed_excess", "trimmed_excess"),
    ("autok", "ours"),
    ("plain", "plain"),
    ("pairs", "pairs"),
)
STEP_GOAL = 1.02  # autok's per-step time over the hand-written loop's, at most
# Epochs (of 63 steps here) per round of (a) and (g): about 1000 pairs. A round's paired excess
# is a median, whose spread over rounds shrinks as 1/sqrt(pairs): at 4 epochs (252 pairs) the
# rounds of (a) spread over 44 µs, near the 2% goal's 50 µs itself
# (benchmarks/results/measurements-in-code.md).
STEP_EPOCHS = 16
BOUNDARY_GOAL = 1.2  # a no-link boundary's CPU cost over one bare all_reduce, at most
LINK_GOAL = 1.05  # exposed time per boundary on an emulated link over the modelled T(S, N)


# ----- pinning: each rank of both sides on the same cores ----------------------------------------


def rank_cpus(cpus: tuple[int, ...], world: int, rank: int) -> tuple[int, ...]:
    """The cores rank `rank` runs on: a disjoint slice of `cpus` when there are at least as
    many cores as ranks (no rank migrates onto another's core mid-run), else all of them."""
    per = len(cpus) // world
    return cpus if per == 0 else cpus[rank * per : (rank + 1) * per]


def rank_threads(cpus: tuple[int, ...], world: int) -> int:
    """Intra-op threads per rank: its own cores, or its share when ranks share them."""
    return max(1, len(cpus) // world)


def _pinned(rank: int, world: int, cpus: tuple[int, ...], fn, *args):
    if hasattr(os, "sched_setaffinity"):
        # threads started later (gloo's, autok's timer) inherit the affinity
        os.sched_setaffinity(0, rank_cpus(cpus, world, rank))
    torch.set_num_threads(rank_threads(cpus, world))
    return fn(rank, world, *args)


def _workers(fn, world: int, cpus: tuple[int, ...] | None, *args) -> list:
    """run_workers with each rank pinned by rank_cpus (the same for every side and round)."""
    # each run's start-up counts from its own start, not from `autok bench`'s (workers inherit it)
    os.environ["AUTOK_STARTED"] = repr(time.time())
    return run_workers(_pinned, world, cpus or all_cpus(), fn, *args)


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
    from autok.trainer.loop.run import Trainer

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
    """Per-step time of the fastest epoch after the first (which pays one-off set-up): on a
    shared machine interference only ever adds time, so the fastest epoch is the steadiest."""
    return min(result["epoch_seconds"][1:]) / result["steps"]


def overhead(rounds: int = MIN_ROUNDS, cpus: tuple[int, ...] | None = None, world: int = 2) -> dict:
    """A ddp step under `autok.Sync` against a hand-written DDP step, taking turns step by step
    in one process pair (the goal); beside it, the built-in loop (`autok train`: the engine plus
    the loop's own per-step loss and accuracy sums) against a hand-written loop, one run each
    per round (separate processes: far noisier)."""
    cfg = TrainConfig(strategy="ddp", link="none", workers=world, progress=False)
    prepare_data(cfg)
    res = _workers(_interleaved_steps, world, cpus, cfg.model_dump_json(), rounds, STEP_EPOCHS)[0]
    loop = cfg.model_copy(update={"epochs": 6, "warmup_epochs": 1})
    plain, ours = [], []
    for i in range(rounds):  # interleaved, so drift in machine load hits both alike
        sides = [(plain, _plain_ddp), (ours, _autok)]
        for times, fn in sides[:: 1 if i % 2 == 0 else -1]:  # which goes first alternates
            times.append(_step_time(_workers(fn, world, cpus, loop.model_dump_json())[0]))
    return _step_ratios(res, world) | {
        "loop": {
            "plain_step_s": statistics.median(plain),
            "autok_step_s": statistics.median(ours),
            "ratio": summarize(ratios(ours, plain)),
        },
    }


# ----- (g) a local step under autok.Sync against a hand-written no_sync() step -------------------


def _times_only(sync) -> None:
    """A Sync whose steps are timed and whose training is not judged: its divergence guard
    judges only whether the drift and update norms are finite (the loss rule off, as on ddp).
    (a), (g) and (h) train at a constant LR until the loss is near zero, where a wobble up trips
    the loss rule: (g)'s 128 epochs of cpdp K = 8 went from 0.0079 to 0.184 at boundary 687 in one
    run, and the bench stopped (benchmarks/results/measurements-in-code.md). A raised factor would
    not do: at a minimum of exactly 0 any loss is more than F times it. The guard still runs where
    it always runs."""
    sync.divergence.shared_loss = False


def _interleaved_steps(
    rank: int, world: int, cfg_json: str, rounds: int, epochs_per_round: int
) -> dict:
    """Both loops in one process pair, taking turns step by step: the same model (same seed),
    data (the same batch), optimizer and schedule. cpdp: only local steps are timed (autok
    under Sync against a hand-written `no_sync()` step); ddp: every step (Sync's ddp against a
    plain DDP step). A step is timed from zero_grad through the optimizer step (autok: the whole
    `with sync.step()` block).

    A round's ratio is paired (benchmarks/stats.py, `paired_round`): the two sides' steps on one
    batch, taken back to back, are a pair. The ratio of the two sides' median steps is returned
    too: on this 2-core machine its spread over 7 rounds was the wider in 9 of 10 runs of (a)
    and ad hoc variants of it (e.g. 0.999-1.079 against 1.024-1.043), and the narrower in one
    (1.020-1.053 against 0.994-1.048; benchmarks/results/measurements-in-code.md)."""
    import autok

    cfg = TrainConfig.model_validate_json(cfg_json)
    splits = build_splits(cfg.dataset, mnist1d_samples=cfg.mnist1d_samples)
    sampler = DistributedSampler(splits.train, world, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(splits.train, batch_size=cfg.batch_size, sampler=sampler)
    criterion = nn.CrossEntropyLoss()
    k = cfg.sync_period
    epochs = (rounds + 1) * epochs_per_round  # + a first, untimed block per side

    def side():
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, splits.meta.input_shape, splits.meta.num_classes)
        opt = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
        sched = build_scheduler(opt, epochs * len(loader), len(loader), "constant")
        return model, opt, sched

    ddp_side = cfg.strategy == "ddp"
    k = 1 if ddp_side else k
    model, opt, sched_a = side()
    sync = autok.Sync(model, opt, strategy=cfg.strategy, sync_period=k, link="none")
    _times_only(sync)

    def autok_step(x, y, times: dict[int, float]) -> None:
        t0 = time.perf_counter()
        with sync.step() as s:
            opt.zero_grad(set_to_none=True)
            loss = criterion(sync.model(x), y)
            loss.backward()
            opt.step()
            s.loss = loss
        if ddp_side or not s.is_boundary:
            times[batch] = time.perf_counter() - t0
        sched_a.step()

    plain, popt, sched_p = side()
    ddp = DistributedDataParallel(plain)
    params = list(plain.parameters())
    step = 0

    def plain_step(x, y, times: dict[int, float]) -> None:
        nonlocal step
        step += 1
        if ddp_side:  # a plain DDP step: gradients all-reduced in backward
            t0 = time.perf_counter()
            popt.zero_grad(set_to_none=True)
            criterion(ddp(x), y).backward()
            popt.step()
            times[batch] = time.perf_counter() - t0
        elif step % k:  # a local step: no gradient all-reduce
            t0 = time.perf_counter()
            with ddp.no_sync():
                popt.zero_grad(set_to_none=True)
                criterion(ddp(x), y).backward()
                popt.step()
            times[batch] = time.perf_counter() - t0
        else:  # a boundary (not timed): synchronized step, then θ <- mean θ_i
            popt.zero_grad(set_to_none=True)
            criterion(ddp(x), y).backward()
            popt.step()
            with torch.no_grad():
                flat = torch.cat([p.reshape(-1) for p in params])
                dist.all_reduce(flat)
                flat.div_(world)
                for p, v in zip(params, flat.split([p.numel() for p in params]), strict=True):
                    p.copy_(v.view_as(p))
        sched_p.step()

    # Step by step, the two sides take turns on the same batch (which goes first alternates), so
    # a slow second of a shared machine hits both alike; both count the same steps, so their
    # boundaries (every k-th step) fall on the same batches.
    # Each side's step times by batch number: the two steps of one batch are a pair.
    per_round: dict[str, list] = {key: [] for key, _ in PAIRED_FIELDS}
    sides = [("autok", autok_step), ("plain", plain_step)]
    batch = 0
    for r in range(rounds + 1):
        times: dict[str, dict[int, float]] = {"autok": {}, "plain": {}}
        dist.barrier()
        for e in range(epochs_per_round):
            sampler.set_epoch(r * epochs_per_round + e)
            for i, (x, y) in enumerate(loader):
                batch += 1
                for name, run in sides[:: 1 if i % 2 == 0 else -1]:
                    run(x, y, times[name])
        if r > 0:  # round 0 pays one-off set-up on both sides
            # both sides time the same steps (cpdp: the boundaries of both are not timed)
            got = paired_round(times["autok"], times["plain"])
            for key, field in PAIRED_FIELDS:
                per_round[key].append(got[field])
    # The Python each side runs per timed step, counted (benchmarks/bytecodes.py): the same
    # on every run, where the times above move with the machine. Untimed, after the rounds.
    counted: dict[str, list[tuple[int, int]]] = {"autok": [], "plain": []}
    for x, y in itertools.chain.from_iterable(itertools.repeat(loader)):  # epoch after epoch
        if min(len(c) for c in counted.values()) >= 4:
            break
        batch += 1
        for name, run in sides:
            timed: dict[int, float] = {}
            got = bytecodes.count(lambda run=run, x=x, y=y, t=timed: run(x, y, t))
            if timed:
                counted[name].append(got)
    sync.close()
    return per_round | {
        "steps_per_epoch": len(loader),
        # per side: (all bytecodes, autok's own) of a timed step, the median over 4 or more
        "bytecodes": {
            k: [statistics.median(c[i] for c in v) for i in (0, 1)] for k, v in counted.items()
        },
    }


def local_step(
    rounds: int = MIN_ROUNDS, cpus: tuple[int, ...] | None = None, world: int = 2
) -> dict:
    cfg = TrainConfig(strategy="cpdp", sync_period=8, link="none", workers=world, progress=False)
    prepare_data(cfg)
    res = _workers(_interleaved_steps, world, cpus, cfg.model_dump_json(), rounds, STEP_EPOCHS)[0]
    return _step_ratios(res, world) | {"k": 8}


def _step_ratios(res: dict, world: int) -> dict:
    """(a) and (g): the goal's ratio is the paired one (see _interleaved_steps); the ratio of
    the two sides' median steps, the figure before, is kept beside it."""
    return {
        "world_size": world,
        "plain_step_s": statistics.median(res["plain"]),
        "autok_step_s": statistics.median(res["autok"]),
        "ratio": summarize(res["paired"], STEP_GOAL),
        "unpaired_ratio": summarize(ratios(res["autok"], res["plain"])),
        "excess_us": [1e6 * e for e in res["excess"]],
        "trimmed_excess_us": [1e6 * e for e in res["trimmed_excess"]],
        "pairs": res["pairs"],
        "plain_rounds": res["plain"],
        "autok_rounds": res["autok"],
        "bytecodes": res["bytecodes"],
    }


# ----- (h) the fixed CPU cost of a boundary against one bare all_reduce --------------------------


def mlp_3m(input_shape: tuple[int, ...], num_classes: int, hidden: int = 1700) -> nn.Module:
    """A model of about 3M parameters (1700² + 1700 * (inputs + classes) + biases)."""
    inputs = 1
    for d in input_shape:
        inputs *= d
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(inputs, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def _boundaries(rank: int, world: int, cfg_json: str, model_name: str, rounds: int, reps: int):
    """Per round, `reps` autok boundaries and `reps` timed bare all_reduces of the boundary's own
    flat buffer, taking turns call by call with the references of _averaging_references. A
    boundary is a real
    boundary step (cpdp, K = 1, the fused boundary with its gradients riding along); its cost is
    the step's sync time, all of the averaging: pack, norms, replica check, the collective, the
    outer step, unpack and the momentum correction (the copy of g_i taken in the optimizer's
    pre-hook counts in the step's optimizer time). A barrier in an optimizer post-hook (after
    autok's own) keeps one rank's compute lag out of the other's collective, as the barrier
    before each bare all_reduce does. Per round: the median of each side."""
    import autok

    cfg = TrainConfig.model_validate_json(cfg_json)
    splits = build_splits(cfg.dataset, mnist1d_samples=cfg.mnist1d_samples)
    torch.manual_seed(cfg.seed)
    shape, classes = splits.meta.input_shape, splits.meta.num_classes
    if model_name == "mlp-3m":
        model = mlp_3m(shape, classes)
    else:
        model = build_model(model_name, shape, classes)
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    # fused from the first boundary (auto's first is two-phase, its buffer without gradients)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=1, link="none", boundary="fused")
    _times_only(sync)  # one batch, boundary after boundary: its loss falls near zero
    opt.register_step_post_hook(lambda *_: dist.barrier())
    x, y = next(iter(DataLoader(splits.train, batch_size=cfg.batch_size)))
    criterion = nn.CrossEntropyLoss()

    def boundary() -> float:
        with sync.step() as s:
            opt.zero_grad(set_to_none=True)
            criterion(sync.model(x), y).backward()
            opt.step()
        assert s.is_boundary
        return sync.last_step.sync_seconds

    boundary()  # its record says how large the flat buffer is
    numel = sync.last_boundary.bytes_communicated // 4  # float32
    # The bare all_reduce runs on the boundary's own buffer, as the goal says ("of the same flat
    # buffer"): one allocation for both sides, so its placement cannot favour either. Between
    # boundaries the buffer holds nothing the engine reads; zeroed (untimed) so the sums stay
    # ordinary numbers.
    flat = sync.averager.flat.buf
    assert flat.numel() == numel

    # How busy the bare all_reduce keeps this rank's cores: CPU time of all its threads (gloo's
    # included) over the wall time. What is left, (1 - share) x its time, bounds how much of
    # the boundary's own work could hide behind the collective by pipelining it in chunks.
    shares: list[float] = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    def bare() -> float:
        assert flat.data_ptr() == sync.averager.flat.buf.data_ptr()  # still the boundary's buffer
        flat.zero_()
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        dist.all_reduce(flat)
        wall = time.perf_counter() - t0
        shares.append((time.process_time() - c0) / wall / cores)
        return wall

    sides = [("autok", boundary), ("bare", bare), *_averaging_references(model, world)]
    for _ in range(3):  # warm every path
        for _, fn in sides:
            fn()
    per_round: dict[str, list[float]] = {name: [] for name, _ in sides} | {"bare_cpu_share": []}
    for _ in range(rounds):
        times: dict[str, list[float]] = {name: [] for name, _ in sides}
        shares.clear()
        for i in range(reps):  # call by call, the sides take turns (the order reverses each call)
            for name, fn in sides[:: 1 if i % 2 == 0 else -1]:
                times[name].append(fn())
        for name in times:
            per_round[name].append(statistics.median(times[name]))
        per_round["bare_cpu_share"].append(statistics.median(shares))
    sync.close()
    params = sum(p.numel() for p in model.parameters())
    return per_round | {"params": params, "buffer_numel": numel}


def _averaging_references(model: nn.Module, world: int) -> list[tuple[str, object]]:
    """What any averaging of these parameters costs here, to read (h)'s goal against: on a
    copy of the parameters (the model's own stay autok's), (1) the floor: the parameters
    packed into a preallocated flat buffer, all-reduced, and written back times 1/N (a pack
    and an unpack, nothing else); (2) torch's own `average_parameters` (what its
    PostLocalSGD's averager runs), as shipped: it allocates its flat buffer at each call;
    (3) a bare all_reduce of a buffer of the parameters' size, their denominator. World a power
    of two, so averaging identical replicas leaves them exactly as they were."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters

    mine = [p.detach().clone() for p in model.parameters()]
    theirs = [nn.Parameter(t.clone()) for t in mine]
    packed = torch.empty(sum(t.numel() for t in mine))
    chunks = packed.split([t.numel() for t in mine])
    views = [c.view_as(t) for c, t in zip(chunks, mine, strict=True)]
    bare_params = torch.zeros_like(packed)

    def floor() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        torch.cat([t.reshape(-1) for t in mine], out=packed)
        dist.all_reduce(packed)
        for t, v in zip(mine, views, strict=True):
            torch.mul(v, 1.0 / world, out=t)
        return time.perf_counter() - t0

    def torch_average() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        average_parameters(iter(theirs), dist.group.WORLD)
        return time.perf_counter() - t0

    def bare() -> float:
        bare_params.zero_()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(bare_params)
        return time.perf_counter() - t0

    return [("floor", floor), ("torch_average", torch_average), ("bare_params", bare)]


def boundary_fixed(
    rounds: int = MIN_ROUNDS, cpus: tuple[int, ...] | None = None, world: int = 2
) -> dict:
    cfg = TrainConfig(strategy="cpdp", link="none", workers=world, progress=False)
    prepare_data(cfg)
    out: dict = {"world_size": world, "goal": BOUNDARY_GOAL}
    for model in ("cnn1d", "mlp-3m"):
        res = _workers(_boundaries, world, cpus, cfg.model_dump_json(), model, rounds, 20)[0]
        out[model] = {
            "params": res["params"],
            "buffer_numel": res["buffer_numel"],
            "autok_boundary_s": statistics.median(res["autok"]),
            "bare_allreduce_s": statistics.median(res["bare"]),
            "ratio": summarize(ratios(res["autok"], res["bare"]), BOUNDARY_GOAL),
            "autok_rounds": res["autok"],
            "bare_rounds": res["bare"],
            # what any averaging of the parameters alone costs here (no goal: a reference)
            "bare_params_s": statistics.median(res["bare_params"]),
            "floor_s": statistics.median(res["floor"]),
            "floor_ratio": summarize(ratios(res["floor"], res["bare_params"])),
            "torch_average_s": statistics.median(res["torch_average"]),
            "torch_average_ratio": summarize(ratios(res["torch_average"], res["bare_params"])),
            "bare_cpu_share": summarize(res["bare_cpu_share"]),
        }
    return out


def wan(rounds: int = MIN_ROUNDS, cpus: tuple[int, ...] | None = None) -> dict:
    runs = [_wan_round(cpus, reverse=i % 2 == 1) for i in range(rounds)]
    out = {name: _median_fields(r[name] for r in runs) for name in ("ddp", "cpdp K=4")}
    for key in ("exposed_ratio", "post_warmup_exposed_ratio", "wall_ratio"):
        out[key] = summarize([r[key] for r in runs])
    out["world_size"], out["epochs"] = runs[0]["world_size"], runs[0]["epochs"]
    return out


def _median_fields(rows) -> dict:
    """Field by field, the median over rounds of one side's figures."""
    rows = list(rows)
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def _wan_round(
    cpus: tuple[int, ...] | None, world: int = 4, epochs: int = 4, reverse: bool = False
) -> dict:
    out = {}
    sides = (("ddp", "ddp", 1), ("cpdp K=4", "cpdp", 4))
    for name, strategy, k in sides[::-1] if reverse else sides:
        cfg = TrainConfig(
            strategy=strategy,
            sync_period=k,
            link="wan",
            epochs=epochs,
            workers=world,
            progress=False,
        )
        prepare_data(cfg)
        res = _workers(_autok, world, cpus, cfg.model_dump_json())[0]
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
    from autok.trainer.loop.run import Trainer

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


def _run(world: int = 2, cpus: tuple[int, ...] | None = None, **kw) -> dict:
    cfg = TrainConfig(workers=world, progress=False, **kw)
    prepare_data(cfg)
    return _workers(_records, world, cpus, cfg.model_dump_json())[0]


def boundary_cost(
    rounds: int = MIN_ROUNDS, cpus: tuple[int, ...] | None = None, world: int = 2
) -> dict:
    link = dict(link="none", link_rtt_ms=20.0, link_bandwidth_gbps=10.0)
    base = dict(epochs=3, warmup_epochs=1, mnist1d_samples=2000, **link)
    sides = {
        "ddp_step_s": dict(strategy="ddp"),
        "cpdp_fused_boundary_s": dict(strategy="cpdp", sync_period=4, boundary="fused"),
        "cpdp_two-phase_boundary_s": dict(strategy="cpdp", sync_period=4, boundary="two-phase"),
    }
    per: dict[str, list[float]] = {key: [] for key in sides}
    for i in range(rounds):
        for key, kw in list(sides.items())[:: 1 if i % 2 == 0 else -1]:
            per[key].append(_median_exposed(_run(world, cpus, **kw, **base)["records"], 1))
    out = {key: statistics.median(v) for key, v in per.items()}
    out |= {"world_size": world, "link": "20 ms RTT, 10 Gbit/s", "rounds": per}
    for mode in ("fused", "two-phase"):
        out[f"ratio_{mode}"] = summarize(ratios(per[f"cpdp_{mode}_boundary_s"], per["ddp_step_s"]))
    return out


def wan_vs_ideal(rounds: int = MIN_ROUNDS, cpus: tuple[int, ...] | None = None) -> dict:
    runs = [_wan_vs_ideal_round(cpus, reverse=i % 2 == 1) for i in range(rounds)]
    keys = ("measured_ratio", "ideal_ratio", "measured_over_ideal")
    out = _median_fields({k: v for k, v in r.items() if k not in keys} for r in runs)
    out["ideal_ratio"] = statistics.median(r["ideal_ratio"] for r in runs)
    for key in ("measured_ratio", "measured_over_ideal"):
        out[key] = summarize([r[key] for r in runs])
    return out


def _wan_vs_ideal_round(
    cpus: tuple[int, ...] | None, world: int = 4, k: int = 4, reverse: bool = False
) -> dict:
    base = dict(link="wan", epochs=4, warmup_epochs=0)
    if reverse:
        cpdp = _run(world, cpus, strategy="cpdp", sync_period=k, **base)
        ddp = _run(world, cpus, strategy="ddp", **base)
    else:
        ddp = _run(world, cpus, strategy="ddp", **base)
        cpdp = _run(world, cpus, strategy="cpdp", sync_period=k, **base)
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


def scaling(cpus: tuple[int, ...] | None = None) -> list[dict]:
    rows = []
    for model in ("cnn1d", "mlp"):
        for world in (2, 4, 8):
            res = _run(
                world, cpus, strategy="ddp", link="none", epochs=3, warmup_epochs=1, model=model
            )
            step = statistics.median(r["epoch_seconds"] for r in res["rows"][1:]) / res["steps"]
            rows.append({"model": model, "world_size": world, "step_s": step})
    return rows


def overlap(cpus: tuple[int, ...] | None = None, world: int = 2) -> dict:
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
        res = _run(world, cpus, overlap_boundary=flag, **base)
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


def default_job(cpus: tuple[int, ...] | None = None) -> dict:
    cfg = TrainConfig(progress=False)
    prepare_data(cfg)
    t0 = time.perf_counter()
    s = _workers(_autok, cfg.workers, cpus, cfg.model_dump_json())[0]["summary"]
    return {
        "wall_seconds": s["wall_seconds"],
        "process_seconds": time.perf_counter() - t0,
        "peak_test_accuracy": s["peak_test_accuracy"],
        "final_test_accuracy": s["final_test_accuracy"],
        "exposed_sync_seconds": s["exposed_sync_seconds"],
        "compute_seconds": s["compute_seconds"],
        "epochs": cfg.epochs,
    }


def machine(cpus: tuple[int, ...] | None = None) -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "pinned_cpus": list(cpus or all_cpus()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def _ratio(r) -> str:
    """A ratio with its spread and verdict; a bare float is a result saved before rounds."""
    return fmt(r) if isinstance(r, dict) else f"{r:.3f} (1 run)"


def _step_references(part: str, m: dict) -> list[str]:
    """(a), (g): beside the paired ratio, the unpaired one and the trimmed mean excess."""
    lines = []
    if "unpaired_ratio" in m:
        lines.append(
            f"| ({part}) reference: the two sides' median steps, unpaired "
            f"| {_ratio(m['unpaired_ratio'])} |"
        )
    if "trimmed_excess_us" in m:
        med, lo, hi = spread(m["trimmed_excess_us"])
        lines.append(
            f"| ({part}) reference: mean paired excess per step, 1% trimmed at each end (it "
            f"counts work on a few steps, which the median does not), µs "
            f"| {med:+.1f} ({lo:+.1f} to {hi:+.1f}) |"
        )
    if "bytecodes" in m:  # a count: no spread (benchmarks/bytecodes.py)
        (plain, plain_own), (ours, own) = m["bytecodes"]["plain"], m["bytecodes"]["autok"]
        lines.append(
            f"| ({part}) reference: Python bytecodes per step, counted (the same on every run), "
            f"plain / autok; of which autok's own (the model and the LR schedule are autok's "
            "on both sides) "
            f"| {plain:.0f} / {ours:.0f} ({ours / plain:.3f}×); {plain_own:.0f} / {own:.0f} |"
        )
    return lines


def _excess(m: dict) -> str:
    """(a), (g): the paired excess per step in µs, median over the rounds and its spread."""
    if "excess_us" not in m:  # a result saved before the ratio was paired: not one
        return ", unpaired (the two sides' median steps)"
    med, lo, hi = spread(m["excess_us"])
    pairs = min(m["pairs"])
    return (
        f", paired (excess per step {med:+.1f} µs, {lo:+.1f} to {hi:+.1f}; at least {pairs} "
        "pairs a round)"
    )


def _cores(cpus: list[int] | None) -> str:
    return ",".join(map(str, cpus)) if cpus else "(not recorded)"


def _when_measured(res: dict) -> list[str]:
    """One line naming when each part was measured, where the parts come from different runs
    (`--only` updates the saved results part by part)."""
    names = {v: k for k, v in PARTS.items()}
    dates: dict[str, list[str]] = {}
    for name, date in res.get("measured", {}).items():
        if name in res:
            dates.setdefault(date, []).append(f"({names.get(name, name)})")
    if len(dates) < 2:
        return []
    text = "; ".join(f"{' '.join(parts)} on {d}" for d, parts in sorted(dates.items()))
    return [f"Measured in separate runs: {text}.", ""]


def render_header(res: dict) -> str:
    """The machine line, when the parts were measured, how to read a ratio: render's opening."""
    return "\n".join(
        [
            "# Engine benchmark",
            "",
            f"Machine: {res['machine']['cpus']} CPUs, {res['machine']['platform']}, "
            f"torch {res['machine']['torch']}, {res['machine']['date']}; ranks pinned to cores "
            f"{_cores(res['machine'].get('pinned_cpus'))}",
            "",
            *_when_measured(res),
            "A ratio reads: median of the per-round ratios (min–max over the rounds, rounds; "
            "goal): verdict. Not resolved: the spread crosses the goal, or fewer than "
            f"{MIN_ROUNDS} rounds. Times are medians over the rounds.",
            "",
            "| measure | value |",
            "|---|---|",
        ]
    )


def render(res: dict) -> str:
    lines = render_header(res).split("\n")
    if "overhead" in res:
        o = res["overhead"]
        lines += [
            f"| (a) step time, plain torch DDP (world {o['world_size']}, link none) "
            f"| {o['plain_step_s'] * 1e3:.2f} ms |",
            f"| (a) step time, autok ddp | {o['autok_step_s'] * 1e3:.2f} ms |",
            f"| (a) **overhead ratio** autok / plain{_excess(o)} | **{_ratio(o['ratio'])}** |",
        ]
        lines += _step_references("a", o)
        if "loop" in o:
            lp = o["loop"]
            lines.append(
                f"| (a) the built-in loop (`autok train`) / a hand-written loop, separate runs: "
                f"{lp['autok_step_s'] * 1e3:.2f} / {lp['plain_step_s'] * 1e3:.2f} ms "
                f"| {_ratio(lp['ratio'])} |"
            )
    if "local_step" in res:
        g = res["local_step"]
        lines += [
            f"| (g) local step, hand-written no_sync() (world {g['world_size']}, link none) "
            f"| {g['plain_step_s'] * 1e3:.2f} ms |",
            f"| (g) local step, autok.Sync cpdp K={g['k']} | {g['autok_step_s'] * 1e3:.2f} ms |",
            f"| (g) **local-step ratio** autok / no_sync(){_excess(g)} "
            f"| **{_ratio(g['ratio'])}** |",
        ]
        lines += _step_references("g", g)
    if "boundary_fixed" in res:
        h = res["boundary_fixed"]
        for model in ("cnn1d", "mlp-3m"):
            m = h[model]
            lines += [
                f"| (h) {model} ({m['params'] / 1e6:.2f}M parameters, world {h['world_size']}, "
                f"link none): boundary step / bare all_reduce of {m['buffer_numel']:,} "
                f"floats | {m['autok_boundary_s'] * 1e3:.2f} / "
                f"{m['bare_allreduce_s'] * 1e3:.2f} ms |",
                f"| (h) **boundary fixed-cost ratio**, {model} | **{_ratio(m['ratio'])}** |",
            ]
            if "floor_ratio" in m:
                n = m["params"]
                lines += [
                    f"| (h) {model}, reference: the floor of any averaging, the parameters "
                    f"packed, all-reduced and written back ×1/N ({m['floor_s'] * 1e3:.2f} ms) / "
                    f"bare all_reduce of their {n:,} floats ({m['bare_params_s'] * 1e3:.2f} ms) "
                    f"| {_ratio(m['floor_ratio'])} |",
                    f"| (h) {model}, reference: torch's `average_parameters` "
                    f"({m['torch_average_s'] * 1e3:.2f} ms) / the same bare all_reduce "
                    f"| {_ratio(m['torch_average_ratio'])} |",
                ]
            if "bare_cpu_share" in m:
                share = m["bare_cpu_share"]["median"]
                idle = (1 - share) * m["bare_allreduce_s"]
                excess = m["autok_boundary_s"] - m["bare_allreduce_s"]
                lines.append(
                    f"| (h) {model}, reference: the bare all_reduce's CPU time (all of a rank's "
                    f"threads) / its wall time on the rank's cores; the idle rest "
                    f"({idle * 1e3:.2f} ms) bounds what pipelining could hide of the boundary's "
                    f"excess ({excess * 1e3:.2f} ms) | {_ratio(m['bare_cpu_share'])} |"
                )
    if "link_fidelity" in res:
        lf = res["link_fidelity"]
        for world in ("2", "4"):
            m = lf[world]
            lines += [
                f"| (i) {lf['strategy']} on {lf['link']}, world {world}: exposed per boundary "
                f"/ modelled T(S, N) | {m['exposed_s'] * 1e3:.2f} / "
                f"{m['modelled_s'] * 1e3:.2f} ms |",
                f"| (i) **link fidelity**, world {world} | **{_ratio(m['ratio'])}** |",
            ]
            if "held_ratio" in m:
                lines.append(
                    f"| (i) the emulator alone, world {world}: collective held / T(S, N) "
                    f"| {_ratio(m['held_ratio'])} |"
                )
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
            f"| (f) exposed-sync ratio cpdp K=4 / ddp | {_ratio(w['exposed_ratio'])} |",
            f"| (f) exposed-sync ratio per epoch after warmup | "
            f"{_ratio(w['post_warmup_exposed_ratio'])} |",
            f"| (f) wall-clock ratio cpdp K=4 / ddp | {_ratio(w['wall_ratio'])} |",
        ]
    if "boundary_cost" in res:
        b = res["boundary_cost"]
        lines += [
            f"| (b) exposed per ddp step, {b['link']}, world {b['world_size']} "
            f"| {b['ddp_step_s'] * 1e3:.1f} ms |",
            f"| (b) exposed per cpdp K=4 boundary, fused / two-phase "
            f"| {b['cpdp_fused_boundary_s'] * 1e3:.1f} / "
            f"{b['cpdp_two-phase_boundary_s'] * 1e3:.1f} ms |",
            f"| (b) **boundary-cost ratio** cpdp / ddp, fused | **{_ratio(b['ratio_fused'])}** |",
            f"| (b) boundary-cost ratio cpdp / ddp, two-phase | {_ratio(b['ratio_two-phase'])} |",
        ]
    if "wan_vs_ideal" in res:
        c = res["wan_vs_ideal"]
        lines += [
            f"| (c) wan, world {c['world_size']}: ddp per step compute / comm "
            f"| {c['compute_per_step_s'] * 1e3:.1f} / {c['comm_per_step_s'] * 1e3:.1f} ms |",
            f"| (c) **training-time ratio** cpdp K={c['k']} / ddp, measured (ideal "
            f"{c['ideal_ratio']:.3f}) | **{_ratio(c['measured_ratio'])}** |",
            f"| (c) training-time ratio, measured / ideal | {_ratio(c['measured_over_ideal'])} |",
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


# ----- (i) the emulated link: exposed time per boundary against the modelled T(S, N) -------------


def _records_held(rank: int, world: int, cfg_json: str) -> dict:
    """_records, also timing each averaging collective as the link holds it (issue to release)."""
    import autok.trainer.engine.averaging as averaging

    held, plain = [], averaging.allreduce_sum_

    def timed(buf, clock):
        seconds = plain(buf, clock)
        held.append(seconds)
        return seconds

    averaging.allreduce_sum_ = timed
    return _records(rank, world, cfg_json) | {"held": held}


def link_fidelity(rounds: int = MIN_ROUNDS, cpus: tuple[int, ...] | None = None) -> dict:
    """cpdp K=4 (fused) on `wan`, world 2 and 4, one run per world and round: the median
    exposed sync per boundary after warmup (a record carries the averaging of the boundary
    before it: pack, the held collective, unpack) over T(S, N) of the link model for that
    boundary's bytes S; beside it, the emulator alone: the median time a collective is held
    (issue to release) over T."""
    from autok.trainer.engine.link import PROFILES

    base = dict(strategy="cpdp", sync_period=4, link="wan", epochs=3, warmup_epochs=1)
    per: dict[int, list[float]] = {2: [], 4: []}
    modelled: dict[int, float] = {}
    exposed: dict[int, list[float]] = {2: [], 4: []}
    held: dict[int, list[float]] = {2: [], 4: []}
    for r in range(rounds):
        for world in (2, 4)[:: 1 if r % 2 == 0 else -1]:
            cfg = TrainConfig(workers=world, progress=False, **base)
            prepare_data(cfg)
            res = _workers(_records_held, world, cpus, cfg.model_dump_json())[0]
            recs = [x for x in res["records"] if x.epoch >= 1]
            nbytes = statistics.median(x.bytes_communicated for x in recs)
            modelled[world] = PROFILES["wan"].allreduce_seconds(int(nbytes), world)
            exposed[world].append(statistics.median(x.exposed_sync_seconds for x in recs))
            per[world].append(exposed[world][-1] / modelled[world])
            held[world].append(statistics.median(res["held"]) / modelled[world])
    return {
        str(w): {
            "modelled_s": modelled[w],
            "exposed_s": statistics.median(exposed[w]),
            "ratio": summarize(per[w], LINK_GOAL),
            "held_ratio": summarize(held[w]),
        }
        for w in (2, 4)
    } | {"link": "wan", "strategy": "cpdp K=4 fused"}


def run_part(name: str, rounds: int, cpus: tuple[int, ...]):
    """One part: `rounds` goes to the parts that take ratios, `cpus` to every part."""
    fn = globals()[name]
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in (("rounds", rounds), ("cpus", cpus)) if k in params})


def main(argv: list[str] | None = None) -> None:
    run_parts(parse(argv))


def run_parts(args: argparse.Namespace) -> None:
    """The parts `args.only` names (flags parsed by benchmarks/bench_cli.py)."""
    # A partial run (--only) updates the saved results instead of replacing them.
    saved = RESULTS / "engine.json"
    res: dict = json.loads(saved.read_text()) if saved.exists() else {}
    res["machine"] = machine(args.cpus)
    names = [PARTS[part.strip()] for part in args.only.split(",")]
    if "diloco" in names:  # its own results file
        from benchmarks.diloco import main as run_diloco

        run_diloco()
        names.remove("diloco")
        if not names:
            return
    for name in names:
        res[name] = run_part(name, args.rounds, args.cpus)
        # a partial run keeps the other parts: each part says when it was measured
        res.setdefault("measured", {})[name] = res["machine"]["date"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine.json").write_text(json.dumps(res, indent=2) + "\n")
    text = render(res)
    (RESULTS / "engine.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
