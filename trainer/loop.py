"""The training loop: build, run steps, reconcile at boundaries, report.

Data flow is one way (DESIGN §2): steps run; at a boundary the strategy's collective returns the
reduced statistics; the controller turns them into a SyncDecision; the loop applies it from the
next interval and hands stats + decision to the sinks.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from autok.config import TrainConfig
from controllers import build_controller
from controllers.base import BoundaryStats
from trainer.averaging import (
    IntervalTotals,
    ParameterAverager,
    ReplicaMismatch,
    param_digest,
    reconcile_buffers,
)
from trainer.checkpoint import latest_valid, load_rank_file, publish, write_rank_file
from trainer.data import build_splits
from trainer.divergence import Diverged, DivergenceGuard, Rollback
from trainer.grad_hook import GradSyncState, emulated_allreduce_hook
from trainer.link import LinkClock, allreduce_sum_
from trainer.models import build_model
from trainer.optim import build_optimizer, build_scheduler, state_tensors
from trainer.profiler import Clock, EpochTimes, Interval
from trainer.sinks import FileSink, ProgressSink, rewind_outputs, summary_table
from trainer.strategies import STRATEGIES, fused


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
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
        self.strategy = STRATEGIES[cfg.strategy]
        if cfg.fused_boundary:
            self.strategy = fused(self.strategy)
        self.now = Clock(self.device)

        splits = build_splits(
            cfg.dataset,
            cfg.data_dir,
            mnist1d_samples=cfg.mnist1d_samples,
            image_size=cfg.image_size,
        )
        # Identical initial weights on every rank; per-rank streams afterwards (augmentation).
        seed_everything(cfg.seed)
        self.model: nn.Module = build_model(
            cfg.model, splits.meta.input_shape, splits.meta.num_classes
        ).to(self.device)
        seed_everything(cfg.seed + 1000 * (rank + 1))

        profile = cfg.link_profile
        self.clock = None if profile.is_ideal else LinkClock(profile, world_size, cfg.seed)
        # DDP's own per-forward buffer broadcast would bypass the emulator and the buffer
        # policy; buffers are reconciled at boundaries instead (they still start from rank 0's).
        self.ddp = DistributedDataParallel(
            self.model,
            forward_sync_buffers=False,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
        )
        self.grad_state = GradSyncState(world_size, self.clock)
        self.ddp.register_comm_hook(self.grad_state, emulated_allreduce_hook)

        self.sampler = DistributedSampler(
            splits.train, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed
        )
        self.train_loader = DataLoader(
            splits.train,
            batch_size=cfg.batch_size,
            sampler=self.sampler,
            num_workers=cfg.loader_workers,
            pin_memory=self.device.type == "cuda",
        )
        # Each rank evaluates a disjoint slice; the counts are summed, so the accuracy is that
        # of the whole test set (DistributedSampler would pad with duplicates).
        self.test_loader = DataLoader(
            Subset(splits.test, range(rank, len(splits.test), world_size)), batch_size=512
        )
        self.steps_per_epoch = len(self.train_loader)

        self.optimizer = build_optimizer(
            cfg.optimizer, self.model, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.nesterov
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            total_steps=cfg.epochs * self.steps_per_epoch,
            warmup_steps=cfg.lr_warmup_epochs * self.steps_per_epoch,
            schedule=cfg.lr_schedule,
        )
        self.float_buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        self.averager = None
        if self.strategy.averages_parameters:
            self.averager = ParameterAverager(
                [p for p in self.model.parameters()],
                rank=rank,
                world_size=world_size,
                beta=cfg.slowmo_beta,
                lr_aware=cfg.slowmo_lr_aware,
                averaged_extras=self._averaged_extras,
                broadcast_extras=self._broadcast_extras,
                fused_sgd=self.optimizer if self.strategy.fused_gradients else None,
            )
        self.controller = build_controller(cfg.policy, cfg.sync_period, cfg.policy_options())
        self.k_path: dict[int, dict[str, float]] = {}  # K -> seconds, boundaries, steps
        self.sync_period = cfg.sync_period  # K after warmup; changes only at boundaries
        # ddp's loss is rank-local (no averaging collective carries it): the guard judges the
        # parameters there, which the averaged gradients keep identical on every rank.
        self.divergence = DivergenceGuard(
            factor=cfg.divergence_factor, shared_loss=self.averager is not None
        )
        self.global_step = self.boundary = self.grad_syncs = self.param_syncs = 0
        self.total_compute = 0.0  # mean over ranks, summed over epochs
        self.total_exposed = 0.0
        self.history: list[float] = []  # test accuracy per epoch
        self.carried_sync = 0.0
        self.rollbacks = 0
        self.start_epoch = 0
        self._pending = None  # a launched averaging not yet applied (overlap)
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
                rewind_outputs(out_dir, epoch)  # rows after the checkpoint would be re-written
                print(
                    f"autok: resuming after epoch {epoch}"
                    if epoch >= 0
                    else "autok: no checkpoint yet; starting over",
                    flush=True,
                )
        self.observers = list(observers or [])
        if rank == 0 and out_dir is not None:
            self.observers.append(FileSink(out_dir))
            self.observers.append(
                ProgressSink(cfg.epochs * self.steps_per_epoch, cfg.progress, self.global_step)
            )

    # ----- what rides with the parameters ------------------------------------------------------

    def _averaged_extras(self) -> list[torch.Tensor]:
        extras = state_tensors(self.optimizer) if self.cfg.sync_optimizer_state else []
        if self.cfg.buffer_policy == "average":
            extras = extras + self.float_buffers
        return extras

    def _broadcast_extras(self) -> list[torch.Tensor]:
        return self.float_buffers if self.cfg.buffer_policy == "broadcast" else []

    # ----- the run -----------------------------------------------------------------------------

    def _emit(self, event: str, *args: Any) -> None:
        for obs in self.observers:
            fn = getattr(obs, event, None)
            if fn is not None:
                fn(*args)

    def k_in_force(self, epoch: int) -> int:
        return 1 if epoch < self.cfg.warmup_epochs else self.sync_period

    def run(self) -> dict[str, Any] | None:
        """Train to the last epoch and return the summary; None when stopped early on purpose
        (--stop-after-epochs), with a checkpoint to continue from."""
        cfg = self.cfg
        epoch = self.start_epoch
        self.wall0 = time.perf_counter()
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
                self._emit("on_stop", epoch)
                return None
            epoch += 1
        summary = self._summary(self.history, self.wall_before + time.perf_counter() - self.wall0)
        self._emit("on_end", summary)
        return summary

    def _train_epoch(self, epoch: int) -> None:
        criterion = nn.CrossEntropyLoss()
        self.sampler.set_epoch(epoch)
        self.ddp.train()
        times = EpochTimes()
        grad_syncs0, param_syncs0 = self.grad_syncs, self.param_syncs
        # An interval opens when the previous boundary has packed its buffer, so it starts with
        # that boundary's averaging time; the last step of an epoch is always a boundary.
        interval = Interval(exposed_sync_seconds=self.carried_sync)
        epoch_start = step_end = self.now()
        for i, (x, y) in enumerate(self.train_loader):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            k = self.k_in_force(epoch)
            is_boundary = interval.steps + 1 >= k or i == self.steps_per_epoch - 1
            self.optimizer.zero_grad(set_to_none=True)
            self.grad_state.reset()

            t0 = self.now()
            with self.strategy.backward_context(self.ddp, is_boundary):
                out = self.ddp(x)
                loss = criterion(out, y)
                t1 = self.now()
                loss.backward()
            t2 = self.now()
            wait = self.grad_state.exposed_wait(t1, t2)
            wait_seen = wait is not None
            if wait_seen:  # gradient sync ran: split backward compute from the wait
                backward = t2 - t1 - wait
                self.grad_syncs += 1
            else:
                backward, wait = t2 - t1, 0.0
            lr = self.scheduler.get_last_lr()[0]
            if is_boundary and self.strategy.fused_gradients:
                self.averager.arm_gradient_capture()  # g_i as it enters the step
            self.optimizer.step()
            self.scheduler.step()
            t3 = self.now()
            if self._pending is not None:  # an overlapped average arrives one local step later
                interval.exposed_sync_seconds += self._finish_boundary(times)

            loss_value = loss.item()
            times.forward_seconds += t1 - t0
            times.backward_seconds += backward
            times.optimizer_seconds += t3 - t2
            times.sync_seconds += wait
            times.train_loss_sum += loss_value * len(y)
            times.train_correct += (out.argmax(1) == y).sum().item()
            times.train_seen += len(y)
            times.steps += 1
            interval.steps += 1
            interval.loss_sum += loss_value
            interval.compute_seconds += (t1 - t0) + backward + (t3 - t2)
            interval.exposed_sync_seconds += wait
            interval.grad_bytes += self.grad_state.nbytes
            interval.samples += len(y)
            interval.grad_syncs += wait_seen
            if is_boundary:
                # Overlap after warmup, but never at an epoch's end: epochs start identical.
                overlap = (
                    self.cfg.overlap_boundary
                    and self.averager is not None
                    and epoch >= self.cfg.warmup_epochs
                    and i < self.steps_per_epoch - 1
                )
                carried = self._boundary(interval, epoch, k, lr, times, overlap)
                interval = Interval(exposed_sync_seconds=carried)
            self._emit("on_step", self, is_boundary)
            self.global_step += 1
            step_end = self.now()
        times.epoch_seconds = step_end - epoch_start
        self.carried_sync = interval.exposed_sync_seconds

        if self.averager is None and self.float_buffers and self.cfg.buffer_policy != "local":
            # ddp has no averaging collective; reconcile buffers where each epoch ends.
            reconcile_buffers(
                self.float_buffers, self.cfg.buffer_policy, self.rank, self.world_size, self.clock
            )
        # `lr` is the LR of the epoch's last step
        row = self._end_epoch(epoch, times, grad_syncs0, param_syncs0, lr)
        self.history.append(row["test_accuracy"])
        self._emit("on_epoch", row)

    # ----- checkpoints, resume, rollback -------------------------------------------------------

    def state_dict(self, epoch: int) -> dict[str, Any]:
        """Everything needed to continue exactly after `epoch` (this rank's part)."""
        return {
            "epoch": epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "averager": self.averager.state_dict() if self.averager else None,
            "controller": self.controller.state_dict(),
            "divergence": self.divergence.state_dict(),
            "link": self.clock.state_dict() if self.clock else None,
            "rng": rng_state(self.device),
            "trainer": {
                "sync_period": self.sync_period,
                "global_step": self.global_step,
                "boundary": self.boundary,
                "grad_syncs": self.grad_syncs,
                "param_syncs": self.param_syncs,
                "total_compute": self.total_compute,
                "total_exposed": self.total_exposed,
                "k_path": self.k_path,
                "history": self.history,
                "carried_sync": self.carried_sync,
                "wall_seconds": self.wall_before + time.perf_counter() - self.wall0,
                "rollbacks": self.rollbacks,
            },
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.averager is not None:
            self.averager.load_state_dict(state["averager"])
        self.controller.load_state_dict(state["controller"])
        self.divergence.load_state_dict(state["divergence"])
        if self.clock is not None and state["link"] is not None:
            self.clock.load_state_dict(state["link"])
        set_rng_state(state["rng"])
        t = state["trainer"]
        self.sync_period = t["sync_period"]
        self.global_step, self.boundary = t["global_step"], t["boundary"]
        self.grad_syncs, self.param_syncs = t["grad_syncs"], t["param_syncs"]
        self.total_compute, self.total_exposed = t["total_compute"], t["total_exposed"]
        self.k_path = {int(k): v for k, v in t["k_path"].items()}
        self.history = list(t["history"])
        self.carried_sync = t["carried_sync"]
        self.wall_before, self.wall0 = t["wall_seconds"], time.perf_counter()
        self.rollbacks = t["rollbacks"]
        self.start_epoch = state["epoch"] + 1

    def save_checkpoint(self, epoch: int) -> bool:
        """Collective: every rank writes its part. Skipped, keeping the last good checkpoint,
        when any rank holds non-finite weights."""
        bad = sum(int(not torch.isfinite(p).all()) for p in self.model.parameters())
        flag = torch.tensor([float(bad)], dtype=torch.float64, device=self.device)
        allreduce_sum_(flag, self.clock)
        if flag.item() > 0:
            if self.rank == 0:
                print(f"autok: not checkpointing epoch {epoch}: non-finite weights", flush=True)
            return False
        write_rank_file(self.out_dir, epoch, self.rank, self.state_dict(epoch))
        allreduce_sum_(torch.zeros(1, dtype=torch.float64, device=self.device), self.clock)
        if self.rank == 0:
            publish(self.out_dir, epoch, self.world_size)
        return True

    def restore_latest(self) -> int:
        """Load the newest valid checkpoint (refusing corrupt ones); return its epoch or -1."""
        found = latest_valid(self.out_dir, self.world_size)
        if self.rank == 0:
            for name, why in found.refused:
                print(f"autok: checkpoint {name} refused: {why}", flush=True)
        if found.path is None:
            return -1
        self.load_state(load_rank_file(found.path, self.rank))
        return found.epoch

    def _roll_back(self, rb: Rollback) -> int:
        """Divergence with --on-divergence rollback: the last good checkpoint, K halved."""
        if self.out_dir is None or self.rollbacks >= self.cfg.max_rollbacks:
            raise Diverged(
                f"training diverged: {rb.reason}; rollbacks exhausted "
                f"({self.rollbacks} of --max-rollbacks {self.cfg.max_rollbacks})"
            )
        rollbacks = self.rollbacks + 1
        epoch = self.restore_latest()
        if epoch < 0:
            raise Diverged(
                f"training diverged: {rb.reason}; no checkpoint to roll back to "
                "(set --checkpoint-every)"
            )
        self.rollbacks = rollbacks
        self.sync_period = max(1, rb.sync_period // 2)
        rollback = getattr(self.controller, "rollback", None)
        if rollback is not None:
            rollback(self.sync_period)
        self._emit("on_rewind", epoch)
        if self.rank == 0:
            print(
                f"autok: diverged ({rb.reason}); rolled back to the end of epoch {epoch}, "
                f"K -> {self.sync_period} (rollback {self.rollbacks} of "
                f"{self.cfg.max_rollbacks})",
                flush=True,
            )
        return epoch + 1

    def _boundary(
        self,
        interval: Interval,
        epoch: int,
        k: int,
        lr: float,
        times: EpochTimes,
        overlap: bool = False,
    ) -> float:
        """Close the interval; return this rank's averaging wall time (counted in the next one).
        With `overlap` the averaging only starts here; _finish_boundary() completes it."""
        if self.strategy.fused_gradients:  # its gradient AllReduce rides in the averaging
            self.grad_syncs += 1
            interval.grad_syncs += 1
        common = dict(
            boundary=self.boundary,
            global_step=self.global_step,
            epoch=epoch,
            sync_period=k,
            interval_steps=interval.steps,
            lr=lr,
            warmup=epoch < self.cfg.warmup_epochs,
            # DistributedSampler gives every rank equally many samples per step.
            samples=interval.samples * self.world_size,
            grad_syncs=interval.grad_syncs,
            param_syncs=int(self.averager is not None),
        )
        self._emit("on_local_interval", interval.compute_seconds, interval.exposed_sync_seconds)
        if self.averager is None:
            # ddp: replicas never drift; there is no averaging collective to carry reduced
            # scalars, so a ddp record holds this rank's own timing and loss. The guard judges
            # the parameters, which the averaged gradients keep identical on every rank.
            params = [p.detach() for p in self.model.parameters()]
            finite = bool(torch.isfinite(torch.stack(torch._foreach_norm(params))).all())
            stats = BoundaryStats(
                **common,
                compute_seconds=interval.compute_seconds,
                exposed_sync_seconds=interval.exposed_sync_seconds,
                drift_norm=0.0,
                update_norm=0.0,
                drift_ratio=0.0,
                train_loss=interval.loss_sum / interval.steps,
                bytes_communicated=interval.grad_bytes,
            )
            self._close_boundary(stats, k, interval.steps, params_finite=finite)
            return 0.0
        totals = IntervalTotals(
            interval.loss_sum,
            interval.steps,
            interval.compute_seconds,
            interval.exposed_sync_seconds,
        )
        pending = self.averager.start(totals, lr, self.clock, overlap=overlap)
        self.param_syncs += 1
        times.sync_seconds += pending.seconds
        self._pending = (pending, common, interval.grad_bytes, k, interval.steps)
        if overlap:
            return pending.seconds
        return pending.seconds + self._finish_boundary(times)

    def _finish_boundary(self, times: EpochTimes) -> float:
        """Complete the launched averaging; return the seconds this rank spent waiting for it
        and applying it."""
        pending, common, grad_bytes, k, steps = self._pending
        self._pending = None
        rec = self.averager.finish(pending)
        finish_seconds = rec.wall_seconds - pending.seconds
        times.sync_seconds += finish_seconds
        stats = BoundaryStats(
            **common,
            compute_seconds=rec.compute_seconds,
            exposed_sync_seconds=rec.exposed_sync_seconds,
            drift_norm=rec.drift_norm,
            update_norm=rec.update_norm,
            drift_ratio=rec.drift_norm / rec.update_norm if rec.update_norm > 0 else 0.0,
            train_loss=rec.train_loss,
            bytes_communicated=grad_bytes + rec.nbytes,
        )
        self._close_boundary(stats, k, steps)
        return finish_seconds

    def _close_boundary(
        self, stats: BoundaryStats, k: int, steps: int, params_finite: bool = True
    ) -> None:
        """Judge, decide, report: the guard, the K path, the controller, the sinks."""
        if why := self.divergence.check(stats, params_finite):
            if self.cfg.on_divergence == "rollback":
                raise Rollback(why, self.sync_period)
            raise Diverged(
                f"training diverged: {why}; lower --lr or --slowmo-beta, or use "
                "--on-divergence rollback with --checkpoint-every"
            )
        at_k = self.k_path.setdefault(k, {"seconds": 0.0, "boundaries": 0, "steps": 0})
        at_k["seconds"] += stats.compute_seconds + stats.exposed_sync_seconds
        at_k["boundaries"] += 1
        at_k["steps"] += steps
        decision = self.controller.observe(stats)
        self.sync_period = decision.next_sync_period
        self._emit("on_boundary", stats, decision)
        self.boundary += 1

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        self.model.eval()
        correct = total = 0
        for x, y in self.test_loader:
            x, y = x.to(self.device), y.to(self.device)
            correct += (self.model(x).argmax(1) == y).sum().item()
            total += len(y)
        self.model.train()
        return float(correct), float(total)

    def _end_epoch(
        self, epoch: int, times: EpochTimes, grad_syncs0: int, param_syncs0: int, times_lr: float
    ) -> dict[str, Any]:
        correct, total = self.evaluate()
        digest = param_digest(list(self.model.parameters()), 32)  # exact in float64
        local = [correct, total, digest, digest if self.rank == 0 else 0.0, *times.values()]
        buf = torch.tensor(local, dtype=torch.float64, device=self.device)
        allreduce_sum_(buf, self.clock)
        red = buf.tolist()
        n = self.world_size
        if red[2] != n * red[3]:
            raise ReplicaMismatch(f"replicas differ at the end of epoch {epoch}")
        t = dict(zip(EpochTimes.names(), [v / n for v in red[4:]], strict=True))
        self.total_compute += t["forward_seconds"] + t["backward_seconds"] + t["optimizer_seconds"]
        self.total_exposed += t["sync_seconds"]
        seen = t["train_seen"] * n
        overhead = t["epoch_seconds"] - t["forward_seconds"] - t["backward_seconds"]
        overhead -= t["sync_seconds"]
        return {
            "epoch": epoch,
            "train_loss": t["train_loss_sum"] * n / seen,
            "train_accuracy": t["train_correct"] * n / seen,
            "test_accuracy": red[0] / red[1],
            "epoch_seconds": t["epoch_seconds"],
            "samples_per_second": seen / t["epoch_seconds"],
            "forward_seconds": t["forward_seconds"],
            "backward_seconds": t["backward_seconds"],
            "sync_seconds": t["sync_seconds"],
            # Optimizer step, data loading and bookkeeping.
            "overhead_seconds": overhead,
            "grad_syncs": self.grad_syncs - grad_syncs0,
            "param_syncs": self.param_syncs - param_syncs0,
            "sync_period": self.k_in_force(epoch),
            "lr": times_lr,
        }

    def _summary(self, history: list[float], wall: float) -> dict[str, Any]:
        n = self.world_size
        # One slot per rank: each writes its own digest, the SUM gathers them (exact in float64).
        slots = torch.zeros(n, dtype=torch.float64, device=self.device)
        slots[self.rank] = param_digest(list(self.model.parameters()), 32)
        allreduce_sum_(slots, self.clock)
        return {
            "strategy": self.cfg.strategy,
            "policy": self.cfg.policy,
            "world_size": n,
            "peak_test_accuracy": max(history),
            "final_test_accuracy": history[-1],
            "wall_seconds": wall,
            "compute_seconds": self.total_compute,
            "exposed_sync_seconds": self.total_exposed,
            "boundaries": self.boundary,
            "grad_syncs": self.grad_syncs,
            "param_syncs": self.param_syncs,
            "final_sync_period": self.sync_period,
            "k_path": [{"sync_period": k, **v} for k, v in self.k_path.items()],
            "param_digest_per_rank": [int(v) for v in slots.tolist()],
            "link": self.cfg.link_profile.name,
            "out_dir": str(self.out_dir) if self.out_dir else "",
        }

    def finish(self) -> None:
        if self.rank == 0 and self.out_dir is not None:
            torch.save(self.model.state_dict(), self.out_dir / "model.pt")


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every generator's state as tensors, ints and lists: a checkpoint that loads with
    torch.load(weights_only=True), which never runs code from the file."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
    }


def set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if rng["cuda"] is not None:
        torch.cuda.set_rng_state_all(rng["cuda"])


def print_summary(summary: dict[str, Any]) -> None:
    print("\nautok summary\n" + summary_table(summary), flush=True)
