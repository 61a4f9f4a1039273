"""The K policy rule's revision (docs/design.md §6, "the rule's revision"): a run records the
revision of its policy's rule (config.json's `policy_revision`), and work made by another revision
is not compared or continued as this one's: a kept experiment run, a resumed sweep study, a
report over both. A policy whose rule never moved has revision 0, what a run recording none
counts as."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autok.config import ConfigError
from autok.controllers import POLICIES, revision, revision_problem
from autok.controllers.exposed_sync import RULE_REVISION


def test_a_policy_whose_rule_moved_is_told_apart_from_a_run_that_recorded_none():
    assert RULE_REVISION >= 1  # the rule moved after runs recorded nothing
    assert revision("exposed-sync") == revision("composite") == RULE_REVISION
    assert revision("fixed") == revision("adacomm") == 0
    assert revision("no-such-policy") == revision(None) == 0
    assert revision_problem("exposed-sync", RULE_REVISION) is None
    assert revision_problem("fixed", None) is None  # none recorded: 0, fixed's revision
    said = revision_problem("exposed-sync", None) or ""
    assert (
        said == f"exposed-sync's rule revision 0 (none recorded), this autok runs {RULE_REVISION}"
    )
    assert "revision 0, " in (revision_problem("composite", 0) or "")
    # a record that is not a revision never matches one (a bool is not a count here)
    assert revision_problem("fixed", False) is not None
    assert revision_problem("exposed-sync", str(RULE_REVISION)) is not None


def test_every_run_records_the_revision_of_its_policys_rule(tmp_path):
    from autok.cli import resolved_config
    from autok.config import load_config

    for policy, recorded in (("exposed-sync", RULE_REVISION), ("composite", RULE_REVISION)):
        cfg = load_config({}, {"policy": policy, "out": str(tmp_path)})
        assert resolved_config(cfg, tmp_path)["policy_revision"] == recorded
    cfg = load_config({}, {"out": str(tmp_path)})
    assert cfg.policy == "fixed" and resolved_config(cfg, tmp_path)["policy_revision"] == 0


def _kept(root: Path, label: str, settings: dict, config: dict):
    """A finished run of an experiment, as `autok experiment run` would find it kept."""
    from autok.experiment import Run
    from autok.trainer.loop.environment import environment

    run = Run(label, 1, settings)
    run_dir = root / run.dir
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"environment": environment()}))
    (run_dir / "run.yaml").write_text(yaml.safe_dump(run.settings))
    (run_dir / "config.json").write_text(json.dumps(config))
    return run, run_dir


def test_a_kept_experiment_run_of_another_rule_revision_does_not_stand_for_one_made_here(
    tmp_path,
):
    """Its run.yaml and installation match, but its K path was chosen by another revision of
    its policy's rule (or by one before runs recorded it): refused in one line naming --out and
    the revisions, the run kept; a fixed-K run that recorded none is kept (its rule never
    moved)."""
    from autok.experiment import check_run_dirs

    settings = {"strategy": "cpdp", "policy": "exposed-sync", "epochs": 2, "workers": 2}
    config = {**settings, "sync_period": 1, "link_drop": 3.0}
    run, run_dir = _kept(tmp_path, "exposed-sync", settings, config)
    with pytest.raises(ConfigError) as refused:
        check_run_dirs([run], tmp_path)
    said = str(refused.value)
    assert said.startswith(f"--out: {run_dir} holds a run made by exposed-sync's rule revision 0")
    assert "choose a new --out" in said and "\n" not in said
    assert (run_dir / "summary.json").is_file()  # nothing cleared
    (run_dir / "config.json").write_text(json.dumps(config | {"policy_revision": 0}))
    with pytest.raises(ConfigError, match="exposed-sync's rule revision 0, this autok runs"):
        check_run_dirs([run], tmp_path)
    (run_dir / "config.json").write_text(json.dumps(config | {"policy_revision": RULE_REVISION}))
    check_run_dirs([run], tmp_path)
    (run_dir / "config.json").write_text("[" * 3000)  # unreadable (too deep for json)
    with pytest.raises(ConfigError, match="config.json cannot be read, so which revision"):
        check_run_dirs([run], tmp_path)
    fixed_settings = settings | {"policy": "fixed", "sync_period": 4}
    fixed, _ = _kept(tmp_path, "fixed", fixed_settings, dict(fixed_settings))
    check_run_dirs([fixed], tmp_path)


def test_a_study_made_by_another_rule_revision_is_not_resumed_with_its_policy():
    from autok.space import Dim
    from autok.sweep import REVISIONS_ATTR, revision_attr, rule_problem

    old: dict = {"fixed": {}}  # made before studies recorded revisions: every policy's was 0
    said = rule_problem(old, {"policy": "exposed-sync"}, []) or ""
    assert said.startswith("ran its trials by exposed-sync's rule revision 0 (none recorded)")
    assert said.endswith("choose a new --out")
    drawn = [Dim("policy", "categorical", choices=("fixed", "composite"))]
    assert "composite's rule revision 0" in (rule_problem(old, {}, drawn) or "")
    assert rule_problem(old, {}, []) is None  # fixed K, whose rule never moved
    assert rule_problem(old, {"policy": "adacomm"}, []) is None
    now = {REVISIONS_ATTR: revision_attr()}
    assert set(now[REVISIONS_ATTR]) == set(POLICIES)
    assert rule_problem(now, {"policy": "exposed-sync"}, []) is None
    assert rule_problem(now, {}, drawn) is None
    moved = {REVISIONS_ATTR: revision_attr() | {"composite": RULE_REVISION + 1}}
    assert "composite's rule revision" in (rule_problem(moved, {}, drawn) or "")
    assert rule_problem(moved, {"policy": "exposed-sync"}, []) is None


def test_a_report_says_when_one_policys_runs_come_from_two_revisions():
    from autok.report import RunResult, rules, say_installations, varied_settings

    def run(seed: int, policy: str, **recorded) -> RunResult:
        config = {"policy": policy, "sync_period": 1, **recorded}
        return RunResult(policy, seed, Path(f"r{seed}"), config, {}, [])

    same = [
        run(1, "fixed"),
        run(2, "exposed-sync", policy_revision=RULE_REVISION),
        run(3, "exposed-sync", policy_revision=RULE_REVISION),
    ]
    assert rules(same) is None
    assert "policy_revision" not in varied_settings(same)  # not an axis of the grid
    mixed = [*same, run(4, "exposed-sync")]
    line = rules(mixed) or ""
    assert line.startswith("**Not comparable as they stand:** these runs of exposed-sync were ")
    assert f"revisions of its rule (config.json's `policy_revision`: 0, {RULE_REVISION}" in line
    text = say_installations("# title\n\nbody", mixed)
    assert text == f"# title\n\n{line}\n\nbody"
    assert say_installations("# title\n\nbody", same) == "# title\n\nbody"


def _state_worker(rank, world):
    """An exposed-sync Sync's state and a fixed one's, each loaded back as saved, as saved before
    the revision was recorded (revision 0), as saved by another revision, and with a revision
    that is not a count."""
    import torch
    from torch import nn

    import autok

    def fresh(policy: str):
        model = nn.Linear(4, 1)
        return autok.Sync(model, torch.optim.SGD(model.parameters(), lr=0.1), policy=policy)

    out = {}
    for policy in ("exposed-sync", "fixed"):
        sync = fresh(policy)
        state = sync.state_dict()
        sync.close()
        kind = state["kind"]
        out[f"{policy} recorded"] = kind.get("policy_revision")
        before = {**state, "kind": {k: v for k, v in kind.items() if k != "policy_revision"}}
        other = {**state, "kind": {**kind, "policy_revision": RULE_REVISION + 1}}
        true = {**state, "kind": {**kind, "policy_revision": True}}
        cases = {"same": state, "before": before, "other": other, "true": true}
        for name, saved in cases.items():
            sync = fresh(policy)
            try:
                sync.load_state_dict(saved)
                said = "loaded"
            except autok.OptionError as exc:
                said = str(exc)
            sync.close()
            out[name if policy == "exposed-sync" else f"fixed {name}"] = said
    return out


@pytest.mark.dist
def test_an_engine_state_of_another_revision_is_refused_naming_it():
    from tests.dist import run_dist

    for out in run_dist(_state_worker, 2):
        assert out["exposed-sync recorded"] == RULE_REVISION and out["fixed recorded"] == 0
        assert out["same"] == "loaded", out
        for name, saved in (("before", 0), ("other", RULE_REVISION + 1)):
            assert out[name] == (
                f"load_state_dict: saved with policy_revision {saved}; this Sync has "
                f"{RULE_REVISION} (another revision of its K policy's rule: continue it with the "
                "autok that saved it)"
            ), out
        assert out["fixed before"] == "loaded", out  # its rule never moved: 0 then and now
        for name in ("true", "fixed true"):  # True == 1, but it is no count
            assert out[name].startswith("load_state_dict: saved with policy_revision True"), out
