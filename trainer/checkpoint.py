"""Checkpoints that continue a run exactly (DESIGN: nothing already written is lost).

Layout: OUT/checkpoints/epoch-NNNN/{rank0.pt, ..., manifest.json}. Each rank writes its own file
(optimizer state and `local` buffers differ per rank) to a temp name, fsyncs and renames it; after
a barrier rank 0 writes the manifest (SHA-256 of every file) and renames the directory into
place. A directory without a valid manifest is not a checkpoint. The previous good one is kept.

Checkpoints are taken at epoch ends, which are always boundaries, so no interval is half open.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

KEEP = 2


class CheckpointError(RuntimeError):
    pass


def ckpt_root(out_dir: Path) -> Path:
    return out_dir / "checkpoints"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def staging_dir(out_dir: Path, epoch: int) -> Path:
    return ckpt_root(out_dir) / f".staging-epoch-{epoch:04d}"


def write_rank_file(out_dir: Path, epoch: int, rank: int, state: dict[str, Any]) -> None:
    d = staging_dir(out_dir, epoch)
    d.mkdir(parents=True, exist_ok=True)
    tmp, final = d / f".rank{rank}.pt.tmp", d / f"rank{rank}.pt"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def publish(out_dir: Path, epoch: int, world_size: int) -> Path:
    """Rank 0, after every rank has written: manifest, then the directory into place."""
    d = staging_dir(out_dir, epoch)
    files = {f"rank{r}.pt": sha256(d / f"rank{r}.pt") for r in range(world_size)}
    manifest = {"epoch": epoch, "world_size": world_size, "files": files, "format": 1}
    with open(d / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(d)
    final = ckpt_root(out_dir) / f"epoch-{epoch:04d}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(d, final)
    _fsync_dir(ckpt_root(out_dir))
    for old in sorted(ckpt_root(out_dir).glob("epoch-*"))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def discard_staging(out_dir: Path, epoch: int) -> None:
    shutil.rmtree(staging_dir(out_dir, epoch), ignore_errors=True)


def verify(path: Path, world_size: int) -> str | None:
    """Why the checkpoint at `path` cannot be used, or None."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        return f"no readable manifest ({exc.__class__.__name__})"
    if manifest.get("world_size") != world_size:
        return f"written by {manifest.get('world_size')} workers, this run has {world_size}"
    for name, digest in manifest.get("files", {}).items():
        f = path / name
        if not f.exists():
            return f"{name} is missing"
        if sha256(f) != digest:
            return f"{name} does not match its checksum (truncated or corrupted)"
    return None


@dataclass(frozen=True)
class Found:
    path: Path | None
    epoch: int  # -1 when none
    refused: tuple[tuple[str, str], ...]  # (checkpoint, why) for each one skipped


def latest_valid(out_dir: Path, world_size: int) -> Found:
    refused = []
    for path in sorted(ckpt_root(out_dir).glob("epoch-*"), reverse=True):
        why = verify(path, world_size)
        if why is None:
            return Found(path, int(path.name.split("-")[1]), tuple(refused))
        refused.append((path.name, why))
    return Found(None, -1, tuple(refused))


def load_rank_file(path: Path, rank: int) -> dict[str, Any]:
    return torch.load(path / f"rank{rank}.pt", weights_only=False)
