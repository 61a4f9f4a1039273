"""Correct on every path (docs/design.md §8): the fused boundary under foreach SGD, ddp's
divergence guard, overlap with broadcast buffers, the replica check after a resume, exact zero
drift, world 3."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autok.trainer.engine.averaging import IntervalTotals, ParameterAverager, ReplicaMismatch
from tests.dist import run_dist
from tests.helpers import tiny_cfg
from tests.test_engine_dist import _final_params_worker, _flat

pytestmark = pytest.mark.dist

FOREACH_GRID = [
    (foreach, nesterov, wd)
    for foreach in (True, False)
    for nesterov in (True, False)
    for wd in (0.0, 5e-4)
]


def _fused_vs_two_phase_worker(rank, world):
    """Every combination in one process group: fused and two-phase runs of the same job."""
    from autok.trainer.loop.run import Trainer

    out = {}
    for foreach, nesterov, wd in FOREACH_GRID:
        for boundary in ("fused", "two-phase"):
            cfg = tiny_cfg(
                strategy="cpdp",
                sync_period=3,
                workers=world,
                boundary=boundary,
                nesterov=nesterov,
                weight_decay=wd,
                slowmo_beta=0.0,
                mnist1d_samples=300,
            )
            tr = Trainer(cfg, rank, world, None)
            for g in tr.optimizer.param_groups:
                g["foreach"] = foreach  # torch's multi-tensor path (the default on CUDA)
            tr.run()
            momenta = [s["momentum_buffer"].reshape(-1) for s in tr.optimizer.state.values()]
            out[(foreach, nesterov, wd, boundary)] = (_flat(tr.model), torch.cat(momenta))
    return out


def test_fused_boundary_is_exact_with_foreach_sgd_nesterov_and_weight_decay():
    """The fused boundary packs g_i as it enters the step: foreach SGD with Nesterov and no
    weight decay adds μ·buf into p.grad in place, which read after the step corrupts the
    momentum correction (buffers off by ~1.7 before the fix)."""
    for res in run_dist(_fused_vs_two_phase_worker, 2):
        for foreach, nesterov, wd in FOREACH_GRID:
            pf, mf = res[(foreach, nesterov, wd, "fused")]
            pt, mt = res[(foreach, nesterov, wd, "two-phase")]
            case = f"foreach={foreach} nesterov={nesterov} wd={wd}"
            assert torch.allclose(mf, mt, rtol=1e-4, atol=1e-5), (case, (mf - mt).abs().max())
            assert torch.allclose(pf, pt, rtol=1e-4, atol=1e-6), (case, (pf - pt).abs().max())


class _NanOnce:
    """A loader that hands rank `rank` one batch of NaNs at global step `step`, once."""

    def __init__(self, loader, trainer, rank, step):
        self.loader, self.tr, self.rank, self.step, self.done = loader, trainer, rank, step, False

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for x, y in self.loader:
            if self.rank == 1 and not self.done and self.tr.global_step == self.step:
                self.done = True
                x = torch.full_like(x, float("nan"))
            yield x, y


def _ddp_nan_worker(rank, world, out_dir):
    from pathlib import Path

    from autok.trainer.loop.run import Trainer

    cfg = tiny_cfg(
        strategy="ddp",
        workers=world,
        epochs=3,
        checkpoint_every=1,
        on_divergence="rollback",
        max_rollbacks=2,
    )
    rewinds = []

    class Watch:
        def on_rewind(self, epoch):
            rewinds.append((epoch, tr.global_step, tr.boundary))

    tr = Trainer(cfg, rank, world, Path(out_dir), observers=[Watch()])
    tr.train_loader = _NanOnce(tr.train_loader, tr, rank, tr.steps_per_epoch + 3)
    summary = tr.run()
    return {"rollbacks": tr.rollbacks, "rewinds": rewinds, "summary": summary}


def test_ddp_rolls_back_on_every_rank_at_the_same_boundary_after_one_ranks_nan(tmp_path):
    res = run_dist(_ddp_nan_worker, 2, str(tmp_path))
    assert [r["rollbacks"] for r in res] == [1, 1]
    assert res[0]["rewinds"] == res[1]["rewinds"] and len(res[0]["rewinds"]) == 1
    assert res[0]["rewinds"][0][0] == 0  # back to the end of epoch 0
    digests = [r["summary"]["param_digest_per_rank"] for r in res]
    assert digests[0] == digests[1] and len(set(digests[0])) == 1


def _overlap_broadcast_worker(rank, world):
    param = torch.nn.Parameter(torch.zeros(4))
    buffer = torch.full((3,), 10.0 + rank)  # e.g. BatchNorm statistics: rank 0's must win
    avg = ParameterAverager(
        [param],
        rank=rank,
        world_size=world,
        beta=0.0,
        lr_aware=False,
        broadcast_extras=lambda: [buffer],
    )
    pending = avg.start(IntervalTotals(1.0, 1, 0.0, 0.0), lr=0.1, clock=None, overlap=True)
    buffer.add_(1.0)  # the local step taken while the average is in flight
    avg.finish(pending)
    return buffer.clone()


@pytest.mark.parametrize("world", [2, 4])
def test_overlap_with_broadcast_buffers_keeps_rank0s_values_plus_the_local_step(world):
    for buf in run_dist(_overlap_broadcast_worker, world):
        assert torch.equal(buf, torch.full((3,), 11.0)), buf


def _resume_differing_worker(rank, world, out_dir):
    from pathlib import Path

    import autok.trainer.loop.run
    from autok.trainer.loop.run import Trainer

    cfg = tiny_cfg(strategy="cpdp", sync_period=3, workers=world, epochs=2, stop_after_epochs=1)
    assert Trainer(cfg, rank, world, Path(out_dir)).run() is None  # checkpoint after epoch 0
    dist.barrier()
    real = autok.trainer.loop.run.load_rank_file

    def differing(path, r):  # rank 1 resumes from weights that are not rank 0's
        state = real(path, r)
        if r == 1:
            first = next(iter(state["model"]))
            state["model"][first] = state["model"][first] + 1e-3
        return state

    autok.trainer.loop.run.load_rank_file = differing
    cfg = tiny_cfg(strategy="cpdp", sync_period=3, workers=world, epochs=2)
    tr = Trainer(cfg, rank, world, Path(out_dir), resume=True)
    try:
        tr.run()
    except ReplicaMismatch as exc:
        return str(exc)
    return None


def test_the_replica_check_catches_replicas_that_resumed_different(tmp_path):
    msgs = run_dist(_resume_differing_worker, 2, str(tmp_path))
    assert all(m and "replicas differ" in m for m in msgs), msgs


def _zero_drift_worker(rank, world, beta):
    torch.manual_seed(0)
    ref0 = torch.randn(1000)
    params = [torch.nn.Parameter(ref0[:600].clone()), torch.nn.Parameter(ref0[600:].clone())]
    averager = ParameterAverager(params, rank=rank, world_size=world, beta=beta, lr_aware=False)
    torch.manual_seed(1)  # the same step on every rank: the replicas move but agree
    with torch.no_grad():
        for p in params:
            p.add_(0.1 * torch.randn_like(p) + 0.01)
    return averager.reconcile(IntervalTotals(1.0, 1, 0.0, 0.0), lr=0.1, clock=None)


@pytest.mark.parametrize("beta", [0.0, 0.5])  # β > 0 sends θ_i − θ_ref, β = 0 sends θ_i
@pytest.mark.parametrize("world", [2, 4])
def test_zero_drift_reads_exactly_zero(world, beta):
    for rec in run_dist(_zero_drift_worker, world, beta):
        assert rec.update_norm > 1.0
        assert rec.drift_norm == 0.0


def test_cpdp_k1_beta0_matches_ddp_at_world_3_to_rounding():
    """Bit for bit holds at world sizes 2 and 4 (test_engine_dist); at 3 the float32 mean of
    three equal values can round, so the two paths agree to rounding only."""
    ddp = run_dist(_final_params_worker, 3, "ddp", 1, 0.0)
    two = run_dist(_final_params_worker, 3, "cpdp", 1, 0.0, "two-phase")
    for a, b in zip(ddp, two, strict=True):
        for name in a:
            assert torch.allclose(a[name], b[name], rtol=1e-5, atol=1e-6), name


def _bn_model() -> torch.nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
    )


def _ddp_buffers_worker(rank, world):
    """ddp under autok.Sync and a hand-written DDP loop (DDP's defaults), on the same batches:
    each rank's BatchNorm sees its own data (rank r's inputs shifted by 3r). Per step, every
    rank's buffers (and parameters) in each loop."""
    from torch.nn.parallel import DistributedDataParallel

    import autok

    g = torch.Generator().manual_seed(7 + rank)
    batches = [
        (torch.randn(8, 6, generator=g) + 3 * rank, torch.randn(8, 1, generator=g))
        for _ in range(6)
    ]

    def run(loop_model, module, opt, step):
        out = []
        for x, y in batches:
            step(loop_model, x, y, opt)
            out.append(
                (
                    torch.cat([b.reshape(-1).float() for b in module.buffers()]),
                    _flat(module),
                )
            )
        return out

    def plain_step(loop_model, x, y, opt):
        opt.zero_grad()
        torch.nn.functional.mse_loss(loop_model(x), y).backward()
        opt.step()

    model = _bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ddp = DistributedDataParallel(model)
    plain = run(ddp, model, opt, plain_step)

    model = _bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sync = autok.Sync(model, opt, strategy="ddp", link="none")

    def sync_step(loop_model, x, y, opt):
        with sync.step():
            plain_step(loop_model, x, y, opt)

    ours = run(sync.model, model, opt, sync_step)
    sync.close()
    return plain, ours


def test_ddp_broadcasts_rank0s_buffers_at_every_forward_as_ddp_does():
    """strategy="ddp" is DDP: BatchNorm's running stats are rank 0's at each forward (DDP's
    default), not each rank's own until the next sync_now(); bit for bit a plain DDP loop's."""
    for plain, ours in run_dist(_ddp_buffers_worker, 2):
        for (pb, pp), (ob, op) in zip(plain, ours, strict=True):
            assert torch.equal(pb, ob), (pb - ob).abs().max()
            assert torch.equal(pp, op)
