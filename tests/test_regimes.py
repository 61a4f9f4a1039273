"""The regimes where K matters: label-skewed data (--partition dirichlet),
LR decay (--lr-schedule step) and stragglers (--straggler). Pure functions first (no process
group), then the built-in loop on real gloo processes (docs/design.md §2, Regimes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, Subset, TensorDataset

from autok.trainer.engine.optim import lr_factor
from autok.trainer.engine.straggler import Straggler, straggler_rank
from autok.trainer.loop.data import ShardSampler, class_labels, dirichlet_partition
from tests.dist import run_dist
from tests.helpers import tiny_cfg


def _labels(n: int = 4000, classes: int = 10, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def _mean_entropy(labels: np.ndarray, shards: list[np.ndarray], classes: int = 10) -> float:
    """Mean over ranks of the entropy (nats) of the rank's label histogram."""
    out = []
    for s in shards:
        p = np.bincount(labels[s], minlength=classes) / len(s)
        p = p[p > 0]
        out.append(float(-(p * np.log(p)).sum()))
    return float(np.mean(out))


# ----- the settings: each knob's option refused without its mode, one line naming the flag -----


@pytest.mark.parametrize(
    "settings, line",
    [
        ({"partition_alpha": 0.1}, "--partition-alpha: needs --partition dirichlet"),
        ({"partition": "dirichlet"}, "--partition: dirichlet needs --partition-alpha"),
        ({"straggler_ms": 5.0}, "--straggler-ms: needs --straggler random or slow-rank"),
        ({"straggler": "random"}, "--straggler: random needs --straggler-ms"),
        (
            {"straggler": "slow-rank", "straggler_ms": 5.0, "straggler_prob": 0.5},
            "--straggler-prob: only --straggler random",
        ),
        ({"lr_schedule": "step"}, "--lr-schedule: step needs --lr-milestones"),
        ({"lr_milestones": "0.5"}, "--lr-milestones: needs --lr-schedule step"),
        ({"lr_gamma": 0.5}, "--lr-gamma: only --lr-schedule step"),
        ({"lr_schedule": "step", "lr_milestones": "0.6,0.5"}, "--lr-milestones: 0.5 does not"),
        ({"lr_schedule": "step", "lr_milestones": "0.1"}, "--lr-milestones: 0.1 of 4 epochs falls"),
    ],
)
def test_a_regime_option_without_its_mode_is_refused_in_one_line(settings, line):
    from autok.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config({}, {"epochs": 4, **settings})
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_the_regime_settings_validate_again_unchanged_from_a_saved_config():
    """A resume re-reads config.json: milestones given as a YAML list are saved as the text."""
    from autok.config import load_config

    cfg = load_config(
        {"lr_milestones": [0.5, 0.75]},
        {"lr_schedule": "step", "partition": "dirichlet", "partition_alpha": 0.1},
    )
    assert cfg.lr_milestones == "0.5,0.75" and cfg.milestones == (0.5, 0.75)
    again = load_config({}, cfg.model_dump(mode="json"))
    assert again.model_dump() == cfg.model_dump()


# ----- --partition dirichlet -------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.0, 100.0])
def test_dirichlet_partition_is_deterministic_disjoint_and_of_equal_lengths(world, alpha):
    labels = _labels(4001)  # not a multiple of most worlds: the remainder goes unused
    shards = dirichlet_partition(labels, world, alpha, seed=3)
    again = dirichlet_partition(labels, world, alpha, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    assert [len(s) for s in shards] == [len(labels) // world] * world
    every = np.concatenate(shards)
    assert len(np.unique(every)) == len(every)  # disjoint, no repeats
    assert every.min() >= 0 and every.max() < len(labels)
    if world > 1:
        other = dirichlet_partition(labels, world, alpha, seed=4)
        assert any(not np.array_equal(a, b) for a, b in zip(shards, other, strict=True))


def test_label_skew_grows_as_alpha_falls():
    """Mean per-rank label entropy (log 10 = 2.30 nats is iid over 10 classes), over 5 seeds:
    100 is nearly iid, 0.1 leaves each rank a few classes even after the balancing step."""
    labels = _labels()
    alphas = [100.0, 1.0, 0.1, 0.01]
    entropy = [
        np.mean([_mean_entropy(labels, dirichlet_partition(labels, 4, a, s)) for s in range(5)])
        for a in alphas
    ]
    assert entropy[0] > 0.98 * math.log(10)
    assert all(a > b for a, b in zip(entropy, entropy[1:], strict=False)), entropy
    assert entropy[2] < 0.75 * math.log(10), entropy


def test_class_labels_come_from_targets_tensors_or_a_subset_and_are_refused_otherwise():
    y = torch.tensor([3, 1, 2, 0])
    td = TensorDataset(torch.zeros(4, 2), y)
    assert class_labels(td).tolist() == [3, 1, 2, 0]
    assert class_labels(Subset(td, [2, 0])).tolist() == [2, 3]

    class WithTargets(torch.utils.data.Dataset):
        targets = [5, 6]

        def __len__(self):
            return 2

    assert class_labels(WithTargets()).tolist() == [5, 6]
    with pytest.raises(ValueError, match="no class labels"):
        class_labels(TensorDataset(torch.zeros(4, 2)))
    with pytest.raises(ValueError, match="integer class"):
        class_labels(TensorDataset(torch.zeros(4, 2), torch.zeros(4)))  # regression targets


def test_a_shard_sampler_keeps_its_samples_and_reorders_them_each_epoch_as_seeded():
    s = ShardSampler(np.arange(10, 50), seed=5)
    first = list(s)
    assert sorted(first) == list(range(10, 50)) and len(s) == 40
    assert list(ShardSampler(np.arange(10, 50), seed=5)) == first
    s.set_epoch(1)
    assert sorted(s) == sorted(first) and list(s) != first


def test_iid_keeps_distributed_samplers_order_bit_for_bit():
    from autok.trainer.loop.run import train_sampler

    ds = TensorDataset(torch.zeros(103, 2), torch.arange(103) % 10)
    cfg = tiny_cfg(seed=11)
    for rank in range(3):
        ours = train_sampler(cfg, ds, rank, 3)
        ref = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=11)
        for epoch in (0, 4):
            ours.set_epoch(epoch)
            ref.set_epoch(epoch)
            assert list(ours) == list(ref)


def _partition_worker(rank, world):
    from autok.trainer.loop.run import Trainer

    cfg = tiny_cfg(partition="dirichlet", partition_alpha=0.1, workers=world, epochs=2)
    tr = Trainer(cfg, rank, world, None)
    seen = list(tr.sampler)  # epoch 0's order
    summary = tr.run()
    labels = class_labels(tr.task.train_dataset)
    return {
        "indices": seen,
        "labels": labels[seen].tolist(),
        "steps": tr.steps_per_epoch,
        "global_step": tr.global_step,
        "agree": len(set(summary["param_digest_per_rank"])) == 1,
    }


@pytest.mark.dist
def test_the_loop_trains_on_equal_disjoint_label_skewed_shards():
    res = run_dist(_partition_worker, 2)
    a, b = res[0]["indices"], res[1]["indices"]
    assert len(a) == len(b) and not set(a) & set(b)
    assert res[0]["steps"] == res[1]["steps"] and res[0]["global_step"] == res[1]["global_step"]
    assert all(r["agree"] for r in res)
    # skewed: each rank nearly lacks some class (iid would give every class about 10%)
    for r in res:
        p = np.bincount(r["labels"], minlength=10) / len(r["labels"])
        assert p.min() < 0.02, p


# ----- --lr-schedule step ----------------------------------------------------------------------


def test_step_schedule_multiplies_by_gamma_at_each_milestone_after_warmup():
    total, warm, ms = 100, 10, (0.5, 0.75)
    f = [lr_factor(s, total, warm, "step", ms, 0.1) for s in range(total)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warmup
    assert f[10] == f[49] == 1.0
    assert f[50] == f[74] == pytest.approx(0.1)
    assert f[75] == f[99] == pytest.approx(0.01)
    assert lr_factor(60, total, warm, "step", ms, 0.5) == 0.5
    # 0.1 of 30 steps is step 3, though 0.1 * 30 = 3.0000000000000004 in floating point
    assert [lr_factor(s, 30, 0, "step", (0.1,), 0.1) for s in (2, 3)] == [1.0, 0.1]


def _lr_worker(rank, world):
    from autok.trainer.loop.run import Trainer

    cfg = tiny_cfg(
        lr_schedule="step", lr_milestones="0.5,0.75", lr_gamma=0.2, epochs=4, workers=world
    )

    class LR:
        def __init__(self):
            self.lrs = []

        def on_step(self, step):  # after the scheduler: the next step's LR
            self.lrs.append(step.next_lr)

    obs = LR()
    tr = Trainer(cfg, rank, world, None, observers=[obs])
    tr.run()
    return obs.lrs, tr.steps_per_epoch


@pytest.mark.dist
def test_the_loop_steps_the_lr_down_at_the_milestones():
    lrs, per_epoch = run_dist(_lr_worker, 2)[0]
    total = 4 * per_epoch
    expected = [0.1 * lr_factor(s + 1, total, per_epoch, "step", (0.5, 0.75), 0.2) for s in
                range(total)]  # fmt: skip
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == pytest.approx(0.1 * 0.04)


# ----- --straggler -----------------------------------------------------------------------------


def test_slow_rank_is_the_last_rank_at_every_step():
    assert {straggler_rank("slow-rank", 1.0, 0, s, 4) for s in range(100)} == {3}
    assert {straggler_rank("none", 1.0, 0, s, 4) for s in range(100)} == {None}


def test_random_stragglers_are_a_seeded_draw_the_same_in_every_view():
    draw = [straggler_rank("random", 1.0, 42, s, 4) for s in range(4000)]
    assert draw == [straggler_rank("random", 1.0, 42, s, 4) for s in range(4000)]
    assert draw != [straggler_rank("random", 1.0, 43, s, 4) for s in range(4000)]
    counts = np.bincount(draw, minlength=4)
    assert counts.min() > 800, counts  # each rank about 1000 of 4000 (a fixed draw)
    some = [straggler_rank("random", 0.25, 42, s, 4) for s in range(4000)]
    assert 800 < sum(r is not None for r in some) < 1200
    # every rank's view: exactly the drawn rank waits, by straggler_ms
    views = [Straggler("random", 30.0, 1.0, 42, r, 4) for r in range(4)]
    for s in range(50):
        delays = [v.seconds(s) for v in views]
        assert sorted(delays) == [0.0, 0.0, 0.0, 0.03] and delays[draw[s]] == 0.03


def _straggler_worker(rank, world, mode):
    from autok.trainer.loop.run import Trainer

    cfg = tiny_cfg(straggler=mode, straggler_ms=25.0, workers=world, epochs=1, mnist1d_samples=300)

    class Forward:
        def __init__(self):
            self.steps = []

        def on_step(self, step):
            self.steps.append((step.global_step - 1, step.times.forward_seconds))

    obs = Forward()
    Trainer(cfg, rank, world, None, observers=[obs]).run()
    return obs.steps


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["slow-rank", "random"])
def test_a_straggling_step_counts_its_delay_as_that_ranks_forward_compute(mode):
    """A sleep lasts at least its length whatever the load: each step the schedule gives a rank
    takes at least 25 ms of forward compute on that rank (a lower bound only: no timing
    assumption about the other steps)."""
    res = run_dist(_straggler_worker, 2, mode)
    slow_steps = 0
    for rank, steps in enumerate(res):
        for step, forward in steps:
            if straggler_rank(mode, 1.0, 42, step, 2) == rank:
                slow_steps += 1
                assert forward >= 0.025, (rank, step, forward)
    assert slow_steps == len(res[0])  # one straggler per step (prob 1)


# ----- the trade-off the regimes exist for ------------------------------------------------------


@pytest.mark.slow
def test_label_skew_makes_a_large_k_cost_accuracy(tmp_path):
    """Regime R1 (its goal): Dirichlet α = 0.1 over 4 workers, no SlowMo, the same seed:
    K = 32 (one average per epoch) ends at least 3 points of test accuracy below K = 1 (measured:
    0.872 against 0.603 at seed 0)."""
    import json

    from tests.test_cli import autok

    final = {}
    for k in (1, 32):
        out = tmp_path / f"k{k}"
        res = autok(
            "train", "--dataset", "mnist1d", "--workers", "4", "--partition", "dirichlet",
            "--partition-alpha", "0.1", "--link", "none", "--slowmo-beta", "0", "--strategy",
            "cpdp", "--sync-period", str(k), "--seed", "0", "--epochs", "10", "--no-progress",
            "--out", str(out), timeout=900,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        final[k] = json.loads((out / "summary.json").read_text())["final_test_accuracy"]
    assert final[1] - final[32] >= 0.03, final
