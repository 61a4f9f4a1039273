"""Loaders on small files written in each data set's real on-disk format; models' shapes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from trainer.data import build_splits, check_data_dir
from trainer.models import build_model


def write_cifar100(root, n_train=40, n_test=20, seed=0):
    """cifar-100-python/{train,test,meta}: pickled dicts as in the official archive."""
    rng = np.random.default_rng(seed)
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    for name, n in (("train", n_train), ("test", n_test)):
        entry = {
            "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            "fine_labels": rng.integers(0, 100, size=n).tolist(),
            "coarse_labels": rng.integers(0, 20, size=n).tolist(),
            "filenames": [f"img_{i}.png" for i in range(n)],
            "batch_label": f"{name} batch",
        }
        (base / name).write_bytes(pickle.dumps(entry))
    meta = {
        "fine_label_names": [f"class_{i}" for i in range(100)],
        "coarse_label_names": [f"super_{i}" for i in range(20)],
    }
    (base / "meta").write_bytes(pickle.dumps(meta))
    return root


def _img(path, size, seed):
    arr = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)


def write_tinyimagenet(root, classes=("n01443537", "n01629819"), per_class=3):
    """tiny-imagenet-200 layout: train/<wnid>/images/*.JPEG, val/images + val_annotations.txt."""
    (root / "wnids.txt").parent.mkdir(parents=True, exist_ok=True)
    (root / "wnids.txt").write_text("\n".join(classes) + "\n")
    for c in classes:
        d = root / "train" / c / "images"
        d.mkdir(parents=True)
        for i in range(per_class):
            _img(d / f"{c}_{i}.JPEG", 64, hash((c, i)) % 1000)
    (root / "val" / "images").mkdir(parents=True)
    lines = []
    for i, c in enumerate(classes * 2):
        name = f"val_{i}.JPEG"
        _img(root / "val" / "images" / name, 64, 500 + i)
        lines.append(f"{name}\t{c}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return root


def write_imagefolder(root, classes=("cat", "dog", "eel"), per_class=4):
    for split in ("train", "val"):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(per_class):
                _img(d / f"{i}.png", 40, hash((split, c, i)) % 1000)
    return root


def test_cifar100_loader_reads_the_real_pickle_format(tmp_path):
    splits = build_splits("cifar100", write_cifar100(tmp_path))
    assert len(splits.train) == 40 and len(splits.test) == 20
    x, y = splits.train[0]
    assert x.shape == (3, 32, 32) and 0 <= y < 100
    assert splits.meta.num_classes == 100
    assert splits.train.classes[3] == "class_3"


def test_tinyimagenet_loader_reads_train_folders_and_val_annotations(tmp_path):
    splits = build_splits("tinyimagenet", write_tinyimagenet(tmp_path))
    assert len(splits.train) == 6 and len(splits.test) == 4
    x, y = splits.test[1]
    assert x.shape == (3, 64, 64) and y == 1  # val_1 is labelled with the second wnid
    assert splits.meta.num_classes == 2


def test_imagefolder_loader_crops_to_image_size(tmp_path):
    splits = build_splits("imagefolder", write_imagefolder(tmp_path), image_size=32)
    assert len(splits.train) == 12 and len(splits.test) == 12
    assert splits.train[0][0].shape == (3, 32, 32) and splits.test[0][0].shape == (3, 32, 32)
    assert splits.meta.num_classes == 3


def test_missing_files_are_named(tmp_path):
    assert "cifar-100-python" in check_data_dir("cifar100", tmp_path)
    assert "val_annotations" in check_data_dir("tinyimagenet", tmp_path)
    assert check_data_dir("mnist1d", None) is None


def test_embedded_datasets():
    m = build_splits("mnist1d", mnist1d_samples=500)
    assert len(m.train) == 400 and m.train[0][0].shape == (1, 40)
    d = build_splits("digits")
    assert len(d.train) + len(d.test) == 1797 and d.train[0][0].shape == (1, 8, 8)


@pytest.mark.parametrize(
    "name, shape, classes",
    [
        ("cnn1d", (1, 40), 10),
        ("cnn", (1, 8, 8), 10),
        ("mlp", (3, 32, 32), 100),
        ("resnet18", (3, 32, 32), 100),
        ("resnet50", (3, 32, 32), 100),
        ("vit-s", (3, 32, 32), 100),
    ],
)
def test_models_forward(name, shape, classes):
    torch.manual_seed(0)
    net = build_model(name, shape, classes).eval()
    with torch.no_grad():
        assert net(torch.randn(2, *shape)).shape == (2, classes)
    if name == "resnet18":  # CIFAR form: 3x3 stride-1 stem, no max-pool
        assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
        assert isinstance(net.maxpool, torch.nn.Identity)
    if name == "vit-s":
        assert net.hidden_dim == 384 and len(net.encoder.layers) == 12 and net.patch_size == 4
