"""The built-in loop that `autok train` runs: data, model, an ordinary PyTorch loop inside
`sync.step()`, evaluation, epoch records, checkpoints and rollbacks. Everything that concerns
synchronization is the engine's (trainer/engine/sync.py), reached through its public surface.
The loop reads top to bottom here; its parts live beside it: the epoch's training sums
(epoch_sums.py), evaluation (evaluation.py), the epoch rows, the summary and their totals
(records.py), the checkpoint files (checkpoint.py).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset

from autok.controllers.scheduled import never_applies, parse_k_schedule
from autok.trainer.engine.divergence import Diverged, Rollback, params_finite
from autok.trainer.engine.link import allreduce_sum_
from autok.trainer.engine.observer import StepInfo, emit
from autok.trainer.engine.optim import build_optimizer, build_scheduler
from autok.trainer.engine.options import OptionError
from autok.trainer.engine.profiler import clock
from autok.trainer.engine.straggler import Straggler
from autok.trainer.engine.sync import Sync
from autok.trainer.loop.checkpoint import (
    CheckpointError,
    ckpt_root,
    latest_valid,
    load_rank_file,
    model_layout,
    publish,
    write_rank_file,
)
from autok.trainer.loop.data import ShardSampler, class_labels, dirichlet_partition
from autok.trainer.loop.environment import environment
from autok.trainer.loop.epoch_sums import TrainSums
from autok.trainer.loop.records import RunRecords
from autok.trainer.loop.runlog import LOGGER, RunLog, run_logger
from autok.trainer.loop.sinks import (
    FileSink,
    ProgressSink,
    epoch_columns,
    rewind_outputs,
    summary_table,
)
from autok.trainer.loop.tasks import Task, load_task, loss_fn_of, metric_of

if TYPE_CHECKING:  # the CLI's config is a SyncOptions with the run's settings; no import cycle
    from autok.config import TrainConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """The built-in loop: `autok.Sync` (trainer/engine/sync.py) around an ordinary PyTorch loop
    over a task (trainer/loop/tasks.py: the built-in classification or a user's --task), plus
    what a run adds: evaluation, epoch records, checkpoints, rollbacks. It uses the engine's
    public surface only, as a user's loop would."""

    def __init__(
        self,
        cfg: TrainConfig,
        rank: int,
        world_size: int,
        out_dir: Path | None,
        device: torch.device | None = None,
        observers: list[Any] | None = None,
        resume: bool = False,
    ) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.out_dir = out_dir
        self.device = device or torch.device("cpu")
        self.now = clock(self.device)
        # What the run says goes to the terminal and OUT/train.log, from rank 0 only.
        self.log = run_logger(out_dir) if rank == 0 else logging.getLogger(LOGGER)
        # When the command started (the CLI sets it): the time a user waits includes start-up.
        self.started = float(os.environ.get("AUTOK_STARTED") or time.time())

        # Identical initial weights on every rank (DDP would broadcast rank 0's anyway); per-rank
        # streams afterwards (augmentation).
        seed_everything(cfg.seed)
        self.task: Task = load_task(cfg)
        self.model: nn.Module = self.task.model.to(self.device)
        seed_everything(cfg.seed + 1000 * (rank + 1))
        train, test = self.task.train_dataset, self.task.test_dataset

        self.sampler = train_sampler(cfg, train, rank, world_size)
        self.train_loader = DataLoader(
            train,
            batch_size=cfg.batch_size,
            sampler=self.sampler,
            num_workers=cfg.loader_workers,
            pin_memory=self.device.type == "cuda",
        )
        # Each rank evaluates a disjoint slice; the metric's sums are added, so it is that of the
        # whole test set (DistributedSampler would pad with duplicates).
        assert isinstance(test, Sized)  # check_task refused a test_dataset without a length
        self.test_loader = DataLoader(
            Subset(test, range(rank, len(test), world_size)), batch_size=512
        )
        self.steps_per_epoch = len(self.train_loader)

        self.optimizer = build_optimizer(
            cfg.optimizer, self.model, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.nesterov
        )
        assert cfg.lr_warmup_epochs is not None  # TrainConfig resolves it to --warmup-epochs
        self.scheduler = build_scheduler(
            self.optimizer,
            total_steps=cfg.epochs * self.steps_per_epoch,
            warmup_steps=cfg.lr_warmup_epochs * self.steps_per_epoch,
            schedule=cfg.lr_schedule,
            milestones=cfg.milestones,
            gamma=cfg.lr_gamma,
        )
        self.straggler = (
            None
            if cfg.straggler == "none"
            else Straggler(
                cfg.straggler, cfg.straggler_ms or 0.0, cfg.straggler_prob, cfg.seed, rank,
                world_size,
            )
        )  # fmt: skip
        # The engine: strategy, boundaries, SlowMo, controller, link emulator, guards. Its
        # observers list is the run's: sinks see boundaries and epochs alike.
        self.sync = Sync(
            self.model,
            self.optimizer,
            device=self.device,
            observers=list(observers or []),
            peak_lr=cfg.lr,
            options=cfg,
        )
        # Every epoch ends with a boundary: a K above its steps could never take effect.
        self.sync.period_cap = self.steps_per_epoch
        if rank == 0 and cfg.policy == "scheduled" and cfg.k_schedule is not None:
            steps = cfg.epochs * self.steps_per_epoch
            if late := never_applies(parse_k_schedule(cfg.k_schedule), steps):
                self.log.warning(
                    f"autok: --k-schedule: {late} ({cfg.epochs} epochs of {self.steps_per_epoch})"
                )
        # --clock virtual: the engine's clock books every time (trainer/engine/clock.py); the
        # epochs'
        # times and the stragglers' delays are booked on it too, never measured or slept
        # (docs/design.md §4)
        self.virtual = self.sync.virtual
        if self.virtual is not None:
            self.virtual.straggler = self.straggler
            self.now = self.virtual.now
        self.observers = self.sync.observers
        # each epoch's row and the summary, and the totals they add up (trainer/loop/records.py)
        self.records = RunRecords(
            self.sync, self.model, self.task, self.test_loader, rank, world_size, self.device
        )
        self.rollbacks = 0
        self.start_epoch = 0
        self.wall_before, self.wall0 = 0.0, time.perf_counter()
        # Checkpoints are collectives: every rank must take them, so every rank needs the run
        # directory (rank 0 alone writes the run's files). A mismatch would hang, not fail.
        # On the rank's device: NCCL refuses CPU tensors.
        has_dir = torch.tensor([float(out_dir is not None)], dtype=torch.float64)
        has_dir = has_dir.to(self.device)
        allreduce_sum_(has_dir, None)  # once, at start-up: not worth modelling on the link
        if 0 < has_dir.item() < world_size:
            raise ValueError("the run directory must be given to every rank or to none")
        if resume and out_dir is not None:
            epoch = self.restore_latest()
            if rank == 0:
                # rows after the checkpoint would be re-written
                rewind_outputs(out_dir, epoch, epoch_columns(self.task.classifies))
                self.log.info(
                    # numbered from 0 as epochs.csv and the epoch lines are, its place beside it
                    f"autok: resuming after epoch {epoch} ({epoch + 1} of {cfg.epochs} done)"
                    if epoch >= 0
                    else "autok: no checkpoint yet; starting over"
                )
        if rank == 0:
            self.observers.append(RunLog(self.log, cfg.epochs))
            if cfg.tensorboard is not None:
                from autok.trainer.loop.tensorboard import TensorBoardSink

                self.observers.append(TensorBoardSink(cfg.tensorboard))
        if rank == 0 and out_dir is not None:
            self.observers.append(FileSink(out_dir, epoch_columns(self.task.classifies)))
            self.observers.append(
                ProgressSink(cfg.epochs * self.steps_per_epoch, cfg.progress, self.global_step)
            )

    # ----- the engine's state, read where the run reports it ------------------------------------

    @property
    def averager(self):
        return self.sync.averager

    @property
    def float_buffers(self) -> list[torch.Tensor]:
        return self.sync.float_buffers

    @property
    def global_step(self) -> int:
        return self.sync.global_step

    @property
    def boundary(self) -> int:
        return self.sync.boundary

    # ----- the run -----------------------------------------------------------------------------

    def k_in_force(self, epoch: int) -> int:
        return 1 if epoch < self.cfg.warmup_epochs else self.sync.sync_period  # already capped

    def run(self) -> dict[str, Any] | None:
        """Train to the last epoch and return the summary; None when stopped early on purpose
        (--stop-after-epochs), with a checkpoint to continue from."""
        cfg = self.cfg
        epoch = self.start_epoch
        self.wall0 = time.perf_counter()
        startup = time.time() - self.started
        # a floor above 1 says so: chosen for the optimizer unless given (docs/design.md §6)
        floor = f" (K >= {cfg.k_floor})" if (cfg.k_floor or 1) > 1 else ""
        if floor and epoch < cfg.warmup_epochs:  # warmup forces K = 1 (docs/design.md §6)
            floor = f" (K >= {cfg.k_floor} after warmup's K = 1)"
        self.log.info(
            f"autok: training {cfg.strategy}/{cfg.policy}{floor} on {self.world_size} workers, "
            f"link {cfg.link_name}, {cfg.task or f'{cfg.dataset}/{cfg.model}'}: epochs "
            f"{epoch + 1}-{cfg.epochs} of {self.steps_per_epoch} steps; start-up took "
            f"{startup:.1f} s (processes, data, model)"
        )
        while epoch < cfg.epochs:
            try:
                self._train_epoch(epoch)
            except Rollback as rb:
                epoch = self._roll_back(rb)
                continue
            last = epoch == cfg.epochs - 1
            stop = cfg.stop_after_epochs == epoch + 1
            every = cfg.checkpoint_every
            if self.out_dir is not None and (last or stop or (every and (epoch + 1) % every == 0)):
                self.save_checkpoint(epoch)
            if stop and not last:
                emit(self.observers, "on_stop", epoch)
                return None
            epoch += 1
        wall = self.wall_before + time.perf_counter() - self.wall0
        summary = self.records.summary(cfg, wall, self.out_dir)
        summary["startup_seconds"] = startup
        if self.virtual is not None:  # the modelled training time (docs/design.md §4)
            summary["virtual_seconds"] = self.virtual.now()
        summary["total_seconds"] = time.time() - self.started
        summary["environment"] = environment()  # what the numbers depend on besides settings
        emit(self.observers, "on_end", summary)
        return summary

    def _train_epoch(self, epoch: int) -> None:
        loss_fn, classifies = loss_fn_of(self.task), self.task.classifies
        batch_metric = metric_of(self.task).batch
        sync = self.sync
        self.sampler.set_epoch(epoch)
        sync.model.train()
        sync.warmup, sync.epoch = epoch < self.cfg.warmup_epochs, epoch
        counts0 = (sync.grad_syncs, sync.param_syncs, sync.collectives)
        epoch_start = step_end = self.now()
        # read per step on the CPU, once at the epoch's end on an accelerator (docs/design.md §4)
        sums = TrainSums(self.device)
        last = self.steps_per_epoch - 1
        straggler = self.straggler if self.virtual is None else None  # (virtual: booked)
        for i, (x, y) in enumerate(self.train_loader):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            delay = 0.0 if straggler is None else straggler.seconds(sync.global_step)
            # The last step of an epoch is always a boundary: every epoch starts identical.
            with sync.step(boundary=i == last) as s:
                if delay:  # inside the step, before its forward: this rank's compute, which
                    time.sleep(delay)  # its peers wait for (docs/design.md §2, Regimes)
                self.optimizer.zero_grad(set_to_none=True)
                out = sync.model(x)
                loss = loss_fn(out, y)
                loss.backward()
                lr = self.optimizer.param_groups[0]["lr"]
                self.optimizer.step()
                s.loss = loss
            self.scheduler.step()
            step = sync.last_step
            scored = batch_metric(out.detach(), y) if classifies else None
            sums.add(step, loss, len(y), scored)
            info = StepInfo(
                global_step=sync.global_step,
                is_boundary=step.is_boundary,
                times=step,
                next_lr=self.optimizer.param_groups[0]["lr"],  # the scheduler has stepped
            )
            emit(self.observers, "on_step", info)
            if sums.on_host:  # on an accelerator the end is read once, below, with a device sync
                step_end = self.now()
        if not sums.on_host:  # the epoch's one device sync: its end, and its sums
            step_end = self.now()
        times = sums.read()
        times.epoch_seconds = step_end - epoch_start
        sync.sync_now()  # the last step was a boundary: ddp's buffers are reconciled here
        # `lr` is the LR of the epoch's last step
        row = self.records.end_epoch(epoch, times, counts0, self.k_in_force(epoch), lr)
        emit(self.observers, "on_epoch", row)

    # ----- checkpoints, resume, rollback -------------------------------------------------------

    def state_dict(self, epoch: int) -> dict[str, Any]:
        """Everything needed to continue exactly after `epoch` (this rank's part). Plain
        tensors, numbers and lists: it loads with torch.load(weights_only=True)."""
        return {
            "epoch": epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sync": self.sync.state_dict(),
            "rng": rng_state(self.device),
            "trainer": {
                "total_compute": self.records.total_compute,
                "total_exposed": self.records.total_exposed,
                "history": self.records.history,
                "wall_seconds": self.wall_before + time.perf_counter() - self.wall0,
                "rollbacks": self.rollbacks,
                "rolled_back_seconds": self.records.rolled_back,
            },
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sync.load_state_dict(state["sync"])  # after the model: it digests the weights
        set_rng_state(state["rng"], self.device)
        t = state["trainer"]
        records = self.records
        records.total_compute, records.total_exposed = t["total_compute"], t["total_exposed"]
        records.history = list(t["history"])
        self.wall_before, self.wall0 = t["wall_seconds"], time.perf_counter()
        self.rollbacks = t["rollbacks"]
        records.restore_rollbacks(float(t.get("rolled_back_seconds", 0.0)))  # (before: none)
        self.start_epoch = state["epoch"] + 1

    def save_checkpoint(self, epoch: int) -> bool:
        """Collective: every rank writes its part. Skipped, keeping the last good checkpoint,
        when any rank holds non-finite weights."""
        bad = 0 if params_finite(list(self.model.parameters())) else 1
        flag = torch.tensor([float(bad)], dtype=torch.float64, device=self.device)
        allreduce_sum_(flag, self.sync.clock)
        if flag.item() > 0:
            if self.rank == 0:
                self.log.info(f"autok: not checkpointing epoch {epoch}: non-finite weights")
            return False
        out_dir = self._checkpoints_dir()
        write_rank_file(out_dir, epoch, self.rank, self.state_dict(epoch))
        allreduce_sum_(torch.zeros(1, dtype=torch.float64, device=self.device), self.sync.clock)
        if self.rank == 0:
            publish(out_dir, epoch, self.world_size)
        return True

    def restore_latest(self) -> int:
        """Load the newest valid checkpoint (refusing corrupt ones); return its epoch or -1.
        Collective: rank 0 verifies and chooses, every rank loads that epoch's file of its own,
        so no rank-local failure can make ranks resume from different epochs."""
        # the model's own layout: a checkpoint whose tensors do not fit it is refused like a
        # corrupted one, and the older good one used
        out_dir = self._checkpoints_dir()
        found = (
            latest_valid(out_dir, self.world_size, model_layout(self.model))
            if self.rank == 0
            else None
        )
        choice = torch.tensor([found.epoch + 1.0 if found else 0.0], dtype=torch.float64)
        choice = choice.to(self.device)
        allreduce_sum_(choice, None)  # rank 0's choice, everywhere
        epoch = int(choice.item()) - 1
        if found is not None:  # (rank 0)
            for name, why in found.refused:
                self.log.info(f"autok: checkpoint {name} refused: {why}")
        if epoch < 0:
            return -1
        try:
            state, why = (
                load_rank_file(ckpt_root(out_dir) / f"epoch-{epoch:04d}", self.rank),
                "",
            )
        except Exception as exc:  # this rank's file: unreadable here (I/O, memory)
            state, why = None, f"{type(exc).__name__}: {exc}"
        failed = torch.tensor([float(state is None)], dtype=torch.float64).to(self.device)
        allreduce_sum_(failed, None)
        if failed.item() > 0:
            raise CheckpointError(
                f"checkpoint epoch-{epoch:04d} could not be loaded on {int(failed.item())} "
                f"rank(s){': ' + why[:200] if why else ''}"
            )
        assert state is not None  # this rank's None was counted in `failed` above
        self.load_state(state)
        return epoch

    def _checkpoints_dir(self) -> Path:
        """OUT: only a run that writes a directory checkpoints (run_epochs checks out_dir)."""
        if self.out_dir is None:
            raise RuntimeError("checkpoints need the run's output directory (out_dir)")
        return self.out_dir

    def _roll_back(self, rb: Rollback) -> int:
        """Divergence with --on-divergence rollback: the last good checkpoint, K halved."""
        if self.out_dir is None or self.rollbacks >= self.cfg.max_rollbacks:
            raise Diverged(
                f"training diverged: {rb.reason}; rollbacks exhausted "
                f"({self.rollbacks} of --max-rollbacks {self.cfg.max_rollbacks})"
            )
        rollbacks = self.rollbacks + 1
        at = time.perf_counter()  # the clocks as the attempt left them
        wall = self.wall_before + at - self.wall0
        virtual = None if self.virtual is None else self.virtual.latest()
        epoch = self.restore_latest()
        if epoch < 0:
            raise Diverged(
                f"training diverged: {rb.reason}; no checkpoint to roll back to "
                "(set --checkpoint-every)"
            )
        self.rollbacks = rollbacks
        self._keep_time(wall, at, virtual)
        self.sync.controller.rollback(max(1, rb.sync_period // 2))  # (the Controller protocol)
        # the policy's K after it: the halved K, or a floor it keeps (exposed-sync's --k-floor)
        self.sync.sync_period = self.sync.controller.sync_period
        emit(self.observers, "on_rewind", epoch)
        self.log.info(
            f"autok: diverged ({rb.reason}); rolled back to the end of epoch {epoch}, "
            f"K -> {self.sync.sync_period} (rollback {self.rollbacks} of "
            f"{self.cfg.max_rollbacks})"
        )
        return epoch + 1

    def _keep_time(self, wall: float, at: float, virtual: float | None) -> None:
        """After a rollback restored the checkpoint's clocks, the discarded attempt's time has
        passed: on the wall (`wall` s at perf_counter `at`) and the virtual clock (`virtual`, its
        latest rank's), which run on from there; it is booked to the epoch trained next."""
        lost = wall - self.wall_before  # wall_before: the checkpoint's wall time
        self.wall_before, self.wall0 = wall, at
        if self.virtual is not None and virtual is not None:  # the clock the records read
            lost = virtual - self.virtual.latest()  # latest(): alike on every rank
            self.virtual.advance(lost)
        self.records.book_rollback(lost)  # (docs/design.md §7, "a rollback's time")

    def finish(self) -> None:
        if self.rank == 0 and self.out_dir is not None:
            # on the CPU: the file loads on a machine with no GPU, with no map_location (a
            # module's extra state may be no tensor; weights tied on a GPU are saved twice)
            weights = {
                k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                for k, v in self.model.state_dict().items()
            }
            torch.save(weights, self.out_dir / "model.pt")


def train_sampler(cfg: TrainConfig, train: Any, rank: int, world_size: int) -> Any:
    """This rank's share of the training set. iid: DistributedSampler's (a new random split
    every epoch). dirichlet: a fixed label-skewed shard of equal size on every rank
    (trainer/loop/data.py's dirichlet_partition), reshuffled every epoch."""
    if cfg.partition == "iid":
        return DistributedSampler(
            train, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed
        )
    try:
        labels = class_labels(train)
    except ValueError as exc:
        raise OptionError(f"--partition: dirichlet splits by class label, and {exc}") from None
    if len(labels) < world_size:
        raise OptionError(
            f"--partition: {len(labels)} training samples cannot give each of {world_size} "
            "ranks one; use iid or fewer workers"
        )
    alpha = cfg.partition_alpha or 0.0  # set whenever dirichlet (TrainConfig)
    shards = dirichlet_partition(labels, world_size, alpha, cfg.seed)
    return ShardSampler(shards[rank], cfg.seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every generator's state as tensors, ints and lists: a checkpoint that loads with
    torch.load(weights_only=True), which never runs code from the file."""
    state = np.random.get_state()
    assert isinstance(state, tuple)  # the global generator is MT19937: its legacy tuple
    name, keys, pos, has_gauss, cached = state
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
        # this rank's device only: a rank that sees every GPU of its machine at save and only its
        # own at resume (CUDA_VISIBLE_DEVICES per rank) restores it all the same
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(rng: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(rng["torch"])
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    cuda = rng["cuda"]
    if cuda is None or device.type != "cuda":
        return
    if isinstance(cuda, list | tuple):  # an older checkpoint's form: every device's
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index < len(cuda):
            torch.cuda.set_rng_state(cuda[index], device)
        return
    torch.cuda.set_rng_state(cuda, device)


def print_summary(summary: dict[str, Any]) -> None:
    """The closing table, to the terminal and train.log (the run's logger, rank 0)."""
    logging.getLogger(LOGGER).info("autok summary\n" + summary_table(summary))
