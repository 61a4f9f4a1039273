"""What `Sync.__init__` builds from its options besides its own state (docs/design.md §3, Public
API; §2, §4): its arguments checked before anything is built, then `SyncParts`, the named bundle
of what it runs on (DDP, the link's clocks, the averager with what rides with the parameters, the
controller, the guard), built in the order the constructor always built them (DDP broadcasts rank
0's parameters before the averager copies its reference). Functions of plain arguments, so that
the Sync's constructor is its own state alone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autok.controllers import build_controller
from autok.controllers.base import Controller
from autok.trainer.engine.averaging import ParameterAverager
from autok.trainer.engine.clock import VirtualClock
from autok.trainer.engine.divergence import DivergenceGuard
from autok.trainer.engine.fragments import tensors_refusal
from autok.trainer.engine.grad_hook import GradSyncState, install_grad_sync
from autok.trainer.engine.grad_watch import GradWatch
from autok.trainer.engine.k_floor import with_optimizer_floor
from autok.trainer.engine.link import LinkClock, LinkSchedule
from autok.trainer.engine.observer import check_observers
from autok.trainer.engine.optim import (
    delayed_state_problem,
    divides_by_second_moment,
    state_tensors,
)
from autok.trainer.engine.options import (
    OptionError,
    SyncOptions,
    check_ddp_kwargs,
    flag,
    fused_is_exact,
    sync_options,
)
from autok.trainer.engine.profiler import DeviceMarks
from autok.trainer.engine.step import TimedDDP
from autok.trainer.engine.strategies import STRATEGIES, SyncStrategy, fused


@dataclass(slots=True)
class Extras:
    """What rides with the parameters at a boundary, for the averager. Its own object, not
    methods of the Sync: the averager would hold the Sync in a cycle (see Sync.close)."""

    optimizer: torch.optim.Optimizer
    options: SyncOptions
    float_buffers: list[torch.Tensor]

    def averaged(self) -> list[torch.Tensor]:
        extras = state_tensors(self.optimizer) if self.options.sync_optimizer_state else []
        if self.options.buffer_policy == "average":
            extras = extras + self.float_buffers
        return extras

    def broadcast(self) -> list[torch.Tensor]:
        return self.float_buffers if self.options.buffer_policy == "broadcast" else []


def check_fragments(opts: SyncOptions, model: nn.Module) -> None:
    """--fragments: at most one fragment per parameter element (per parameter tensor, where
    --fragment-by cuts between tensors)."""
    numel = sum(p.numel() for p in model.parameters())
    if opts.fragments > numel:
        raise OptionError(
            f"--fragments: {opts.fragments} fragments of a model with {numel} parameters; "
            f"give at most {numel}"
        )
    if why := tensors_refusal(model, opts.fragments, opts.fragment_by):
        raise OptionError(why)


def build_averager(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    opts: SyncOptions,
    float_buffers: list[torch.Tensor],
    *,
    rank: int,
    world_size: int,
    fused_sgd: torch.optim.SGD | None,
) -> ParameterAverager:
    """The parameter averager of an averaging strategy (trainer/engine/averaging.py)."""
    extras = Extras(optimizer, opts, float_buffers)
    return ParameterAverager(
        list(model.parameters()),
        rank=rank,
        world_size=world_size,
        outer=opts.outer,
        compress=opts.compress,
        averaged_extras=extras.averaged,
        broadcast_extras=extras.broadcast,
        fused_sgd=fused_sgd,
        fragments=opts.fragments,
        offload=opts.outer_state_device == "cpu",
        fragment_by=opts.fragment_by,
        merge_alpha=float(opts.fragment_alpha) if opts.fragment_merge == "lerp" else None,
    )


def virtual_clock(
    opts: SyncOptions, model: nn.Module, plan: LinkSchedule, world_size: int, rank: int
) -> VirtualClock:
    """--clock virtual's clock; --model-bytes scales every collective's bytes by the model's
    own parameter bytes (a small model booked as the large one it stands for)."""
    own = sum(p.numel() * p.element_size() for p in model.parameters())
    scale = opts.model_bytes / own if opts.model_bytes is not None and own else 1.0
    compute_ms = opts.compute_ms or 0.0  # (set whenever virtual: trainer/engine/options.py)
    return VirtualClock(plan, world_size, rank, opts.seed, compute_ms, scale)


def fused_boundary_is_exact(strategy: str, optimizer: torch.optim.Optimizer) -> bool:
    """The one-collective cpdp boundary is exact for SGD without dampening (linear in g)."""
    return (
        fused_is_exact(strategy, "sgd")  # the rule; what follows: this optimizer is that "sgd"
        and type(optimizer) is torch.optim.SGD
        and all(g.get("dampening", 0) == 0 for g in optimizer.param_groups)
    )


@dataclass(slots=True)
class Checked:
    """`Sync`'s arguments once checked, before anything is built."""

    options: SyncOptions
    ddp_kwargs: dict[str, Any]
    exact: bool  # the fused boundary is exact here (fused_boundary_is_exact, no unused parameter)
    unused: bool  # find_unused_parameters: a rank's gradient may be None where another's is not
    # the LR the K policy takes as its peak: given, or group 0's, the group every boundary reads
    # η from, so qsr's ratio η/peak is one group's schedule whatever the order or relative LRs
    # of the groups (docs/design.md, "The LR a boundary records"); a tensor LR (CUDA graphs, a
    # compiled step) read as a number
    peak_lr: float


def check_arguments(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    observers: list[Any] | None,
    options: SyncOptions | None,
    ddp_kwargs: dict[str, Any] | None,
    kwargs: dict[str, Any],
    peak_lr: float | None = None,
) -> Checked:
    """`Sync`'s arguments, each refused in one line naming it (OptionError), before anything is
    built (DDP's construction is a collective): the options, the fragments the model can be cut
    into, the peak LR a policy reads, DDP's own arguments, the observers, --boundary fused where
    it is not exact, the process group, a late state average the optimizer cannot take."""
    if options is not None and kwargs:
        raise OptionError(f"{flag(next(iter(kwargs)))}: give options or keywords, not both")
    opts = options if options is not None else sync_options(**kwargs)
    # K's floor, where the policy reads one and none is given: the optimizer's (k_floor.py)
    opts = with_optimizer_floor(opts, divides_by_second_moment(optimizer))
    check_fragments(opts, model)
    lr = float(optimizer.param_groups[0]["lr"]) if peak_lr is None else float(peak_lr)
    if not math.isfinite(lr):  # the K policies' options refuse it (controllers/options.py)
        raise OptionError(
            f"peak_lr: {lr} is not finite (default: the LR of the optimizer's first param "
            "group); give a finite peak_lr or fix the optimizer's lr"
        )
    ddp_kwargs = check_ddp_kwargs(ddp_kwargs, opts.strategy, opts.accumulation_steps)
    check_observers(observers or [])
    # With unused parameters a rank's gradient may be None where another's is not: its
    # local step then skips the parameter (no weight decay, no momentum buffer), which the
    # fused boundary's correction m_i += ḡ − g_i cannot repair. DDP, reducing first, gives
    # every rank ḡ: the two-phase boundary (docs/design.md §2, the fused boundary's
    # conditions).
    unused = bool(ddp_kwargs.get("find_unused_parameters"))
    exact = fused_boundary_is_exact(opts.strategy, optimizer) and not unused
    if opts.boundary == "fused" and not exact:
        raise OptionError(
            "--boundary: fused is not exact with ddp_kwargs find_unused_parameters (a rank "
            "whose gradient is None skips the parameter's step); use two-phase or auto"
            if unused
            else "--boundary: fused is exact only for cpdp with torch.optim.SGD without "
            "dampening (AdamW is not linear in the gradient); use two-phase or auto"
        )
    if not dist.is_available() or not dist.is_initialized():
        raise OptionError(
            "autok.Sync needs an initialized process group (torchrun, or "
            "torch.distributed.init_process_group)"
        )
    delayed = opts.sync_optimizer_state and opts.delay > 0  # a late state average
    world_size = dist.get_world_size()
    if delayed and (why := delayed_state_problem(optimizer, world_size, opts.delay)):
        raise OptionError(why)
    return Checked(opts, ddp_kwargs, exact, unused, lr)


@dataclass(slots=True)
class SyncParts:
    """What `Sync` runs on, built from its checked arguments (`build_parts`); the Sync keeps each
    as an attribute of its own, read at every step without a further lookup."""

    rank: int
    world_size: int
    device: torch.device
    strategy: SyncStrategy  # its fused form where --boundary fused
    auto: bool  # --boundary auto may take the fused boundary: it probes until it has
    marks: DeviceMarks | None  # the step's spans on a GPU, from its events
    link_name: str  # the profile in force (a schedule moves it)
    virtual: VirtualClock | None
    clock: LinkClock | None
    model: TimedDDP
    grad_state: GradSyncState
    float_buffers: list[torch.Tensor]
    params: list[nn.Parameter]
    averager: ParameterAverager | None
    watch: GradWatch | None
    controller: Controller
    divergence: DivergenceGuard


def build_parts(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    checked: Checked,
    device: torch.device | None,
) -> SyncParts:
    """`SyncParts`, in the order the parts depend on: the clocks before DDP (its comm hook
    holds the link clock), DDP before the averager (rank 0's parameters, broadcast, are the
    averager's reference), the averager before the guard (which judges its shared loss)."""
    opts, rank, world_size = checked.options, dist.get_rank(), dist.get_world_size()
    device = device or next(model.parameters()).device
    strategy = STRATEGIES[opts.strategy]
    # auto takes the fused boundary only once a boundary step has shown, on every rank, that
    # the loop leaves the gradients as backward gave them (no clipping): until then it is
    # two-phase, and for good if a rank changed them (trainer/engine/grad_watch.py;
    # docs/design.md, "What the fused boundary needs unchanged"). auto keeps the gradients'
    # all-reduce exact: fused would quantize them under --compress.
    auto = opts.boundary == "auto" and checked.exact and opts.delay == 0
    auto = auto and opts.compress == "none"
    if opts.boundary == "fused":
        strategy = fused(strategy)
    # The host clock is read without a device sync; on a GPU the step's spans come from
    # DeviceMarks' events, read once at the step's close.
    marks = DeviceMarks(device) if device.type == "cuda" else None
    plan = opts.link_plan
    # --clock virtual: the link is physically ideal (nothing sleeps) and the virtual clock
    # books what it would cost instead (trainer/engine/clock.py; docs/design.md §4)
    virtual = (
        virtual_clock(opts, model, plan, world_size, rank) if opts.clock == "virtual" else None
    )
    ideal = plan.is_ideal or virtual is not None
    clock = None if ideal else LinkClock(plan, world_size, opts.seed)
    ddp = timed_ddp(model, opts, device, checked.ddp_kwargs)
    grad_state = GradSyncState(world_size, clock)
    # DDP's built-in path times a backward by the first parameter's gradient, which an unused
    # parameter, or a static graph's delayed reduction, may never give: the comm hook, which
    # every bucket passes through, times and counts those (trainer/engine/grad_hook.py)
    reduction_as_given = not (checked.unused or checked.ddp_kwargs.get("static_graph"))
    install_grad_sync(ddp, grad_state, builtin=reduction_as_given)
    float_buffers = [b for b in model.buffers() if b.is_floating_point()]
    params = list(model.parameters())  # DDP fixes them: no parameter joins later
    averager = None
    if strategy.averages_parameters:
        # the optimizer a fused boundary corrects (or auto probes for one): SGD, as the
        # exactness check (fused_boundary_is_exact) required of either
        sgd = optimizer if strategy.fused_gradients or auto else None
        assert sgd is None or isinstance(sgd, torch.optim.SGD)
        averager = build_averager(
            model, optimizer, opts, float_buffers, rank=rank, world_size=world_size, fused_sgd=sgd
        )
    # the check a fused boundary, or auto's choice of it, needs at each boundary step
    watch = GradWatch(params) if strategy.fused_gradients or auto else None
    return SyncParts(
        rank=rank,
        world_size=world_size,
        device=device,
        strategy=strategy,
        auto=auto,
        marks=marks,
        link_name=plan.segments[0][1].name,
        virtual=virtual,
        clock=clock,
        model=ddp,
        grad_state=grad_state,
        float_buffers=float_buffers,
        params=params,
        averager=averager,
        watch=watch,
        controller=controller(opts, checked.peak_lr),
        # ddp's loss is rank-local (no averaging collective carries it): the guard judges the
        # parameters there, which the averaged gradients keep identical on every rank.
        divergence=DivergenceGuard(factor=opts.divergence_factor, shared_loss=averager is not None),
    )


def timed_ddp(
    model: nn.Module, opts: SyncOptions, device: torch.device, ddp_kwargs: dict[str, Any]
) -> TimedDDP:
    """`sync.model`. On the averaging strategies DDP's own per-forward buffer broadcast would
    bypass the emulator and the buffer policy: buffers are reconciled at boundaries instead
    (they still start from rank 0's). ddp is DDP: rank 0's buffers at every forward, as plain
    DDP broadcasts them, unless the policy keeps them local (docs/design.md, "Parameter
    averaging")."""
    return TimedDDP(
        model,
        forward_sync_buffers=opts.strategy == "ddp" and opts.buffer_policy != "local",
        device_ids=[device.index] if device.type == "cuda" else None,
        **ddp_kwargs,
    )


def controller(opts: SyncOptions, peak_lr: float) -> Controller:
    """The policy's controller, its peak LR the checked one (`Checked.peak_lr`)."""
    assert opts.sync_period is not None  # SyncOptions resolves K (its strategy's default)
    return build_controller(opts.policy, opts.sync_period, opts.policy_options(peak_lr))
