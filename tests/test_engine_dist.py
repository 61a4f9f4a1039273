"""The engine on real gloo process groups (world sizes 2 and 4)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autok.trainer.engine.averaging import IntervalTotals, ParameterAverager, ReplicaMismatch
from autok.trainer.loop.run import Trainer
from tests.dist import run_dist
from tests.helpers import expected_boundaries, tiny_cfg

pytestmark = pytest.mark.dist


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _fill_(model, value) -> None:
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.copy_(value[offset : offset + n].view_as(p).to(p.dtype))
            offset += n


def _rank_fill_worker(rank, world, strategy, k, beta):
    """Parameters are set to the rank after every boundary (but the epoch's last); with LR 0 the
    only thing that moves them is the boundary. Records every step against a hand computation:
    an epoch end the schedule did not make due (fewer than K steps since the last boundary) is
    unscheduled, θ_avg with SlowMo's reference and velocity untouched (docs/design.md §2)."""
    cfg = tiny_cfg(
        strategy=strategy,
        sync_period=k,
        slowmo_beta=beta,
        momentum=0.0,
        weight_decay=0.0,
        divergence_factor=1e12,  # parameters set to constants: the loss is meant to jump
        workers=world,
    )
    log = []

    class Observer:
        def __init__(self, tr):
            self.tr = tr
            self.n = _flat(tr.model).numel()
            self.ref = _flat(tr.model).double()  # θ_0: SlowMo's first reference
            self.v = torch.zeros(self.n, dtype=torch.float64)
            self.expected = torch.full((self.n,), float(rank), dtype=torch.float64)
            self.filled = True  # expected holds the rank (differs across ranks)
            self.since = 0  # steps since the last boundary
            _fill_(tr.model, self.expected)

        def on_step(self, step):
            tr, is_boundary = self.tr, step.is_boundary
            got = _flat(tr.model).double()
            self.since += 1
            if is_boundary:
                avg = torch.full_like(got, (world - 1) / 2) if self.filled else self.expected
                due, self.since = self.since >= (1 if tr.sync.warmup else k), 0
                if beta == 0 or not due:
                    new = avg
                else:
                    self.v = beta * self.v + (avg - self.ref)
                    new = self.ref + self.v
                if due:
                    self.ref = new
                self.expected = new.clone()
            err = (got - self.expected).abs().max().item()
            log.append((tr.global_step, is_boundary, err))
            # on_step comes after the step: global_step already counts it
            last_of_epoch = tr.global_step % tr.steps_per_epoch == 0
            if is_boundary and not last_of_epoch:
                self.expected = torch.full_like(got, float(rank))
                self.filled = True
                _fill_(tr.model, self.expected)
            elif is_boundary:
                self.filled = False

    tr = Trainer(cfg, rank, world, None)
    for g in tr.optimizer.param_groups:
        g["lr"] = 0.0
    tr.scheduler.base_lrs = [0.0] * len(tr.scheduler.base_lrs)
    tr.observers.append(Observer(tr))
    summary = tr.run()
    return {"log": log, "steps_per_epoch": tr.steps_per_epoch, "summary": summary}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("strategy", ["cpdp", "localsgd"])
def test_boundary_gives_exact_mean_and_nothing_moves_between(world, strategy):
    k = 3
    results = run_dist(_rank_fill_worker, world, strategy, k, 0.0)
    for res in results:
        log = res["log"]
        assert [b for _, b, _ in log] == expected_boundaries(res["steps_per_epoch"], 2, 1, k)
        # Exact: the mean of small integers is representable, and between boundaries LR 0 steps
        # under no_sync() must leave the rank's own values untouched.
        assert all(err == 0.0 for _, _, err in log), [e for e in log if e[2] != 0.0][:3]
    # steps per epoch is not a multiple of K, so the epoch-end boundary must have fired
    assert results[0]["steps_per_epoch"] % k != 0


@pytest.mark.parametrize("world", [2, 4])
def test_slowmo_wiring_matches_hand_computation(world):
    beta = 0.5
    for res in run_dist(_rank_fill_worker, world, "cpdp", 2, beta):
        assert max(err for _, _, err in res["log"]) < 1e-5


def test_sync_event_counts_follow_design_table():
    k = 3
    for strategy, (grad_per_boundary, param_per_boundary) in {
        "ddp": (1, 0),
        "localsgd": (0, 1),
        "cpdp": (1, 1),
    }.items():
        kk = 1 if strategy == "ddp" else k
        beta = 0.0 if strategy != "cpdp" else 0.3
        res = run_dist(_counts_worker, 2, strategy, kk, beta)[0]
        n_boundaries = sum(expected_boundaries(res["steps_per_epoch"], 2, 1, kk))
        s = res["summary"]
        assert s["boundaries"] == n_boundaries
        assert s["grad_syncs"] == grad_per_boundary * n_boundaries
        assert s["param_syncs"] == param_per_boundary * n_boundaries


def _counts_worker(rank, world, strategy, k, beta):
    cfg = tiny_cfg(strategy=strategy, sync_period=k, slowmo_beta=beta, workers=world)
    tr = Trainer(cfg, rank, world, None)
    return {"summary": tr.run(), "steps_per_epoch": tr.steps_per_epoch}


def _final_params_worker(rank, world, strategy, k, beta, boundary="auto"):
    cfg = tiny_cfg(
        strategy=strategy,
        sync_period=k,
        slowmo_beta=beta,
        workers=world,
        epochs=2,
        boundary=boundary,
    )
    tr = Trainer(cfg, rank, world, None)
    tr.run()
    return {n: p.detach().clone() for n, p in tr.model.state_dict().items()}


def test_cpdp_k1_beta0_is_exactly_ddp():
    """docs/design.md §2, bit for bit on the two-collective path; the fused path (the default, one
    collective) is the same math in another summation order: equal to rounding."""
    ddp = run_dist(_final_params_worker, 2, "ddp", 1, 0.0)
    two = run_dist(_final_params_worker, 2, "cpdp", 1, 0.0, "two-phase")
    fused = run_dist(_final_params_worker, 2, "cpdp", 1, 0.0, "fused")
    for a, b, c in zip(ddp, two, fused, strict=True):
        for name in a:
            assert torch.equal(a[name], b[name]), name
            assert torch.allclose(a[name], c[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.slow
def test_cpdp_k1_beta0_is_exactly_ddp_at_world_4():
    """The README's claim at world size 4 (a power of two: the mean of equal values divides
    exactly), on the two-collective path. Slow: two runs of four processes on two cores."""
    ddp = run_dist(_final_params_worker, 4, "ddp", 1, 0.0)
    two = run_dist(_final_params_worker, 4, "cpdp", 1, 0.0, "two-phase")
    for a, b in zip(ddp, two, strict=True):
        for name in a:
            assert torch.equal(a[name], b[name]), name


def _replica_check_worker(rank, world, strategy):
    cfg = tiny_cfg(strategy=strategy, sync_period=3, workers=world, lr=0.1)
    checked = []

    class Gather:
        def on_step(self, step):
            if not step.is_boundary:
                return
            mine = _flat(tr.model)
            all_ = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(all_, mine)  # test-only collective
            checked.append(all(torch.equal(all_[0], t) for t in all_))

    tr = Trainer(cfg, rank, world, None, observers=[Gather()])
    summary = tr.run()
    return checked, summary["param_digest_per_rank"]


@pytest.mark.parametrize("strategy", ["cpdp", "localsgd"])
def test_replicas_bit_identical_after_every_boundary(strategy):
    checked, digests = run_dist(_replica_check_worker, 4, strategy)[0]
    assert checked and all(checked)
    assert len(set(digests)) == 1 and len(digests) == 4


def _drift_worker(rank, world, beta):
    torch.manual_seed(0)
    ref0 = torch.randn(1000)
    params = [
        torch.nn.Parameter(ref0[:600].clone().view(20, 30)),
        torch.nn.Parameter(ref0[600:].clone()),
    ]
    averager = ParameterAverager(params, rank=rank, world_size=world, beta=beta, lr_aware=False)
    torch.manual_seed(100 + rank)  # local steps: each replica drifts its own way
    with torch.no_grad():
        params[0].add_(0.1 * torch.randn(20, 30))
        params[1].add_(0.05 * torch.randn(400) + 0.3)
    mine = torch.cat([p.detach().reshape(-1) for p in params]).double()
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    stack = torch.stack(gathered)
    avg = stack.mean(0)
    drift = ((stack - avg) ** 2).sum(1).mean().sqrt().item()
    update = (avg - ref0.double()).norm().item()
    rec = averager.reconcile(IntervalTotals(2.0 * (rank + 1), 2, 0.5, 0.25), lr=0.1, clock=None)
    return drift, update, rec


@pytest.mark.parametrize("beta", [0.0, 0.5])  # β > 0 sends θ_i − θ_ref, β = 0 sends θ_i
@pytest.mark.parametrize("world", [2, 4])
def test_drift_norm_matches_direct_computation_on_gathered_replicas(world, beta):
    for drift, update, rec in run_dist(_drift_worker, world, beta):
        assert rec.drift_norm == pytest.approx(drift, rel=1e-5)
        assert rec.update_norm == pytest.approx(update, rel=1e-5)
        # piggybacked scalars: loss mean over ranks and steps, times as means over ranks
        losses = sum(2.0 * (r + 1) for r in range(world))
        assert rec.train_loss == pytest.approx(losses / (2 * world))
        assert rec.compute_seconds == pytest.approx(0.5)
        assert rec.exposed_sync_seconds == pytest.approx(0.25)


def _narrow_worker(rank, world, dtype_name):
    """Parameters in bfloat16 or float16: two plain-average boundaries of the same start, each
    rank moved its own way before each, then one whose write-back goes wrong on rank 1, and
    the boundary after it."""
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(600, dtype=dtype)),
        torch.nn.Parameter(torch.randn(7, dtype=dtype)),
    ]
    averager = ParameterAverager(params, rank=rank, world_size=world, beta=0.0, lr_aware=False)
    totals = IntervalTotals(1.0, 1, 0.0, 0.0)
    out = {"buffer": None, "mismatch": None}
    for b in range(2):
        torch.manual_seed(100 * b + rank)
        with torch.no_grad():
            for p in params:
                p.add_(0.1 * torch.randn(p.shape, dtype=dtype))
        mine = torch.cat([p.detach().reshape(-1) for p in params])
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        stack = torch.stack(gathered).double()
        drift = ((stack - stack.mean(0)) ** 2).sum(1).mean().sqrt().item()
        rec = averager.reconcile(totals, lr=0.1, clock=None)
        # three bfloat16/float16 values sum exactly in float32: θ_new is their float32 mean,
        # rounded to the parameters' dtype as it is written back
        expected = (stack.float().sum(0) / world).to(dtype)
        got = torch.cat([p.detach().reshape(-1) for p in params])
        out[b] = (drift, rec.drift_norm, torch.equal(got, expected), got.dtype)
        out[f"ref{b}"] = torch.equal(averager.ref, got.float())  # θ_ref: what the replicas hold
    out["buffer"] = averager.flat.buf.dtype
    if rank == 1:  # a faulty write-back (as in _mismatch_worker): caught at the next boundary
        write_back = averager._copy_into

        def faulty(tensors, values):
            write_back(tensors, values)
            with torch.no_grad():
                tensors[0].view(-1)[0] += 1.0

        averager._copy_into = faulty
    averager.reconcile(totals, lr=0.1, clock=None)
    try:
        averager.reconcile(totals, lr=0.1, clock=None)
    except ReplicaMismatch as exc:
        out["mismatch"] = str(exc)
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrow_parameters_average_in_float32_and_their_replica_check_holds(dtype):
    """The averaging works in float32 for narrower parameters: in bfloat16 three ranks' digests
    summed in the buffer's own dtype rounded (a false ReplicaMismatch on agreeing replicas), in
    float16 they overflowed to inf (inf == 3 x inf: a real mismatch went unseen)."""
    for out in run_dist(_narrow_worker, 3, dtype):
        assert out["buffer"] == torch.float32
        for b in range(2):
            drift, drift_norm, exact, held = out[b]
            assert exact and held == getattr(torch, dtype)
            assert drift_norm == pytest.approx(drift, rel=1e-4)
            assert out[f"ref{b}"]
        assert out["mismatch"] and "after boundary 2" in out["mismatch"], out["mismatch"]


def _narrow_sync_worker(rank, world):
    """A bfloat16 model under autok.Sync: cpdp K=4, the fused boundary with SlowMo."""
    import autok
    from autok.trainer.engine.digest import param_digest
    from autok.trainer.loop.models import build_model

    torch.manual_seed(0)
    model = build_model("cnn1d", (40,), 10).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=4, policy="fixed", link="none")
    g = torch.Generator().manual_seed(rank)
    drifts = []
    for _ in range(12):
        x = torch.randn(16, 1, 40, generator=g, dtype=torch.bfloat16)
        y = torch.randint(0, 10, (16,), generator=g)
        with sync.step() as s:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(sync.model(x).float(), y).backward()
            opt.step()
        if s.is_boundary:
            drifts.append(sync.last_boundary.drift_norm)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    # θ_ref as the replicas hold it after the last boundary (step 12), in float32
    ref_held = sync.averager.ref.dtype == torch.float32 and torch.equal(
        sync.averager.ref, params.float()
    )
    sync.close()
    return drifts, param_digest(list(model.parameters()), 32), ref_held


def test_a_bfloat16_model_trains_under_sync_with_replicas_that_agree():
    res = run_dist(_narrow_sync_worker, 3)
    assert len({digest for _, digest, _ in res}) == 1  # every boundary wrote the same θ_new
    drifts = res[0][0]
    assert len(drifts) == 3 and all(0.0 < d < 1.0 for d in drifts), drifts
    assert all(r[0] == drifts and r[2] for r in res)


def _mismatch_worker(rank, world):
    """Rank 1's write-back at boundary 2 goes wrong (as a faulty reduce would): the replicas leave
    that boundary different, and the digest riding in boundary 3's buffer must say so."""
    cfg = tiny_cfg(strategy="cpdp", sync_period=2, workers=world)
    tr = Trainer(cfg, rank, world, None)
    averager, write_back = tr.averager, tr.averager._copy_into

    def faulty(tensors, values):
        write_back(tensors, values)
        params = averager.params  # the write-back of the parameters (views of them, detached)
        is_params = len(tensors) == len(params) and all(
            t.data_ptr() == p.data_ptr() for t, p in zip(tensors, params, strict=True)
        )
        if rank == 1 and averager.boundaries == 3 and is_params:
            with torch.no_grad():
                tensors[0].view(-1)[0] += 1e-3

    averager._copy_into = faulty
    try:
        tr.run()
    except ReplicaMismatch as exc:
        return str(exc)
    return None


def test_replica_mismatch_is_caught_at_the_next_boundary():
    msgs = run_dist(_mismatch_worker, 2)
    assert all(m and "boundary 2" in m for m in msgs), msgs


def _policy_worker(rank, world, data_dir, buffer_policy, sync_opt):
    cfg = tiny_cfg(
        dataset="imagefolder",
        data_dir=data_dir,
        image_size=16,
        model="resnet18",
        batch_size=8,
        epochs=1,
        warmup_epochs=0,
        sync_period=4,
        workers=world,
        buffer_policy=buffer_policy,
        sync_optimizer_state=sync_opt,
    )
    tr = Trainer(cfg, rank, world, None)
    tr.run()
    buffers = torch.cat([b.reshape(-1) for b in tr.float_buffers])
    momenta = torch.cat(
        [
            t.reshape(-1)
            for t in tr.optimizer.state_dict()["state"][0].values()
            if isinstance(t, torch.Tensor)
        ]
    )
    return buffers, momenta


@pytest.mark.parametrize(
    "buffer_policy, sync_opt", [("average", True), ("broadcast", False), ("local", False)]
)
def test_buffer_and_optimizer_state_policies(tmp_path, buffer_policy, sync_opt):
    from tests.test_data import write_imagefolder

    # a model with BatchNorm buffers, on image files (PNG: nothing is unpickled)
    root = write_imagefolder(tmp_path, classes=("a", "b"), per_class=16)
    (b0, m0), (b1, m1) = run_dist(_policy_worker, 2, root, buffer_policy, sync_opt)
    if buffer_policy == "local":
        assert not torch.equal(b0, b1)  # each rank's BatchNorm saw its own shard
    else:
        assert torch.equal(b0, b1)
    assert torch.equal(m0, m1) == sync_opt


def _seeded_worker(rank, world, seed, optimizer, nesterov):
    cfg = tiny_cfg(
        strategy="cpdp",
        sync_period=3,
        workers=world,
        seed=seed,
        optimizer=optimizer,
        nesterov=nesterov,
        lr=0.01 if optimizer == "adamw" else 0.1,
    )
    tr = Trainer(cfg, rank, world, None)
    summary = tr.run()
    return _flat(tr.model), summary


# Determinism does not hang on the optimizer: the default suite keeps plain SGD (CI's 20-minute
# budget); Nesterov and AdamW run with -m slow.
@pytest.mark.parametrize(
    "optimizer, nesterov",
    [
        ("sgd", False),
        pytest.param("sgd", True, marks=pytest.mark.slow),
        pytest.param("adamw", False, marks=pytest.mark.slow),
    ],
)
def test_deterministic_given_seed(optimizer, nesterov):
    (a, sa), _ = run_dist(_seeded_worker, 2, 7, optimizer, nesterov)
    (b, _), _ = run_dist(_seeded_worker, 2, 7, optimizer, nesterov)
    (c, _), _ = run_dist(_seeded_worker, 2, 8, optimizer, nesterov)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.isfinite(a).all() and 0.0 <= sa["final_test_accuracy"] <= 1.0


def _boundary_mode_worker(rank, world, boundary, nesterov, weight_decay, beta, sync_opt):
    cfg = tiny_cfg(
        strategy="cpdp",
        sync_period=3,
        workers=world,
        boundary=boundary,
        nesterov=nesterov,
        weight_decay=weight_decay,
        slowmo_beta=beta,
        sync_optimizer_state=sync_opt,
        epochs=2,
    )
    tr = Trainer(cfg, rank, world, None)
    summary = tr.run()
    momenta = [s["momentum_buffer"].clone() for s in tr.optimizer.state.values()]
    return _flat(tr.model), torch.cat([m.reshape(-1) for m in momenta]), summary


@pytest.mark.parametrize(
    "nesterov, weight_decay, beta, sync_opt",
    [  # the plainest and the fullest case by default; the two between with -m slow
        (False, 0.0, 0.0, False),
        pytest.param(True, 5e-4, 0.0, False, marks=pytest.mark.slow),
        pytest.param(False, 5e-4, 0.3, False, marks=pytest.mark.slow),
        (True, 5e-4, 0.5, True),
    ],
)
def test_fused_boundary_matches_the_two_collective_path(nesterov, weight_decay, beta, sync_opt):
    fused = run_dist(_boundary_mode_worker, 2, "fused", nesterov, weight_decay, beta, sync_opt)
    two = run_dist(_boundary_mode_worker, 2, "two-phase", nesterov, weight_decay, beta, sync_opt)
    for (pf, mf, sf), (pt, mt, st) in zip(fused, two, strict=True):
        assert torch.allclose(pf, pt, rtol=1e-4, atol=1e-6), (pf - pt).abs().max()
        assert torch.allclose(mf, mt, rtol=1e-4, atol=1e-6), (mf - mt).abs().max()
        # same sync events, one collective fewer per boundary on the wire
        assert sf["grad_syncs"] == st["grad_syncs"] == sf["boundaries"]
    assert torch.equal(fused[0][0], fused[1][0])  # replicas agree


def _overlap_worker(rank, world):
    cfg = tiny_cfg(
        strategy="localsgd",
        sync_period=3,
        workers=world,
        overlap_boundary=True,
        mnist1d_samples=1000,
        slowmo_beta=0.0,
    )
    tr = Trainer(cfg, rank, world, None)
    av, finish, checks = tr.averager, tr.averager.finish, []

    def gather(t):
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t.contiguous())  # test-only collective
        return out

    def watched(pending, settle=False):
        if not pending.overlap or settle:
            return finish(pending, settle=settle)
        before, sent = _flat(tr.model).clone(), av.flat.snapshot[: av.numel].clone()
        rec = finish(pending)
        after, theta_new = _flat(tr.model), av.ref.clone()
        news, sents = gather(theta_new), gather(sent)
        checks.append(
            {
                # what the replicas agree on after the correction: bit-identical everywhere
                "agree": all(torch.equal(news[0], t) for t in news),
                # ...and it is the average of what they sent (β = 0)
                "is_mean": torch.allclose(theta_new, torch.stack(sents).mean(0), atol=1e-6),
                # each rank keeps the local step it took while the average was in flight
                "kept_step": torch.allclose(after - before, theta_new - sent, atol=1e-6),
                "moved": not torch.equal(before, sent),
            }
        )
        return rec

    av.finish = watched
    summary = tr.run()
    return checks, summary


def test_overlapped_averaging_is_applied_one_step_later_and_replicas_agree():
    for checks, summary in run_dist(_overlap_worker, 2):
        assert checks and all(c["agree"] and c["is_mean"] and c["kept_step"] for c in checks)
        assert all(c["moved"] for c in checks)  # a local step really happened in between
        assert len(set(summary["param_digest_per_rank"])) == 1  # epoch ends are synchronous


def _count_worker(rank, world, strategy, boundary, link):
    """Counts the real collectives per boundary (wrapping, not replacing, all_reduce) and what
    the engine counts (`collectives`). With no link DDP all-reduces the gradients in C++, out of
    Python's sight; with an emulated one through autok's comm hook, which the wrapper sees."""
    import autok.trainer.engine.averaging
    import autok.trainer.engine.grad_hook
    import autok.trainer.engine.link

    calls = {"n": 0}
    real = dist.all_reduce

    def counting(*a, **kw):
        calls["n"] += 1
        return real(*a, **kw)

    engine = autok.trainer.engine
    for mod in (engine.averaging, engine.grad_hook, engine.link):
        mod.dist.all_reduce = counting  # the same module object: one patch covers all
    cfg = tiny_cfg(
        strategy=strategy,
        sync_period=3,
        boundary=boundary,
        workers=world,
        warmup_epochs=0,
        epochs=1,
        link=link,
    )
    per_boundary, counted, ptrs = [], [], set()

    class Count:
        last = 0
        last_counted = 0

        def on_boundary(self, stats, decision):
            per_boundary.append(calls["n"] - self.last)
            self.last = calls["n"]
            counted.append(tr.sync.collectives - self.last_counted)
            self.last_counted = tr.sync.collectives
            if tr.averager is not None:
                ptrs.add(tr.averager.flat.buf.data_ptr())

    class CountingGroup:
        """The gradient hook's process group: it calls the group's allreduce directly."""

        def __init__(self, group):
            self.group = group

        def allreduce(self, tensors):
            calls["n"] += 1
            return self.group.allreduce(tensors)

    counter = Count()
    tr = Trainer(cfg, rank, world, None, observers=[counter])
    tr.sync.grad_state.process_group = CountingGroup(dist.distributed_c10d._get_default_group())
    counter.last = calls["n"]  # start-up collectives are not a boundary's
    tr.run()
    dist.all_reduce = real
    return per_boundary, counted, ptrs


@pytest.mark.parametrize(
    "strategy, boundary, link, seen, per_boundary",
    [
        ("cpdp", "fused", "none", 1, 1),  # parameters and gradients in ONE collective
        # one gradient bucket (this model) + the parameter average
        ("cpdp", "two-phase", "lan", 2, 2),
        ("cpdp", "two-phase", "none", 1, 2),  # the bucket in C++: counted, not seen
        ("localsgd", "auto", "none", 1, 1),
    ],
)
def test_one_flat_collective_per_boundary_and_a_persistent_buffer(
    strategy, boundary, link, seen, per_boundary
):
    real, counted, ptrs = run_dist(_count_worker, 2, strategy, boundary, link)[0]
    assert real and set(real) == {seen}, real
    assert set(counted) == {per_boundary}, counted
    assert len(ptrs) == 1  # the flat buffer is reused, never reallocated


@pytest.mark.parametrize("strategy, k", [("ddp", 1), ("cpdp", 8)])
def test_the_step_bench_pairs_each_timed_step_with_the_plain_one_on_its_batch(strategy, k):
    """`autok bench` (a) and (g): both sides time the same batches (cpdp: all but every k-th,
    the boundaries), so every round has its pairs (benchmarks/stats.py, paired_round, would
    raise on a batch one side timed alone); the goal's ratio is the paired one."""
    from autok.launch import prepare_data
    from benchmarks import engine

    cfg = tiny_cfg(strategy=strategy, sync_period=k, epochs=1)
    prepare_data(cfg)
    res = engine._workers(engine._interleaved_steps, 2, None, cfg.model_dump_json(), 2, 1)[0]
    steps = res["steps_per_epoch"]  # one epoch a round, after an untimed first round
    if strategy == "cpdp":  # boundaries (untimed) fall on every k-th step of the whole run
        timed = [sum((s + 1) % k != 0 for s in range(r * steps, (r + 1) * steps)) for r in (1, 2)]
    else:
        timed = [steps, steps]
    assert res["pairs"] == timed
    assert strategy == "ddp" or min(timed) < steps  # the cpdp rounds hold a boundary each
    out = engine._step_ratios(res, 2)
    assert out["ratio"]["rounds"] == res["paired"] and "goal" in out["ratio"]
    assert out["unpaired_ratio"]["rounds"] == [
        a / p for a, p in zip(res["autok"], res["plain"], strict=True)
    ]


def test_the_boundary_bench_times_both_sides_and_how_busy_the_bare_collective_keeps_a_rank():
    """`autok bench` (h): per round, one median for the boundary, the bare all_reduce and the
    references, and the bare all_reduce's CPU time (all of the rank's threads, gloo's included)
    over its wall time on the rank's cores: a share of the cores, the idle rest of which bounds
    what pipelining the boundary's work into the collective could hide."""
    from autok.launch import prepare_data
    from benchmarks import engine

    cfg = tiny_cfg(strategy="cpdp", link="none")
    prepare_data(cfg)
    res = engine._workers(engine._boundaries, 2, None, cfg.model_dump_json(), "cnn1d", 2, 3)[0]
    for side in ("autok", "bare", "floor", "torch_average", "bare_params", "bare_cpu_share"):
        assert len(res[side]) == 2 and all(v > 0 for v in res[side]), (side, res[side])
    # CPU time on the rank's own cores cannot exceed their wall time (the two clock reads
    # around the collective's timer add a few µs at most)
    assert all(s <= 1.2 for s in res["bare_cpu_share"]), res["bare_cpu_share"]
    assert res["buffer_numel"] > 2 * res["params"]  # Δ_i, g_i and the scalar tail


def _bench_passes_worker(rank, world):
    """Two fused boundaries of a small MLP (SlowMo β = 0.3, SGD momentum): the real averager's,
    and benchmarks.fused_passes's passes on copies of what the second one started from, with
    the same collective between their start and finish."""
    from autok.trainer.engine.outer import OuterOptimizer
    from benchmarks.fused_passes import finish_passes, start_passes

    def flat(ts) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in ts])

    torch.manual_seed(0)  # the same θ_0 on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1000)
    )  # 67,624 parameters: the row norms' form of sq_norm (from 65,536), with a tail of 40
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    outer = OuterOptimizer("slowmo", 1.0, 0.3)
    averager = ParameterAverager(params, rank=rank, world_size=world, outer=outer, fused_sgd=opt)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(2):  # the second starts from a velocity the first left
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        averager.capture_boundary_grads()  # the optimizer pre-hook's copy
        opt.step()  # the boundary step, local: θ_i and m_i now differ between the ranks
        momenta = [opt.state[p]["momentum_buffer"] for p in params]
        theta, m, g = flat(params), flat(momenta), flat(p.grad for p in params)
        ref, v = averager.ref.clone(), averager.velocity.clone()
        got = averager.reconcile(IntervalTotals(1.0, 1, 0.0, 0.0), 0.1, None)
    n = theta.numel()
    buf = torch.cat([torch.empty(n), g])
    s = start_passes(theta, ref, m, buf[n:], v, buf[:n], outer.momentum)
    dist.all_reduce(buf)
    u, digest = finish_passes(buf[:n], buf[n:], m, v, ref, theta, 1 / world, 1 / world)
    return {
        "bench": [theta, ref, m, v],
        "autok": [flat(params), averager.ref, flat(momenta), averager.velocity],
        "s": float(s),
        "u": float(u),
        "digest": int(digest) % (1 << 32),
        "update_norm": got.update_norm,
        "drift_norm": got.drift_norm,
        "last_digest": averager.last_digest,
        "bits": averager._bits,
    }


def test_the_fused_passes_bench_times_the_boundarys_own_arithmetic():
    """benchmarks/fused_passes.py times its own functions as the fused boundary's host passes:
    they must compute what ParameterAverager's start and finish compute, bit for bit for the
    state (θ, θ_ref, momentum, velocity), to rounding for the norms, and the digest's sum."""
    from autok.trainer.engine.digest import _MIX

    results = run_dist(_bench_passes_worker, 2)
    for r in results:
        for name, b, a in zip(("θ", "θ_ref", "m", "v"), r["bench"], r["autok"], strict=True):
            assert torch.equal(b, a), name
        assert r["u"] == pytest.approx(r["update_norm"] ** 2, rel=1e-6)
        assert r["update_norm"] > 0
        assert ((r["digest"] * _MIX) % (1 << 32)) >> (32 - r["bits"]) == r["last_digest"]
    # the drift from the ranks' s_i: mean_i s_i − ||mean Δ||²
    drift_sq = sum(r["s"] for r in results) / 2 - results[0]["u"]
    assert drift_sq == pytest.approx(results[0]["drift_norm"] ** 2, rel=1e-5)
    assert drift_sq > 0
