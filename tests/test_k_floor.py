"""exposed-sync's K floor where --k-floor is not given: the optimizer's (trainer/engine/k_floor.py;
docs/design.md §6, "the floor")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import autok
from autok.config import load_config
from autok.trainer.engine.k_floor import default_floor
from autok.trainer.engine.optim import SECOND_MOMENT, build_optimizer, divides_by_second_moment
from autok.training_settings import DIVIDES_BY_SECOND_MOMENT
from tests.dist import run_dist

SECOND_MOMENT_STATE = {"exp_avg_sq", "square_avg", "sum", "exp_inf", "row_var", "variance"}


def _stepped_state_keys(cls: type[torch.optim.Optimizer]) -> set[str] | None:
    """The state keys `cls` keeps after one step on a small dense (or sparse) parameter, or None
    where it cannot be made with an LR alone."""
    p = nn.Parameter(torch.ones(4, 3))
    try:
        opt = cls([p], lr=0.01)
    except (TypeError, ValueError):
        return None
    grad = torch.full((4, 3), 0.5)
    p.grad = grad.to_sparse() if cls is torch.optim.SparseAdam else grad
    opt.step(lambda: p.sum())  # a closure: LBFGS needs one, the others call it if given
    return set(opt.state[p])


def test_the_family_is_every_torch_optimizer_that_keeps_a_second_moment():
    """The list is checked against torch itself: every optimizer class torch ships that keeps a
    second-moment state after a step is in SECOND_MOMENT, and none that keeps none (SGD)."""
    seen = 0
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        if cls is torch.optim.Optimizer or (keys := _stepped_state_keys(cls)) is None:
            continue
        seen += 1
        assert (cls in SECOND_MOMENT) == bool(keys & SECOND_MOMENT_STATE), (name, keys)
    assert seen >= 10  # SGD, Adam, AdamW, ... were all stepped
    assert torch.optim.SGD not in SECOND_MOMENT


def test_autok_trains_named_optimizers_are_read_as_their_torch_classes():
    """TrainConfig resolves the floor from --optimizer's name; the class autok train builds for
    that name must be what autok.Sync would read from the object."""
    from typing import get_args

    model = nn.Linear(2, 2)
    names = get_args(load_config.__globals__["TrainConfig"].model_fields["optimizer"].annotation)
    assert set(names) == set(DIVIDES_BY_SECOND_MOMENT)  # every choice has its answer
    for name in names:
        built = build_optimizer(name, model, 0.1, 0.0, 0.0, False)
        assert divides_by_second_moment(built) is DIVIDES_BY_SECOND_MOMENT[name]


@pytest.mark.parametrize(
    "given, floor, start",
    [
        ({"optimizer": "adamw"}, 2, 2),  # the direct rule with lowering starts at the floor
        ({"optimizer": "sgd"}, 1, 1),
        ({"optimizer": "adamw", "sync_period": 8}, 2, 8),
        ({"optimizer": "adamw", "max_sync_period": 1}, 1, 1),  # K may not reach 2
        ({"optimizer": "adamw", "k_floor": 1}, 1, 1),  # a floor given is kept
        ({"optimizer": "adamw", "k_floor": 3}, 3, 3),
        ({"optimizer": "adamw", "k_rule": "double"}, 2, 4),  # started at max(4, floor)
    ],
)
def test_autok_train_resolves_and_records_the_floor_of_its_optimizer(given, floor, start):
    cfg = load_config({}, {"policy": "exposed-sync", "strategy": "cpdp", **given})
    assert (cfg.k_floor, cfg.sync_period) == (floor, start)
    # config.json carries it: saved and read again, the run is the same
    again = load_config({}, cfg.model_dump(mode="json"))
    assert (again.k_floor, again.sync_period) == (floor, start)


def test_a_start_given_under_the_optimizers_floor_is_refused_naming_both_ways_out():
    from autok.config import ConfigError

    with pytest.raises(ConfigError) as exc:
        load_config({}, {"policy": "exposed-sync", "optimizer": "adamw", "sync_period": 1})
    said = str(exc.value)
    assert said.startswith("--sync-period: 1 is under the K floor 2") and "--k-floor 1" in said
    given = {"policy": "exposed-sync", "optimizer": "adamw", "sync_period": 1, "k_floor": 1}
    assert load_config({}, given).sync_period == 1


def test_under_ddp_the_policy_is_refused_before_any_floor():
    from autok.config import ConfigError

    given = {"strategy": "ddp", "policy": "exposed-sync", "optimizer": "adamw", "sync_period": 1}
    with pytest.raises(ConfigError, match="^--policy: ddp keeps K=1"):
        load_config({}, given)


def test_a_policy_that_reads_no_floor_resolves_none():
    cfg = load_config({}, {"policy": "fixed", "strategy": "cpdp", "optimizer": "adamw"})
    assert cfg.k_floor is None and cfg.sync_period == 4
    composite = load_config({}, {"policy": "composite", "optimizer": "adamw"})
    assert composite.k_floor == 2


def test_default_floor_fits_under_the_cap():
    assert default_floor(False, 64) == 1
    assert default_floor(True, 64) == 2
    assert default_floor(True, 1) == 1


class _MyAdam(torch.optim.Adam):
    """A user's subclass: still of the family."""


def _library_worker(rank, world, tmp):
    out = {}
    cases = {
        "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), {}),
        "adamw": (lambda p: torch.optim.AdamW(p, lr=0.01), {}),
        "rmsprop": (lambda p: torch.optim.RMSprop(p, lr=0.01), {}),
        "subclass": (lambda p: _MyAdam(p, lr=0.01), {}),
        "adamw-start-4": (lambda p: torch.optim.AdamW(p, lr=0.01), {"sync_period": 4}),
        "adamw-given-1": (lambda p: torch.optim.AdamW(p, lr=0.01), {"k_floor": 1}),
        "adamw-fixed": (lambda p: torch.optim.AdamW(p, lr=0.01), {"policy": "fixed"}),
    }
    for name, (make, kw) in cases.items():
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = make(model.parameters())
        sync = autok.Sync(model, opt, **({"policy": "exposed-sync", "link": "wan"} | kw))
        floor = getattr(sync.controller, "k_floor", None)
        out[name] = (sync.options.k_floor, sync.options.sync_period, sync.sync_period, floor)
        sync.close()
    model = nn.Linear(4, 1)
    made = Path(tmp) / "never"
    try:
        adamw = torch.optim.AdamW(model.parameters())
        autok.Sync(model, adamw, policy="exposed-sync", sync_period=1, out_dir=made)
    except autok.OptionError as exc:
        out["refused"] = str(exc)
    out["made"] = made.exists()  # refused before anything was written
    # the engine's own options= path: a start set on a copy is kept, as given
    from autok.trainer.engine.options import SyncOptions
    from autok.trainer.engine.sync import Sync as Engine

    copied = SyncOptions(policy="exposed-sync").model_copy(update={"sync_period": 8})
    engine = Engine(model, torch.optim.AdamW(model.parameters()), options=copied)
    out["copied"] = (engine.options.k_floor, engine.sync_period)
    engine.close()
    return out


@pytest.mark.dist
def test_autok_sync_takes_the_floor_of_the_optimizer_it_is_given(tmp_path):
    """(options' floor, options' start, the K the Sync starts at, the controller's floor)."""
    for out in run_dist(_library_worker, 2, str(tmp_path)):
        assert out["sgd"] == (1, 1, 1, 1)
        assert out["adamw"] == (2, 2, 2, 2)
        assert out["rmsprop"] == (2, 2, 2, 2)
        assert out["subclass"] == (2, 2, 2, 2)
        assert out["adamw-start-4"] == (2, 4, 4, 2)  # a start given is kept
        assert out["refused"].startswith("--sync-period: 1 is under the K floor 2"), out
        assert out["made"] is False
        assert out["copied"] == (2, 8)
        assert out["adamw-given-1"] == (1, 1, 1, 1)
        assert out["adamw-fixed"] == (None, 4, 4, None)


def _lan_adamw_run(out, *extra: str) -> tuple[str, dict, list[dict]]:
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "autok.cli", "train", "--workers", "2", "--epochs", "2"]
    cmd += ["--mnist1d-samples", "500", "--no-progress", "--clock", "virtual"]
    cmd += ["--compute-ms", "20", "--link", "lan", "--strategy", "cpdp", "--warmup-epochs", "0"]
    cmd += ["--policy", "exposed-sync", "--optimizer", "adamw", "--lr", "0.003", *extra]
    res = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    records = [json.loads(line) for line in (out / "boundaries.jsonl").read_text().splitlines()]
    return res.stderr + res.stdout, config, records


def test_autok_train_under_adamw_keeps_k_at_2_records_it_and_says_so(tmp_path):
    """End to end: an exposed-sync AdamW run on the LAN, where the link alone takes K to 1
    (--k-floor 1 shows it), starts at 2 and stays there; config.json records the floor and the
    first line names it."""
    said, config, records = _lan_adamw_run(tmp_path / "default")
    assert "cpdp/exposed-sync (K >= 2) on 2 workers" in said
    assert (config["k_floor"], config["sync_period"]) == (2, 2)
    assert records and {r["sync_period"] for r in records} == {2}
    assert {r["next_sync_period"] for r in records} == {2}
    said, config, records = _lan_adamw_run(tmp_path / "floor1", "--k-floor", "1")
    assert "(K >=" not in said and config["k_floor"] == 1
    assert {r["sync_period"] for r in records} == {1}
    # warmup forces K = 1 whatever the floor, and the first line says so
    said, config, records = _lan_adamw_run(tmp_path / "warmup", "--warmup-epochs", "1")
    assert "cpdp/exposed-sync (K >= 2 after warmup's K = 1) on 2 workers" in said
    assert {r["sync_period"] for r in records if r["epoch"] == 0} == {1}
    assert {r["sync_period"] for r in records if r["epoch"] == 1} == {2}


def _state_worker(rank, world):
    """A state saved under SGD (floor 1), loaded into an AdamW Sync (floor 2) and into one given
    k_floor=1; and the same state with no floor recorded (saved before it was)."""
    out = {}
    model = nn.Linear(4, 1)
    sgd = autok.Sync(model, torch.optim.SGD(model.parameters(), lr=0.1), policy="exposed-sync")
    state = sgd.state_dict()
    sgd.close()
    old = {**state, "kind": {k: v for k, v in state["kind"].items() if k != "k_floor"}}
    for name, kw, saved in (
        ("adamw", {}, state),
        ("adamw-old", {}, old),
        ("adamw-floor-1", {"k_floor": 1}, old),
    ):
        model = nn.Linear(4, 1)
        opt = torch.optim.AdamW(model.parameters())
        sync = autok.Sync(model, opt, policy="exposed-sync", **kw)
        try:
            sync.load_state_dict(saved)
            out[name] = "loaded"
        except autok.OptionError as exc:
            out[name] = str(exc)
        sync.close()
    return out


@pytest.mark.dist
def test_a_saved_state_resumes_only_under_the_floor_it_ran_with():
    for out in run_dist(_state_worker, 2):
        said = "load_state_dict: saved with k_floor 1; this Sync has 2 (pass k_floor=1 to "
        assert out["adamw"] == said + "continue it)", out
        assert out["adamw-old"] == out["adamw"]  # none recorded: it ran with none (1)
        assert out["adamw-floor-1"] == "loaded"
