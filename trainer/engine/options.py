"""The engine's typed options: every setting of `Sync` (trainer/engine/sync.py) that concerns
synchronization. The CLI's TrainConfig composes them (it inherits these fields), so each option has
the name and default of its `autok train` flag, and the same one-line errors.

Field `foo_bar` is flag `--foo-bar`; an error names the flag to change (docs/design.md §3).
"""

from __future__ import annotations

import numbers
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

from autok.controllers import CAPS, POLICY_OPTIONS, PolicyOptions, PolicySettings
from autok.controllers import POLICIES as POLICY_ENTRIES
from autok.controllers import READS as POLICY_READS
from autok.controllers import REGISTRY as POLICIES
from autok.controllers.options import COUNT_MAX, K_MAX
from autok.controllers.options import GROUP as POLICY_GROUP
from autok.controllers.options import K_REASON as _K_REASON
from autok.trainer.engine.fragments import FRAGMENTS_MAX
from autok.trainer.engine.link import (
    PROFILES,
    LinkProfile,
    LinkSchedule,
    parse_schedule,
    resolve_profile,
    static_schedule,
)
from autok.trainer.engine.outer import DEFAULT_LR, DEFAULT_MOMENTUM, OuterOptimizer

STRATEGIES = ("ddp", "localsgd", "cpdp")
SEED_MAX = 2**32 - 1
ACCUMULATION_MAX = 65_536  # micro-batches per optimizer step
MODEL_BYTES_MAX = 2**44  # --model-bytes: 16 TiB

# One place per setting (docs/design.md §3): a field's description is its `--help` line, and
# `about(...)`, its json_schema_extra, says the rest: its group in `autok train --help` (and
# docs/flags.md), why a bound is where it is (printed with the refusal, docs/design.md §9), and
# whether a resume may change it (docs/design.md §7), and under which values of another setting
# a run reads it. autok/cli.py and autok/flagdoc.py derive HELP, FLAG_GROUPS, RESUME_MAY_CHANGE
# and the flag tables from the fields; `describe` reads the reasons, `read_only_under` the rest.
# The K policies declare their options' fields themselves (controllers/options.py), group and
# all. The groups, in the order `--help` lists them:
GROUPS = (
    "distribution and synchronization",
    POLICY_GROUP,
    "link emulator",
    "optimization",
    "data and model",
    "stragglers",
    "run",
    "checkpoints and failures",
    "metrics",
)
_SYNC, _POLICY, _LINK, _FAILURES = GROUPS[0], GROUPS[1], GROUPS[2], GROUPS[7]  # the engine's
# --policy's help names every registered policy, with what its registry entry notes
_POLICY_HELP = "how K evolves while training: " + ", ".join(
    name + (f" ({policy.note})" if policy.note else "") for name, policy in POLICY_ENTRIES.items()
)
_LINK_HELP = "emulated network: " + ", ".join(
    f"{n} ({p.rtt_ms:g} ms RTT, {p.bandwidth_gbps:g} Gbit/s)" if n != "none" else "none (no delay)"
    for n, p in PROFILES.items()
)


class ReadOnlyUnder(NamedTuple):
    """A setting a run reads only under some values of another, the choosing setting. Given
    under another value, it is refused, not ignored: a run would report a setting that changed
    nothing (docs/design.md §6); sweeps draw it only where it is read, and a resume drops it
    where it never was (autok/space.py)."""

    chooser: str
    values: frozenset[str]  # the chooser's values under which a run reads the setting
    why: str  # why the chooser's other values do not read it


@dataclass(frozen=True)
class About:
    """What a setting's field says besides its type, bounds, default and help line."""

    group: str | None  # None: autok.Sync's alone, no `autok train` flag
    too_low: str | None = None  # why the lower bound (ge, gt) is where it is
    too_high: str | None = None  # why the upper bound (le, lt) is where it is
    resume: bool = False  # `autok train --resume` may change it
    before: str | None = None  # listed just before this setting of its group (else field order)
    read_only_under: ReadOnlyUnder | None = None  # None: read under every value of the others


_ABOUT_KEYS = frozenset(About.__dataclass_fields__)


def about(
    group: str | None,
    *,
    too_low: str | None = None,
    too_high: str | None = None,
    resume: bool = False,
    before: str | None = None,
    read_only_under: tuple[str, frozenset[str], str] | None = None,
) -> JsonDict:
    """A setting's `json_schema_extra`: see About; `read_only_under` is (the chooser, the values
    under which it is read, why the others do not read it). A group outside GROUPS fails at
    import."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"about: unknown group {group!r}; choose from {GROUPS}")
    said: dict[str, Any] = dict(
        group=group, too_low=too_low, too_high=too_high, resume=resume, before=before
    )
    if read_only_under is not None:
        chooser, values, why = read_only_under
        said["read_only_under"] = {"chooser": chooser, "values": sorted(values), "why": why}
    return {"autok": {k: v for k, v in said.items() if v not in (None, False)}}


def about_of(info: FieldInfo, name: str = "a setting") -> About:
    """What `about` put on a field (setting `name`); a field without it is refused: it would
    have no group, so no flag. So is a key `about` does not write (one the controllers' own
    `about` misspelled: controllers/options.py)."""
    extra = info.json_schema_extra
    data = extra.get("autok") if isinstance(extra, dict) else None
    if not isinstance(data, dict):
        raise TypeError(f"{name}: its Field has no json_schema_extra=about(...) (its group)")
    if unknown := sorted(set(data) - _ABOUT_KEYS):
        raise TypeError(f"{name}: its about(...) has {unknown}; it takes {sorted(_ABOUT_KEYS)}")

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) else None

    return About(
        group=text("group"),
        too_low=text("too_low"),
        too_high=text("too_high"),
        resume=data.get("resume") is True,
        before=text("before"),
        read_only_under=_read_only_under_of(data.get("read_only_under")),
    )


def _read_only_under_of(said: object) -> ReadOnlyUnder | None:
    """`about`'s JSON form of read_only_under (a dict of lists) as the ReadOnlyUnder it was."""
    if not isinstance(said, dict):
        return None
    values = said.get("values")
    return ReadOnlyUnder(
        str(said.get("chooser")),
        frozenset(str(v) for v in values) if isinstance(values, list) else frozenset(),
        str(said.get("why")),
    )


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


_AVERAGING = frozenset({"localsgd", "cpdp"})
_DDP_STATES = "every ddp step applies the same averaged gradient: optimizer states never differ"
# A cap on K (CAPS, declared by the controllers, which know no strategies) is read where K can
# change: ddp keeps K = 1.
_CAP_UNDER = ReadOnlyUnder("strategy", _AVERAGING, "ddp keeps K = 1")


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


class SyncOptions(PolicySettings):
    """The engine's options. The K policies' (target_sync_share, max_sync_period, ...) are the
    fields it inherits from PolicySettings (controllers/options.py): declared there once, with
    their help, bounds and group, so a new policy option is one edit (docs/design.md §3)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

    # --- strategy and boundary
    strategy: Literal["ddp", "localsgd", "cpdp"] = Field(
        "cpdp",
        description="ddp: sync every step; localsgd: average every K; cpdp: grad sync + average "
        "+ SlowMo every K",
        json_schema_extra=about(_SYNC),
    )
    sync_period: int | None = Field(
        None,
        ge=1,
        le=K_MAX,
        description="K, optimizer steps between boundaries (default: 4; 1 on ddp)",
        json_schema_extra=about(_SYNC, too_high=_K_REASON),
    )
    # listed first of its group, before the policies' own options (inherited: earlier fields)
    policy: str = Field(
        "fixed",
        description=_POLICY_HELP,
        json_schema_extra=about(_POLICY, before=POLICY_OPTIONS[0]),
    )
    slowmo_beta: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="SlowMo momentum β in [0, 1); 0 turns it off; on localsgd it makes the "
        "LocalSGD+SlowMo ablation (default: 0.3 on cpdp, 0 otherwise)",
        json_schema_extra=about(_SYNC),
    )
    slowmo_lr_aware: bool = Field(
        False,
        description="keep the SlowMo velocity in LR units (fairscale's form)",
        json_schema_extra=about(
            _SYNC, read_only_under=("strategy", _AVERAGING, "ddp has no SlowMo")
        ),
    )
    # --- outer optimizer on the pseudo-gradient θ_ref − θ_avg (trainer/engine/outer.py); unset:
    # SlowMo with --slowmo-beta (that spelling stays; giving both is refused)
    outer_optimizer: Literal["average", "slowmo", "nesterov", "sgd"] | None = Field(
        None,
        description="outer step on the pseudo-gradient θ_ref − θ_avg at each boundary: "
        "average, sgd, nesterov (DiLoCo) or slowmo (default: unset, SlowMo with --slowmo-beta)",
        json_schema_extra=about(_SYNC),
    )
    outer_lr: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="outer learning rate α: θ = θ_ref − α·step; slowmo: the slow LR (default: 0.7 "
        "on nesterov, 1 otherwise)",
        json_schema_extra=about(
            _SYNC,
            too_high="an outer step 10x the replicas' mean move overshoots; DiLoCo uses 0.7",
        ),
    )
    outer_momentum: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="outer momentum μ in [0, 1) (default: 0.9 on nesterov, 0 otherwise)",
        json_schema_extra=about(_SYNC),
    )
    # what the averaging collective carries: Δ_i = θ_i − θ_ref quantized
    # (trainer/engine/compress.py)
    compress: Literal["none", "fp16", "int8"] = Field(
        "none",
        description="what the parameter averaging carries: none (fp32 θ), or the pseudo-gradient "
        "θ − θ_ref in fp16 or int8 with a per-chunk scale and error feedback; with --boundary "
        "fused the gradients ride it too, quantized without error feedback (default: none)",
        json_schema_extra=about(_SYNC),
    )
    sync_optimizer_state: bool = Field(
        False,
        description="also average momentum buffers / Adam moments at boundaries",
        json_schema_extra=about(_SYNC, read_only_under=("strategy", _AVERAGING, _DDP_STATES)),
    )
    buffer_policy: Literal["average", "broadcast", "local"] = Field(
        "average",
        description="BatchNorm statistics at boundaries: average, broadcast (rank 0) or local",
        json_schema_extra=about(_SYNC),
    )
    boundary: Literal["auto", "fused", "two-phase"] = Field(
        "auto",
        description="cpdp boundary: fused (one collective carrying parameters and gradients, "
        "exact for SGD), two-phase (gradient AllReduce, then parameter AllReduce), or auto "
        "(fused when exact, and not under --compress)",
        json_schema_extra=about(
            _SYNC,
            read_only_under=(
                "strategy",
                frozenset({"cpdp"}),
                "only a cpdp boundary has both a gradient and a parameter collective to fuse "
                "or split",
            ),
        ),
    )
    overlap_boundary: bool = Field(
        False,
        description="start parameter averaging asynchronously and apply it one local step "
        "later, hiding the link latency behind compute (changes the algorithm: see README)",
        json_schema_extra=about(_SYNC),
    )
    # Where θ_ref and the outer velocity live between boundaries (trainer/engine/averaging.py):
    # "cpu" keeps the model's device at most 2x the parameters (docs/design.md §4)
    outer_state_device: Literal["model", "cpu"] = Field(
        "model",
        description="where θ_ref and the outer velocity live between boundaries: model (its "
        "device) or cpu (host memory, staged per boundary; the device then holds at most 2x "
        "the parameters)",
        json_schema_extra=about(_SYNC, before="boundary"),
    )
    # --- the step: forward/backward passes per optimizer step, only the last all-reduces
    # (trainer/engine/sync.py). Library only: `autok train`'s loop takes one per step
    # (autok/config.py), so it has no group (no flag)
    accumulation_steps: int = Field(
        1,
        ge=1,
        le=ACCUMULATION_MAX,
        description="micro-batches per optimizer step",
        json_schema_extra=about(
            None,
            too_high="a larger batch per optimizer step needs no more passes: give each a "
            "larger micro-batch",
        ),
    )
    # --- streaming fragment sync (trainer/engine/fragments.py): each boundary moves 1/F of the
    # model
    fragments: int = Field(
        1,
        ge=1,
        le=FRAGMENTS_MAX,
        description="F: split the parameters into F contiguous fragments that sync in turn, one "
        "every K/F steps, so each boundary moves 1/F of the model (localsgd; needs K >= F; epoch "
        "ends sync every fragment) (default: 1)",
        json_schema_extra=about(
            _SYNC, too_high=f"more than {FRAGMENTS_MAX} fragments only add a latency per sync"
        ),
    )
    fragment_delay: int = Field(
        0,
        ge=0,
        le=K_MAX,
        description="τ: apply a sync's average τ local steps after it started, keeping the "
        "steps taken meanwhile; τ <= K/F; --overlap-boundary is F = 1, τ = 1 (default: 0)",
        json_schema_extra=about(_SYNC, too_high=_K_REASON),
    )
    # How a delayed average lands on the local steps taken meanwhile (docs/design.md §2,
    # "Fragments", the merge): keep is autok's own (overlap local SGD), lerp torchft's and
    # Streaming DiLoCo's mix. Two settings, not α alone: α = 1 is no merge at all, and keep is
    # no α, so neither can be spelled by a value of the other.
    fragment_merge: Literal["keep", "lerp"] = Field(
        "keep",
        description="how a delayed average (--fragment-delay, --overlap-boundary) lands: keep "
        "(θ_global plus the local steps taken since it started) or lerp ((1 − α)·θ_global + "
        "α·θ_local, α = --fragment-alpha, torchft's fragment_update_alpha) (default: keep)",
        json_schema_extra=about(_SYNC),
    )
    fragment_alpha: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="α of --fragment-merge lerp: the share of θ_local kept where a delayed "
        "average lands (0 discards the local steps, torchft's default) (default: 0.0)",
        json_schema_extra=about(
            _SYNC,
            too_high="α = 1 keeps θ_local whole: every average would be thrown away",
            read_only_under=(
                "fragment_merge",
                frozenset({"lerp"}),
                "keep adds the local steps to θ_global and mixes nothing",
            ),
        ),
    )
    # What a fragment is (trainer/engine/fragments.py, fragment_plan)
    fragment_by: Literal["element", "module", "strided"] = Field(
        "element",
        description="how --fragments cuts the parameters: element (near-equal contiguous "
        "slices, a cut may fall inside a tensor), module (contiguous runs of whole parameter "
        "tensors, near-equal by bytes) or strided (fragment j takes tensors j, j + F, j + 2F, "
        "...) (default: element)",
        json_schema_extra=about(_SYNC),
    )
    # --- K policy options: inherited from PolicySettings (controllers/options.py)
    # --- link emulator
    # the library's default: no emulated network (docs/design.md §3); `autok train` studies the
    # emulated WAN by default (TrainConfig overrides it)
    link: str = Field("none", description=_LINK_HELP, json_schema_extra=about(_LINK))
    link_rtt_ms: float | None = Field(
        None,
        ge=0.0,
        le=60_000.0,
        description="override the link's round-trip time, ms (default: the --link profile's)",
        json_schema_extra=about(
            _LINK, too_high="a minute per round trip; no link to emulate is slower"
        ),
    )
    link_bandwidth_gbps: float | None = Field(
        None,
        ge=1e-6,
        description="override the link's bandwidth, Gbit/s (default: the --link profile's)",
        json_schema_extra=about(_LINK, too_low="below 1 kbit/s one collective would take hours"),
    )
    link_jitter_ms: float | None = Field(
        None,
        ge=0.0,
        le=60_000.0,
        description="uniform extra delay per collective in [0, J] ms, seeded (default: 0)",
        json_schema_extra=about(
            _LINK, too_high="a minute of jitter per collective; no link to emulate is slower"
        ),
    )
    link_schedule: str | None = Field(
        None,
        max_length=2000,
        description="a link that changes during the run: PROFILE,PROFILE@epoch=N,... or "
        "@step=N (epochs and steps counted from 0), e.g. lan,wan@epoch=2,lan@epoch=4; replaces "
        "--link (default: unset)",
        json_schema_extra=about(_LINK),
    )
    # --- the clock every recorded time comes from (trainer/engine/clock.py; docs/design.md §4)
    clock: Literal["wall", "virtual"] = Field(
        "wall",
        description="where recorded times come from: wall (measured; the link emulator sleeps) "
        "or virtual (modelled from --compute-ms and the link model; nothing sleeps, and a seed "
        "gives the same records on any machine)",
        json_schema_extra=about(_LINK),
    )
    compute_ms: float | None = Field(
        None,
        gt=0.0,
        le=60_000.0,
        description="virtual: the compute of one optimizer step, ms (plus any straggler delay) "
        "(default: unset)",
        json_schema_extra=about(
            _LINK,
            too_high="a minute per step; no model to emulate is slower",
            read_only_under=("clock", frozenset({"virtual"}), "the wall clock measures compute"),
        ),
    )
    model_bytes: int | None = Field(
        None,
        ge=1,
        le=MODEL_BYTES_MAX,
        description="virtual: book every collective as if the model had this many parameter "
        "bytes (default: the model's own)",
        json_schema_extra=about(
            _LINK,
            too_high="16 TiB of parameters is beyond any model",
            read_only_under=(
                "clock",
                frozenset({"virtual"}),
                "the wall clock's link moves real bytes",
            ),
        ),
    )
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
        "minimum and either 1/4 of its first 4 boundaries' or F^2 x the minimum and 1/16 of those "
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
    def _sync_cross_field(self) -> SyncOptions:
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
        if self.sync_period is None:
            self.sync_period = 1 if self.strategy == "ddp" else 4
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
        assert k is not None  # the validator resolves K (its strategy's default) before this
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

    @property
    def outer(self) -> OuterOptimizer:
        """The resolved outer step of a boundary (trainer/engine/outer.py)."""
        if self.outer_optimizer is None:
            return OuterOptimizer("slowmo", 1.0, self.slowmo_beta or 0.0, self.slowmo_lr_aware)
        # both resolved to the optimizer's defaults by validation (_check_outer)
        assert self.outer_lr is not None and self.outer_momentum is not None
        return OuterOptimizer(
            self.outer_optimizer, self.outer_lr, self.outer_momentum, self.slowmo_lr_aware
        )

    def policy_options(self, peak_lr: float) -> PolicyOptions:
        """Every PolicyOptions field is the setting of the same name; the peak LR is given."""
        names = [n for n in PolicyOptions.model_fields if n != "peak_lr"]
        return PolicyOptions(peak_lr=peak_lr, **{n: getattr(self, n) for n in names})

    @property
    def link_profile(self) -> LinkProfile:
        """The profile the run starts on (with a schedule: its first)."""
        return resolve_profile(
            self.link, self.link_rtt_ms, self.link_bandwidth_gbps, self.link_jitter_ms
        )

    @property
    def link_plan(self) -> LinkSchedule:
        """The link over the whole run: the schedule, or the one profile throughout."""
        if self.link_schedule is not None:
            return parse_schedule(self.link_schedule)
        return static_schedule(self.link_profile)

    @property
    def link_name(self) -> str:
        """How records and labels name the link: the profile, or the schedule's text."""
        return self.link_plan.text if self.link_schedule is not None else self.link_profile.name


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
