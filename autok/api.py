"""The public API: `autok.Sync` in your own training loop (docs/design.md §3, Public API).

    import autok   # inside an initialized process group (torchrun, or autok's launcher)

    sync = autok.Sync(model, optimizer, strategy="cpdp", sync_period=4, policy="exposed-sync",
                      link="wan", metrics_port=0, out_dir=None)
    for epoch in range(epochs):
        for x, y in loader:
            with sync.step() as s:           # local step or boundary; no_sync on local steps
                loss = loss_fn(sync.model(x), y)
                loss.backward()
                scaler.step(optimizer)       # or optimizer.step()
                scaler.update(); optimizer.zero_grad()
                s.loss = loss                # optional; a tensor is fine
            scheduler.step()
        sync.sync_now()                      # a boundary now: replicas identical
    torch.save({"sync": sync.state_dict(), ...}, path)
    sync.close()                             # final boundary, metrics server stopped

Every option is the `autok train` flag of the same name and default (`sync_period` is
--sync-period), except `link`: none here (no emulated network), the emulated WAN in `autok train`
(docs/design.md §3); a bad one raises `autok.OptionError` (a ValueError) whose one line names it.
`ddp_kwargs` goes on to DDP (find_unused_parameters, static_graph, gradient_as_bucket_view,
bucket_cap_mb); what autok sets itself (device_ids, process_group, ...) is refused.
`outer_optimizer` also takes a factory, `params -> torch.optim.Optimizer` (the API only): the
outer step is then that optimizer's step on the pseudo-gradient (trainer/engine/outer.py,
TorchOuter).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autok.config import SyncSettings
from autok.trainer.engine.handoff import hand
from autok.trainer.engine.k_floor import with_optimizer_floor
from autok.trainer.engine.observer import BaseObserver, Observer, StepInfo
from autok.trainer.engine.optim import divides_by_second_moment
from autok.trainer.engine.options import OptionError, SyncOptions, check_ddp_kwargs, sync_options
from autok.trainer.engine.outer import OuterFactory, TorchOuter
from autok.trainer.engine.state_check import BadState
from autok.trainer.engine.step import StepHandle, StepTimes
from autok.trainer.engine.sync import Sync as _Engine
from autok.trainer.loop.sinks import BoundaryLog
from autok.trainer.loop.tasks import ACCURACY, PERPLEXITY, Metric, Task

__all__ = [
    "ACCURACY",
    "PERPLEXITY",
    "BaseObserver",
    "Metric",
    "Observer",
    "OptionError",
    "StepHandle",
    "StepInfo",
    "StepTimes",
    "Sync",
    "Task",
]


class Sync(_Engine):
    """The engine (trainer/engine/sync.py) with the service around it: `out_dir` gets rank 0's
    boundaries.jsonl, `metrics_port` starts the Prometheus exporter (as `autok train` does)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        out_dir: str | Path | None = None,
        device: torch.device | None = None,
        observers: list[Any] | None = None,
        peak_lr: float | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        factory = _outer_factory(options)  # (then options' outer_optimizer is "average")
        settings = sync_options(SyncSettings, **options)
        assert isinstance(settings, SyncSettings)  # sync_options builds the class it is given
        if factory is not None:
            _check_outer_settings(settings)
        if isinstance(device, str):  # "cuda:1", as torch itself takes it
            try:
                device = torch.device(device)
            except RuntimeError:
                raise OptionError(f"device: {device!r} is not a device torch knows") from None
        _check_arguments(model, device, out_dir, observers)
        _check_optimizer(model, optimizer)
        # K's floor, the optimizer's where none is given, before anything is made (out_dir)
        settings = with_optimizer_floor(settings, divides_by_second_moment(optimizer))
        ddp_kwargs = check_ddp_kwargs(ddp_kwargs, settings.strategy, settings.accumulation_steps)
        _check_service(settings, model, device, out_dir, peak_lr)
        # built (the factory called, its result checked) before DDP: use_outer adopts it
        self._outer = _build_outer(factory, model) if factory is not None else None
        super().__init__(
            model,
            optimizer,
            device=device,
            observers=observers,
            peak_lr=peak_lr,
            options=settings,
            ddp_kwargs=ddp_kwargs,
        )
        if self._outer is not None and self.averager is not None:  # (ddp: refused above)
            self.averager.use_outer(self._outer)
        from autok.launch import start_exporter  # the same exporter `autok train` starts

        self.out_dir = Path(out_dir) if out_dir is not None else None
        if self.rank == 0 and self.out_dir is not None:
            self.observers.append(BoundaryLog(self.out_dir))
        exporter = start_exporter(settings, self.rank, str(self.out_dir or "run"))
        if exporter is not None:
            self.observers.append(exporter)

    def _kind(self) -> dict[str, Any]:
        """The engine's, with a factory's optimizer named: a state saved under another outer
        step (a name, or another optimizer class) is refused naming outer_optimizer."""
        kind = super()._kind()
        if self._outer is not None:
            kind["outer_optimizer"] = self._outer.name
        return kind

    def _check_state(self, state: dict[str, Any]) -> None:
        """The engine's checks, and a factory's optimizer state tried on a copy: all before
        load_state_dict applies anything."""
        super()._check_state(state)
        outer = self._outer
        if outer is not None and (why := _outer_state_refusal(outer, state["averager"])):
            raise BadState(f"averager.outer: {why}")


# what only the named outer steps read: with a factory, the optimizer's own settings rule
_NAMED_ONLY = {
    "slowmo_beta": None,
    "slowmo_lr_aware": False,
    "outer_lr": None,
    "outer_momentum": None,
}


def _outer_factory(options: dict[str, Any]) -> OuterFactory | None:
    """`outer_optimizer` as a factory (popped: the options take names only), refused with what
    only the names read, or on ddp; None where it is a name (the options check it)."""
    factory = options.get("outer_optimizer")
    if not callable(factory):
        return None
    for name, unset in _NAMED_ONLY.items():
        if options.get(name, unset) is not unset:
            raise OptionError(
                f"outer_optimizer: a factory's optimizer takes its own settings; {name} applies "
                "to the named outer steps only (drop it, or give a name such as 'nesterov')"
            )
    if options.get("strategy") == "ddp":
        raise OptionError("outer_optimizer: ddp has no parameter averaging; use localsgd or cpdp")
    options["outer_optimizer"] = "average"  # the engine's averaging; use_outer adds the step
    return factory


def _check_outer_settings(settings: SyncOptions) -> None:
    """A factory's step moves the whole θ_ref where it lives (ParameterAverager.use_outer)."""
    if settings.fragments > 1:
        raise OptionError(
            "outer_optimizer: a factory's optimizer steps the whole model; with fragments "
            f"{settings.fragments} each boundary moves a slice (give a name, or fragments 1)"
        )
    if settings.outer_state_device != "model":
        raise OptionError(
            "outer_optimizer: a factory's optimizer keeps θ_ref on the model's device; "
            "outer_state_device 'cpu' needs a named outer step"
        )


def _build_outer(factory: OuterFactory, model: nn.Module) -> TorchOuter:
    """The factory's optimizer over a new θ_ref in the averaging's dtype (at least float32, as
    ParameterAverager's own; use_outer checks they agree), refused naming outer_optimizer."""
    params = list(model.parameters())
    work = torch.float32
    for p in params:
        work = torch.promote_types(work, p.dtype)
    numel = sum(p.numel() for p in params)
    flat = torch.empty(numel, dtype=work, device=params[0].device)
    try:
        return TorchOuter(factory, flat, [p.shape for p in params])
    except ValueError as exc:
        raise OptionError(f"outer_optimizer: {exc}") from None


def _outer_state_refusal(outer: TorchOuter, saved: Any) -> str | None:
    """Why a saved averager state cannot give this factory's optimizer its state, or None:
    loaded on a copy (torch checks the groups), each state tensor a scalar or of its
    parameter's shape (torch does not, and the first step would fail on it)."""
    if not isinstance(saved, dict) or "outer" not in saved:
        return "no outer optimizer's state (saved without outer_optimizer=FACTORY?)"
    state = saved["outer"]
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict):
        return "not a torch optimizer's state_dict()"
    shapes = [p.shape for p in outer.params]
    for key, per_param in state["state"].items():
        if not (isinstance(key, int) and 0 <= key < len(shapes)):
            return f"state key {str(key)[:20]!r} is no parameter's index"
        if not isinstance(per_param, dict):
            return f"state[{key}] is not a dict"
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor) and value.numel() > 1 and value.shape != shapes[key]:
                return f"state[{key}][{str(name)[:20]!r}] is not of parameter {key}'s shape"
    try:
        copy.deepcopy(outer.optimizer).load_state_dict(state)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:80]}"
    return None


def _check_arguments(model: Any, device: Any, out_dir: Any, observers: Any) -> None:
    """Sync's arguments of the wrong kind, refused naming the argument (the same on every
    rank: no agreement needed), before they fail deep inside DDP or the first boundary."""
    if not isinstance(model, nn.Module):
        raise OptionError(f"model: a {type(model).__name__}, not a torch.nn.Module")
    if why := _wrapped(model):
        raise OptionError(f"model: {why}")
    first = next(iter(model.parameters()), None)
    if first is None:
        raise OptionError("model: it has no parameters; autok.Sync trains a model's parameters")
    if not any(p.requires_grad for p in model.parameters()):
        raise OptionError(
            "model: every parameter is frozen (requires_grad=False); autok.Sync trains a "
            "model's parameters"
        )
    if device is not None:
        if not isinstance(device, torch.device):
            raise OptionError(f"device: {device!r} is not a torch.device (or a name of one)")
        if device.type != first.device.type:
            raise OptionError(
                f"device: {device}, but the model's parameters are on {first.device}; move the "
                "model there first (model.to(device))"
            )
    if out_dir is not None and not isinstance(out_dir, str | Path):
        raise OptionError(f"out_dir: a {type(out_dir).__name__}; give a path, or None")
    if observers is not None and not isinstance(observers, list | tuple):
        raise OptionError(f"observers: a {type(observers).__name__}; give a list of observers")


def _wrapped(model: nn.Module) -> str | None:
    """Why a model already wrapped for data parallelism (at its root or inside) is refused:
    `Sync` wraps it in DDP itself, and would all-reduce twice (DDP in DDP), or average shards
    as if they were replicas (FSDP, FSDP2's fully_shard: DTensor parameters)."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    sharded: tuple[type, ...] = ()
    dtensor: type | None = None
    try:  # (a build of torch without torch.distributed has neither)
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
        from torch.distributed.tensor import DTensor

        sharded, dtensor = (FullyShardedDataParallel, FSDPModule), DTensor
    except ImportError:
        pass
    for name, m in model.named_modules():
        where = f"(at {name}) " if name else ""
        if isinstance(m, DataParallel | DistributedDataParallel):
            return (
                f"a {type(m).__name__} {where}is already wrapped; give the model itself "
                "(autok.Sync wraps it in DDP)"
            )
        if sharded and isinstance(m, sharded):
            return (
                f"a {type(m).__name__} {where}is sharded (FSDP): sharded models are not "
                "supported yet; give the model itself"
            )
    if dtensor is not None:
        for name, p in model.named_parameters():
            if isinstance(p, dtensor):
                return (
                    f"parameter {name} is a DTensor (sharded: FSDP2, tensor parallel): sharded "
                    "models are not supported yet"
                )
    return None


def _check_optimizer(model: nn.Module, optimizer: Any) -> None:
    """An optimizer that is one, over this model's parameters: one over another model's would
    step parameters that autok never synchronizes, and the model would never train."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise OptionError(f"optimizer: a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    mine = {id(p) for p in model.parameters()}
    if any(id(p) not in mine for g in optimizer.param_groups for p in g["params"]):
        raise OptionError(
            "optimizer: it holds parameters that are not the model's (an optimizer over "
            "another model?); build it over model.parameters()"
        )


def _check_service(
    settings: SyncSettings, model: nn.Module, device, out_dir: str | Path | None, peak_lr
) -> None:
    """The arguments `Sync` adds to the options, checked before DDP is built: an OptionError
    naming the argument, as the options' own errors do. Some can fail on one rank only (rank 0
    makes out_dir; each rank binds its own metrics port): the ranks agree in one small
    all-reduce, so that every rank raises, none waits in DDP's set-up for the others."""
    import math

    import torch.distributed as dist

    if peak_lr is not None and (
        isinstance(peak_lr, bool)
        or not isinstance(peak_lr, int | float)
        or not math.isfinite(peak_lr)
        or not 0 < peak_lr <= 1e6  # --lr's own bound
    ):
        raise OptionError(f"peak_lr: {peak_lr!r} is not a learning rate in (0, 1e6] (or None)")
    if out_dir is not None and str(out_dir).strip() == "":
        raise OptionError("out_dir: empty; give a directory, or None to write no records")
    if not (dist.is_available() and dist.is_initialized()):
        return  # the engine says so, naming the process group
    rank, world = dist.get_rank(), dist.get_world_size()
    why = _rank_refusal(settings, rank, out_dir)
    # a CPU tensor for gloo, the rank's device for nccl (collectives take no other)
    dev = device or next(model.parameters()).device
    flags = torch.zeros(world, device=dev if dist.get_backend() == "nccl" else "cpu")
    flags[rank] = why is not None
    hand(flags)  # the backend's thread may drop it after this returns (trainer/engine/handoff.py)
    dist.all_reduce(flags)
    if why is not None:
        raise OptionError(why)
    if failed := [r for r in range(world) if flags[r] > 0]:
        raise OptionError(f"autok.Sync: rank {failed[0]} refused its arguments (see its error)")


def _rank_refusal(settings: SyncSettings, rank: int, out_dir: str | Path | None) -> str | None:
    """Why this rank cannot take Sync's own arguments, or None."""
    if out_dir is not None and rank == 0:  # the rank that writes boundaries.jsonl there
        try:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"out_dir: cannot make {out_dir} ({exc.strerror})"
    if settings.metrics_port and (rank == 0 or settings.metrics_per_rank):
        from autok.metrics_http import port_taken

        port = settings.metrics_port + rank
        if port > 65535:
            return f"--metrics-port: {port} (PORT + rank {rank}) is above 65535"
        if why := port_taken(settings.metrics_host, port):
            return (
                f"--metrics-port: {port} cannot be served on {settings.metrics_host}: {why}; "
                "choose another port, or 0 to turn metrics off"
            )
    return None
