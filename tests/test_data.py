"""Loaders on small files written in each data set's real on-disk format; models' shapes."""

from __future__ import annotations

import hashlib
import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from autok.trainer.loop import data
from autok.trainer.loop.data import build_splits, check_data_dir
from autok.trainer.loop.models import build_model


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


def md5_of_cifar100(root) -> dict[str, str]:
    """The md5 of each file of a CIFAR-100 tree, in the form of
    autok.trainer.loop.data.CIFAR100_MD5."""
    base = root / "cifar-100-python"
    return {n: hashlib.md5((base / n).read_bytes()).hexdigest() for n in data.CIFAR100_MD5}


def test_cifar100_loader_reads_the_real_pickle_format(tmp_path, monkeypatch):
    root = write_cifar100(tmp_path)
    # Generated files are not the official archive's: pin their sums where the official ones
    # live, so the loader's own md5 check passes for these files and for no others.
    monkeypatch.setattr(data, "CIFAR100_MD5", md5_of_cifar100(root))
    assert check_data_dir("cifar100", root) is None
    splits = build_splits("cifar100", root)
    assert len(splits.train) == 40 and len(splits.test) == 20
    x, y = splits.train[0]
    assert x.shape == (3, 32, 32) and 0 <= y < 100
    assert splits.meta.num_classes == 100
    assert splits.train.classes[3] == "class_3"


class _Marker:
    def __init__(self, path) -> None:
        self.path = path

    def __reduce__(self):  # unpickling this creates a directory
        return (os.mkdir, (str(self.path),))


def test_a_crafted_cifar_pickle_is_refused_and_never_unpickled(tmp_path):
    root = tmp_path / "data"
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    marker = tmp_path / "PWNED"
    for name in ("train", "test", "meta"):
        (base / name).write_bytes(pickle.dumps({"data": _Marker(marker)}))
    pickle.loads((base / "train").read_bytes())  # the file does what it says...
    assert marker.is_dir()
    marker.rmdir()
    why = check_data_dir("cifar100", root)  # ...and autok never lets it
    assert why and "md5" in why and "not the official" in why
    with pytest.raises(ValueError, match="--data-dir"):
        build_splits("cifar100", root)  # the loader keeps torchvision's md5 check too
    assert not marker.exists()


def test_generated_cifar_files_are_not_the_official_ones(tmp_path):
    root = write_cifar100(tmp_path)
    assert "md5 mismatch" in check_data_dir("cifar100", root)
    assert data.CIFAR100_MD5["train"] == "16019d7e3df5f24257cddd939b257f8d"  # torchvision's


def test_disk_layouts_are_checked_before_loading(tmp_path):
    tin = write_tinyimagenet(tmp_path / "tin")
    assert check_data_dir("tinyimagenet", tin) is None
    (tin / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn00000000\t0\t0\t1\t1\n")
    assert "not in wnids.txt" in check_data_dir("tinyimagenet", tin)
    imf = write_imagefolder(tmp_path / "imf")
    assert check_data_dir("imagefolder", imf) is None
    (imf / "val" / "cat").rename(imf / "val" / "lion")
    assert "same classes" in check_data_dir("imagefolder", imf)


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
    "damage",
    [
        lambda p: p.write_bytes(p.read_bytes()[:100]),  # a crash mid-write on another machine
        lambda p: np.savez(p, x=np.zeros((3, 40))),  # an array missing
        lambda p: np.savez(p, x=np.zeros(5), y=np.zeros(5), x_test=np.zeros(1), y_test=[0]),
    ],
    ids=["truncated", "missing-array", "other-size"],
)
def test_a_damaged_mnist1d_cache_is_made_again(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("AUTOK_CACHE", str(tmp_path))
    path = data.prepare_mnist1d(500, 0)
    good = np.load(path)["x"].copy()
    damage(path)
    assert data.prepare_mnist1d(500, 0) == path
    with np.load(path) as d:
        assert np.array_equal(d["x"], good) and len(d["x"]) + len(d["x_test"]) == 500
    mtime = path.stat().st_mtime_ns
    data.prepare_mnist1d(500, 0)  # a whole cache is kept as it is
    assert path.stat().st_mtime_ns == mtime


def test_a_held_out_mnist1d_test_set_leaves_the_training_set_as_it_was(tmp_path, monkeypatch):
    """--mnist1d-test-samples tests on a second draw of that size: the training set (the 80%) is
    the same tensors, the test set is new samples of every class, none of them trained on."""
    monkeypatch.setenv("AUTOK_CACHE", str(tmp_path))
    plain = build_splits("mnist1d", mnist1d_samples=500)
    # a draw as large as the data set: were it the same draw, its own 80% would be the
    # training rows to the last bit
    held = build_splits("mnist1d", mnist1d_samples=500, mnist1d_test_samples=500)
    pairs = zip(plain.train.tensors, held.train.tensors, strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert len(plain.test) == 100 and len(held.test) == 500
    xs, ys = held.test.tensors
    assert torch.bincount(ys, minlength=10).tolist() == [50] * 10
    seen = {tuple(r.tolist()) for r in held.train.tensors[0].flatten(1)}
    assert not any(tuple(r.tolist()) in seen for r in xs.flatten(1))
    # made once and cached like the data set
    assert data.mnist1d_cached(500, data.HELD_OUT_SEED)
    mtime = data.prepare_mnist1d(500, data.HELD_OUT_SEED).stat().st_mtime_ns
    again = build_splits("mnist1d", mnist1d_samples=500, mnist1d_test_samples=500)
    assert torch.equal(again.test.tensors[0], xs)
    assert data.prepare_mnist1d(500, data.HELD_OUT_SEED).stat().st_mtime_ns == mtime


def test_a_whole_mnist1d_cache_of_any_size_is_kept(tmp_path, monkeypatch):
    """mnist1d makes whole tens of samples: 105 asked, 100 made, and that cache is whole."""
    monkeypatch.setenv("AUTOK_CACHE", str(tmp_path))
    path = data.prepare_mnist1d(105, 0)
    mtime = path.stat().st_mtime_ns
    assert data.prepare_mnist1d(105, 0) == path and path.stat().st_mtime_ns == mtime


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
