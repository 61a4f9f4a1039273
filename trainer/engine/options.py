"""The engine's typed options: every setting of `Sync` (trainer/engine/sync.py) that concerns
synchronization, declared in settings models of one idea each (trainer/engine/*_settings.py; the K
policies' in controllers/options.py) that SyncOptions inherits, with the checks that read several
of them. The CLI's TrainConfig composes them (it inherits these fields), so each option has
the name and default of its `autok train` flag, and the same one-line errors.

Field `foo_bar` is flag `--foo-bar`; an error names the flag to change (docs/design.md §3).
"""

from __future__ import annotations

import numbers
import typing
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from autok.controllers import CAPS, POLICY_OPTIONS, PolicyOptions, PolicySettings
from autok.controllers import READS as POLICY_READS
from autok.controllers import REGISTRY as POLICIES
from autok.controllers.options import COUNT_MAX as COUNT_MAX
from autok.controllers.options import K_MAX as K_MAX
from autok.controllers.options import SKEW_RULE_OPTIONS
from autok.controllers.scheduled import parse_k_schedule
from autok.trainer.engine.about import GROUPS as GROUPS
from autok.trainer.engine.about import About as About
from autok.trainer.engine.about import ReadOnlyUnder, about, about_of
from autok.trainer.engine.boundary_settings import ACCUMULATION_MAX as ACCUMULATION_MAX
from autok.trainer.engine.boundary_settings import BoundarySettings
from autok.trainer.engine.fragment_settings import FragmentSettings
from autok.trainer.engine.k_floor import SECOND_MOMENT_KEY, check_floor, resolve_floor
from autok.trainer.engine.link import PROFILES, parse_schedule
from autok.trainer.engine.link_settings import MODEL_BYTES_MAX as MODEL_BYTES_MAX
from autok.trainer.engine.link_settings import LinkSettings
from autok.trainer.engine.outer import DEFAULT_LR, DEFAULT_MOMENTUM
from autok.trainer.engine.outer_settings import OuterSettings
from autok.trainer.engine.strategy_settings import AVERAGING, StrategySettings

STRATEGIES = ("ddp", "localsgd", "cpdp")
SEED_MAX = 2**32 - 1

# Each setting's field says its group, bounds' reasons, resume rule and when it is read with
# `about(...)` (trainer/engine/about.py, re-exported here with GROUPS, About and ReadOnlyUnder).
_FAILURES = GROUPS[7]  # the divergence guard's; the other groups' fields live in their modules


def limit_reason(model: type[BaseModel], field: str, side: str) -> str | None:
    """Why `field`'s bound on `side` ("ge": lower, "le": upper) is where it is, or None."""
    info = model.model_fields.get(field)
    if info is None or not isinstance(info.json_schema_extra, dict):
        return None
    said = about_of(info)
    return said.too_low if side == "ge" else said.too_high if side == "le" else None


def fused_is_exact(strategy: str, optimizer: str) -> bool:
    """Whether the one-collective cpdp boundary equals the two-phase one (to rounding): only
    for an optimizer linear in the gradient, "sgd" (torch.optim.SGD without dampening), and
    only on cpdp, the one boundary with both collectives (docs/design.md §2, the fused
    boundary). The engine names a torch optimizer's kind, TrainConfig its --optimizer."""
    return strategy == "cpdp" and optimizer == "sgd"


# A cap on K (CAPS, declared by the controllers, which know no strategies) is read where K can
# change: ddp keeps K = 1.
_CAP_UNDER = ReadOnlyUnder("strategy", AVERAGING, "ddp keeps K = 1")


@cache
def read_only_under(model: type[BaseModel]) -> Mapping[str, ReadOnlyUnder]:
    """The settings of `model` read only under some values of another (see ReadOnlyUnder), from
    its fields' `about(read_only_under=...)` and the caps on K, in field order; read-only. A
    chooser that is not a setting of `model`, or a value it cannot take, is refused."""
    fields = model.model_fields
    out: dict[str, ReadOnlyUnder] = {}
    for name, info in fields.items():
        under = _CAP_UNDER if name in CAPS else about_of(info, name).read_only_under
        if under is None:
            continue
        chooser = fields.get(under.chooser)
        if chooser is None:
            raise ValueError(f"{name}: read only under {under.chooser!r}, not a setting")
        ann = chooser.annotation
        takes = set(typing.get_args(ann)) if typing.get_origin(ann) is Literal else under.values
        if odd := sorted(under.values - takes):
            raise ValueError(f"{name}: read only under {under.chooser} {odd}, not its values")
        out[name] = under
    return MappingProxyType(out)


def default_slowmo_beta(strategy: str) -> float:
    """SlowMo's β where neither --slowmo-beta nor --outer-optimizer is given: the paper's 0.3 on
    cpdp; none on localsgd (plain LocalSGD) or ddp."""
    return 0.3 if strategy == "cpdp" else 0.0


class OptionError(ValueError):
    """A bad setting; the message starts with the flag (option) to change."""


# `ddp_kwargs=` (autok.Sync): what a user may pass on to DDP, with the check of its value. The
# rest of DDP's arguments are autok's to set (below), or change what DDP reduces and when in a way
# the engine's gradient path and records do not follow (refused as unsupported).
DDP_KWARGS_TAKEN: dict[str, str] = {
    "find_unused_parameters": "bool",
    "static_graph": "bool",
    "gradient_as_bucket_view": "bool",
    "bucket_cap_mb": "number",
}
DDP_BUCKET_CAP_MB_MAX = 65_536.0  # 64 GiB buckets: beyond any model's gradients
DDP_KWARGS_AUTOK_SETS: dict[str, str] = {
    "module": "it is the model you pass",
    "device_ids": "it follows the model's device (or device=)",
    "output_device": "it follows the model's device (or device=)",
    "process_group": "the default process group carries every collective of autok's",
    "device_mesh": "the default process group carries every collective of autok's",
    "broadcast_buffers": "buffers follow buffer_policy",
    "forward_sync_buffers": "buffers follow buffer_policy",
    "init_sync": "autok's replica check needs the replicas to start identical",
}
UNUSED_PARAMETERS_HINT = (
    "pass ddp_kwargs={'find_unused_parameters': True}; a branch used on some ranks only needs "
    "it too"
)


def check_ddp_kwargs(
    ddp_kwargs: object, strategy: str = "ddp", accumulation_steps: int = 1
) -> dict[str, Any]:
    """`ddp_kwargs` as DDP will get it, or an OptionError naming the key: only the arguments in
    DDP_KWARGS_TAKEN, of their kind; those autok sets, DDP's others and unknown names refused.
    static_graph only where every backward all-reduces (ddp, one pass a step): DDP's static
    graph fails an internal assert on a backward under no_sync()."""
    if ddp_kwargs is None:
        return {}
    if not isinstance(ddp_kwargs, dict):
        raise OptionError(f"ddp_kwargs: a {type(ddp_kwargs).__name__}; give a dict, or None")
    taken = ", ".join(DDP_KWARGS_TAKEN)
    for key, value in ddp_kwargs.items():
        name = repr(key)[:60]
        if key in DDP_KWARGS_AUTOK_SETS:
            raise OptionError(
                f"ddp_kwargs: {name} is set by autok.Sync ({DDP_KWARGS_AUTOK_SETS[key]}); "
                f"it takes {taken}"
            )
        kind = DDP_KWARGS_TAKEN.get(key)
        if kind is None:
            import inspect

            from torch.nn.parallel import DistributedDataParallel

            known = inspect.signature(DistributedDataParallel.__init__).parameters
            what = (
                "not supported by autok.Sync"
                if key in known
                else "not an argument of DistributedDataParallel"
            )
            raise OptionError(f"ddp_kwargs: {name} is {what}; it takes {taken}")
        if kind == "bool" and not _boolean(value):
            raise OptionError(f"ddp_kwargs: {key} is {value!r:.40}; give True or False")
        if kind == "number" and (
            _boolean(value)
            or not isinstance(value, int | float)
            or not 0 < value <= DDP_BUCKET_CAP_MB_MAX
        ):
            raise OptionError(
                f"ddp_kwargs: {key} is {value!r:.40}; give MiB in (0, {DDP_BUCKET_CAP_MB_MAX:g}]"
            )
    if ddp_kwargs.get("static_graph") and (strategy != "ddp" or accumulation_steps > 1):
        raise OptionError(
            "ddp_kwargs: static_graph needs every backward to all-reduce (strategy ddp, "
            f"accumulation_steps 1); {strategy}'s local steps skip it (no_sync)"
            if strategy != "ddp"
            else "ddp_kwargs: static_graph needs every backward to all-reduce; "
            "accumulation_steps > 1 skips it on all passes but the last (no_sync)"
        )
    return {k: bool(v) if DDP_KWARGS_TAKEN[k] == "bool" else v for k, v in ddp_kwargs.items()}


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def describe(
    exc: ValidationError,
    model: type[BaseModel],
    unknown: str = "check the name in your --config file",
) -> str:
    """The first error of validating `model` as one line that starts with the flag to change
    (and, for a bound, why: the field's `about`); `unknown`: the hint for a setting no field has
    (where the name came from)."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ())]
    msg = " ".join(str(err.get("msg", "invalid")).split())
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if msg.startswith("--"):
        return msg
    if err.get("type") == "extra_forbidden":
        return f"{flag(loc[0])[:60]}: unknown setting ({unknown})"
    field = loc[0] if loc else "config"
    got = repr(err.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    line = f"{flag(field)}: {msg.lower()} (got {got})"
    side = {
        "less_than_equal": "le",
        "less_than": "le",
        "greater_than_equal": "ge",
        "greater_than": "ge",
    }.get(str(err.get("type")))
    if reason := limit_reason(model, field, side or ""):
        line += f": {reason}"
    return line


def _boolean(value: object) -> bool:
    """A boolean, also NumPy's (np.True_) or torch's (a bool tensor), which pydantic reads as
    the int 1 or 0 alike; without importing either."""
    return isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def _takes_bool(info) -> bool:
    """Whether a field's type admits a boolean (bool, bool | None, or an untyped value)."""
    ann = info.annotation
    return ann is bool or bool in typing.get_args(ann) or ann in (typing.Any, object)


class SyncOptions(
    LinkSettings,
    FragmentSettings,
    BoundarySettings,
    OuterSettings,
    StrategySettings,
    PolicySettings,
):
    """The engine's options, declared by the settings models it inherits, one idea each: the K
    policies' (PolicySettings, controllers/options.py: declared there once, so a new policy
    option is one edit, docs/design.md §3), the strategy's, the outer step's, the boundary's, the
    fragments' and the link's and clock's (trainer/engine/*_settings.py); the seed and the
    divergence guard are its own. Its validators check what reads settings of several models.

    The bases are listed last first: pydantic orders the fields base by base from the end of the
    MRO, so they keep the order of one class (--help's groups, the first of several errors
    reported, config.json's keys)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)
    # --sync-period as given (None: derived), for autok.Sync's floor (trainer/engine/k_floor.py)
    _given_start: int | None = PrivateAttr(None)

    # --- its own: the seed, then the divergence guard (after every inherited field)
    seed: int = Field(
        42,
        ge=0,
        le=SEED_MAX,
        description="seed for weights, data order and jitter",
        json_schema_extra=about(
            "run",
            too_low=f"seeds are 32-bit (numpy's RNG): use 0..{SEED_MAX}",
            too_high=f"seeds are 32-bit (numpy's RNG): use 0..{SEED_MAX}",
        ),
    )
    # --- divergence guard
    on_divergence: Literal["stop", "rollback"] = Field(
        "stop",
        description="non-finite loss or parameters, or loss far above its running minimum "
        "(--divergence-factor): stop, or rollback to the last checkpoint with K halved",
        json_schema_extra=about(_FAILURES),
    )
    divergence_factor: float = Field(
        4.0,
        gt=1.0,
        description="F: diverged when the mean loss of 4 boundaries exceeds F x its running "
        "minimum and either its first 4 boundaries' or F^2 x the minimum and 1/16 of those "
        "(a larger F never stops sooner)",
        json_schema_extra=about(_FAILURES),
    )

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data):
        """True is an int to pydantic (and YAML's `true` to a config file): a boolean given
        for a number (sync_period=True, metrics_port=True: port 1) is refused, not read as 1."""
        if isinstance(data, dict):
            for name, value in data.items():
                info = cls.model_fields.get(name)
                if _boolean(value) and info is not None and not _takes_bool(info):
                    raise ValueError(f"{flag(name)}: {value} is a boolean, not a value it takes")
        return data

    @model_validator(mode="after")
    def _sync_cross_field(self, info: ValidationInfo) -> SyncOptions:
        if self.link not in PROFILES:
            raise ValueError(f"--link: unknown {self.link!r}; choose from {list(PROFILES)}")
        if self.link_schedule is not None:
            try:
                plan = parse_schedule(self.link_schedule)
            except ValueError as exc:
                raise ValueError(f"--link-schedule: {exc}") from None
            last = plan.segments[-1][0]
            if plan.unit == "epoch" and last > COUNT_MAX:
                # Only this is provably unreachable here: the engine cannot know how long a
                # loop runs (autok train also refuses epochs past its --epochs: autok/config.py)
                raise ValueError(
                    f"--link-schedule: epoch={last} is past any run (epochs are at most "
                    f"{COUNT_MAX})"
                )
            first = plan.segments[0][1].name
            if "link" in self.model_fields_set and self.link != first:
                raise ValueError(
                    f"--link: {self.link} differs from --link-schedule's first profile {first}; "
                    "drop --link (the schedule names every profile)"
                )
            self.link = first  # recorded in config.json: a resume passes both, consistently
            for name in ("link_rtt_ms", "link_bandwidth_gbps", "link_jitter_ms"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{flag(name)}: overrides apply to one profile, not to a "
                        "--link-schedule; drop one of them"
                    )
        if self.policy not in POLICIES:
            raise ValueError(f"--policy: unknown {self.policy!r}; choose from {sorted(POLICIES)}")
        if self.random_mean is not None and self.policy != "random":
            raise ValueError("--random-mean: only --policy random draws K; drop it or use random")
        self._check_policy_options()
        check_skew_options(self)
        self._check_k_schedule()
        self._given_start = self.sync_period
        # K's floor, before K's start: the optimizer's (k_floor.py), autok.Sync's or the named
        resolve_floor(self, (info.context or {}).get(SECOND_MOMENT_KEY, self.named_second_moment()))
        if self.sync_period is None:
            self.sync_period = self._default_sync_period()
        self._check_outer()
        if self.strategy == "ddp":
            if self.sync_period != 1:
                raise ValueError("--sync-period: ddp synchronizes every step; use 1 (or cpdp)")
            if self.slowmo_beta not in (None, 0.0):
                raise ValueError("--slowmo-beta: ddp has no SlowMo; use localsgd or cpdp")
            if self.outer_optimizer is not None:
                raise ValueError(
                    "--outer-optimizer: ddp has no parameter averaging; use localsgd or cpdp"
                )
            if self.policy != "fixed":
                raise ValueError("--policy: ddp keeps K=1; adaptive policies need localsgd/cpdp")
        check_floor(self)
        if self.compress != "none" and self.strategy == "ddp":
            raise ValueError(
                "--compress: ddp's gradient AllReduce is not compressed; use localsgd or cpdp"
            )
        self._check_unread()
        if self.clock == "virtual" and self.compute_ms is None:
            raise ValueError(
                "--clock: virtual models each step's compute and needs --compute-ms (e.g. the "
                "step time of the model you stand for)"
            )
        if self.slowmo_lr_aware and self.outer.momentum == 0.0:  # no velocity: nothing to rescale
            src = "--outer-momentum" if self.outer_optimizer is not None else "--slowmo-beta"
            raise ValueError(
                f"--slowmo-lr-aware: keeps SlowMo's momentum in LR units, and {src} is 0 (no "
                f"momentum): it would change nothing; drop it or give {src} > 0"
            )
        if self.overlap_boundary and self.strategy == "ddp":
            raise ValueError("--overlap-boundary: ddp has no parameter averaging to overlap")
        if self.overlap_boundary and self.boundary == "fused":
            raise ValueError(
                "--overlap-boundary: needs --boundary two-phase (or auto): the "
                "fused boundary's momentum correction cannot arrive a step late"
            )
        self._check_fragments()
        self._check_outer_state_device()
        if self.random_mean is not None and self.random_mean > self.max_sync_period:
            raise ValueError(
                f"--random-mean: {self.random_mean:g} is above --max-sync-period "
                f"{self.max_sync_period}"
            )
        if self.qsr_base is not None and self.qsr_base > self.max_sync_period:
            # QSR's K never goes below its base, so a base above the cap would run past it
            raise ValueError(
                f"--qsr-base: {self.qsr_base} is above --max-sync-period {self.max_sync_period}"
            )
        cap_given = self.max_sync_period != type(self).model_fields["max_sync_period"].default
        if (
            "max_sync_period" in POLICY_READS[self.policy] or cap_given
        ) and self.max_sync_period < self.sync_period:
            raise ValueError(
                f"--max-sync-period: {self.max_sync_period} is below --sync-period "
                f"{self.sync_period}"
            )
        return self

    def _check_k_schedule(self) -> None:
        """`scheduled` needs its schedule, whose first K is the run's K: a --sync-period that
        differs would be recorded as the K the run started at, and is refused."""
        if self.policy != "scheduled":
            return
        if self.k_schedule is None:
            raise ValueError(
                "--k-schedule: --policy scheduled needs one: K,K@step=N,... (e.g. "
                "16,32@step=160,16@step=352)"
            )
        # K changes at the step named only where each boundary syncs the whole model when it
        # is reached (controllers/scheduled.py)
        for name, given, what in (
            ("fragments", self.fragments > 1, "a fragment boundary syncs part of the model"),
            ("fragment_delay", self.fragment_delay > 0, "a delayed average decides K late"),
            ("overlap_boundary", self.overlap_boundary, "an overlapped average decides K late"),
        ):
            if given:
                raise ValueError(
                    f"{flag(name)}: --policy scheduled changes K at the step it names, and {what}; "
                    f"drop {flag(name)} (or use another policy)"
                )
        schedule = parse_k_schedule(self.k_schedule)
        first = schedule[0][1]
        if self.sync_period is not None and self.sync_period != first:
            raise ValueError(
                f"--sync-period: {self.sync_period} differs from --k-schedule's first K {first}; "
                "drop --sync-period (the schedule names every K)"
            )
        if (top := max(k for _, k in schedule)) > self.max_sync_period:
            raise ValueError(
                f"--k-schedule: K {top} is above --max-sync-period {self.max_sync_period}"
            )

    def _default_sync_period(self) -> int:
        """K where --sync-period is not given: 1 on ddp; its --k-floor (1; 2 under Adam's family)
        under exposed-sync's direct rule with lowering (its first measured boundary, the
        second, sets K* from the link, so where K = 1 is best the run is K = 1's from its first
        step; started at 4, its first four steps alone moved the panel's time to target per seed by
        0.71-1.15x: docs/design.md §6);
        under scheduled, its --k-schedule's first K; else 4, the study's K (or the policy's
        --k-floor above it)."""
        if self.strategy == "ddp":
            return 1
        if self.policy == "scheduled" and self.k_schedule is not None:
            return parse_k_schedule(self.k_schedule)[0][1]
        if self.policy == "exposed-sync" and self.k_rule == "direct" and self.k_lowering:
            # the smallest K a round of F fragment syncs, each τ steps late, allows, and the
            # policy's own floor
            return max(self.k_floor or 1, self.fragments, self.fragments * self.fragment_delay)
        return max(4, self.k_floor or 1)

    def _check_policy_options(self) -> None:
        """A K-policy option the chosen policy does not read is refused, not ignored: a run
        would otherwise report a setting that changed nothing. "Given" is "differs from the
        default", so a saved config (which carries every default) validates again unchanged.
        A cap (CAPS: --max-sync-period) is checked against K instead."""
        reads = POLICY_READS[self.policy]
        fields = type(self).model_fields
        for name in (n for n in POLICY_OPTIONS if n not in reads and n not in CAPS):
            if getattr(self, name) != fields[name].default:
                readers = ", ".join(p for p, r in POLICY_READS.items() if name in r)
                # ddp keeps K = 1 under the fixed policy: a reader needs another strategy too
                strategy = " with --strategy localsgd or cpdp" if self.strategy == "ddp" else ""
                raise ValueError(
                    f"{flag(name)}: --policy {self.policy} does not read it; drop it, or use a "
                    f"policy that does ({readers}){strategy}"
                )

    def _check_unread(self, skip: frozenset[str] = frozenset()) -> None:
        """A setting the run does not read (`read_only_under`) is refused, not ignored. "Given"
        is "differs from the default", as for the K-policy options, so a saved config validates
        again unchanged. `skip`: choosers whose settings a subclass refuses in its own words."""
        fields = type(self).model_fields
        for name, (chooser, readers, why) in read_only_under(type(self)).items():
            if chooser in skip:
                continue
            value = getattr(self, chooser)
            if value not in readers and getattr(self, name) != fields[name].default:
                raise ValueError(
                    f"{flag(name)}: {flag(chooser)} {value} does not read it ({why}); drop "
                    f"it, or use {flag(chooser)} {' or '.join(sorted(readers))}"
                )

    def _check_fragments(self) -> None:
        """F and τ (trainer/engine/fragments.py). F > the model's parameter count is refused where
        the
        model is known: `Sync` and, before anything is written, the CLI's check_task."""
        frags, tau, k = self.fragments, self.fragment_delay, self.sync_period
        assert k is not None  # the validator resolves K (its default) before this
        if frags > 1 and self.strategy != "localsgd":
            raise ValueError(
                f"--fragments: streams the parameter averaging of localsgd only; {self.strategy} "
                + (
                    "has none"
                    if self.strategy == "ddp"
                    else "all-reduces every gradient (the whole model) at each boundary step"
                )
                + "; use --strategy localsgd or --fragments 1"
            )
        if frags > k:
            raise ValueError(
                f"--fragments: {frags} fragments need K >= {frags} steps per round (one "
                f"fragment per step at most); --sync-period is {k}"
            )
        if frags > 1 and self.sync_optimizer_state:
            raise ValueError(
                "--sync-optimizer-state: optimizer state would move whole at every fragment "
                "sync; drop it or use --fragments 1"
            )
        if tau > 0 and self.overlap_boundary:
            raise ValueError(
                "--overlap-boundary: is --fragment-delay 1 (F = 1, τ = 1); give one of them"
            )
        if tau > 0 and self.strategy == "ddp":
            raise ValueError("--fragment-delay: ddp has no parameter averaging to delay")
        if tau > 0 and self.boundary == "fused":
            raise ValueError(
                "--fragment-delay: needs --boundary two-phase (or auto): the fused boundary's "
                "momentum correction cannot arrive late"
            )
        if tau * frags > k:
            raise ValueError(
                f"--fragment-delay: τ = {tau} is above K/F = {k}/{frags}: a fragment's average "
                "must land no later than the next fragment sync starts; lower it or raise "
                "--sync-period"
            )
        if self.fragment_merge == "lerp" and self.delay == 0:
            # without a delay the average lands where it was taken: a mix with θ_local would
            # only leave the replicas differing (docs/design.md §2, the merge)
            raise ValueError(
                "--fragment-merge: lerp mixes θ_global with the local steps a delayed average "
                "spans, and nothing is delayed; give --fragment-delay (or --overlap-boundary), "
                "or drop it"
            )
        if self.fragment_by != "element" and frags == 1:
            raise ValueError(
                f"--fragment-by: {self.fragment_by} cuts --fragments F > 1, and F is 1 (one "
                "fragment is the whole model); give --fragments or drop it"
            )

    def _check_outer_state_device(self) -> None:
        """θ_ref and the velocity in host memory are staged on the device for one boundary
        (trainer/engine/averaging.py): not across the steps a delayed average spans, and not the
        error feedback of a compressed one; ddp keeps no outer state."""
        if self.outer_state_device == "model":
            return
        why = (
            "ddp keeps no outer state (no parameter averaging)"
            if self.strategy == "ddp"
            else "a delayed average (--overlap-boundary, --fragment-delay) would hold the "
            "staged state across steps"
            if self.delay
            else "--compress's error feedback stays on the device"
            if self.compress != "none"
            else None
        )
        if why:
            raise ValueError(f"--outer-state-device: cpu: {why}; use model (the default)")

    @property
    def delay(self) -> int:
        """τ in force: --fragment-delay, or 1 for --overlap-boundary (the same delayed path)."""
        return self.fragment_delay or int(self.overlap_boundary)

    def _check_outer(self) -> None:
        """--slowmo-beta β spells `slowmo` with α = 1, μ = β (≡ `sgd` α = 1, μ = β); its default
        applies only without --outer-optimizer. Neither is rewritten into the other, so a saved
        config validates again unchanged (a resume)."""
        kind = self.outer_optimizer
        if kind is None:
            for name in ("outer_lr", "outer_momentum"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{flag(name)}: needs --outer-optimizer (sgd or nesterov)")
            if self.slowmo_beta is None:
                self.slowmo_beta = default_slowmo_beta(self.strategy)
            return
        if self.slowmo_beta is not None:
            raise ValueError(
                f"--slowmo-beta: is SlowMo's spelling of an outer optimizer; drop it and give "
                f"--outer-momentum with --outer-optimizer {kind}"
            )
        if kind == "average":  # its only values are the defaults (a saved config holds them)
            for name, only in (("outer_lr", 1.0), ("outer_momentum", 0.0)):
                if getattr(self, name) not in (None, only):
                    raise ValueError(f"{flag(name)}: average takes no outer step; use sgd")
        if self.slowmo_lr_aware and kind != "slowmo":
            raise ValueError(f"--slowmo-lr-aware: applies to SlowMo only, not {kind}")
        if self.outer_lr is None:
            self.outer_lr = DEFAULT_LR[kind]
        if self.outer_momentum is None:
            self.outer_momentum = DEFAULT_MOMENTUM[kind]

    def named_second_moment(self) -> bool | None:
        """Whether the optimizer these settings name divides by a second moment (k_floor.py);
        None: they name none (autok.Sync is given it). TrainConfig names --optimizer."""
        return None

    def __eq__(self, other: object) -> bool:
        """Equal settings: the same fields (how --sync-period got its value is not a setting)."""
        return type(other) is type(self) and self.model_dump() == other.model_dump()

    def policy_options(self, peak_lr: float) -> PolicyOptions:
        """Every PolicyOptions field is the setting of the same name; the peak LR is given."""
        names = [n for n in PolicyOptions.model_fields if n != "peak_lr"]
        return PolicyOptions(peak_lr=peak_lr, **{n: getattr(self, n) for n in names})


def check_skew_options(o: SyncOptions) -> None:
    """SyncOptions' skew options, refused where nothing reads them: --skew-power or --skew-cap
    (off their defaults) or --skew-clear with --skew-drift 0, --skew-grade-gamma without a grade,
    a --skew-strong that grades nothing."""
    for f, what in SKEW_RULE_OPTIONS.items():
        if getattr(o, f) != type(o).model_fields[f].default and o.skew_drift == 0:
            raise ValueError(
                f"{flag(f)}: {what}, and --skew-drift is 0 (off); drop {flag(f)} or give "
                "--skew-drift"
            )
    if o.skew_strong == 0 and o.skew_grade_gamma > 0:
        raise ValueError(
            "--skew-grade-gamma: scales the grade's drift ratio, and --skew-strong is 0 "
            "(no grade); give --skew-strong or drop --skew-grade-gamma"
        )
    if o.skew_strong == 0:
        return
    if o.skew_drift == 0:
        raise ValueError(
            "--skew-strong: grades skew, and --skew-drift is 0 (off); drop --skew-strong "
            "or give --skew-drift"
        )
    if o.skew_strong <= o.skew_drift:
        raise ValueError(
            f"--skew-strong: {o.skew_strong:g} is not above --skew-drift "
            f"{o.skew_drift:g}: it would grade nothing apart; raise it (or 0: off)"
        )
    if o.skew_cap < 2:
        raise ValueError(
            f"--skew-strong: strong skew halves --skew-cap's scale, and --skew-cap "
            f"{o.skew_cap} has no smaller half; raise --skew-cap or drop --skew-strong"
        )


# The engine's settings read only under some values of another (autok/config.py's READ_ONLY_UNDER
# is the run's, a superset): derived from the fields, and its choosers checked, at import.
READ_ONLY_UNDER = read_only_under(SyncOptions)


def sync_options(cls: type[SyncOptions] = SyncOptions, **options) -> SyncOptions:
    """Validated options, or an OptionError whose one line names the option to change.

    Strict, as Python's own arguments are (the library's path; the CLI's config reads text and
    coerces): sync_period="4" or 2.0 is refused, not read as 4 or 2. An integer of another type
    (NumPy's) is taken as the int it is; a boolean never is (see _no_booleans_for_numbers)."""
    options = {
        k: int(v) if isinstance(v, numbers.Integral) and not _boolean(v) else v
        for k, v in options.items()
    }
    try:
        return cls.model_validate(options, strict=True)
    except ValidationError as exc:
        hint = "not an option of autok.Sync: its options are the `autok train` flags' names"
        raise OptionError(describe(exc, cls, hint)) from None
