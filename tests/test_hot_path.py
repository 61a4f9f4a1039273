"""The Python a step under `autok.Sync` runs, counted (benchmarks/bytecodes.py), held to a
budget: a count, unlike a time, is the same on every run, so this cannot flake on a busy
machine, and any per-step work added to the hot path (docs/design.md §4, Per step) shows in it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autok
from autok.trainer.engine.ddp_path import DDP_PARAM_CHECK_EVERY
from autok.trainer.loop.models import build_model
from benchmarks.bytecodes import count
from tests.dist import run_dist

pytestmark = pytest.mark.dist

# autok's own bytecodes per step of the cnn1d at world 2, with about 3% headroom over what they
# were when set (the counts, and what moved them: benchmarks/results/measurements-in-code.md). The
# counts are exact: a change that adds per-step work fails here; lower a budget when a change
# removes some.
DDP_STEP = 740
LOCAL_STEP = 580
BOUNDARY = 4125


def _counts(strategy: str, rank: int) -> list[tuple[int, bool]]:
    """autok's own bytecodes of each of 12 steps (after 8 uncounted) of a user's loop, and
    whether the step was a boundary."""
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 1, 40, generator=g), torch.randint(0, 10, (16,), generator=g)
    torch.manual_seed(0)
    model = build_model("cnn1d", (40,), 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    k = 4 if strategy == "cpdp" else 1
    sync = autok.Sync(model, opt, strategy=strategy, sync_period=k, policy="fixed", link="none")
    handles = []

    def step():
        with sync.step() as s:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(sync.model(x), y)
            loss.backward()
            opt.step()
            s.loss = loss
        handles.append(s)

    # 20 steps in all: no ddp boundary the guard judges (every DDP_PARAM_CHECK_EVERY-th, 64),
    # and cpdp at K = 4 from the start (no warmup at K = 1). Uncounted: cpdp's first boundary
    # (auto: two-phase, until a boundary step shows the gradients untouched after backward;
    # trainer/engine/grad_watch.py) and the local step after it, which drops the gradient hook it
    # armed
    for _ in range(8):
        step()
    assert sync.k_in_force == k and DDP_PARAM_CHECK_EVERY > 20
    assert k == 1 or sync.strategy.fused_gradients
    counts = [(count(step)[1], handles[-1].is_boundary) for _ in range(12)]
    sync.close()
    return counts


def _counts_worker(rank, world):
    """ddp, and cpdp K=4 (the fused boundary, SlowMo), on the cnn1d with no link."""
    return {strategy: _counts(strategy, rank) for strategy in ("ddp", "cpdp")}


def test_a_step_under_sync_runs_no_more_python_than_its_budget():
    for res in run_dist(_counts_worker, 2):
        ddp = [n for n, _ in res["ddp"]]
        assert len(set(ddp)) == 1, ddp  # every ddp step runs the same code (no check is due)
        assert 0 < ddp[0] <= DDP_STEP, ddp
        local = [n for n, boundary in res["cpdp"] if not boundary]
        boundaries = [n for n, boundary in res["cpdp"] if boundary]
        assert len(boundaries) == 3 and len(set(local)) == 1, res["cpdp"]
        assert 0 < local[0] <= LOCAL_STEP, local
        assert max(boundaries) <= BOUNDARY, boundaries
