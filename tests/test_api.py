"""The public API alone: `autok.Sync` in a user's own loop, on real gloo process groups."""

from __future__ import annotations

import copy
import io
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import autok
from tests.dist import run_dist

pytestmark = pytest.mark.dist


def _model() -> nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _batches(rank: int, n: int, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    out = []
    for _ in range(n):
        x = torch.randn(batch, 8, generator=g)
        out.append((x, x.sum(1, keepdim=True).sin()))
    return out


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _agree(t: torch.Tensor) -> bool:
    world = dist.get_world_size()
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous())  # test-only collective
    return all(torch.equal(out[0], o) for o in out)


def _train(sync, optimizer, batches, micro: int = 1, inf_at: int | None = None, scaler=None):
    """A user's loop: returns, per step, (is_boundary, replicas agree after it)."""
    log = []
    for i, (x, y) in enumerate(batches):
        with sync.step() as s:
            optimizer.zero_grad()
            for xm, ym in zip(x.chunk(micro), y.chunk(micro), strict=True):
                loss = nn.functional.mse_loss(sync.model(xm), ym) / micro
                (scaler.scale(loss) if scaler else loss).backward()
            if inf_at == i:  # this rank's (scaled) gradients overflow in backward, as in fp16
                sync.model(x[:1]).sum().mul(math.inf).backward()
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            s.loss = loss
        log.append((s.is_boundary, _agree(_flat(sync.module)) if s.is_boundary else None))
    return log


def _basic_worker(rank, world):
    res = {}
    # 1. cpdp + SGD (fused boundary), K = 3: boundaries every 3 optimizer steps, replicas agree
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=3, link="none")
    res["sgd"] = _train(sync, opt, _batches(rank, 12))
    # auto: two-phase at the first boundary step, whose loop is seen to leave the gradients
    # alone (trainer/engine/grad_watch.py), fused after it
    res["fused"] = sync.strategy.fused_gradients
    # a fused boundary is one gradient sync and one parameter sync in ONE collective
    res["fused_counts"] = (sync.grad_syncs, sync.param_syncs, sync.collectives)
    # 2. sync_now() mid-interval: a boundary now, replicas identical, the interval recorded
    _train(sync, opt, _batches(rank, 2))
    sync.sync_now()
    res["sync_now"] = (_agree(_flat(model)), sync.last_boundary.interval_steps)
    sync.close()
    # 3. AdamW: not linear in the gradient, so two collectives (grad AllReduce + average)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=2, link="none")
    res["adamw_fused"] = sync.strategy.fused_gradients
    res["adamw"] = _train(sync, opt, _batches(rank, 8))
    # two-phase: the gradient AllReduce (one DDP bucket for this model) and the average
    res["two_phase_counts"] = (sync.grad_syncs, sync.param_syncs, sync.collectives)
    sync.close()
    # 4. gradient accumulation: K counts optimizer steps, not micro-batches
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    samples = []

    class Samples:
        def on_boundary(self, stats, decision):
            samples.append(stats.samples)

    sync = autok.Sync(model, opt, sync_period=4, link="none", observers=[Samples()])
    res["accum"] = _train(sync, opt, _batches(rank, 8), micro=2)
    res["accum_samples"] = samples
    sync.close()
    return res


def test_own_loop_replicas_agree_after_every_boundary_and_k_counts_optimizer_steps():
    for res in run_dist(_basic_worker, 2):
        assert res["fused"] and not res["adamw_fused"]
        for name, k in (("sgd", 3), ("adamw", 2), ("accum", 4)):
            log = res[name]
            assert [b for b, _ in log] == [(i + 1) % k == 0 for i in range(len(log))], name
            assert all(ok for b, ok in log if b), name
        assert res["sync_now"] == (True, 2)
        assert res["fused_counts"] == (4, 4, 5)  # 12 steps, K = 3; the first: bucket + average
        assert res["two_phase_counts"] == (4, 4, 8)  # 8 steps, K = 2
        # 2 micro-batches of 8 per step, 4 steps per boundary, 2 ranks
        assert res["accum_samples"] == [4 * 16 * 2, 4 * 16 * 2]


def _scaler_worker(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    steps = []

    class Where:
        def on_boundary(self, stats, decision):
            steps.append(stats.global_step)

    sync = autok.Sync(model, opt, sync_period=4, link="none", observers=[Where()])
    # rank 1 overflows at a local step: GradScaler skips its optimizer step there only
    log = _train(sync, opt, _batches(rank, 12), inf_at=5 if rank == 1 else None, scaler=scaler)
    sync.close()
    return steps, log, scaler.get_scale(), bool(torch.isfinite(_flat(model)).all())


def test_a_step_gradscaler_skips_on_one_rank_still_counts_so_ranks_agree_on_boundaries():
    (steps0, log0, scale0, fin0), (steps1, log1, scale1, fin1) = run_dist(_scaler_worker, 2)
    assert steps0 == steps1 == [3, 7, 11]
    assert scale1 < scale0  # rank 1 really skipped (its scale backed off)
    assert all(ok for b, ok in log0 + log1 if b) and fin0 and fin1


def _resume_worker(rank, world):
    opts = dict(strategy="cpdp", sync_period=4, slowmo_beta=0.3, link="lan", link_jitter_ms=1)
    batches = _batches(rank, 10)

    def fresh():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        return model, opt, autok.Sync(model, opt, **opts)

    model, opt, sync = fresh()
    _train(sync, opt, batches)
    whole = _flat(model)
    sync.close()

    model, opt, sync = fresh()
    _train(sync, opt, batches[:6])  # stopped mid-interval: 2 steps after the boundary at 4
    buf = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sync": sync.state_dict()}, buf
    )
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # plain tensors and containers only
    model, opt, sync = fresh()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sync.load_state_dict(state["sync"])
    _train(sync, opt, batches[6:])
    resumed = _flat(model)
    sync.close()
    return whole, resumed


def test_state_dict_resume_is_bit_for_bit_the_uninterrupted_run():
    for whole, resumed in run_dist(_resume_worker, 2):
        assert torch.equal(whole, resumed)


def _foreign_state_worker(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cpdp = autok.Sync(model, opt, strategy="cpdp", sync_period=2, link="none")
    _train(cpdp, opt, _batches(rank, 3))
    saved = cpdp.state_dict()
    cpdp.close()
    said = {}
    others = {
        "ddp": dict(strategy="ddp", link="none"),
        "policy": dict(strategy="cpdp", policy="exposed-sync", link="none"),
        "empty": dict(strategy="cpdp", link="none"),
        "none": dict(strategy="cpdp", link="none"),
    }
    for name, kwargs in others.items():
        sync = autok.Sync(model, opt, **kwargs)
        state = {"empty": {}, "none": None}.get(name, saved)
        try:
            sync.load_state_dict(state)
        except ValueError as exc:
            said[name] = str(exc)
        sync.close()
    same = autok.Sync(model, opt, strategy="cpdp", sync_period=2, link="none")
    same.load_state_dict(saved)  # its own kind loads
    same.close()
    return said


def test_a_state_of_another_kind_of_sync_is_refused_naming_what_differs():
    (said,) = run_dist(_foreign_state_worker, 1)
    assert said["ddp"] == "load_state_dict: saved by averaging; this Sync's strategy is ddp"
    assert said["policy"] == (
        "load_state_dict: saved with policy 'fixed'; this Sync has 'exposed-sync'"
    )
    assert said["empty"] == "load_state_dict: not an autok.Sync state (no 'counters')"
    assert said["none"].startswith("load_state_dict: expected the dict sync.state_dict()")


def _step_object_worker(rank, world):
    """One `sync.step()` object per step: entered twice (also after an opening that raised),
    nested, or a fresh one after an opening that raised: the engine says so or carries on as a
    fresh step would."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=2, link="none")
    (x, y), said = _batches(rank, 1)[0], {}

    def body(s):
        opt.zero_grad()
        loss = nn.functional.mse_loss(sync.model(x), y)
        loss.backward()
        opt.step()
        s.loss = loss

    def refused(step) -> str | None:
        """What entering `step` raises (None: it ran a step)."""
        try:
            with step as s:
                body(s)
        except RuntimeError as exc:
            return str(exc)
        return None

    step = sync.step()
    with step as s:
        body(s)
    said["reused"] = refused(step)
    boundary = sync.step()  # the second step: a boundary, whose backward has no context
    with boundary as s:
        try:
            with sync.step():
                pass
        except RuntimeError as exc:
            said["nested"] = str(exc)
        body(s)
    said["reused boundary"] = refused(boundary)
    sync.clock = "not a clock"  # its opening raises after the step's state is made
    failed = sync.step()
    try:
        with failed as s:
            body(s)
    except AttributeError:
        said["raised"] = True
    sync.clock = None
    # an object whose opening raised is spent too: it would carry that opening's state
    said["reentered"] = refused(failed)
    with sync.step() as s:  # nothing was left open
        body(s)
    said["steps"], said["boundaries"] = sync.global_step, sync.boundary
    sync.close()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(model, opt, strategy="ddp", link="none")
    ddp_step = sync.step()
    with ddp_step as s:
        body(s)
    said["reused ddp"] = refused(ddp_step)
    said["ddp steps"] = sync.global_step
    sync.close()
    return said


def test_a_step_object_serves_one_step_and_a_failed_opening_leaves_none_open():
    (said,) = run_dist(_step_object_worker, 1)
    assert said["reused"] == "a sync.step() serves one step: open a new one for each"
    assert said["nested"] == "sync.step() is already open: one optimizer step at a time"
    assert said["raised"] is True
    assert said["reentered"] == said["reused"]
    assert said["reused boundary"] == said["reused ddp"] == said["reused"]
    assert said["ddp steps"] == 1
    assert (said["steps"], said["boundaries"]) == (3, 1)


def _exposed_sync_worker(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = autok.Sync(
        model,
        opt,
        sync_period=1,
        policy="exposed-sync",
        sync_window=2,
        link="wan",
        slowmo_beta=0,
        loss_rise=100.0,  # this tiny regression's loss is noisy: the guard is not under test
        drift_limit=1e6,
    )
    ks, nexts = [], []

    class Next:
        def on_boundary(self, stats, decision):
            nexts.append((stats.sync_period, decision.next_sync_period, decision.reason))

    sync.observers.append(Next())
    for _ in range(3):
        _train(sync, opt, _batches(rank, 16))
        ks.append(sync.sync_period)
    decisions = sync.last_decision
    # A loop whose intervals can hold at most 3 steps (its forced boundaries): K and every
    # decision from here on are capped there, and the records say so.
    sync.period_cap = 3
    capped = sync.sync_period
    nexts.clear()
    _train(sync, opt, _batches(rank, 12))
    sync.close()
    return ks, decisions.reason, capped, nexts


def test_k_rises_under_exposed_sync_on_the_emulated_wan_and_ranks_agree():
    (k0, why0, capped, nexts), (k1, why1, _, nexts1) = run_dist(_exposed_sync_worker, 2)
    assert k0 == k1 and why0 == why1 and nexts == nexts1
    assert k0[-1] > 3, (k0, why0)  # a tiny model's step is far shorter than a 33 ms WAN sync
    assert capped == 3
    assert nexts and all(k <= 3 and nxt <= 3 for k, nxt, _ in nexts), nexts
    assert any("capped at 3" in why for _, _, why in nexts), nexts


def _builtin_equivalence_worker(rank, world):
    """The built-in loop is one client of the API: a hand-written loop over autok.Sync with the
    same data, model and optimizer gives its parameters bit for bit."""
    from torch.utils.data import DataLoader, DistributedSampler

    from autok.trainer.engine.optim import build_optimizer, build_scheduler
    from autok.trainer.loop.data import build_splits
    from autok.trainer.loop.models import build_model
    from autok.trainer.loop.run import Trainer, seed_everything
    from tests.helpers import tiny_cfg

    cfg = tiny_cfg(strategy="cpdp", sync_period=3, workers=world, epochs=2, slowmo_beta=0.3)
    tr = Trainer(cfg, rank, world, None)
    tr.run()
    builtin = _flat(tr.model)

    splits = build_splits(cfg.dataset, None, mnist1d_samples=cfg.mnist1d_samples)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, splits.meta.input_shape, splits.meta.num_classes)
    seed_everything(cfg.seed + 1000 * (rank + 1))
    sampler = DistributedSampler(splits.train, world, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(splits.train, batch_size=cfg.batch_size, sampler=sampler)
    opt = build_optimizer("sgd", model, cfg.lr, cfg.momentum, cfg.weight_decay, False)
    sched = build_scheduler(opt, cfg.epochs * len(loader), len(loader), cfg.lr_schedule)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=3, slowmo_beta=0.3, link="none")
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        sync.warmup = epoch < cfg.warmup_epochs  # K = 1 in the warmup epoch, as autok train
        for i, (x, y) in enumerate(loader):
            with sync.step(boundary=i == len(loader) - 1) as s:  # epochs end identical
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(sync.model(x), y)
                loss.backward()
                opt.step()
                s.loss = loss
            sched.step()
    sync.close()
    return builtin, _flat(model)


def test_a_hand_written_loop_over_the_api_equals_autok_train_bit_for_bit():
    for builtin, own in run_dist(_builtin_equivalence_worker, 2):
        assert torch.equal(builtin, own)


@pytest.mark.parametrize(
    "options, flag",
    [
        ({"sync_period": 0}, "--sync-period"),
        ({"strategy": "fedavg"}, "--strategy"),
        ({"link_rtt_ms": math.inf}, "--link-rtt-ms"),
        ({"slowmo_beta": 1.0}, "--slowmo-beta"),
        ({"sync_perod": 4}, "--sync-perod"),
        ({"strategy": "ddp", "sync_period": 4}, "--sync-period"),
        ({"metrics_per_rank": True}, "--metrics-per-rank"),
        ({"metrics_host": "example.com"}, "--metrics-host"),
        ({"boundary": "fused", "_adamw": True}, "--boundary"),
        ({"sync_period": True}, "--sync-period"),  # a boolean is not the number 1
        ({"metrics_port": True}, "--metrics-port"),
        ({"sync_period": torch.tensor(True)}, "--sync-period"),  # torch's boolean too
        ({"seed": np.True_}, "--seed"),  # and NumPy's
        ({"policy": "qsr", "k_growth": 4}, "--k-growth"),  # unread by the chosen policy
        ({"target_sync_share": 0.5}, "--target-sync-share"),
        ({"policy": "exposed-sync", "skew_strong": 1.0}, "--skew-strong"),  # under --skew-drift
        ({"policy": "exposed-sync", "skew_strong": 2.3, "skew_cap": 1}, "--skew-strong"),
        ({"policy": "exposed-sync", "skew_grade_gamma": 0.28}, "--skew-grade-gamma"),  # no grade
        ({"policy": "exposed-sync", "skew_power": 0.6, "skew_drift": 0.0}, "--skew-power"),
        ({"policy": "exposed-sync", "skew_cap": 8, "skew_drift": 0.0}, "--skew-cap"),
        ({"policy": "exposed-sync", "skew_clear": 0.25, "skew_drift": 0.0}, "--skew-clear"),
        ({"policy": "composite", "skew_clear": 1.0}, "--skew-clear"),  # at --skew-drift itself
        ({"policy": "exposed-sync", "skew_clear": -0.5}, "--skew-clear"),
        ({"policy": "exposed-sync", "k_floor": 2, "sync_period": 1}, "--k-floor"),
        ({"policy": "exposed-sync", "link_shift": 0.5}, "--link-shift"),
        ({"policy": "exposed-sync", "k_rule": "double", "epoch_rounds": True}, "--epoch-rounds"),
        ({"policy": "qsr", "epoch_rounds": True}, "--epoch-rounds"),  # unread by the policy
        ({"strategy": "ddp", "sync_optimizer_state": True}, "--sync-optimizer-state"),  # unread
        ({"strategy": "localsgd", "boundary": "two-phase"}, "--boundary"),  # by the strategy
        ({"strategy": "localsgd", "slowmo_lr_aware": True}, "--slowmo-lr-aware"),  # at β 0
        ({"peak_lr": math.nan}, "peak_lr"),
        ({"peak_lr": -1.0}, "peak_lr"),
        ({"peak_lr": True}, "peak_lr"),
        ({"peak_lr": 1e200, "policy": "qsr"}, "peak_lr"),  # its α² overflowed at a boundary
        # outer_optimizer as a factory (trainer/engine/outer.py, TorchOuter): what it returns, and
        # what
        # only the named outer steps read
        ({"outer_optimizer": lambda params: None}, "outer_optimizer"),  # not an optimizer
        ({"outer_optimizer": lambda p: torch.optim.SGD(p[:1], lr=0.1)}, "outer_optimizer"),
        ({"outer_optimizer": lambda p: torch.optim.SGD(p + p, lr=0.1)}, "outer_optimizer"),
        ({"outer_optimizer": lambda p: torch.optim.SGD(p, lr=-1.0)}, "outer_optimizer"),
        ({"outer_optimizer": torch.optim.Adam, "slowmo_beta": 0.3}, "outer_optimizer"),
        ({"outer_optimizer": torch.optim.Adam, "slowmo_lr_aware": True}, "outer_optimizer"),
        ({"outer_optimizer": torch.optim.Adam, "outer_lr": 0.7}, "outer_optimizer"),
        ({"outer_optimizer": torch.optim.Adam, "outer_momentum": 0.9}, "outer_optimizer"),
        ({"outer_optimizer": torch.optim.Adam, "strategy": "ddp"}, "outer_optimizer"),
        (
            {"outer_optimizer": torch.optim.Adam, "strategy": "localsgd", "fragments": 2},
            "outer_optimizer",
        ),
        ({"outer_optimizer": torch.optim.Adam, "outer_state_device": "cpu"}, "outer_optimizer"),
        # refused before DDP is built (its construction is a collective) and so here, without
        # a process group: more fragments than the model's 161 parameters; a NaN LR in the
        # group a policy reads its peak from
        ({"strategy": "localsgd", "fragments": 1000, "sync_period": 1000}, "--fragments"),
        ({"policy": "qsr", "_nan_lr": True}, "peak_lr"),
    ],
)
def test_bad_arguments_raise_one_line_naming_the_option(options, flag):
    model = _model()
    adamw = options.pop("_adamw", False)
    opt = (torch.optim.AdamW if adamw else torch.optim.SGD)(model.parameters(), lr=0.1)
    if options.pop("_nan_lr", False):
        opt.param_groups[0]["lr"] = math.nan
    with pytest.raises(autok.OptionError) as info:
        autok.Sync(model, opt, **options)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert msg.startswith(flag) and "\n" not in msg, msg
    if "perod" in flag:  # an unknown name: the hint speaks of the API, not of a config file
        assert "not an option of autok.Sync" in msg, msg


def _delayed_state_worker(rank, world, beta2, late=None):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, beta2))
    try:
        autok.Sync(
            model, opt, strategy="cpdp", sync_period=4, sync_optimizer_state=True,
            **(late or {"overlap_boundary": True}),
        )  # fmt: skip
    except autok.OptionError as exc:
        return str(exc)
    return None


def test_a_delayed_state_average_is_refused_where_adams_second_moment_can_turn_negative():
    """v_i + (v̄ − v_i,sent) after one step of v ← β2·v + (1 − β2)·g² is at worst
    v_i·(1/N − (1 − β2)): negative on N > 1/(1 − β2) ranks (1.67 for β2 = 0.4; 1000 for
    Adam's default 0.999, which 2 ranks keep)."""
    said = run_dist(_delayed_state_worker, 2, 0.4)
    assert all(s is not None and s.startswith("--sync-optimizer-state: ") for s in said), said
    assert "\n" not in said[0] and "2 ranks" in said[0]
    assert run_dist(_delayed_state_worker, 2, 0.999) == [None, None]


def test_a_fragment_delay_is_the_same_late_state_average_and_is_refused_alike():
    """--fragment-delay τ takes the overlapped path too (τ = 1 is --overlap-boundary); after τ
    steps the bound is N > 1/(1 − β2^τ): β2 = 0.6 keeps 2 ranks at τ = 1 (2.5), not at τ = 2
    (1.56)."""
    said = run_dist(_delayed_state_worker, 2, 0.4, {"fragment_delay": 1})
    assert all(s is not None and s.startswith("--sync-optimizer-state: ") for s in said), said
    assert run_dist(_delayed_state_worker, 2, 0.6) == [None, None]
    said = run_dist(_delayed_state_worker, 2, 0.6, {"fragment_delay": 2})
    assert said[0] is not None and "--fragment-delay 2" in said[0] and "\n" not in said[0], said


def _service_args_worker(rank, world, tmp):
    """Sync's own arguments, refused (OptionError) before DDP is built, on every rank: where
    one rank alone finds the fault (rank 0 makes out_dir; each rank binds its own port), the
    others say which rank refused, rather than wait in DDP's set-up."""
    import socket

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if rank == 0:
        (Path(tmp) / "afile").write_text("")
    dist.barrier()
    said = {}
    with socket.socket() as taken:  # a port some other server holds (each rank its own)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = [0] * world
        dist.all_gather_object(ports, port)
        cases = {
            "empty": {"out_dir": ""},
            "file": {"out_dir": Path(tmp) / "afile"},
            "under a file": {"out_dir": Path(tmp) / "afile" / "run"},
            "rank 0's port": {"metrics_port": ports[0]},
            "rank 1's port": {"metrics_port": ports[1] - 1, "metrics_per_rank": True},
            "above 65535": {"metrics_port": 65535, "metrics_per_rank": True},
        }
        for name, kwargs in cases.items():
            try:
                autok.Sync(model, opt, **kwargs)
            except autok.OptionError as exc:
                said[name] = str(exc)
    return said


def test_sync_own_arguments_are_refused_on_every_rank_before_ddp_is_built(tmp_path):
    said0, said1 = run_dist(_service_args_worker, 2, str(tmp_path))
    for said in (said0, said1):
        assert said["empty"].startswith("out_dir: empty")
    for name in ("file", "under a file"):
        assert said0[name].startswith("out_dir: cannot make "), said0[name]
        assert said1[name] == "autok.Sync: rank 0 refused its arguments (see its error)"
    assert said0["rank 0's port"].startswith("--metrics-port: ")
    assert "choose another port" in said0["rank 0's port"]
    assert said1["rank 0's port"] == "autok.Sync: rank 0 refused its arguments (see its error)"
    assert said1["rank 1's port"].startswith("--metrics-port: ")
    assert said0["rank 1's port"] == "autok.Sync: rank 1 refused its arguments (see its error)"
    assert said1["above 65535"] == "--metrics-port: 65536 (PORT + rank 1) is above 65535"


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"model": nn.ReLU()}, "model: it has no parameters"),
        ({"model": "a model"}, "model: a str, not a torch.nn.Module"),
        ({"device": "no-such-device"}, "device: 'no-such-device' is not a device torch knows"),
        ({"device": 0}, "device: 0 is not a torch.device"),
        ({"device": "meta"}, "device: meta, but the model's parameters are on cpu"),
        ({"out_dir": 5}, "out_dir: a int; give a path"),
        ({"observers": 5}, "observers: a int; give a list"),
    ],
)
def test_arguments_of_the_wrong_kind_are_refused_naming_them(kwargs, said):
    """Before any process group is needed: the same refusal on every rank."""
    model = kwargs.pop("model", None) or _model()
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    with pytest.raises(autok.OptionError) as e:
        autok.Sync(model, opt, **kwargs)
    assert str(e.value).startswith(said), str(e.value)


def test_without_a_process_group_the_error_says_so():
    model = _model()
    with pytest.raises(autok.OptionError, match="process group"):
        autok.Sync(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_the_own_loop_example_runs_under_torchrun_and_resumes_bit_for_bit(tmp_path):
    """examples/own_loop.py, as the README runs it: 2 processes, AdamW, GradScaler, cosine LR,
    its own checkpoints with sync.state_dict(); replicas agree at the end. Stopped mid-run (in
    the middle of an interval: K = 2, stopped after step 21) and resumed, it ends bit for bit
    where the same run without a stop ends (with the fixed policy: exposed-sync picks K from
    measured times)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [str(root / "examples" / "own_loop.py")]

    def run(*args):
        return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300)

    def sums(res):
        assert res.returncode == 0, res.stderr[-3000:]
        # found anywhere, not line by line: the ranks share torchrun's stdout, and an
        # unbuffered print writes its text and its newline apart, so two ranks' lines can
        # interleave ("...sum 1.5rank 1: done ...\n\n")
        found = re.findall(r"rank (\d+): done at step \d+, parameter sum ([-+0-9.e]+)", res.stdout)
        return {f"rank {r}": v for r, v in found}

    readme = sums(run("--steps", "30", "--out", str(tmp_path / "readme")))
    assert set(readme) == {"rank 0", "rank 1"} and len(set(readme.values())) == 1
    assert (tmp_path / "readme" / "boundaries.jsonl").stat().st_size > 0

    fixed = ["--steps", "40", "--policy", "fixed", "--save-every", "7"]
    straight = sums(run(*fixed, "--out", str(tmp_path / "straight")))
    assert len(set(straight.values())) == 1
    stopped = run(*fixed, "--stop-after", "21", "--out", str(tmp_path / "stopped"))
    assert stopped.returncode == 0 and "stopped after step 21" in stopped.stdout
    assert sums(stopped) == {}
    saved = (tmp_path / "stopped" / "rank0.pt").read_bytes()
    refused = run(*fixed[2:], "--steps", "41", "--resume", "--out", str(tmp_path / "stopped"))
    # each rank exits 2 with that line; torchrun itself then exits 1
    assert refused.returncode != 0
    assert "error: --steps: the checkpoint is of a 40-step run" in refused.stderr
    assert (tmp_path / "stopped" / "rank0.pt").read_bytes() == saved  # nothing overwritten
    resumed = sums(run(*fixed, "--resume", "--out", str(tmp_path / "stopped")))
    assert resumed == straight  # the parameter sums, every digit
    for rank in (0, 1):
        a, b = (
            torch.load(tmp_path / d / f"rank{rank}.pt", weights_only=True)["model"]
            for d in ("straight", "stopped")
        )
        assert all(torch.equal(a[k], b[k]) for k in a)


def _sync_now_bytes_worker(rank, world):
    from autok.trainer.engine.exact_sums import N_SCALARS

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=2, link="none", boundary="fused")
    numel = sum(p.numel() for p in model.parameters())
    log = _train(sync, opt, _batches(rank, 3))  # steps 0-1: a fused boundary; step 2 local
    fused_bytes = sync.last_boundary.bytes_communicated
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    sync.sync_now()
    after = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    return {
        "boundaries": [b for b, _ in log],
        "fused": fused_bytes,
        "sync_now": sync.last_boundary.bytes_communicated,
        "expected": ((2 * numel + N_SCALARS) * 4, (numel + N_SCALARS) * 4),
        "momentum_kept": all(torch.equal(a, b) for a, b in zip(momentum, after, strict=True)),
        "agree": _agree(_flat(model)),
    }


def test_sync_now_sends_no_gradients_on_the_fused_boundary():
    """A boundary step's fused collective carries g_i beside θ_i; sync_now() has no boundary
    step, so it sends θ_i alone (half the bytes) and leaves the momentum buffers as they are."""
    for res in run_dist(_sync_now_bytes_worker, 2):
        assert res["boundaries"] == [False, True, False]
        assert (res["fused"], res["sync_now"]) == res["expected"]
        assert res["momentum_kept"] and res["agree"]


def _refusals(sync) -> list[str]:
    out = []
    for call in (lambda: sync.step().__enter__(), sync.sync_now):
        try:
            call()
        except RuntimeError as e:
            out.append(str(e))
    return out


def _close_frees_worker(rank, world, strategy, link):
    import gc
    import weakref

    gc.disable()  # only reference counting: what close() leaves in a cycle stays
    try:
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # cpdp: the two-phase boundary
        period = 1 if strategy == "ddp" else 2
        sync = autok.Sync(model, opt, strategy=strategy, sync_period=period, link=link)
        log = _train(sync, opt, _batches(rank, 3))
        builtin = sync.grad_state.builtin
        sync.close()
        sync.close()  # a second close does nothing (no collective: it would hang alone)
        refused = _refusals(sync)
        hooks = len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)
        saved = sync.state_dict()["counters"]["global_step"]
        refs = weakref.ref(sync), weakref.ref(sync.model), weakref.ref(sync.model.reducer)
        del sync, model, opt
        freed = [r() is None for r in refs]
    finally:
        gc.enable()
    return {
        "builtin": builtin,
        "boundaries": [b for b, _ in log],
        "freed": freed,
        "refused": refused,
        "hooks": hooks,
        "saved": saved,
    }


@pytest.mark.parametrize(
    ("strategy", "link", "builtin", "boundaries"),
    [
        ("cpdp", "wan", False, [False, True, False]),  # the comm hook through the emulator
        ("ddp", "none", True, [True, True, True]),  # the built-in path: a hook on a parameter
    ],
)
def test_a_closed_sync_and_its_ddp_go_when_the_loop_drops_them(strategy, link, builtin, boundaries):
    """sync.model reports to the Sync that made it, and the built-in path's hook on a parameter
    holds the reducer: cycles that only the cyclic GC frees (with the gloo group the reducer
    holds), perhaps at interpreter exit. close() breaks them: with the GC off, the Sync, its DDP
    and the reducer are freed the moment the loop drops its names. Closed, the Sync leaves the
    optimizer's hooks, refuses a step or a boundary, and still gives its state."""
    for res in run_dist(_close_frees_worker, 2, strategy, link):
        assert (res["builtin"], res["boundaries"]) == (builtin, boundaries)
        assert res["freed"] == [True, True, True]
        assert res["refused"] == [
            "sync.step() after sync.close(): make a new autok.Sync",
            "sync.sync_now() after sync.close(): the replicas agree",
        ]
        assert (res["hooks"], res["saved"]) == (0, 3)


def _loss_kinds_worker(rank, world):
    """Losses given as a scalar tensor, a bfloat16 one, a vector (summed) and a float, with the
    held tensors read every 3: the boundary's train loss is the mean over ranks and steps of
    what each step gave, and a state saved mid-interval holds the sum. An observer reading
    `last_step` at the boundary reads the boundary's step, which counts the averaging."""
    import autok.trainer.engine.loss_sum

    autok.trainer.engine.loss_sum.LOSSES_HELD = 3  # read the held loss tensors inside the interval
    seen = []

    class Record:
        def on_boundary(self, stats, decision):
            seen.append(stats.train_loss)
            steps.append(sync.last_step.is_boundary)  # the boundary's own step, read here

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=7, observers=[Record()])
    given, saved, steps = [], None, []
    for i, (x, y) in enumerate(_batches(rank, 7)):
        with sync.step() as s:
            opt.zero_grad()
            loss = nn.functional.mse_loss(sync.model(x), y)
            loss.backward()
            opt.step()
            kind = i % 4
            if kind == 0:
                s.loss = loss
            elif kind == 1:
                s.loss = loss.to(torch.bfloat16)
            elif kind == 2:
                s.loss = torch.stack([loss, 2 * loss])  # summed: 3 × the loss
            else:
                s.loss = loss.item()
            given.append(float(s.loss.double().sum()) if kind != 3 else s.loss)
        if i == 4:  # 3 folded, 2 held
            c = sync.state_dict()["counters"]
            saved = c["loss_sum"] + math.fsum(c["loss_held"])
    steps.append(sync.last_step.sync_seconds > 0)  # the boundary's averaging counted in it
    total = torch.tensor([math.fsum(given)], dtype=torch.float64)
    dist.all_reduce(total)
    sync.close()
    return seen, total.item() / (7 * world), saved, math.fsum(given[:5]), steps


def test_the_train_loss_is_the_mean_of_every_kind_of_loss_a_step_gives():
    for seen, expected, saved, saved_expected, steps in run_dist(_loss_kinds_worker, 2):
        assert len(seen) == 1 and seen[0] == pytest.approx(expected, rel=1e-6)
        assert saved == pytest.approx(saved_expected, rel=1e-12)
        assert steps == [True, True]


def _ddp_records_worker(rank, world):
    """Two ddp Syncs over the same steps: one with no observer (its records kept lazily, built
    on reading) and one whose observer makes every record at its boundary. Past the first
    guard check, the lazy one takes ddp_path.close_ddp_lazily."""
    from dataclasses import asdict

    class Keep:
        def __init__(self):
            self.records = []

        def on_boundary(self, stats, decision):
            self.records.append(stats)

    keep = Keep()
    syncs = []
    for observers in (None, [keep]):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        syncs.append((autok.Sync(model, opt, strategy="ddp", observers=observers), opt, model))
    timing = {"compute_seconds", "exposed_sync_seconds"}
    lazy, kept, fast, types, seconds = [], [], [], [], 0.0
    batches = _batches(rank, 70, batch=4)  # past DDP_PARAM_CHECK_EVERY (64): both branches
    losses = [(i % 3 == 0, i % 5 == 0) for i in range(len(batches))]  # no loss; a float
    for (x, y), (none, number) in zip(batches, losses, strict=True):
        for sync, opt, _ in syncs:
            with sync.step() as s:
                opt.zero_grad()
                loss = nn.functional.mse_loss(sync.model(x), y)
                loss.backward()
                opt.step()
                s.loss = None if none else loss.item() if number else loss
        held = syncs[0][0]._lazy_record
        fast.append(held is not None and isinstance(held[1], list))  # close_ddp_lazily's
        b = syncs[0][0].last_boundary
        seconds += b.compute_seconds + b.exposed_sync_seconds
        lazy.append({k: v for k, v in asdict(b).items() if k not in timing})
        kept.append({k: v for k, v in asdict(keep.records[-1]).items() if k not in timing})
        # (== takes 0 for 0.0 and True for 1: the types too, timing's among them)
        types.append([[type(v) for v in asdict(r).values()] for r in (b, keep.records[-1])])
    counts = [
        (s.global_step, s.boundary, s.grad_syncs, s.collectives, s.sync_period)
        + tuple((k, v["boundaries"], v["steps"]) for k, v in sorted(s.k_path.items()))
        for s, _, _ in syncs
    ]
    same = torch.equal(_flat(syncs[0][2]), _flat(syncs[1][2]))
    # the K path's seconds: every record's, whether a fast close kept them apart or not
    path_seconds = (syncs[0][0].k_path[1]["seconds"], seconds)
    # a loss written over in place before the record is read: refused, not misread
    sync, opt, _ = syncs[0]
    x, y = batches[0]
    with sync.step() as s:
        opt.zero_grad()
        loss = nn.functional.mse_loss(sync.model(x), y)
        loss.backward()
        opt.step()
        s.loss = loss
    with torch.no_grad():
        loss.mul_(2)
    try:
        sync.last_boundary  # noqa: B018
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    for sync, _, _ in syncs:
        sync.close()
    return lazy, kept, counts, refused, same, fast, types, path_seconds


def test_ddps_lazy_records_are_the_records_an_observer_gets():
    # the fast path: not at the first step (no decision yet) nor at a guard check (boundary
    # 0, 64), nor with a loss given as a number (the general path sums it)
    expected = [i not in (0, 64) and (i % 3 == 0 or i % 5 != 0) for i in range(70)]
    for lazy, kept, counts, refused, same, fast, types, path_seconds in run_dist(
        _ddp_records_worker, 2
    ):
        assert fast == expected
        assert len(lazy) == 70 and lazy == kept  # every field but the two times, losses exact
        assert all(a == b for a, b in types), types
        assert path_seconds[0] == pytest.approx(path_seconds[1], rel=1e-9, abs=1e-12)
        assert counts[0] == counts[1]
        assert refused is not None and "written over in place" in refused
        assert same


def _ddp_state_worker(rank, world):
    """ddp's state after fast closes (the K path's sums kept apart), saved and loaded into a
    fresh Sync and into the one that saved it."""
    syncs = []
    for _ in range(2):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        syncs.append((autok.Sync(model, opt, strategy="ddp", link="none"), opt))
    batches = _batches(rank, 11)
    (saver, opt), (fresh, _) = syncs
    _train(saver, opt, batches[:10])
    fast = saver._lazy_record is not None and isinstance(saver._lazy_record[1], list)
    state = saver.state_dict()
    out = {"fast": fast, "saved": state["counters"]["k_path"]}
    fresh.load_state_dict(state)
    before = saver.last_boundary is not None
    saver.load_state_dict(state)
    out["last"] = (before, saver.last_boundary, fresh.last_boundary)
    counters = [(s.global_step, s.boundary, s.k_path) for s, _ in syncs]
    out["loaded"] = counters[0] == counters[1]
    for sync, opt in syncs:
        _train(sync, opt, batches[10:])
    out["after"] = [(s.global_step, s.boundary, s.k_path[1]["boundaries"]) for s, _ in syncs]
    for sync, _ in syncs:
        sync.close()
    return out


def test_ddps_state_holds_the_k_path_its_fast_close_kept_apart():
    for out in run_dist(_ddp_state_worker, 2):
        assert out["fast"]  # the last of the 10 steps closed on the fast path
        assert list(out["saved"]) == [1]
        assert (out["saved"][1]["boundaries"], out["saved"][1]["steps"]) == (10, 10)
        assert out["loaded"]
        assert out["last"] == (True, None, None)  # no record before the load is this run's
        assert out["after"] == [(11, 11, 11), (11, 11, 11)]


def _ddp_holds_worker(rank, world):
    """Which losses ddp's fast close holds unread (close_ddp_lazily) and which LossSum.add
    holds: the two spell the same test, inlined for the hot path."""
    from autok.trainer.engine.loss_sum import LossSum

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(model, opt, strategy="ddp", link="none")
    kinds = {
        "scalar": lambda loss: loss,
        "scalar, detached": lambda loss: loss.detach(),
        "a view": lambda loss: loss.reshape(1)[0],
        "a 1-element vector": lambda loss: loss.reshape(1),
        "a float": lambda loss: loss.item(),
    }
    out = {}
    for i, (x, y) in enumerate(_batches(rank, 2 + 2 * len(kinds))):
        name = list(kinds)[(i // 2) % len(kinds)]
        with sync.step() as s:
            opt.zero_grad()
            loss = nn.functional.mse_loss(sync.model(x), y)
            loss.backward()
            opt.step()
            s.loss = kinds[name](loss)
        if i < 2:
            continue  # the first boundary: the general path (no decision yet, a guard check)
        kept = sync._lazy_record[1]  # held pairs (the fast close) or a LossSum (the general path)
        fast = isinstance(kept, list) and bool(kept)
        acc = LossSum()
        acc.add(kinds[name](loss))
        out.setdefault(name, set()).add((fast, bool(acc.held)))
    sync.close()
    return out


def test_ddps_fast_close_holds_the_losses_loss_sum_holds():
    for res in run_dist(_ddp_holds_worker, 2):
        assert res == {
            "scalar": {(True, True)},
            "scalar, detached": {(True, True)},
            "a view": {(False, False)},
            "a 1-element vector": {(False, False)},
            "a float": {(False, False)},
        }


def _builtin_path_worker(rank, world, link):
    """ddp steps with rank 1 sleeping between its forward and its backward, so rank 0's
    backward waits on the gradient all-reduce; then two-phase cpdp steps for the counts."""
    import time

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(model, opt, strategy="ddp", link=link)
    steps, records = [], []
    for x, y in _batches(rank, 4):
        with sync.step() as s:
            opt.zero_grad()
            loss = nn.functional.mse_loss(sync.model(x), y)
            if rank == 1:
                time.sleep(0.2)
            loss.backward()
            opt.step()
            s.loss = loss
        steps.append((sync.last_step.sync_seconds, sync.last_step.backward_seconds))
        b = sync.last_boundary  # built on reading (no observer asked for it)
        records.append(
            (b.boundary, b.global_step, b.sync_period, b.interval_steps, b.samples, b.grad_syncs)
            + (b.param_syncs, b.fragment, b.train_loss == loss.item(), b.lr == 0.05)
        )
    ddp = (sync.grad_syncs, sync.collectives, sync.last_boundary.bytes_communicated)
    x, y = _batches(rank, 1)[0]
    with sync.step():  # two micro-batches, both synchronized: DDP all-reduces twice
        opt.zero_grad()
        for xm, ym in zip(x.chunk(2), y.chunk(2), strict=True):
            nn.functional.mse_loss(sync.model(xm), ym).backward()
        opt.step()
    twice = (sync.collectives, sync.last_boundary.bytes_communicated)
    sync.close()
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # two-phase: a gradient all-reduce
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=3, link=link)
    synced = []
    for x, y in _batches(rank, 6):
        with sync.step() as s:
            opt.zero_grad()
            nn.functional.mse_loss(sync.model(x), y).backward()
            opt.step()
        synced.append((s.is_boundary, sync.last_step.grad_synced))
    cpdp = (sync.grad_syncs, sync.param_syncs, sync.collectives)
    sync.close()
    return {
        "builtin": sync.grad_state.builtin,
        "steps": steps,
        "records": records,
        "ddp": ddp,
        "twice": twice,
        "cpdp": cpdp,
        "synced": synced,
        "nbytes": sum(p.numel() * 4 for p in model.parameters()),
    }


def test_the_builtin_gradient_path_times_a_slow_ranks_wait_as_sync_and_counts_as_the_hook():
    """With no link on the CPU, DDP all-reduces in C++ and one post-accumulate-grad hook marks
    the end of backward compute. Rank 1 sleeps 0.2 s before each backward: rank 0's backward is
    blocked for about that long, and it must land in sync seconds, not backward compute. Counts
    (gradient syncs, collectives, bytes) and which steps synchronized are the same as through
    the comm hook on an emulated link (`lan`), which sees every bucket."""
    none = run_dist(_builtin_path_worker, 2, "none")
    lan = run_dist(_builtin_path_worker, 2, "lan")
    assert none[0]["builtin"] and not lan[0]["builtin"]
    for runs in (none, lan):
        waits = [w for w, _ in runs[0]["steps"][1:]]  # step 0 also pays DDP's first set-up
        computes = [b for _, b in runs[0]["steps"][1:]]
        assert min(waits) > 0.1, runs[0]["steps"]
        assert max(computes) < min(waits), runs[0]["steps"]
    for a, b in zip(none, lan, strict=True):
        assert a["ddp"] == b["ddp"] == (4, 4, a["nbytes"])  # one bucket a step
        assert a["twice"] == b["twice"] == (6, 2 * a["nbytes"])
        assert a["records"] == [(i, i, 1, 1, 32, 1, 0, -1, True, True) for i in range(4)]
        assert a["cpdp"] == b["cpdp"] == (2, 2, 4)  # 2 boundaries: a bucket + an average each
        assert a["synced"] == b["synced"]
        assert [g for _, g in a["synced"]] == [b for b, _ in a["synced"]]


class _DeviceClock:
    """Stands in for a GPU's clock: the test moves it by exact amounts of "device work"."""

    def __init__(self) -> None:
        self.t = 0.0

    def advance(self, seconds: float) -> None:
        self.t += seconds


def _device_marks_worker(rank, world):
    """A user's loop under Sync with DeviceMarks' events (what a GPU uses), whose clock moves
    only by the device work the loop declares: forward 1 s (plus 0.125 s of set-up before it,
    which the step counts as forward), backward 2 s, the optimizer 0.5 s, 0.25 s after it."""
    from autok.trainer.engine.profiler import DeviceMarks

    device = _DeviceClock()

    class Event:
        def __init__(self) -> None:
            self.at: float | None = None

        def record(self, stream=None) -> None:
            self.at = device.t

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: Event) -> float:
            return (end.at - self.at) * 1e3  # milliseconds, as torch.cuda.Event

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    records = []

    class Keep:
        def on_boundary(self, stats, decision):
            records.append(stats.compute_seconds)

    # fused from the first boundary (auto's first is two-phase: a gradient wait on the host)
    sync = autok.Sync(model, opt, sync_period=4, link="none", observers=[Keep()], boundary="fused")
    sync._marks = DeviceMarks(torch.device("cpu"), event=Event)
    model.register_forward_hook(lambda *a: device.advance(1.0))
    opt.register_step_pre_hook(lambda *a: device.advance(0.5))  # after Sync's: the step's work
    steps = []
    for i, (x, y) in enumerate(_batches(rank, 9)):
        with sync.step() as s:
            device.advance(0.125)
            opt.zero_grad()
            loss = nn.functional.mse_loss(sync.model(x), y)
            loss.backward()
            device.advance(2.0)
            if i != 8:  # the last step skips its optimizer step (as GradScaler may)
                opt.step()
            device.advance(0.25)
            s.loss = loss
        t = sync.last_step
        steps.append(
            (t.forward_seconds, t.backward_seconds, t.optimizer_seconds, t.is_boundary)
            + ((t.sync_seconds,) if not t.is_boundary else ())
        )
    sync.close()
    return steps, records


def test_on_a_device_clock_a_step_is_timed_by_its_events_read_once_at_its_close():
    """On a GPU, Sync times a step by events at its points
    (autok.trainer.engine.profiler.DeviceMarks) and
    waits for the device once, at the close. With a stand-in device clock the spans are exact:
    a skipped optimizer step ends backward at the close, and each boundary's compute is the
    sum of its four steps, on both ranks."""
    for steps, records in run_dist(_device_marks_worker, 2):
        local = (1.125, 2.0, 0.5, False, 0.0)
        boundary = (1.125, 2.0, 0.5, True)
        assert steps[:8] == [local, local, local, boundary] * 2
        assert steps[8] == (1.125, 2.25, 0.0, False, 0.0)
        assert records[:2] == [4 * 3.625, 4 * 3.625]


def _layouts_worker(rank, world):
    """sync_now (no gradients ride along), then a fused boundary, whose larger buffer takes a
    new allocation, then sync_now again: its views must be cut from the new allocation."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = autok.Sync(model, opt, sync_period=2, slowmo_beta=0.0, link="none")
    batches = _batches(rank, 4)
    _train(sync, opt, batches[:1])
    sync.sync_now()  # the first buffer: parameters and scalars
    _train(sync, opt, batches[1:3])  # a local step, then a fused boundary: a larger buffer
    _train(sync, opt, batches[3:])
    before = _flat(model)
    gathered = [torch.empty_like(before) for _ in range(world)]
    dist.all_gather(gathered, before)  # test-only collective
    sync.sync_now()  # the first layout again, on the new buffer
    return _flat(model), torch.stack(gathered).sum(0) / world


def test_a_layout_seen_before_the_buffer_grew_is_cut_again_from_the_new_buffer():
    for after, mean in run_dist(_layouts_worker, 2):
        assert torch.equal(after, mean)  # a plain average at world 2: the sum, halved


def _fused_sgd_scaler_worker(rank, world):
    """The same loop with torch.optim.SGD(fused=True) and with the plain SGD, under a
    GradScaler: a fused optimizer gets the scale and found_inf from scaler.step and unscales
    (or skips) inside its own step, after the optimizer pre-hook that captures g_i."""
    out = {}
    for fused in (True, False):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=fused)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        sync = autok.Sync(model, opt, strategy="cpdp", sync_period=4, link="none")
        # rank 1 overflows at the boundary step 7: its optimizer step is skipped (by the
        # scaler for plain SGD, inside the fused kernel for fused SGD)
        log = _train(sync, opt, _batches(rank, 12), inf_at=7 if rank == 1 else None, scaler=scaler)
        # one collective from the second boundary (auto): g_i rides in the averaging
        assert sync.strategy.fused_gradients
        momenta = [opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()]
        out[fused] = (_flat(model), torch.cat(momenta), log, scaler.get_scale())
        sync.close()
    return out


def test_a_fused_sgd_under_gradscaler_reconciles_the_unscaled_gradients():
    for out in run_dist(_fused_sgd_scaler_worker, 2):
        (p_f, m_f, log_f, scale_f), (p_u, m_u, log_u, scale_u) = out[True], out[False]
        assert scale_f == scale_u
        assert all(ok for b, ok in log_f + log_u if b)
        assert torch.isfinite(p_f).all() and torch.isfinite(m_f).all()
        # the scaled g_i (x256) or an inf would move the momentum far from plain SGD's
        torch.testing.assert_close(m_f, m_u, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(p_f, p_u, rtol=1e-6, atol=1e-7)


def _tensor_lr_worker(rank, world, tmp):
    """An LR held as a tensor (as for CUDA graphs or a compiled step), which a scheduler
    updates in place, stepped inside the step: the records hold each step's LR as a number,
    as with the same LR held as a float."""
    lrs = {}
    for strategy, k, make, lr in (
        ("cpdp", 2, lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9), 0.05),
        ("ddp", 1, lambda ps, lr: torch.optim.Adam(ps, lr=lr), 0.01),
    ):
        for held in ("tensor", "float"):
            model = _model()
            # float64: the same value as the float (a float32 tensor would round 0.05)
            opt = make(
                model.parameters(),
                torch.tensor(lr, dtype=torch.float64) if held == "tensor" else lr,
            )
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

            class Lr:
                def __init__(self) -> None:
                    self.seen = []

                def on_boundary(self, stats, decision):
                    self.seen.append(stats.lr)

            lr_seen = Lr()
            out_dir = Path(tmp) / f"{strategy}-{held}"
            sync = autok.Sync(
                model,
                opt,
                strategy=strategy,
                sync_period=k,
                link="none",
                out_dir=out_dir,
                observers=[lr_seen],
            )
            for x, y in _batches(rank, 4):
                with sync.step():
                    opt.zero_grad()
                    nn.functional.mse_loss(sync.model(x), y).backward()
                    opt.step()
                    sched.step()  # the next step's LR, written into the tensor in place
            sync.close()
            lines = (out_dir / "boundaries.jsonl").read_text().splitlines() if rank == 0 else []
            lrs[strategy, held] = (lr_seen.seen, [json.loads(line)["lr"] for line in lines])
    return lrs


def test_a_learning_rate_held_as_a_tensor_is_recorded_as_a_number(tmp_path):
    for rank, lrs in enumerate(run_dist(_tensor_lr_worker, 2, str(tmp_path))):
        for strategy, lr in (("cpdp", 0.05), ("ddp", 0.01)):
            seen, written = lrs[strategy, "tensor"]
            # each boundary's step's LR: 0.05 halved per step, the boundaries at steps 2 and 4
            # of cpdp (K = 2); at every step of ddp
            steps = [2, 4] if strategy == "cpdp" else [1, 2, 3, 4]
            assert seen == pytest.approx([lr * 0.5 ** (s - 1) for s in steps]), seen
            assert all(type(v) is float for v in seen)
            assert seen == lrs[strategy, "float"][0]  # as a float LR gives, bit for bit
            if rank == 0:
                assert written == seen


_BETWEEN = 0.3  # seconds of the loop's own work between backward() and optimizer.step()


def _between_worker(rank, world, link):
    """ddp with the loop's own work (a sleep standing for GradScaler's unscale or clipping)
    between backward() and optimizer.step(): the gradient wait ends where DDP's does."""
    import time

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(model, opt, strategy="ddp", link=link)
    waits = []
    for x, y in _batches(rank, 4):
        with sync.step():
            opt.zero_grad()
            nn.functional.mse_loss(sync.model(x), y).backward()
            time.sleep(_BETWEEN)
            opt.step()
        times = sync.last_step
        waits.append((times.grad_synced, times.sync_seconds, times.backward_seconds))
    sync.close()
    return waits


@pytest.mark.parametrize("link", ["none", "wan"])
def test_the_loops_work_between_backward_and_the_optimizer_step_is_not_sync(link):
    """On the built-in all-reduce (no link) and through the link's comm hook (wan: each step
    holds its gradients at least the link's latency), the sleep is backward's side of the
    step, not exposed sync."""
    for waits in run_dist(_between_worker, 2, link):
        for synced, wait, backward in waits[1:]:
            # the sleep is the loop's, counted in backward (span less the wait), however long
            # the wait for the other rank was (the wait ran to the optimizer step and took it)
            assert synced and backward >= _BETWEEN, waits
            if link == "wan":
                assert wait >= 0.008, waits  # the hold (16.6 ms RTT) is still sync


def _qsr_groups_worker(rank, world):
    """qsr with two parameter groups, a head at 10x the body's LR, listed in either order; at a
    constant LR, and halved every 4 steps. The K each boundary decides, per case."""
    out = {}
    for head_first in (True, False):
        for decay in (False, True):
            model = _model()
            body = {"params": model[0].parameters(), "lr": 0.01}
            head = {"params": model[2].parameters(), "lr": 0.1}
            groups = [head, body] if head_first else [body, head]
            opt = torch.optim.SGD(groups, lr=0.01)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda t, decay=decay: 0.5 ** (t // 4) if decay else 1.0
            )

            class Decisions:
                def __init__(self) -> None:
                    self.ks: list[int] = []

                def on_boundary(self, stats, decision):
                    self.ks.append(decision.next_sync_period)

            sync = autok.Sync(
                model,
                opt,
                strategy="cpdp",
                sync_period=4,
                policy="qsr",
                link="none",
                observers=[decisions := Decisions()],
            )
            for x, y in _batches(rank, 24):
                with sync.step():
                    opt.zero_grad()
                    nn.functional.mse_loss(sync.model(x), y).backward()
                    opt.step()
                sched.step()
            sync.close()
            out[head_first, decay] = decisions.ks
    return out


def test_qsr_reads_one_schedule_whatever_the_order_of_the_param_groups():
    """η over its peak is one group's ratio (group 0's): a head group at another LR, first or
    second, neither moves K at a constant LR nor changes the K path of a decaying one."""
    for out in run_dist(_qsr_groups_worker, 2):
        for head_first in (True, False):
            assert set(out[head_first, False]) == {4}, out  # constant LR: K stays K_base
        # the LR halved every 4 steps: the same K path in both orders, and K grew
        assert out[True, True] == out[False, True], out
        assert max(out[True, True]) > 4, out


def _clip_worker(rank, world):
    """The same 12 steps of one loop under ddp and under cpdp K=1, β=0: with the gradients
    clipped between backward and optimizer.step() (clip_grad_norm_, and GradScaler's unscale_
    then clip_grad_norm_), or left as backward gave them (plain, and GradScaler's own unscale in
    scaler.step). Per case: the parameters, the boundary path taken at the end, the counts."""

    def run(strategy, clip, amp=False, **options):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if amp else None
        if strategy == "cpdp":
            options["slowmo_beta"] = 0.0
        sync = autok.Sync(model, opt, strategy=strategy, sync_period=1, link="none", **options)
        try:
            for x, y in _batches(rank, 12):
                with sync.step():
                    opt.zero_grad()
                    loss = nn.functional.mse_loss(sync.model(x), y)
                    (scaler.scale(loss) if amp else loss).backward()
                    if amp and clip:
                        scaler.unscale_(opt)  # the AMP idiom: unscale, then clip
                    if clip:
                        nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
                    if amp:
                        scaler.step(opt)
                        scaler.update()
                    else:
                        opt.step()
        except autok.OptionError as exc:
            return str(exc)
        counts = (sync.grad_syncs, sync.param_syncs, sync.collectives)
        fused = sync.strategy.fused_gradients
        sync.close()
        return _flat(model), fused, counts

    return {
        "ddp clip": run("ddp", True),
        "auto clip": run("cpdp", True),
        "two-phase clip": run("cpdp", True, boundary="two-phase"),
        "fused clip": run("cpdp", True, boundary="fused"),
        "ddp plain": run("ddp", False),
        "auto plain": run("cpdp", False),
        "ddp amp clip": run("ddp", True, amp=True),
        "auto amp clip": run("cpdp", True, amp=True),
        "auto amp": run("cpdp", False, amp=True),
    }


def test_a_loop_that_clips_gets_ddps_result_or_a_refusal_never_a_fused_boundary():
    """The fused boundary applies what the loop does to the gradients after backward (here
    clip_grad_norm_) to each rank's gradient, where DDP applies it to the averaged one: auto
    finds it at its first boundary step and stays two-phase (ddp's parameters bit for bit at
    K=1, β=0); boundary="fused" refuses it in one line; a loop that leaves them alone (GradScaler's
    unscale is linear and alike on every rank) still gets the fused boundary after the first."""
    for res in run_dist(_clip_worker, 2):
        ddp, _, _ = res["ddp clip"]
        for case in ("auto clip", "two-phase clip"):
            params, fused, counts = res[case]
            assert torch.equal(params, ddp), (case, (params - ddp).abs().max())
            assert not fused and counts == (12, 12, 24), (case, counts)  # a bucket + an average
        refusal = res["fused clip"]
        assert isinstance(refusal, str) and refusal.startswith("--boundary: the loop changed")
        assert "\n" not in refusal and 'boundary="two-phase"' in refusal
        params, fused, counts = res["auto amp clip"]
        assert torch.equal(params, res["ddp amp clip"][0]) and not fused
        # no clipping: two-phase at the first boundary step (its bucket), fused after it
        params, fused, counts = res["auto plain"]
        assert fused and counts == (12, 12, 13), counts
        torch.testing.assert_close(params, res["ddp plain"][0], rtol=0, atol=1e-6)
        assert res["auto amp"][1] and res["auto amp"][2] == (12, 12, 13), res["auto amp"]


# ----- Sync's arguments and its saved state (docs/design.md §3) ----------------------------------


def _frozen_model() -> nn.Module:
    model = _model()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.mark.parametrize(
    "build, said",
    [
        (lambda m: (m, None, {}), "optimizer: a NoneType, not a torch.optim.Optimizer"),
        (lambda m: (m, "sgd", {}), "optimizer: a str, not a torch.optim.Optimizer"),
        (
            lambda m: (m, torch.optim.SGD(_model().parameters(), lr=0.1), {}),
            "optimizer: it holds parameters that are not the model's",
        ),
        (
            lambda m: (_frozen_model(), torch.optim.SGD(m.parameters(), lr=0.1), {}),
            "model: every parameter is frozen",
        ),
        (
            lambda m: (nn.DataParallel(m), torch.optim.SGD(m.parameters(), lr=0.1), {}),
            "model: a DataParallel is already wrapped; give the model itself",
        ),
        (
            lambda m: (
                nn.Sequential(nn.DataParallel(m)),
                torch.optim.SGD(m.parameters(), lr=0.1),
                {},
            ),
            "model: a DataParallel (at 0) is already wrapped",
        ),
        ({"sync_period": "4"}, "--sync-period: input should be a valid integer"),
        ({"sync_period": 2.0}, "--sync-period: input should be a valid integer"),
        ({"link_schedule": "lan,wan@epoch=1000001"}, "--link-schedule: epoch=1000001 is past"),
        ({"ddp_kwargs": {"device_ids": [0]}}, "ddp_kwargs: 'device_ids' is set by autok.Sync"),
        ({"ddp_kwargs": {"process_group": None}}, "ddp_kwargs: 'process_group' is set by"),
        ({"ddp_kwargs": {"broadcast_buffers": True}}, "ddp_kwargs: 'broadcast_buffers' is set"),
        ({"ddp_kwargs": {"check_reduction": True}}, "ddp_kwargs: 'check_reduction' is not supp"),
        ({"ddp_kwargs": {"find_unused": True}}, "ddp_kwargs: 'find_unused' is not an argument"),
        ({"ddp_kwargs": {"find_unused_parameters": 1}}, "ddp_kwargs: find_unused_parameters is"),
        ({"ddp_kwargs": {"bucket_cap_mb": 0}}, "ddp_kwargs: bucket_cap_mb is 0; give MiB in"),
        ({"ddp_kwargs": {"bucket_cap_mb": math.inf}}, "ddp_kwargs: bucket_cap_mb is inf"),
        ({"ddp_kwargs": [("static_graph", True)]}, "ddp_kwargs: a list; give a dict, or None"),
        (  # DDP's static graph fails an internal assert on a backward under no_sync()
            {"strategy": "cpdp", "ddp_kwargs": {"static_graph": True}},
            "ddp_kwargs: static_graph needs every backward to all-reduce (strategy ddp",
        ),
    ],
)
def test_a_model_optimizer_or_argument_sync_cannot_take_is_refused_naming_it(build, said):
    """Before any process group is needed (the same refusal on every rank), one line: an
    optimizer that is none, or over another model's parameters; a model with nothing to train,
    or already wrapped; K of another type (not read as 4 or 2); DDP arguments autok sets itself
    or does not take."""
    model = _model()
    if callable(build):
        model, opt, kwargs = build(model)
    else:
        opt, kwargs = torch.optim.SGD(model.parameters(), lr=0.1), dict(build)
    with pytest.raises(autok.OptionError) as e:
        autok.Sync(model, opt, **kwargs)
    msg = str(e.value)
    assert msg.startswith(said) and "\n" not in msg, msg


def _wrapped_worker(rank, world):
    """Models wrapped for data parallelism (DDP), or sharded (FSDP, FSDP2's fully_shard, tensor
    parallel DTensors): refused, naming the wrapper, before autok builds its own DDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    mesh = init_device_mesh("cpu", (world,))
    ddp = DistributedDataParallel(_model())
    fsdp = FullyShardedDataParallel(_model(), device_id=torch.device("cpu"))
    fsdp2 = _model()
    fully_shard(fsdp2[0], mesh=mesh)
    fully_shard(fsdp2, mesh=mesh)
    tp = parallelize_module(_model(), mesh, {"0": ColwiseParallel()})
    said = {}
    for name, model in (("ddp", ddp), ("fsdp", fsdp), ("fsdp2", fsdp2), ("tp", tp)):
        try:
            autok.Sync(model, torch.optim.SGD(model.parameters(), lr=0.1))
        except autok.OptionError as exc:
            said[name] = str(exc)
    return said


def test_a_model_already_wrapped_or_sharded_is_refused_naming_the_wrapper():
    (said,) = run_dist(_wrapped_worker, 1)
    assert said["ddp"].startswith(
        "model: a DistributedDataParallel is already wrapped; give the model itself"
    ), said
    assert said["fsdp"].startswith(
        "model: a FullyShardedDataParallel is sharded (FSDP): sharded models are not supported"
    ), said
    assert said["fsdp2"].startswith("model: a FSDPSequential is sharded (FSDP)"), said
    assert said["tp"].startswith("model: parameter 0.weight is a DTensor"), said
    assert "sharded models are not supported yet" in said["tp"], said


class _Spare(nn.Module):
    """A regression net with a spare head, listed first (DDP's first parameter), used where
    `spare` says: on one rank only, or on none."""

    def __init__(self, spare: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.extra = nn.Linear(16, 1)
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 1)
        self.spare = spare

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        return self.head(h) + self.extra(h) if self.spare else self.head(h)


def _unused_worker(rank, world):
    """ddp and cpdp K=1 β=0 on a model whose spare head rank 0 alone uses, with
    find_unused_parameters: trained, counted and equal bit for bit (the two-phase boundary,
    as DDP reduces first). Without it, a spare head no rank uses: one line naming ddp_kwargs
    on every strategy that reduces gradients."""
    res = {}
    unused = {"find_unused_parameters": True}

    def run(strategy, spare, ddp_kwargs=None, optimizer=torch.optim.SGD, steps=8, **options):
        model = _Spare(spare)
        if optimizer is torch.optim.SGD:
            opt = optimizer(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
        else:
            opt = optimizer(model.parameters(), lr=0.01)
        sync = autok.Sync(
            model, opt, strategy=strategy, sync_period=1, ddp_kwargs=ddp_kwargs, **options
        )
        try:
            log = _train(sync, opt, _batches(rank, steps))
        except autok.OptionError as exc:
            return str(exc)
        out = (_flat(model), log, sync.grad_syncs, sync.strategy.fused_gradients)
        sync.close()
        return out

    res["ddp"] = run("ddp", rank == 0, unused)
    res["cpdp"] = run("cpdp", rank == 0, unused, slowmo_beta=0.0)
    res["localsgd"] = run("localsgd", rank == 0)  # no gradient sync: nothing to find
    static = {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 1}
    res["static"] = run("ddp", True, static)  # the other arguments DDP takes, on ddp
    for name, strategy, options in (
        ("ddp refused", "ddp", {}),
        ("fused refused", "cpdp", {"slowmo_beta": 0.0}),
        ("two-phase refused", "cpdp", {"slowmo_beta": 0.0, "boundary": "two-phase"}),
        # no DDP reduction to check it: the fused boundary's own capture of g_i refuses
        ("fused given refused", "cpdp", {"slowmo_beta": 0.0, "boundary": "fused"}),
    ):
        res[name] = run(strategy, False, steps=3, **options)
    try:
        run("cpdp", False, unused, boundary="fused")
    except autok.OptionError as exc:
        res["fused given"] = str(exc)
    return res


def test_a_model_with_unused_parameters_trains_with_find_unused_parameters_exactly():
    for res in run_dist(_unused_worker, 2):
        ddp, log, grad_syncs, fused = res["ddp"]
        assert all(ok for _, ok in log) and grad_syncs == 8, res["ddp"]
        # every step's reduction counted, also on rank 1, which never reaches the spare head
        # listed first (the built-in path times a backward by it)
        cpdp, log, grad_syncs, fused = res["cpdp"]
        assert not fused and grad_syncs == 8 and all(ok for _, ok in log), res["cpdp"]
        assert torch.equal(cpdp, ddp)  # two-phase K=1, β=0 is ddp bit for bit
        assert all(ok for _, ok in res["localsgd"][1])
        _, log, grad_syncs, _ = res["static"]
        assert all(ok for _, ok in log) and grad_syncs == 8, res["static"]
        for name in ("ddp refused", "fused refused", "two-phase refused", "fused given refused"):
            said = res[name]
            assert isinstance(said, str) and said.startswith("ddp_kwargs: "), (name, said)
            assert "find_unused_parameters': True" in said and "\n" not in said, said
        assert res["fused given"].startswith(
            "--boundary: fused is not exact with ddp_kwargs find_unused_parameters"
        ), res["fused given"]


def _same(a: Any, b: Any) -> bool:
    """Equal states: tensors equal, containers equal item by item."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)  # (NaN)


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A tampering: state[path] = value (a dotted path), or deleted where value is _DELETE."""

    def tamper(state: dict) -> None:
        *head, last = path.split(".")
        for key in head:
            state = state[key]
        if value is _DELETE:
            del state[last]
        elif callable(value):
            state[last] = value(state[last])
        else:
            state[last] = value

    return tamper


_DELETE = object()
_TAMPERED = [
    ("counters.boundary", _DELETE, "counters: no 'boundary'"),
    ("counters.sync_period", 0, "counters.sync_period: 0 is not an integer in [1, 1048576]"),
    ("counters.sync_period", -3, "counters.sync_period: -3 is not an integer"),
    ("counters.sync_period", 10**30, "counters.sync_period: 1000000000000000000000000000000 "),
    ("counters.sync_period", "four", "counters.sync_period: 'four' is not an integer"),
    ("counters.sync_period", 2.0, "counters.sync_period: 2.0 is not an integer"),
    ("counters.k_path", {"x": {}}, "counters.k_path['x']: K is not an integer"),
    ("counters.interval.steps", -1, "counters.interval.steps: -1 is not an integer"),
    ("counters.fragment_position", 2, "counters.fragment_position: 2 is beyond fragments 1"),
    ("counters.loss_held", ["a"], "counters.loss_held[0]: 'a' is not a number"),
    ("averager", {}, "averager: no 'ref'"),
    ("averager.ref", lambda t: t[:-1], "averager.ref: shape (160,), this model's is (161,)"),
    ("averager.ref", lambda t: t.double(), "averager.ref: torch.float64, this Sync averages in"),
    ("averager.velocity", lambda t: t[:-1], "averager.velocity: shape (160,)"),
    ("averager.boundaries", None, "averager.boundaries: None is not an integer"),
    ("controller", {}, "controller: no 'sync_period'"),
    ("controller.sync_period", 0, "controller.sync_period: 0 is not an integer in [1, 1048576]"),
    ("divergence", [], "divergence: a list, not a dict"),
    ("divergence.recent", 5, "divergence.recent: not a list"),
    ("link.rng", (1, 2), "link.rng: not a random generator's state"),
]


def _tampered_worker(rank, world):
    """A state saved mid-interval, each value tampered with in turn, loaded into a Sync that
    has trained otherwise: every one refused in one line naming the key, and the Sync left as
    it was; the state as saved then loads."""
    opts = dict(strategy="cpdp", sync_period=2, link="lan", link_jitter_ms=1)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = autok.Sync(model, opt, **opts)
    _train(sync, opt, _batches(rank, 5))
    saved = sync.state_dict()
    sync.close()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    target = autok.Sync(model, opt, **opts)
    _train(target, opt, _batches(rank + 7, 3))
    before = target.state_dict()
    said, unchanged = [], []
    for path, value, _ in _TAMPERED:
        state = copy.deepcopy(saved)
        _set(path, value)(state)
        try:
            target.load_state_dict(state)
            said.append(None)
        except autok.OptionError as exc:
            said.append(str(exc))
        unchanged.append(_same(target.state_dict(), before))
    target.load_state_dict(saved)
    loaded = _same(target.state_dict(), saved)
    _train(target, opt, _batches(rank, 2))
    target.close()
    return said, unchanged, loaded


def test_a_tampered_state_is_refused_naming_the_key_and_leaves_the_sync_unchanged():
    (res,) = run_dist(_tampered_worker, 1)
    said, unchanged, loaded = res
    for (path, _, expect), msg, same in zip(_TAMPERED, said, unchanged, strict=True):
        assert msg is not None, f"{path}: loaded"
        assert msg.startswith("load_state_dict: " + expect) and "\n" not in msg, (path, msg)
        assert same, f"{path}: the refused state changed the Sync"
    assert loaded


def _settings_worker(rank, world):
    """States saved under other settings that shape them, loaded under these: an outer
    momentum into an average, no compression into int8, F = 4 fragments into F = 2. Refused
    naming the option; also a state without the settings it was saved under (its "kind")."""

    def saved_under(steps, **opts):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        sync = autok.Sync(model, opt, **opts)
        _train(sync, opt, _batches(rank, steps))
        state = sync.state_dict()
        position = sync._position
        sync.close()
        return state, position

    cases = {
        "outer": (
            dict(strategy="cpdp", sync_period=2, outer_optimizer="nesterov"),
            dict(strategy="cpdp", sync_period=2, outer_optimizer="average"),
        ),
        "compress": (
            dict(strategy="localsgd", sync_period=2),
            dict(strategy="localsgd", sync_period=2, compress="int8"),
        ),
        "fragments": (
            dict(strategy="localsgd", sync_period=4, fragments=4),
            dict(strategy="localsgd", sync_period=4, fragments=2),
        ),
    }
    said = {}
    for name, (was, now) in cases.items():
        state, position = saved_under(3, **was)
        said["position"] = position if name == "fragments" else said.get("position")
        model = _model()
        sync = autok.Sync(model, torch.optim.SGD(model.parameters(), lr=0.05), **now)
        for kind in (True, False):
            if not kind:
                del state["kind"]  # as a state saved before the settings were recorded
            try:
                sync.load_state_dict(state)
            except autok.OptionError as exc:
                said[name, kind] = str(exc)
        sync.close()
    return said


def test_a_state_saved_under_other_settings_is_refused_naming_the_option():
    (said,) = run_dist(_settings_worker, 1)
    assert said["position"] == 4  # the next fragment sync moves fragment 4 of 4
    expect = {
        ("outer", True): "saved with outer_optimizer 'nesterov'; this Sync has 'average'",
        ("outer", False): "averager.velocity: saved with an outer momentum (outer_optimizer",
        ("compress", True): "saved with compress 'none'; this Sync has 'int8'",
        ("compress", False): "averager.residual: none after 1 boundaries: saved with compress",
        ("fragments", True): "saved with fragments 4; this Sync has 2",
        ("fragments", False): "counters.fragment_position: 4 is beyond fragments 2",
    }
    for key, text in expect.items():
        assert said.get(key, "").startswith("load_state_dict: " + text), (key, said.get(key))


def _default_link_worker(rank, world):
    model = _model()
    sync = autok.Sync(model, torch.optim.SGD(model.parameters(), lr=0.1))
    out = (sync.options.link, sync.link_name, sync.clock is None)
    sync.close()
    return out


def test_the_librarys_default_link_is_none_and_autok_trains_default_is_the_wan():
    """docs/design.md §3: no emulated network unless asked for in a user's loop; the CLI's
    study keeps the emulated WAN as its default."""
    from autok.cli import build_parser, config_from_args

    assert run_dist(_default_link_worker, 1) == [("none", "none", True)]
    cfg = config_from_args(build_parser().parse_args(["train"]))
    assert cfg.link == "wan" and cfg.link_profile.name == "wan"


class _ReadsLastStep:
    """An observer that reads `sync.last_step` in on_boundary, as a loop's own logger may."""

    def __init__(self) -> None:
        self.sync: Any = None
        self.seen: list[float] = []

    def on_boundary(self, stats, decision) -> None:
        self.seen.append(self.sync.last_step.sync_seconds)


def _last_step_worker(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = _ReadsLastStep()
    sync = autok.Sync(
        model, opt, strategy="cpdp", sync_period=2, overlap_boundary=True, observers=[watcher]
    )
    watcher.sync = sync
    steps = []
    for x, y in _batches(rank, 8):
        with sync.step() as s:
            opt.zero_grad()
            loss = nn.functional.mse_loss(sync.model(x), y)
            loss.backward()
            opt.step()
            s.loss = loss
        steps.append(sync.last_step)
    sync.close()
    return len(watcher.seen), [t.sync_seconds >= 0 for t in steps]


def test_an_observer_reading_last_step_while_a_delayed_average_finishes_is_served():
    """With the average in flight (--overlap-boundary), its boundary's record reaches observers
    inside the step that finishes it: a read of `sync.last_step` there must not break the step's
    own bookkeeping, which then adds the finishing time to the same StepTimes."""
    for seen, ok in run_dist(_last_step_worker, 2):
        assert seen >= 3 and all(ok)
