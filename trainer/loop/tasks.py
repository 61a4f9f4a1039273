"""Tasks: what the built-in loop trains (docs/design.md §3, Public API). A task is a model, its data
and how to judge it; `--task MODULE:FUNCTION` names a function `FUNCTION(cfg) -> Task`. The built-in
data sets and models are the task `autok.trainer.loop.tasks:classification`, registered the same
way, so the
CLI's own runs go through the path a user's task takes.

A metric is judged from sums, not means: each rank evaluates a disjoint slice of the test set,
the (sum, count) pairs are added across ranks, and `value(sum / count)` is the metric of the
whole test set whatever the slicing (accuracy: correct / seen; perplexity: exp(mean NLL)).
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads with the task: `autok --help` reads TASK_SPEC and ACCURACY without
    import torch
    from torch import nn
    from torch.utils.data import Dataset

__all__ = ["ACCURACY", "BUILTIN_TASK", "Metric", "PERPLEXITY", "Task", "TaskError", "load_task"]

BUILTIN_TASK = "autok.trainer.loop.tasks:classification"
# the built-in task's name before the loop moved under autok (a saved run.yaml may hold it)
MOVED = {"trainer.tasks:classification": BUILTIN_TASK}
# `package.module:function`: identifiers only, so a spec can never name a file path or code.
TASK_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
# Samples in one data set: DistributedSampler draws a permutation of every index on every rank
# each epoch (int64, then a Python list of ~40 bytes an index): 2^27 is ~5 GB per rank already,
# and a length of 10^12 would ask for terabytes after launch. ImageNet-21k has 1.4 * 10^7.
SAMPLES_MAX = 1 << 27


class TaskError(ValueError):
    """A task that cannot be used; the message names --task."""


def _identity(x: float) -> float:
    return x


@dataclass(frozen=True)
class Metric:
    """How a task is judged. `batch(output, target)` returns (sum, count) for one batch (tensors
    or numbers); the metric is `value(total sum / total count)`."""

    name: str
    higher_is_better: bool
    batch: Callable[[Any, Any], tuple[Any, Any]]
    value: Callable[[float], float] = _identity

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "higher_is_better": self.higher_is_better}


def _correct(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
    return (output.argmax(-1) == target).sum(), target.numel()


def _token_nll(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
    import torch.nn.functional as F

    # Logits (..., vocabulary) against class indices (...): summed NLL and the token count.
    logits = output.reshape(-1, output.shape[-1]).float()
    return F.cross_entropy(logits, target.reshape(-1), reduction="sum"), target.numel()


def _exp(mean_nll: float) -> float:
    return math.exp(min(mean_nll, 700.0))  # a diverged model reads as huge, not as an error


ACCURACY = Metric("accuracy", True, _correct)
PERPLEXITY = Metric("perplexity", False, _token_nll, _exp)


def _cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


@dataclass
class Task:
    """What `--task MODULE:FUNCTION` returns: the model (built by FUNCTION(cfg), which runs on
    every rank; DDP starts every replica from rank 0's weights), the data sets (the same on every
    rank: the loop shards them), the loss (default cross-entropy over the last dimension) and
    the metric (default accuracy)."""

    model: nn.Module
    train_dataset: Dataset
    test_dataset: Dataset
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    metric: Metric | None = None

    def __post_init__(self) -> None:
        if self.loss_fn is None:
            self.loss_fn = _cross_entropy
        if self.metric is None:
            self.metric = ACCURACY

    @property
    def classifies(self) -> bool:
        """Accuracy-judged: the run's files keep their classification columns."""
        metric = metric_of(self)
        return metric.name == "accuracy" and metric.higher_is_better


# The fields stay Optional because None is the constructor's "the default" (docs/design.md §7);
# these read them as __post_init__ resolved them, typed without the None.
def loss_fn_of(task: Task) -> Callable[[Any, Any], torch.Tensor]:
    return task.loss_fn if task.loss_fn is not None else _cross_entropy


def metric_of(task: Task) -> Metric:
    return task.metric if task.metric is not None else ACCURACY


def classification(cfg: Any) -> Task:
    """The built-in task: `--dataset` with `--model` (trainer/loop/data.py,
    trainer/loop/models.py)."""
    from autok.trainer.loop.data import build_splits
    from autok.trainer.loop.models import build_model

    splits = build_splits(
        cfg.dataset,
        cfg.data_dir,
        mnist1d_samples=cfg.mnist1d_samples,
        mnist1d_test_samples=cfg.mnist1d_test_samples,
        image_size=cfg.image_size,
    )
    model = build_model(cfg.model, splits.meta.input_shape, splits.meta.num_classes)
    return Task(model, splits.train, splits.test)


def resolve(spec: str) -> Callable[[Any], Any]:
    """The function a `--task` spec names, imported. Raises TaskError naming --task."""
    if not TASK_SPEC.match(spec):
        raise TaskError(f"--task: {spec[:120]!r} is not MODULE:FUNCTION (e.g. mypkg.tasks:build)")
    spec = MOVED.get(spec, spec)
    module_name, fn_name = spec.split(":")
    # As `python -m` does: modules of the directory the command runs in are importable (the
    # launcher's workers and sweep trials start in that directory too).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # the user's import failing (or running argparse)
        raise TaskError(f"--task: cannot import {module_name}: {_brief(exc)}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise TaskError(f"--task: {module_name} has no function {fn_name!r}")
    return fn


def load_task(cfg: Any) -> Task:
    """Build the run's task (`cfg.task`, or the built-in classification); TaskError naming
    --task when the function fails or returns something that is not a usable Task: the
    checks include one forward, loss and metric on two samples of each data set, so a task
    that cannot train is refused here, before any worker starts."""
    spec = getattr(cfg, "task", None) or BUILTIN_TASK
    fn = resolve(spec)
    try:
        task = fn(cfg)
    except TaskError:
        raise
    except (Exception, SystemExit) as exc:
        raise TaskError(f"{_who(cfg, spec)} failed: {_brief(exc)}") from None
    if why := _unusable(task) or _probe(task):
        raise TaskError(f"{_who(cfg, spec)} returned {why}")
    return task


def _who(cfg: Any, spec: str) -> str:
    """What to blame: the --task given, or with none the built-in task's data (a damaged file
    under --data-dir, say): the flag to change."""
    if getattr(cfg, "task", None) is not None:
        return f"--task: {spec}"
    flag = "--data-dir" if getattr(cfg, "data_dir", None) else "--dataset"
    return f"{flag}: the {cfg.dataset} data set"


def _unusable(task: Any) -> str | None:
    from torch import nn

    if not isinstance(task, Task):
        return f"a {type(task).__name__}, not an autok.Task"
    if not isinstance(task.model, nn.Module):
        return f"a model that is a {type(task.model).__name__}, not a torch.nn.Module"
    if not any(p.requires_grad for p in task.model.parameters()):
        return "a model with no trainable parameters"
    if why := _non_real_parameter(task.model):
        return why
    for name in ("train_dataset", "test_dataset"):
        ds = getattr(task, name)
        try:
            n = len(ds)
        except TypeError:
            return f"a {name} without a length (a map-style Dataset is needed: the loop shards it)"
        except Exception as exc:
            return f"a {name} whose length fails: {_brief(exc)}"
        if n == 0:
            return f"an empty {name}"
        if n > SAMPLES_MAX:
            return (
                f"a {name} of {n} samples; at most {SAMPLES_MAX} (every rank's sampler holds "
                "a shuffled list of all its indices, ~40 bytes each)"
            )
    if not callable(task.loss_fn):
        return "a loss_fn that is not callable"
    m = task.metric
    if not (isinstance(m, Metric) and m.name and callable(m.batch) and callable(m.value)):
        return "a metric that is not an autok.Metric with a name and a batch function"
    return None


def _non_real_parameter(model: nn.Module) -> str | None:
    """A parameter that is not a real floating-point tensor (complex, integer): a boundary
    averages every parameter in one flat buffer that also carries real scalars (the drift
    norm, the loss: docs/design.md §3), so such a model would fail after launch."""
    for name, p in model.named_parameters():
        if not p.is_floating_point():
            kind = str(p.dtype).removeprefix("torch.")
            return f"a model whose parameter {name[:60]!r} is {kind}; autok averages real floats"
    return None


def _probe(task: Task) -> str | None:
    """Why two samples of each data set cannot go through the model, the loss and the metric
    as the loop will put them, or None. Runs in eval mode, so it leaves no trace in the model
    (BatchNorm statistics, the RNG of dropout); the training samples' loss is built with
    autograd on, as the loop's is, but never backpropagated (no .grad is written)."""
    import torch
    from torch.utils.data import default_collate

    was_training = task.model.training
    task.model.eval()
    try:
        for name in ("train_dataset", "test_dataset"):
            ds = getattr(task, name)
            stage = "batching"
            try:
                batch = default_collate([ds[i] for i in range(min(2, len(ds)))])
                if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
                    return f"a {name} whose samples are not (input, target) pairs"
                x, y = batch
                training = name == "train_dataset"
                with torch.set_grad_enabled(training):
                    stage = "the model"
                    out = task.model(x)
                    stage = "loss_fn"
                    loss = loss_fn_of(task)(out, y)
                if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
                    return "a loss_fn that does not return a scalar tensor"
                if training and not loss.requires_grad:  # backward() would fail after launch
                    return (
                        "a loss_fn whose loss does not require grad (detached from the model's "
                        "output, or built without autograd): the loop cannot backpropagate it"
                    )
                with torch.no_grad():  # on what the loop gives it: a training output detached
                    stage = "the metric"
                    batch_metric = metric_of(task).batch
                    total, count = batch_metric(out.detach() if training else out, y)
                    float(total), float(count)
            except Exception as exc:
                return f"a task whose {name} fails in {stage} on 2 samples: {_brief(exc)}"
    finally:
        task.model.train(was_training)
    return None


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
