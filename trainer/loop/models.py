"""Models, by name. Each data set has a default; incompatible pairs are refused at config time."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads when a model is built: `autok --help` reads MODELS without it
    import torch
    from torch import nn

# Which models fit which input kind, and each data set's default.
INPUT_KIND = {
    "mnist1d": "signal",
    "digits": "image",
    "cifar100": "image",
    "tinyimagenet": "image",
    "imagefolder": "image",
}
MODELS_FOR = {
    "signal": ("cnn1d", "mlp"),
    "image": ("cnn", "mlp", "resnet18", "resnet50", "vit-s"),
}
DEFAULT_MODEL = {
    "mnist1d": "cnn1d",
    "digits": "cnn",
    "cifar100": "resnet18",
    "tinyimagenet": "resnet18",
    "imagefolder": "resnet18",
}
MODELS = ("cnn1d", "cnn", "mlp", "resnet18", "resnet50", "vit-s")


def incompatibility(dataset: str, model: str) -> str | None:
    allowed = MODELS_FOR[INPUT_KIND[dataset]]
    if model not in allowed:
        return f"model {model!r} does not fit dataset {dataset!r}; choose from {list(allowed)}"
    return None


@functools.cache
def _classes() -> dict[str, type]:
    """The nn.Module classes, defined on first use (they need torch at class creation)."""
    from torch import nn

    class CNN1D(nn.Module):
        """A small 1-D CNN for MNIST-1D signals of shape (1, L)."""

        def __init__(self, length: int, num_classes: int, width: int = 32) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv1d(1, width, 5, stride=2, padding=2),
                nn.ReLU(),
                nn.Conv1d(width, width, 3, stride=1, padding=1),
                nn.ReLU(),
                nn.Conv1d(width, width, 3, stride=1, padding=1),
                nn.ReLU(),
            )
            self.head = nn.Linear(width * math.ceil(length / 2), num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x).flatten(1))

    class SmallCNN(nn.Module):
        """Two conv blocks and a linear head; fits 8x8 digits and small RGB images."""

        def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, width, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(width, 2 * width, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(2 * width, 2 * width, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(2),
            )
            self.head = nn.Linear(8 * width, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x).flatten(1))

    classes: dict[str, type] = {"CNN1D": CNN1D, "SmallCNN": SmallCNN}
    # pickle finds them as autok.trainer.loop.models.NAME (__getattr__)
    for name, cls in classes.items():
        cls.__qualname__ = name
    return classes


def __getattr__(name: str) -> Any:
    """`autok.trainer.loop.models.CNN1D` and `SmallCNN`, as before the torch import became lazy."""
    if name in ("CNN1D", "SmallCNN"):
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def mlp(in_features: int, num_classes: int, hidden: int = 256) -> nn.Module:
    from torch import nn

    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def cifar_resnet(depth: int, in_channels: int, num_classes: int) -> nn.Module:
    """torchvision's ResNet in the CIFAR form: 3x3 stride-1 stem, no max-pool."""
    from torch import nn
    from torchvision.models import resnet18, resnet50

    net = (resnet18 if depth == 18 else resnet50)(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


def vit_small(image_size: int, in_channels: int, num_classes: int, patch: int = 4) -> nn.Module:
    """ViT-Small (12 layers, 6 heads, width 384) on patch-4 tokens, torchvision's implementation."""
    from torch import nn
    from torchvision.models import VisionTransformer

    net = VisionTransformer(
        image_size=image_size,
        patch_size=patch,
        num_layers=12,
        num_heads=6,
        hidden_dim=384,
        mlp_dim=1536,
        num_classes=num_classes,
    )
    if in_channels != 3:
        net.conv_proj = nn.Conv2d(in_channels, 384, kernel_size=patch, stride=patch)
    return net


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    channels = input_shape[0]
    if name == "cnn1d":
        return _classes()["CNN1D"](input_shape[-1], num_classes)
    if name == "cnn":
        return _classes()["SmallCNN"](channels, num_classes)
    if name == "mlp":
        return mlp(math.prod(input_shape), num_classes)
    if name in ("resnet18", "resnet50"):
        return cifar_resnet(int(name[6:]), channels, num_classes)
    if name == "vit-s":
        return vit_small(input_shape[-1], channels, num_classes)
    raise ValueError(f"unknown model {name!r}")
