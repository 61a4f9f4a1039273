"""A faster link met two rounds after it changes (`--link-drop`, on by default): the downward half
of the changed-link check alone (controllers/link_check.py, "a faster link"; docs/design.md §6),
and the saved work that ran without it (a config.json, a kept experiment run, a sweep study, an
engine state) keeping what it ran with."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn

import autok
from autok.controllers import PolicyOptions, build_controller
from autok.controllers.exposed_sync import ExposedSyncController
from tests.dist import run_dist
from tests.test_controllers import link_path

KW = dict(target=0.2, max_sync_period=64, window=8, rule="direct", lower=True, skew_drift=0.0)


def _path(syncs, **kw):
    return link_path(ExposedSyncController(sync_period=1, **{**KW, **kw}), syncs)


def test_a_faster_link_is_met_at_its_second_round_a_slower_one_after_the_window():
    """Slow, then 100 times faster: with the check K falls at the second fast round, from those
    two rounds; without it the window of 8 waits out its rounds. A slower link is met as without
    the check (a window later), and with --link-shift as well both halves are its."""
    syncs = [0.1] * 20 + [0.001] * 12
    on, off = _path(syncs, link_drop=3.0), _path(syncs)
    big = [d.next_sync_period for d in off[:20]]
    assert [d.next_sync_period for d in on[:20]] == big and big[-1] == 64
    assert on[20].reason.startswith("measuring") and "1 off its level" in on[20].reason
    assert on[21].reason.startswith("link changed: network 1 ms a round over 2 rounds, 100 ms")
    assert on[21].next_sync_period == 1  # K* = 64 · (0.001/0.32)/0.25 → 1
    # without: K = 64 until the window closes at round 24, on 4 slow and 4 fast rounds, then
    # the mix's K* (30) for another window
    assert all(d.next_sync_period == 64 for d in off[20:24])
    assert {d.next_sync_period for d in off[24:32]} == {30}
    # a slower link: no different from the check off, reasons and all
    slower = [0.001] * 20 + [0.1] * 28
    assert [(d.next_sync_period, d.reason) for d in _path(slower, link_drop=3.0)] == [
        (d.next_sync_period, d.reason) for d in _path(slower)
    ]
    # with --link-shift too: --link-shift reads the slower link, --link-drop the faster; at the
    # same ratio the check both ways, as --link-shift alone ran it
    there_and_back = slower + [0.001] * 8
    both = _path(there_and_back, link_drop=3.0, link_shift=3.0)
    shift = _path(there_and_back, link_shift=3.0)
    assert [(d.next_sync_period, d.reason) for d in both] == [
        (d.next_sync_period, d.reason) for d in shift
    ]
    assert any("link changed" in d.reason and d.next_sync_period == 1 for d in both)
    # a fall by 5x: under --link-shift 3 alone a faster link, not under --link-drop 8 with it
    fall = [0.1] * 20 + [0.02] * 4
    assert "link changed" in _path(fall, link_shift=3.0)[21].reason
    assert "link changed" not in _path(fall, link_shift=3.0, link_drop=8.0)[21].reason


def test_rounds_without_a_time_or_a_saved_level_that_is_not_one_are_no_faster_link():
    """A round whose network time is not finite (read as none) is not held as a faster link; a
    saved level that is not a number >= 0 is refused when the state loads."""
    nan = _path([0.1] * 20 + [float("nan")] * 3, link_drop=3.0)
    assert not any("link changed" in d.reason for d in nan)
    ran = ExposedSyncController(sync_period=1, **KW, link_drop=3.0)
    link_path(ran, [0.1] * 10)
    state = json.loads(json.dumps(ran.state_dict()))
    for bad in (float("nan"), -1.0, True, "0.1", None):
        broken = {**state, "window": {**state["window"], "per_round": [bad]}}
        with pytest.raises(ValueError, match="per_round must be a number >= 0"):
            ExposedSyncController(sync_period=1, **KW, link_drop=3.0).load_state_dict(broken)
    # a round of an unbounded time joins the window's sums, not its level, and what the
    # controller saves it loads (an inf a state saved before the check held loads too)
    inf = ExposedSyncController(sync_period=1, **KW, link_drop=3.0)
    link_path(inf, [0.1] * 10 + [float("inf")])
    assert math.inf not in inf._win.per_round
    ExposedSyncController(sync_period=1, **KW, link_drop=3.0).load_state_dict(inf.state_dict())
    older = {**state, "window": {**state["window"], "per_round": [0.1, math.inf]}}
    ExposedSyncController(sync_period=1, **KW, link_drop=3.0).load_state_dict(older)


def test_a_lone_dip_never_reads_as_a_faster_link_and_spikes_up_change_nothing():
    """A single fast round the level follows is held a round and rejoins the window (which then
    closes a round later); rounds slower than the level, any number of them, are the check
    off's to the last reason: only --link-shift reads a slower link."""
    dips = [0.02 * (0.1 if i % 5 == 2 else 1.0) for i in range(120)]
    on, off = _path(dips, link_drop=3.0), _path(dips)
    assert not any("link changed" in d.reason for d in on)
    assert on[-1].next_sync_period == off[-1].next_sync_period
    spikes = [0.02 * (10.0 if i % 3 == 1 else 1.0) for i in range(60)] + [0.5] * 60
    on, off = _path(spikes, link_drop=3.0), _path(spikes)
    assert [(d.next_sync_period, d.reason) for d in on] == [
        (d.next_sync_period, d.reason) for d in off
    ]


def test_link_drop_is_3_by_default_and_above_1_or_off():
    assert build_controller("exposed-sync", 1, PolicyOptions()).link_drop == 3.0
    assert build_controller("composite", 4, PolicyOptions(qsr_base=4)).share.link_drop == 3.0
    assert build_controller("exposed-sync", 1, PolicyOptions(link_drop=0)).link_drop == 0
    with pytest.raises(ValueError, match="--link-drop: 1 would read every round"):
        PolicyOptions(link_drop=1)


def test_a_config_json_without_it_resumes_as_it_ran(tmp_path):
    """An exposed-sync run saved before the check was a setting ran without it: it resumes with
    0; one saved since keeps its own; a fixed run is untouched (it reads none)."""
    from autok.cli import build_parser, resume_config
    from autok.config import load_config
    from autok.controllers import revision

    run = tmp_path / "run"
    run.mkdir()
    saved = load_config({}, {"policy": "exposed-sync", "out": str(run)}).model_dump(mode="json")
    saved = {k: v for k, v in saved.items() if k != "link_drop"}
    saved["policy_revision"] = revision("exposed-sync")  # so that the resume reads the check
    (run / "config.json").write_text(json.dumps(saved))
    args = build_parser().parse_args(["train", "--resume", str(run)])
    assert resume_config(args).link_drop == 0
    (run / "config.json").write_text(json.dumps(saved | {"link_drop": 3.0}))
    assert resume_config(args).link_drop == 3.0
    fixed = {k: v for k, v in saved.items() if k not in ("k_floor",)}
    fixed |= {"policy": "fixed", "policy_revision": revision("fixed")}
    (run / "config.json").write_text(json.dumps(fixed))
    assert resume_config(args).link_drop == 3.0  # unread, so nothing to keep


def test_a_kept_experiment_run_made_without_it_does_not_stand_for_one_with_it(tmp_path):
    """Its run.yaml matches, but it ran without the check (config.json has no link_drop):
    refused in one line naming --out, where the settings leave it to the default; kept where
    they give 0, or the run's config records the default's 3."""
    from autok.config import ConfigError
    from autok.controllers import revision
    from autok.experiment import Run, check_run_dirs
    from autok.trainer.loop.environment import environment

    settings = {"strategy": "cpdp", "policy": "exposed-sync", "epochs": 2, "workers": 2}
    run = Run("exposed-sync", 1, settings)
    run_dir = tmp_path / run.dir
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"environment": environment()}))
    (run_dir / "run.yaml").write_text(yaml.safe_dump(run.settings))
    # made by this version's rule (the rule's revision: tests/test_rule_revision.py)
    config = {**settings, "sync_period": 1, "policy_revision": revision("exposed-sync")}
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError, match="holds a run that read a faster link at 0, these settings now at 3"
    ):
        check_run_dirs([run], tmp_path)
    (run_dir / "config.json").write_text(json.dumps(config | {"link_drop": 3.0}))
    check_run_dirs([run], tmp_path)
    # a link_drop that is not a number matches no ratio: refused, naming it (after the K start)
    bad = {**settings, "sync_period": 1, "link_drop": None}
    (run_dir / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="read a faster link at None"):
        check_run_dirs([run], tmp_path)
    (run_dir / "config.json").write_text(json.dumps(bad | {"sync_period": 4}))
    with pytest.raises(ConfigError, match="started at K = 4, these settings now start at K = 1"):
        check_run_dirs([run], tmp_path)
    # one made before with --link-shift 3 read a faster link at 3, as the default does now
    shifted = Run("exposed-sync", 1, settings | {"link_shift": 3.0})
    (run_dir / "run.yaml").write_text(yaml.safe_dump(shifted.settings))
    (run_dir / "config.json").write_text(json.dumps(config | {"link_shift": 3.0}))
    check_run_dirs([shifted], tmp_path)
    (run_dir / "run.yaml").write_text(yaml.safe_dump(run.settings))
    off = Run("exposed-sync", 1, settings | {"link_drop": 0.0})
    (run_dir / "run.yaml").write_text(yaml.safe_dump(off.settings))
    (run_dir / "config.json").write_text(json.dumps(config))
    check_run_dirs([off], tmp_path)
    fixed = Run("fixed", 1, settings | {"policy": "fixed", "sync_period": 4})
    fixed_dir = tmp_path / fixed.dir
    fixed_dir.mkdir(parents=True)
    (fixed_dir / "summary.json").write_text(json.dumps({"environment": environment()}))
    (fixed_dir / "run.yaml").write_text(yaml.safe_dump(fixed.settings))
    (fixed_dir / "config.json").write_text(json.dumps(fixed.settings))
    check_run_dirs([fixed], tmp_path)  # fixed K reads no check


def test_a_study_made_without_it_is_not_resumed_with_trials_that_have_it():
    from autok.space import Dim
    from autok.sweep import DROP_ATTR, link_drop_problem

    old: dict = {"fixed": {}}  # a study made before the check was on
    policies = [Dim("policy", "categorical", choices=("fixed", "composite"))]
    assert "faster link" in (link_drop_problem(old, {"policy": "exposed-sync"}, []) or "")
    assert "faster link" in (link_drop_problem(old, {}, policies) or "")
    assert link_drop_problem(old, {}, []) is None  # fixed reads no check
    assert link_drop_problem(old, {"policy": "qsr"}, []) is None
    assert link_drop_problem(old, {"policy": "exposed-sync", "link_drop": 0.0}, []) is None
    drawn = [Dim("link_drop", "float", 2.0, 4.0)]
    assert link_drop_problem(old, {"policy": "exposed-sync"}, drawn) is None
    assert link_drop_problem({DROP_ATTR: True}, {"policy": "exposed-sync"}, []) is None


def test_runs_before_and_after_vary_it_only_where_the_policy_read_it():
    """In a report's axes: fixed K runs made before (no link_drop) and after (3 recorded, unread)
    do not vary it; exposed-sync runs made before (none: 0) and after (3) do."""
    from autok.report import varied_settings

    def run(**config):
        return SimpleNamespace(config=config)

    old_fixed, new_fixed = run(policy="fixed"), run(policy="fixed", link_drop=3.0)
    assert varied_settings([old_fixed, new_fixed]) == []
    old, new = run(policy="exposed-sync"), run(policy="exposed-sync", link_drop=3.0)
    assert varied_settings([old_fixed, old, new]) == ["policy", "link_drop"]


def _state_worker(rank, world):
    """A state saved by an exposed-sync Sync, its kind without link_drop (saved before it was
    recorded: it ran without the check), loaded into Syncs with the check and without; and a
    fixed Sync's old state into a fixed Sync."""
    out = {}
    for policy in ("exposed-sync", "fixed"):
        model = nn.Linear(4, 1)
        sync = autok.Sync(model, torch.optim.SGD(model.parameters(), lr=0.1), policy=policy)
        state = sync.state_dict()
        sync.close()
        old = {**state, "kind": {k: v for k, v in state["kind"].items() if k != "link_drop"}}
        nan = {**state, "kind": {**state["kind"], "link_drop": float("nan")}}
        cases = (("new", {}, state), ("old", {}, old), ("old-off", {}, old), ("nan", {}, nan))
        for name, kw, saved in cases:
            if name == "old-off" and policy == "exposed-sync":
                kw = {"link_drop": 0.0}
            model = nn.Linear(4, 1)
            sync = autok.Sync(
                model, torch.optim.SGD(model.parameters(), lr=0.1), policy=policy, **kw
            )
            try:
                sync.load_state_dict(saved)
                out[f"{policy} {name}"] = "loaded"
            except autok.OptionError as exc:
                out[f"{policy} {name}"] = str(exc)
            sync.close()
    return out


@pytest.mark.dist
def test_an_engine_state_saved_without_it_resumes_only_without_it():
    for out in run_dist(_state_worker, 2):
        assert out["exposed-sync new"] == "loaded"
        assert out["exposed-sync old"] == (
            "load_state_dict: saved with link_drop 0.0; this Sync has 3.0 (pass link_drop=0.0 "
            "to continue it)"
        ), out
        assert out["exposed-sync old-off"] == "loaded"
        assert out["fixed nan"] == out["exposed-sync nan"], out
        assert "saved with link_drop nan, not a number >= 0" in out["fixed nan"], out
        assert out["fixed old"] == out["fixed new"] == "loaded"


def test_its_ratio_is_a_setting_and_a_bad_one_is_one_line(tmp_path):
    """The check's ratio is 3 unless given (config.json is the settings' dump, so it records it);
    --link-drop 0.5 is refused naming the flag; under --policy fixed it is refused as unread
    (the CLI's refusals, before anything is written: tests/test_bad_input.py)."""
    from autok.config import ConfigError, load_config

    cfg = load_config({}, {"policy": "exposed-sync", "out": str(tmp_path / "a")})
    assert cfg.link_drop == 3.0 and json.loads(cfg.model_dump_json())["link_drop"] == 3.0
    with pytest.raises(ConfigError, match="--link-drop: 0.5 would read every round"):
        load_config({}, {"policy": "exposed-sync", "link_drop": 0.5, "out": str(tmp_path / "b")})
    with pytest.raises(ConfigError, match="--link-drop"):
        load_config({}, {"policy": "fixed", "link_drop": 2.0, "out": str(tmp_path / "c")})
