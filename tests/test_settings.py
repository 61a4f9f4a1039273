"""One place per setting (docs/design.md §3): a setting's field says its help line, its group,
why its bounds are where they are and whether a resume may change it; `--help`, its groups, the
bound refusals, the resume rule and docs/flags.md's tables are read from it. Each K policy's
registry entry says which options it reads. The fused boundary's exactness is one rule."""

from __future__ import annotations

import argparse

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
    assert "peak_lr" in PolicyOptions.model_fields
    for name in ("not_an_option", "peak_lr"):  # peak_lr is the run's, given to every policy
        with pytest.raises(ValueError, match=name):
            Policy(lambda k, o: FixedController(k), frozenset({name}))


@pytest.mark.parametrize("strategy", ["ddp", "localsgd", "cpdp"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_run_and_the_engine_judge_the_fused_boundary_by_one_rule(strategy, optimizer):
    from autok.trainer.engine.build import fused_boundary_is_exact
    from autok.trainer.engine.optim import build_optimizer
    from autok.trainer.engine.options import fused_is_exact

    cfg = TrainConfig(strategy=strategy, optimizer=optimizer)
    built = build_optimizer(
        optimizer, torch.nn.Linear(2, 1), cfg.lr, cfg.momentum, cfg.weight_decay, cfg.nesterov
    )
    expected = strategy == "cpdp" and optimizer == "sgd"
    assert cfg.fused_is_exact == fused_boundary_is_exact(strategy, built) == expected
    assert fused_is_exact(strategy, optimizer) == expected


@pytest.mark.parametrize(
    "given, k",
    [
        ({}, 4),
        ({"strategy": "ddp"}, 1),
        ({"policy": "exposed-sync"}, 1),  # the direct rule with lowering: K* from one step
        ({"policy": "exposed-sync", "k_rule": "double"}, 4),
        ({"policy": "exposed-sync", "k_lowering": False}, 4),
        ({"policy": "exposed-sync", "sync_period": 8}, 8),
        ({"policy": "adacomm"}, 4),
        ({"policy": "composite"}, 4),  # it reads the direct rule too, but starts from QSR's base
        # the smallest K the fragments allow: F, or F·τ with a delay
        ({"policy": "exposed-sync", "strategy": "localsgd", "fragments": 2}, 2),
        (
            {"policy": "exposed-sync", "strategy": "localsgd", "fragments": 2, "fragment_delay": 2},
            4,
        ),
    ],
)
def test_the_default_k_is_1_where_the_policy_sets_k_from_its_first_boundary(given, k):
    assert SyncOptions(**given).sync_period == k


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


# ----- derived, never hand-kept: the policy options, --policy's list, the conditional settings


def test_each_policy_option_is_declared_once_by_the_controllers_and_is_a_flag():
    """SyncOptions takes the K policies' options from PolicySettings (controllers/options.py):
    its own body declares none of them, so a new one is one edit there, and becomes an
    autok.Sync option, a TrainConfig setting and an `autok train` flag of the K policy group
    with the controllers' type, default, bounds, help and about."""
    from autok.cli import add_train_flags, flag_groups
    from autok.controllers import POLICY_OPTIONS, PolicySettings

    assert issubclass(SyncOptions, PolicySettings)
    own = set(SyncOptions.__annotations__) | set(TrainConfig.__annotations__)
    assert not own & set(POLICY_OPTIONS), "a K-policy option declared twice"
    actions = {
        a.dest: a for a in add_train_flags(argparse.ArgumentParser())["K policy"]._group_actions
    }
    assert set(flag_groups()["K policy"]) == {"policy", *POLICY_OPTIONS}
    for name in POLICY_OPTIONS:
        declared, taken = PolicySettings.model_fields[name], TrainConfig.model_fields[name]
        assert (taken.annotation, taken.default, taken.metadata) == (
            declared.annotation,
            declared.default,
            declared.metadata,
        ), name
        assert about_of(taken, name) == about_of(declared, name), name
        assert actions[name].help.startswith(declared.description.replace("%", "%%")), name


def test_the_controllers_about_is_read_as_the_engines_and_a_misspelt_key_is_refused():
    from pydantic.fields import FieldInfo

    from autok.controllers.options import about as policy_about

    said = about_of(FieldInfo(json_schema_extra=policy_about(too_high="why", before="k_rule")))
    assert (said.group, said.too_high, said.before) == ("K policy", "why", "k_rule")
    with pytest.raises(TypeError, match="too_hihg"):
        about_of(FieldInfo(json_schema_extra={"autok": {"group": "K policy", "too_hihg": "x"}}))


def test_policy_help_lists_every_registered_policy_in_registry_order_with_its_note():
    import re

    from autok.cli import HELP
    from autok.controllers import POLICIES, REGISTRY

    head, _, listed = HELP["policy"].partition(": ")
    assert head == "how K evolves while training"
    names = [re.sub(r" \(.*\)$", "", item) for item in listed.split(", ")]
    assert names == list(REGISTRY)
    for name, policy in POLICIES.items():
        assert (f"{name} ({policy.note})" in listed) == (policy.note is not None), name


def test_a_setting_read_only_under_another_is_refused_elsewhere_from_its_field_alone():
    from autok.space import conditional
    from autok.trainer.engine.options import read_only_under

    class Unread(TrainConfig):
        """TrainConfig with one setting more, read only under --on-divergence rollback:
        declared in one place, its field."""

        patience: int = Field(
            0,
            ge=0,
            le=5,
            description="rollbacks to wait before halving K again",
            json_schema_extra=about(
                "checkpoints and failures",
                read_only_under=("on_divergence", frozenset({"rollback"}), "stop never rolls back"),
            ),
        )

    assert Unread(on_divergence="rollback", patience=2).patience == 2
    with pytest.raises(ValidationError) as exc:
        Unread(patience=2)
    assert describe(exc.value, Unread) == (
        "--patience: --on-divergence stop does not read it (stop never rolls back); drop it, "
        "or use --on-divergence rollback"
    )
    assert conditional(read_only_under(Unread))["patience"] == (
        "on_divergence",
        frozenset({"rollback"}),
    )


def test_a_read_only_under_naming_no_setting_or_a_value_it_cannot_take_is_refused():
    from pydantic import BaseModel

    from autok.trainer.engine.options import read_only_under

    def model(chooser: str, value: str) -> type[BaseModel]:
        class Odd(SyncOptions):
            odd: int = Field(
                0,
                description="odd",
                json_schema_extra=about(None, read_only_under=(chooser, frozenset({value}), "x")),
            )

        return Odd

    with pytest.raises(ValueError, match="'stratgy', not a setting"):
        read_only_under(model("stratgy", "cpdp"))
    with pytest.raises(ValueError, match=r"strategy \['cdpd'\], not its values"):
        read_only_under(model("strategy", "cdpd"))


def test_the_read_only_tables_are_derived_not_mutated_at_import():
    """The engine's table holds the engine's settings only (importing autok.config adds none to
    it), neither can be edited, and each is what the fields say."""
    import autok.config as config
    import autok.trainer.engine.options as options

    assert set(options.READ_ONLY_UNDER) <= set(SyncOptions.model_fields)
    assert options.read_only_under(SyncOptions) == options.READ_ONLY_UNDER
    assert options.read_only_under(TrainConfig) == config.READ_ONLY_UNDER
    assert {"max_rollbacks", "momentum", "mnist1d_samples"} <= set(config.READ_ONLY_UNDER)
    for table in (options.READ_ONLY_UNDER, config.READ_ONLY_UNDER):
        with pytest.raises(TypeError):
            table["knob"] = ("strategy", frozenset({"cpdp"}), "x")  # type: ignore[index]


def test_the_sweeps_conditional_settings_are_the_policies_reads_and_the_fields_only():
    """SGD's --momentum and --nesterov are conditional on --optimizer because their fields say
    so, as the strategy's and the data set's are; the K-policy options by the registry."""
    from autok.config import READ_ONLY_UNDER
    from autok.controllers import CAPS, POLICY_OPTIONS
    from autok.space import CONDITIONAL

    assert set(CONDITIONAL) == (set(POLICY_OPTIONS) - CAPS) | set(READ_ONLY_UNDER)
    for name in ("momentum", "nesterov"):
        said = about_of(TrainConfig.model_fields[name], name).read_only_under
        assert said is not None and (said.chooser, said.values) == ("optimizer", {"sgd"})
        assert CONDITIONAL[name] == ("optimizer", frozenset({"sgd"}))
    with pytest.raises(ValidationError, match="--momentum: --optimizer adamw does not read it"):
        TrainConfig(optimizer="adamw", momentum=0.5)


# ----- the settings models: one idea each, one field order, no class over 400 lines


def test_no_class_of_the_settings_modules_is_over_400_lines():
    """SyncOptions and TrainConfig declare their fields in settings models, one idea each
    (trainer/engine/*_settings.py, autok/*_settings.py), so that no class of the settings grows
    past about 400 lines (docs/design.md §3, the module table)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [root / "trainer/engine/options.py", root / "autok/config.py"]
    files += sorted((root / "trainer/engine").glob("*_settings.py"))
    files += sorted((root / "autok").glob("*_settings.py"))
    for path in files:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                assert lines <= 400, f"{path.name}: {node.name} is {lines} lines"


def test_the_settings_models_keep_the_fields_in_one_order():
    """The bases of SyncOptions and TrainConfig are listed last first (pydantic orders fields
    base by base from the end of the MRO): each model's fields come in turn, then the class's
    own, in the order they had as one class, so config.json's keys and the first of several
    errors reported are as they were."""
    from autok.controllers import PolicySettings
    from autok.data_settings import DataSettings
    from autok.trainer.engine.boundary_settings import BoundarySettings
    from autok.trainer.engine.fragment_settings import FragmentSettings
    from autok.trainer.engine.link_settings import LinkSettings
    from autok.trainer.engine.outer_settings import OuterSettings
    from autok.trainer.engine.strategy_settings import StrategySettings
    from autok.training_settings import TrainingSettings

    engine = (PolicySettings, StrategySettings, OuterSettings, BoundarySettings)
    engine += (FragmentSettings, LinkSettings, SyncOptions)
    run = (*engine, SyncSettings, TrainingSettings, DataSettings, TrainConfig)
    for models in (engine, run):
        annotated = [n for m in models for n in vars(m).get("__annotations__", {})]
        declared = [n for n in annotated if not n.startswith("_")]  # a private attribute
        assert list(models[-1].model_fields) == list(dict.fromkeys(declared)), models[-1]
    names = list(TrainConfig.model_fields)
    # one field of each block, in the order of the single class they were declared in before
    landmarks = ["target_sync_share", "strategy", "slowmo_beta", "compress", "fragments", "link"]
    landmarks += ["model_bytes", "seed", "metrics_port", "workers", "lr_gamma", "task"]
    landmarks += ["partition_alpha", "straggler", "max_rollbacks"]
    assert sorted(landmarks, key=names.index) == landmarks
    with pytest.raises(ValidationError) as exc:
        TrainConfig(lr_gamma=2.0, workers=0)  # two bad settings: the earlier field's is told
    assert describe(exc.value, TrainConfig).startswith("--workers: ")
