"""What the run trains on: a --task, or the built-in data set and model, how the data is loaded
and split over the ranks (docs/design.md §2, Regimes: the label skew). One of the run's settings
models that TrainConfig (autok/config.py) composes; what reads settings of several is checked
there (a --task with the built-in task's settings, the unread ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autok.trainer.engine.options import GROUPS, about
from autok.trainer.loop.data import DATASETS, check_data_dir
from autok.trainer.loop.models import DEFAULT_MODEL, MODELS, incompatibility
from autok.trainer.loop.tasks import TASK_SPEC

_DATA = GROUPS[4]


class DataSettings(BaseModel):
    """The data and model group: --task, --dataset, --data-dir, --model, ..., --partition-alpha."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # --- data and model
    task: str | None = Field(
        None,
        max_length=200,
        description="MODULE:FUNCTION returning an autok.Task; default: "
        "the built-in classification of --dataset with --model",
        json_schema_extra=about(_DATA),
    )
    dataset: str = Field(
        "mnist1d",
        description="mnist1d and digits are built in; cifar100, tinyimagenet, imagefolder read "
        "--data-dir",
        json_schema_extra=about(_DATA),
    )
    data_dir: Path | None = Field(
        None, description="root of an on-disk data set", json_schema_extra=about(_DATA)
    )
    model: str | None = Field(
        None,
        description="cnn1d (mnist1d), cnn (digits), mlp, resnet18, resnet50, vit-s "
        "(default: the data set's)",
        json_schema_extra=about(_DATA),
    )
    mnist1d_samples: int = Field(
        5000,
        ge=100,
        le=1_000_000,
        description="samples generated for mnist1d (80% train, 20% test)",
        json_schema_extra=about(
            _DATA,
            too_high="mnist1d is generated on one core at about 2,000 samples/s",
            read_only_under=("dataset", frozenset({"mnist1d"}), "only mnist1d is generated"),
        ),
    )
    mnist1d_test_samples: int | None = Field(
        None,
        ge=100,
        le=1_000_000,
        description="held-out mnist1d samples of a second draw to test on, in place of the 20% "
        "split (the training set is unchanged); a finer accuracy: on n samples it spreads by "
        "sqrt(p(1-p)/n)",
        json_schema_extra=about(
            _DATA,
            too_high="mnist1d is generated on one core at about 2,000 samples/s",
            read_only_under=("dataset", frozenset({"mnist1d"}), "only mnist1d is generated"),
        ),
    )
    image_size: int = Field(
        32,
        ge=8,
        le=1024,
        description="crop size for imagefolder",
        json_schema_extra=about(
            _DATA,
            too_high="larger crops exhaust memory at any batch size",
            read_only_under=(
                "dataset",
                frozenset({"imagefolder"}),
                "only imagefolder images are cropped to a size",
            ),
        ),
    )
    loader_workers: int = Field(
        0,
        ge=0,
        le=64,
        description="DataLoader worker processes per rank",
        json_schema_extra=about(
            _DATA, too_high="DataLoader processes per rank; more only contend for the cores"
        ),
    )
    partition: Literal["iid", "dirichlet"] = Field(
        "iid",
        description="how the training set is split over the ranks: iid (a new random split "
        "every epoch) or dirichlet (a fixed label-skewed shard per rank, --partition-alpha)",
        json_schema_extra=about(_DATA),
    )
    partition_alpha: float | None = Field(
        None,
        gt=0.0,
        le=1e6,
        description="dirichlet: the concentration α; 0.1 gives each rank a few classes, 100 "
        "is nearly iid (default: unset)",
        json_schema_extra=about(_DATA),
    )

    @field_validator("task")
    @classmethod
    def _a_task_spec(cls, v: str | None) -> str | None:
        if v is not None and not TASK_SPEC.match(v):
            raise ValueError(f"--task: {v[:120]!r} is not MODULE:FUNCTION (e.g. mypkg.tasks:build)")
        return v

    def _check_builtin_task(self) -> None:
        """The built-in task's data set and model (no --task): known, fitting each other, and
        its files where --data-dir says. TrainConfig's validator calls it once --task is judged."""
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset: unknown {self.dataset!r}; choose from {list(DATASETS)}")
        if self.model is None:
            self.model = DEFAULT_MODEL[self.dataset]
        if self.model not in MODELS:
            raise ValueError(f"--model: unknown {self.model!r}; choose from {list(MODELS)}")
        if why := incompatibility(self.dataset, self.model):
            raise ValueError(f"--model: {why}")
        if why := check_data_dir(self.dataset, self.data_dir):
            raise ValueError(f"--data-dir: {why}")
