"""One place per setting (docs/design.md §3): a setting's field says its help line, its group,
why its bounds are where they are and whether a resume may change it; `--help`, its groups, the
bound refusals, the resume rule and docs/flags.md's tables are read from it. Each K policy's
registry entry says which options it reads. The fused boundary's exactness is one rule."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest
import torch
from pydantic import Field, ValidationError

from autok.config import SyncSettings, TrainConfig
from autok.trainer.engine.options import GROUPS, SyncOptions, about, about_of, describe


class Extra(TrainConfig):
    """TrainConfig with one setting more, declared in one place: its field."""

    knob: int = Field(
        3,
        ge=1,
        le=9,
        description="a knob of the K policy",
        json_schema_extra=about(
            "K policy", too_high="nine is plenty", resume=True, before="policy"
        ),
    )


def test_a_setting_declared_once_has_its_flag_group_help_refusal_and_resume_rule():
    from autok.cli import add_train_flags, flag_groups, resume_may_change

    assert flag_groups(Extra)["K policy"][:2] == ("knob", "policy")  # before="policy"
    assert "knob" in resume_may_change(Extra) and "knob" not in resume_may_change()
    parser = argparse.ArgumentParser()
    groups = add_train_flags(parser, model=Extra)
    knob = next(a for a in groups["K policy"]._group_actions if "--knob" in a.option_strings)
    assert knob.help == "a knob of the K policy (default: 3)"
    with pytest.raises(ValidationError) as exc:
        Extra.model_validate({"knob": 10})
    line = describe(exc.value, Extra)
    assert line.startswith("--knob: ") and line.endswith("(got 10): nine is plenty"), line
    with pytest.raises(ValidationError) as exc:
        Extra.model_validate({"knob": 0})  # no reason given for the lower bound: none printed
    assert describe(exc.value, Extra).endswith("(got 0)")


def test_every_setting_says_its_group_and_help_and_reasons_only_for_its_bounds():
    engine_only = set(SyncOptions.model_fields)
    for model in (SyncOptions, SyncSettings, TrainConfig):
        for name, info in model.model_fields.items():
            said = about_of(info, name)  # raises for a field without about(...)
            assert info.description, f"{name}: no help line (its description)"
            # autok.Sync's own options alone may have no flag
            assert said.group in GROUPS or (said.group is None and name in engine_only), name
            kinds = {type(m).__name__ for m in info.metadata}
            assert said.too_high is None or kinds & {"Le", "Lt"}, f"{name}: a reason, no bound"
            assert said.too_low is None or kinds & {"Ge", "Gt"}, f"{name}: a reason, no bound"


def test_a_group_outside_the_help_groups_is_refused_where_the_setting_is_declared():
    with pytest.raises(ValueError, match="unknown group 'K polcy'"):
        about("K polcy")


def test_docs_flags_tables_are_what_the_settings_write():
    from autok import flagdoc

    page = flagdoc.PAGE.read_text(encoding="utf-8")
    assert page == flagdoc.render(page), "docs/flags.md is stale: run python -m autok.flagdoc"
    # every flag of `autok train --help`, with its default, is in a table row
    for action in flagdoc.train_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert f"| `{action.option_strings[0]}`" in page, action.option_strings


def test_each_policy_declares_the_options_it_reads_in_its_registry_entry():
    from autok.controllers import POLICIES, READS, REGISTRY, Policy, PolicyOptions
    from autok.controllers.fixed import FixedController

    assert {name: policy.reads for name, policy in POLICIES.items()} == READS
    assert {name: policy.build for name, policy in POLICIES.items()} == REGISTRY
    assert "peak_lr" in {f.name for f in fields(PolicyOptions)}
    for name in ("not_an_option", "peak_lr"):  # peak_lr is the run's, given to every policy
        with pytest.raises(ValueError, match=name):
            Policy(lambda k, o: FixedController(k), frozenset({name}))


@pytest.mark.parametrize("strategy", ["ddp", "localsgd", "cpdp"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_run_and_the_engine_judge_the_fused_boundary_by_one_rule(strategy, optimizer):
    from autok.trainer.engine.optim import build_optimizer
    from autok.trainer.engine.options import fused_is_exact
    from autok.trainer.engine.sync import fused_boundary_is_exact

    cfg = TrainConfig(strategy=strategy, optimizer=optimizer)
    built = build_optimizer(
        optimizer, torch.nn.Linear(2, 1), cfg.lr, cfg.momentum, cfg.weight_decay, cfg.nesterov
    )
    expected = strategy == "cpdp" and optimizer == "sgd"
    assert cfg.fused_is_exact == fused_boundary_is_exact(strategy, built) == expected
    assert fused_is_exact(strategy, optimizer) == expected


def test_the_k_policy_settings_default_as_the_policies_own_options():
    from autok.controllers import PolicyOptions

    assert SyncOptions().policy_options(peak_lr=0.3) == PolicyOptions(peak_lr=0.3)


def test_flagdoc_writes_nothing_on_a_bad_argument_or_a_page_without_its_markers(
    tmp_path, monkeypatch, capsys
):
    import autok.flagdoc as flagdoc

    page = tmp_path / "flags.md"
    page.write_text("no markers here\n", encoding="utf-8")
    monkeypatch.setattr(flagdoc, "PAGE", page)
    with pytest.raises(SystemExit) as info:
        flagdoc.main(["--chek"])
    assert info.value.code == 2
    assert flagdoc.main([]) == 2  # the markers are missing: one line, nothing written
    assert page.read_text(encoding="utf-8") == "no markers here\n"
    assert "markers" in capsys.readouterr().err.strip().splitlines()[-1]
