"""Data sets: the embedded defaults (mnist1d, digits) and real torchvision loaders for image data.

`mnist1d` is generated procedurally by the mnist1d package (never its download); the launcher
generates it once into a cache so N workers on 2 cores do not each repeat the work.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and torch load with the data: `autok --help` reads DATASETS without
    from torch.utils.data import Dataset

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


# The files of the official cifar-100-python.tar.gz (torchvision's own pins). They are pickles:
# a file that does not match is never unpickled (unpickling runs code), only refused.
CIFAR100_MD5 = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "meta": "7973b15100ade9c7d40fb424638fde48",
}
# torchvision.datasets.folder.IMG_EXTENSIONS: what ImageFolder counts as an image.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def check_data_dir(dataset: str, data_dir: Path | None) -> str | None:
    """Why `data_dir` cannot serve `dataset`, or None. Runs at config time, before any output:
    the layout, the class lists and (CIFAR-100) the files' checksums, so that a malformed data
    set is refused here rather than crashing inside the workers."""
    if dataset not in DISK_DATASETS:  # built in: a directory given would be silently unread
        return None if data_dir is None else f"{dataset} is built in and reads no files"
    if data_dir is None:
        return f"dataset {dataset!r} reads files: give --data-dir"
    if not data_dir.is_dir():
        return f"{data_dir} is not a directory"
    try:
        return {
            "cifar100": _check_cifar100,
            "tinyimagenet": _check_tinyimagenet,
            "imagefolder": _check_imagefolder,
        }[dataset](data_dir)
    except OSError as exc:
        return f"cannot read {exc.filename or data_dir} ({exc.strerror})"


def _check_cifar100(root: Path) -> str | None:
    base = root / "cifar-100-python"
    missing = [str(base / n) for n in CIFAR100_MD5 if not (base / n).is_file()]
    if missing:
        return f"cifar100 files missing under {root}: {', '.join(missing)}"
    for name, expected in CIFAR100_MD5.items():
        if _md5(base / name) != expected:
            return (
                f"{base / name} is not the official CIFAR-100 file (md5 mismatch); autok reads "
                "only the files of cifar-100-python.tar.gz and never unpickles others"
            )
    return None


_MD5_CACHE: dict[tuple, str] = {}


def _md5(path: Path) -> str:
    """The file's md5, remembered per (file, size, mtime): every rank validates the config."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _MD5_CACHE:
        h = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _MD5_CACHE[key] = h.hexdigest()
    return _MD5_CACHE[key]


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _has_image(folder: Path) -> bool:
    """Whether ImageFolder would find an image under `folder` (it walks it, following links)."""
    for _, _, files in os.walk(folder, followlinks=True):
        if any(_is_image(f) for f in files):
            return True
    return False


def _class_dirs(folder: Path) -> list[str]:
    """The classes ImageFolder reads from `folder`: its subdirectories, sorted."""
    return sorted(e.name for e in os.scandir(folder) if e.is_dir())


def _check_tinyimagenet(root: Path) -> str | None:
    needed = [root / "wnids.txt", root / "train", root / "val" / "val_annotations.txt"]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        return f"tinyimagenet files missing under {root}: {', '.join(missing)}"
    wnids = [w.strip() for w in (root / "wnids.txt").read_text(errors="replace").splitlines()]
    wnids = [w for w in wnids if w]
    if not wnids or len(set(wnids)) != len(wnids):
        return f"{root / 'wnids.txt'} must list each class (wnid) once, one per line"
    if not (root / "train").is_dir():
        return f"{root / 'train'} is not a directory"
    found = _class_dirs(root / "train")
    if extra := sorted(set(found) - set(wnids)):
        return f"{root / 'train'} has a class folder {extra[0]!r} that wnids.txt does not list"
    for w in wnids:
        images = root / "train" / w / "images"
        if not images.is_dir() or not _has_image(images):
            return f"class {w!r} of wnids.txt has no images in {images}"
    val_images = root / "val" / "images"
    present = {e.name for e in os.scandir(val_images)} if val_images.is_dir() else set()
    annotations = root / "val" / "val_annotations.txt"
    n = 0
    for i, line in enumerate(annotations.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        where = f"{annotations} line {i}"
        if len(fields) < 2:
            return f"{where}: expected FILE<TAB>WNID, got {line[:40]!r}"
        name, wnid = fields[0], fields[1]
        if name not in present or not _is_image(name):
            return f"{where}: no image {name[:60]!r} in {val_images}"
        if wnid not in wnids:
            return f"{where}: class {wnid[:40]!r} is not in wnids.txt"
        n += 1
    if n == 0:
        return f"{annotations} labels no validation image"
    return None


def _first_existing(root: Path, names: tuple[str, ...]) -> Path | None:
    return next((root / n for n in names if (root / n).exists()), None)


def _check_imagefolder(root: Path) -> str | None:
    test_dir = _first_existing(root, ("val", "test"))
    missing = [] if (root / "train").exists() else [str(root / "train")]
    if test_dir is None:
        missing.append(f"{root / 'val'} (or {root / 'test'})")
    if missing or test_dir is None:
        return f"imagefolder files missing under {root}: {', '.join(missing)}"
    for split in (root / "train", test_dir):
        if not split.is_dir():
            return f"{split} is not a directory"
    train, test = _class_dirs(root / "train"), _class_dirs(test_dir)
    if not train:
        return f"{root / 'train'} has no class folders (train/<class>/<image>)"
    if train != test:
        only = sorted(set(train) ^ set(test))[0]
        side = root / "train" if only in train else test_dir
        return f"class {only!r} is only in {side}: train and {test_dir.name} need the same classes"
    for split in (root / "train", test_dir):
        for c in train:
            if not _has_image(split / c):
                return f"{split / c} holds no image ({', '.join(IMG_EXTENSIONS)})"
    return None


# ----- mnist1d ---------------------------------------------------------------------------------


def _mnist1d_cache(num_samples: int, seed: int) -> Path:
    base = Path(os.environ.get("AUTOK_CACHE", Path.home() / ".cache" / "autok"))
    key = hashlib.sha1(f"mnist1d-v1-{num_samples}-{seed}".encode()).hexdigest()[:12]
    return base / f"mnist1d-{key}.npz"


def prepare_mnist1d(num_samples: int, seed: int) -> Path:
    """Generate the data set once (deterministic in num_samples and seed) and cache it."""
    _mnist1d_arrays(num_samples, seed)
    return _mnist1d_cache(num_samples, seed)


def mnist1d_ready(num_samples: int, test_samples: int | None) -> bool:
    """Whether a run's whole mnist1d (the data set, and the held-out draw it tests on if any) is
    cached: then the run never imports the mnist1d package."""
    held_out = test_samples is None or mnist1d_cached(test_samples, HELD_OUT_SEED)
    return held_out and mnist1d_cached(num_samples, DATA_SEED)


def mnist1d_cached(num_samples: int, seed: int) -> bool:
    """Whether the cache holds the whole data set: then a run reads it, and the mnist1d package
    (an extra: autok/extras.py) is not needed to make it."""
    path = _mnist1d_cache(num_samples, seed)
    return path.is_file() and _read_whole(path, num_samples) is not None


def _mnist1d_arrays(num_samples: int, seed: int) -> tuple:
    """(x, y, x_test, y_test), read from the cache, which is made (again) when it is missing,
    truncated or of another size: it is a cache. One read when it is whole."""
    import numpy as np

    path = _mnist1d_cache(num_samples, seed)
    if path.exists() and (arrays := _read_whole(path, num_samples)) is not None:
        return arrays
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
    return d["x"], d["y"], d["x_test"], d["y_test"]


def _read_whole(path: Path, num_samples: int) -> tuple | None:
    """The cached arrays, or None if the file is not a whole data set of num_samples (arrays
    only: np.load unpickles nothing by default)."""
    import numpy as np

    try:
        with np.load(path) as d:
            x, y, xt, yt = d["x"], d["y"], d["x_test"], d["y_test"]
    except Exception:  # BadZipFile, a missing array, a truncated member: not the data set
        return None
    # make_dataset makes whole tens of samples (num_samples // 10 * 10): a cache of fewer, or
    # of more, is another data set
    total = len(x) + len(xt)
    whole = len(x) == len(y) and len(xt) == len(yt) and num_samples - 10 < total <= num_samples
    return (x, y, xt, yt) if whole else None


def prepare_mnist1d_test(test_samples: int | None) -> None:
    """The held-out draw, made and cached once like the data set (nothing when not asked for)."""
    if test_samples is not None:
        prepare_mnist1d(test_samples, HELD_OUT_SEED)


def _mnist1d(num_samples: int, seed: int, test_samples: int | None = None) -> Splits:
    """The data set's 80% to train on; its 20% to test on, or, with `test_samples`, every sample of
    a second draw of that size (a finer accuracy: docs/design.md §6, "Judging a policy"; the
    training set is the same either way)."""
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset

    x, y, xt, yt = _mnist1d_arrays(num_samples, seed)
    if test_samples is not None:
        hx, hy, hxt, hyt = _mnist1d_arrays(test_samples, HELD_OUT_SEED)
        xt, yt = np.concatenate([hx, hxt]), np.concatenate([hy, hyt])
    mean, std = x.mean(), x.std()

    def ds(a, b):
        t = torch.tensor((a - mean) / std, dtype=torch.float32).unsqueeze(1)  # (n, 1, 40)
        return TensorDataset(t, torch.tensor(b, dtype=torch.long))

    return Splits(ds(x, y), ds(xt, yt), DataMeta((1, x.shape[1]), 10))


# ----- digits ----------------------------------------------------------------------------------


def _digits(seed: int) -> Splits:
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from torch.utils.data import TensorDataset

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
        # torchvision checks each file's md5 before it unpickles it: never set these to None
        # (any pickle would then load, and unpickling runs the code a crafted file carries).
        train_list = [["train", CIFAR100_MD5["train"]]]
        test_list = [["test", CIFAR100_MD5["test"]]]
        meta = {**datasets.CIFAR100.meta, "md5": CIFAR100_MD5["meta"]}

    norm = T.Normalize(CIFAR_MEAN, CIFAR_STD)
    train_tf = T.Compose(
        [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm]
    )
    test_tf = T.Compose([T.ToTensor(), norm])
    try:
        train = CIFAR100Files(str(root), train=True, transform=train_tf, download=False)
        test = CIFAR100Files(str(root), train=False, transform=test_tf, download=False)
    except RuntimeError:  # torchvision: "not found or corrupted" (an md5 mismatch)
        raise ValueError(f"--data-dir: {_check_cifar100(root) or 'corrupted'}") from None
    return Splits(train, test, DataMeta((3, 32, 32), 100))


@functools.cache
def _tinyimagenet_val_class() -> type:
    """TinyImageNetVal, defined on first use (a torch Dataset needs torch at class creation)."""
    from torch.utils.data import Dataset

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

    TinyImageNetVal.__qualname__ = "TinyImageNetVal"  # pickle finds it through __getattr__
    return TinyImageNetVal


def __getattr__(name: str) -> Any:
    """`autok.trainer.loop.data.TinyImageNetVal`, as before the torch import became lazy."""
    if name == "TinyImageNetVal":
        return _tinyimagenet_val_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tinyimagenet(root: Path) -> Splits:
    from torchvision import datasets
    from torchvision import transforms as T

    norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_tf = T.Compose(
        [T.RandomCrop(64, padding=8), T.RandomHorizontalFlip(), T.ToTensor(), norm]
    )
    test_tf = T.Compose([T.ToTensor(), norm])
    train = datasets.ImageFolder(str(root / "train"), transform=train_tf)  # train/<wnid>/images/
    test = _tinyimagenet_val_class()(root, train.class_to_idx, test_tf)
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
# The seed of a --mnist1d-test-samples set: another draw of the same generator, so its samples are
# new to training and of the same distribution, up to each draw's own standardization in
# make_dataset (about 0.3% of σ apart for the panel's sizes, before the loader applies the
# training set's).
HELD_OUT_SEED = 43


def build_splits(
    dataset: str,
    data_dir: Path | None = None,
    *,
    mnist1d_samples: int = 5000,
    mnist1d_test_samples: int | None = None,
    image_size: int = 32,
) -> Splits:
    if dataset == "mnist1d":
        return _mnist1d(mnist1d_samples, DATA_SEED, mnist1d_test_samples)
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


# ----- how the training set is split over the ranks (--partition) ------------------------------

PARTITIONS = ("iid", "dirichlet")


def class_labels(dataset: Any) -> Any:
    """The integer class label of every sample of `dataset` (a numpy array), read without loading
    a sample: a `.targets` list (torchvision's data sets), a TensorDataset's last tensor (x, y),
    or a Subset of either. Raises ValueError saying why there is none."""
    import numpy as np

    if hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # a Subset
        return class_labels(dataset.dataset)[np.asarray(dataset.indices, dtype=np.int64)]
    tensors: tuple[Any, ...] = getattr(dataset, "tensors", ())
    if hasattr(dataset, "targets"):
        labels = np.asarray(dataset.targets)
    elif len(tensors) >= 2:
        labels = tensors[-1].detach().cpu().numpy()
    else:
        raise ValueError(
            "its train_dataset has no class labels (.targets, or a TensorDataset (x, y))"
        )
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != len(dataset):
        raise ValueError("its labels are not one integer class per sample")
    if len(labels) and labels.min() < 0:
        raise ValueError("its labels are not one integer class per sample (a negative one)")
    return labels


def dirichlet_partition(labels: Any, world_size: int, alpha: float, seed: int) -> list[Any]:
    """Per-rank sample indices with label skew (the standard Dirichlet split, Hsu et al. 2019):
    for each class, proportions over the ranks drawn from Dir(alpha), and that class's samples
    (in a seeded random order) cut in those proportions. A pure function of its arguments, so
    every rank computes the same partition with no collective.

    Balancing (DDP needs the same number of steps on every rank): each rank then holds exactly
    n // world_size samples. A rank above that gives away its surplus from its rarest classes
    first, and the ranks below take the pooled surplus in rank order, so a receiving rank gets a
    few whole classes rather than a sample of every class: the skew survives the balancing. The
    n mod world_size samples left are unused. Trimming to the smallest shard instead would drop
    most of the data at small alpha; padding with repeats would weight a small shard's samples
    several times."""
    import numpy as np

    rng = np.random.default_rng(seed)
    parts: list[list[Any]] = [[] for _ in range(world_size)]
    for c in np.unique(labels):  # sorted: the same draws in the same order on every rank
        idx = rng.permutation(np.flatnonzero(labels == c))
        share = rng.dirichlet(np.full(world_size, alpha))
        cuts = np.floor(np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
        for r, part in enumerate(np.split(idx, cuts)):
            parts[r].append(part)
    empty = np.zeros(0, dtype=np.int64)
    shards = [np.concatenate(p) if p else empty for p in parts]
    return _balance(shards, labels, len(labels) // world_size)


def _balance(shards: list[Any], labels: Any, size: int) -> list[Any]:
    """Every shard cut or filled to `size` samples (dirichlet_partition's balancing step)."""
    import numpy as np

    pool = []
    for r, shard in enumerate(shards):
        if len(shard) > size:
            lab = labels[shard]
            held = np.bincount(lab)[lab]  # how many of its class the rank holds, per sample
            # rarest class first, then by class; stable: a class keeps its seeded random order
            order = np.lexsort((lab, held))
            pool.append(shard[order[: len(shard) - size]])
            shards[r] = shard[order[len(shard) - size :]]
    spare = np.concatenate(pool) if pool else np.zeros(0, dtype=np.int64)
    for r, shard in enumerate(shards):
        need = size - len(shard)
        if need > 0:
            shards[r], spare = np.concatenate([shard, spare[:need]]), spare[need:]
    return [np.sort(s) for s in shards]


class ShardSampler:
    """This rank's fixed shard of the training set, in a new seeded order every epoch
    (`set_epoch`), as DistributedSampler orders its own (seed + epoch). A sampler is any
    iterable of indices to a DataLoader: torch is imported only when the order is drawn."""

    def __init__(self, indices: Any, seed: int) -> None:
        self.indices = [int(i) for i in indices]
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        import torch

        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.indices), generator=g).tolist()
        return iter([self.indices[i] for i in order])
