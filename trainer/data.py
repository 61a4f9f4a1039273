"""Data sets: the embedded defaults (mnist1d, digits) and real torchvision loaders for image data.

`mnist1d` is generated procedurally by the mnist1d package (never its download); the launcher
generates it once into a cache so N workers on 2 cores do not each repeat the work.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

DATASETS = ("mnist1d", "digits", "cifar100", "tinyimagenet", "imagefolder")
DISK_DATASETS = ("cifar100", "tinyimagenet", "imagefolder")

CIFAR_MEAN, CIFAR_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DataMeta:
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    num_classes: int


@dataclass
class Splits:
    train: Dataset
    test: Dataset
    meta: DataMeta


def check_data_dir(dataset: str, data_dir: Path | None) -> str | None:
    """Why `data_dir` cannot serve `dataset`, or None. Runs at config time, before any output."""
    if dataset not in DISK_DATASETS:
        return None
    if data_dir is None:
        return f"dataset {dataset!r} reads files: give --data-dir"
    if not data_dir.is_dir():
        return f"{data_dir} is not a directory"
    needed = {
        "cifar100": [
            data_dir / "cifar-100-python" / "train",
            data_dir / "cifar-100-python" / "test",
        ],
        "tinyimagenet": [data_dir / "train", data_dir / "val" / "val_annotations.txt"],
        "imagefolder": [data_dir / "train", _first_existing(data_dir, ("val", "test"))],
    }[dataset]
    missing = [str(p) for p in needed if p is None or not p.exists()]
    if missing:
        return f"{dataset} files missing under {data_dir}: {', '.join(missing)}"
    return None


def _first_existing(root: Path, names: tuple[str, ...]) -> Path | None:
    return next((root / n for n in names if (root / n).exists()), None)


# ----- mnist1d ---------------------------------------------------------------------------------


def _mnist1d_cache(num_samples: int, seed: int) -> Path:
    base = Path(os.environ.get("AUTOK_CACHE", Path.home() / ".cache" / "autok"))
    key = hashlib.sha1(f"mnist1d-v1-{num_samples}-{seed}".encode()).hexdigest()[:12]
    return base / f"mnist1d-{key}.npz"


def prepare_mnist1d(num_samples: int, seed: int) -> Path:
    """Generate the data set once (deterministic in num_samples and seed) and cache it."""
    path = _mnist1d_cache(num_samples, seed)
    if path.exists():
        return path
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    state = np.random.get_state()  # make_dataset reseeds numpy's global RNG
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, x=d["x"], y=d["y"], x_test=d["x_test"], y_test=d["y_test"])
    os.replace(tmp, path)
    return path


def _mnist1d(num_samples: int, seed: int) -> Splits:
    with np.load(prepare_mnist1d(num_samples, seed)) as d:
        x, y, xt, yt = d["x"], d["y"], d["x_test"], d["y_test"]
    mean, std = x.mean(), x.std()

    def ds(a, b):
        t = torch.tensor((a - mean) / std, dtype=torch.float32).unsqueeze(1)  # (n, 1, 40)
        return TensorDataset(t, torch.tensor(b, dtype=torch.long))

    return Splits(ds(x, y), ds(xt, yt), DataMeta((1, x.shape[1]), 10))


# ----- digits ----------------------------------------------------------------------------------


def _digits(seed: int) -> Splits:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = bunch.data.astype(np.float32).reshape(-1, 1, 8, 8) / 16.0
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    x = (x - x[train].mean()) / x[train].std()

    def ds(idx):
        return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

    return Splits(ds(train), ds(test), DataMeta((1, 8, 8), 10))


# ----- image data on disk (real torchvision loaders) -------------------------------------------


def _cifar100(root: Path) -> Splits:
    from torchvision import datasets
    from torchvision import transforms as T

    class CIFAR100Files(datasets.CIFAR100):
        # torchvision pins the md5 sums of the official archive; with md5 None its own
        # check_integrity only asks that the files exist, so any set of files in the real pickle
        # format (a subset, a re-pickled copy) loads, and the parser rejects bad content.
        train_list = [["train", None]]
        test_list = [["test", None]]
        meta = {**datasets.CIFAR100.meta, "md5": None}

    norm = T.Normalize(CIFAR_MEAN, CIFAR_STD)
    train_tf = T.Compose(
        [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm]
    )
    test_tf = T.Compose([T.ToTensor(), norm])
    train = CIFAR100Files(str(root), train=True, transform=train_tf, download=False)
    test = CIFAR100Files(str(root), train=False, transform=test_tf, download=False)
    return Splits(train, test, DataMeta((3, 32, 32), 100))


class TinyImageNetVal(Dataset):
    """`val/images/*.JPEG` labelled by `val/val_annotations.txt` (file, wnid, box...)."""

    def __init__(self, root: Path, class_to_idx: dict[str, int], transform) -> None:
        from torchvision.datasets.folder import default_loader

        self.loader, self.transform = default_loader, transform
        self.samples = []
        for line in (root / "val" / "val_annotations.txt").read_text().splitlines():
            if line.strip():
                name, wnid = line.split("\t")[:2]
                self.samples.append((root / "val" / "images" / name, class_to_idx[wnid]))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        return self.transform(self.loader(str(path))), label


def _tinyimagenet(root: Path) -> Splits:
    from torchvision import datasets
    from torchvision import transforms as T

    norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_tf = T.Compose(
        [T.RandomCrop(64, padding=8), T.RandomHorizontalFlip(), T.ToTensor(), norm]
    )
    test_tf = T.Compose([T.ToTensor(), norm])
    train = datasets.ImageFolder(str(root / "train"), transform=train_tf)  # train/<wnid>/images/
    test = TinyImageNetVal(root, train.class_to_idx, test_tf)
    return Splits(train, test, DataMeta((3, 64, 64), len(train.classes)))


def _imagefolder(root: Path, image_size: int) -> Splits:
    from torchvision import datasets
    from torchvision import transforms as T

    norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_tf = T.Compose(
        [T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), T.ToTensor(), norm]
    )
    test_tf = T.Compose(
        [T.Resize(int(image_size * 1.14)), T.CenterCrop(image_size), T.ToTensor(), norm]
    )
    train = datasets.ImageFolder(str(root / "train"), transform=train_tf)
    test_dir = _first_existing(root, ("val", "test"))
    test = datasets.ImageFolder(str(test_dir), transform=test_tf)
    if test.class_to_idx != train.class_to_idx:
        raise ValueError(f"--data-dir: {test_dir} has other classes than {root / 'train'}")
    return Splits(train, test, DataMeta((3, image_size, image_size), len(train.classes)))


# The data set is part of the task, not of the run: --seed varies training, never the data.
DATA_SEED = 42


def build_splits(
    dataset: str,
    data_dir: Path | None = None,
    *,
    mnist1d_samples: int = 5000,
    image_size: int = 32,
) -> Splits:
    if dataset == "mnist1d":
        return _mnist1d(mnist1d_samples, DATA_SEED)
    if dataset == "digits":
        return _digits(DATA_SEED)
    assert data_dir is not None
    if dataset == "cifar100":
        return _cifar100(data_dir)
    if dataset == "tinyimagenet":
        return _tinyimagenet(data_dir)
    if dataset == "imagefolder":
        return _imagefolder(data_dir, image_size)
    raise ValueError(f"unknown dataset {dataset!r}")
