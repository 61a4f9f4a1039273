"""Tasks for the --task tests: a user's module, imported by name as `autok train --task` does
(`tests.task_fixtures:regression`). Only the public API: `autok.Task`, `autok.Metric`."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import autok


def _squared_error(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
    return ((output.squeeze(-1) - target) ** 2).sum(), target.numel()


MSE = autok.Metric("mse", higher_is_better=False, batch=_squared_error)


def regression_data() -> tuple[TensorDataset, TensorDataset]:
    """y = x·w with noise; the same on every rank and in the test (a fixed generator)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(640, 8, generator=g)
    y = x @ torch.randn(8, generator=g) + 0.1 * torch.randn(640, generator=g)
    return TensorDataset(x[:512], y[:512]), TensorDataset(x[512:], y[512:])


def regression_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def _mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output.squeeze(-1), target)


def regression(cfg) -> autok.Task:
    """Not a classification: MSE loss, judged by test MSE (lower is better)."""
    train, test = regression_data()
    return autok.Task(regression_model(), train, test, loss_fn=_mse_loss, metric=MSE)


def linear(cfg) -> autok.Task:
    """A model of 9 parameters: fewer than some --fragments."""
    train, test = regression_data()
    return autok.Task(nn.Linear(8, 1), train, test, loss_fn=_mse_loss, metric=MSE)


def not_a_task(cfg):
    return {"model": regression_model()}


def raises(cfg):
    raise RuntimeError("the data set is not where this task expects it")


def no_parameters(cfg) -> autok.Task:
    train, test = regression_data()
    return autok.Task(nn.Identity(), train, test)


def empty_test_set(cfg) -> autok.Task:
    train, _ = regression_data()
    return autok.Task(regression_model(), train, TensorDataset(torch.zeros(0, 8)))


NOT_CALLABLE = 3


def unpaired_samples(cfg) -> autok.Task:
    train, test = regression_data()
    return autok.Task(regression_model(), TensorDataset(train.tensors[0]), test)


def wrong_shapes(cfg) -> autok.Task:
    """A model for 5 input features on data with 8: fails in the model, on every rank."""
    train, test = regression_data()
    return autok.Task(nn.Linear(5, 1), train, test, loss_fn=_mse_loss, metric=MSE)


def loss_not_scalar(cfg) -> autok.Task:
    train, test = regression_data()
    return autok.Task(
        regression_model(), train, test, loss_fn=lambda out, y: (out.squeeze(-1) - y) ** 2
    )


def detached_loss(cfg) -> autok.Task:
    """A scalar loss cut from the graph: fine under no_grad, backward() fails in training."""
    train, test = regression_data()
    return autok.Task(
        regression_model(), train, test, loss_fn=lambda out, y: _mse_loss(out, y).detach()
    )


class Endless(torch.utils.data.Dataset):
    """A map-style data set of 10^12 synthetic samples (made on demand, none stored)."""

    def __len__(self) -> int:
        return 10**12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((8,), float(i % 7)), torch.tensor(float(i % 3))


def huge_train_set(cfg) -> autok.Task:
    _, test = regression_data()
    return autok.Task(regression_model(), Endless(), test, loss_fn=_mse_loss, metric=MSE)


class ComplexLinear(nn.Module):
    """A linear map with a complex weight, read out as the real part."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 1, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.complex64) @ self.weight).real


def complex_parameter(cfg) -> autok.Task:
    train, test = regression_data()
    return autok.Task(ComplexLinear(), train, test, loss_fn=_mse_loss, metric=MSE)


def integer_parameter(cfg) -> autok.Task:
    """A trainable model beside an integer parameter (no gradient): not averageable either."""
    train, test = regression_data()
    model = regression_model()
    model.register_parameter("step", nn.Parameter(torch.zeros(1, dtype=torch.int64), False))
    return autok.Task(model, train, test, loss_fn=_mse_loss, metric=MSE)
