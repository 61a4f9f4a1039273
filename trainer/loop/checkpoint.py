"""Checkpoints that continue a run exactly, losing nothing already written (docs/design.md §7).

Layout: OUT/checkpoints/epoch-NNNN/{rank0.pt, ..., manifest.json}. Each rank writes its own file
(optimizer state and `local` buffers differ per rank) to a temp name, fsyncs and renames it; after
a barrier rank 0 writes the manifest (SHA-256 of every file) and renames the directory into
place. A directory without a valid manifest is not a checkpoint. The previous good one is kept.

Checkpoints are taken at epoch ends, which are always boundaries, so no interval is half open.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

KEEP = 2
MANIFEST_MAX = 1 << 20  # bytes: a manifest lists one checksum per rank
FORMAT = 2  # 2: the engine's state under "sync" (autok.Sync.state_dict()), plain tensors
# what every rank file holds at its top level (autok.trainer.loop.run.Trainer.state_dict)
STATE_KEYS = ("epoch", "model", "optimizer", "scheduler", "sync", "rng", "trainer")


class CheckpointError(RuntimeError):
    pass


# Tests only: with this set to a directory, a checkpoint writer reaching pause point P waits
# while DIR/pause-at-P exists, after creating DIR/reached-P, so a test can act (send SIGINT)
# at that exact moment without guessing at timing.
PAUSE_ENV = "AUTOK_TEST_CHECKPOINT_PAUSE"


def _pause_point(point: str) -> None:
    where = os.environ.get(PAUSE_ENV)
    if not where or not os.path.exists(os.path.join(where, f"pause-at-{point}")):
        return
    open(os.path.join(where, f"reached-{point}"), "w").close()
    while os.path.exists(os.path.join(where, f"pause-at-{point}")):
        time.sleep(0.05)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(exc: BaseException) -> OSError | None:
    """The out-of-space error behind `exc`, if that is what it is. torch.save reports a failed
    write as `RuntimeError: [enforce fail at inline_container.cc] . unexpected pos`, with the
    file's OSError only as its context."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: the error, then what it was raised during
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in DISK_FULL:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _numbered(root: Path) -> list[tuple[int, Path]]:
    """What autok names epoch-NNNN under `root`, each with its number (in glob order)."""
    return [(n, p) for p in root.glob("epoch-*") if (n := _epoch_of(p)) is not None]


def _last_complete(out_dir: Path) -> str:
    ours = _numbered(ckpt_root(out_dir))
    return max(ours, key=lambda numbered: numbered[0])[1].name if ours else ""


@contextlib.contextmanager
def _saying_disk_full(out_dir: Path, epoch: int, path: Path) -> Iterator[None]:
    """A full disk while writing `path` becomes one clear CheckpointError: which file, and that
    the last complete checkpoint is intact (every file is written under a temporary name and
    renamed into place only when whole, so a failed write never touches one)."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        full = _disk_full(exc)
        if full is None:
            raise
        with contextlib.suppress(OSError):
            path.unlink()  # the partial file: give its space back
        last = _last_complete(out_dir)
        kept = (
            f"the last checkpoint, {last}, is intact (free space, then continue with --resume)"
            if last
            else "no checkpoint is complete yet"
        )
        # short: the CLI's error line holds 280 characters, the path included
        what = "the disk is full" if full.errno == errno.ENOSPC else "the disk quota is used up"
        raise CheckpointError(
            f"{what}: {path} (checkpoint epoch-{epoch:04d}) could not be written; {kept}"
        ) from None


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
    with _saying_disk_full(out_dir, epoch, tmp), open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        _pause_point(f"epoch{epoch}-rank{rank}-file")
        os.fsync(f.fileno())
    os.replace(tmp, final)


def publish(out_dir: Path, epoch: int, world_size: int) -> Path:
    """Rank 0, after every rank has written: manifest, then the directory into place."""
    d = staging_dir(out_dir, epoch)
    files = {f"rank{r}.pt": sha256(d / f"rank{r}.pt") for r in range(world_size)}
    manifest = {"epoch": epoch, "world_size": world_size, "files": files, "format": FORMAT}
    path = d / "manifest.json"
    with _saying_disk_full(out_dir, epoch, path), open(path, "w") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(d)
    _pause_point(f"epoch{epoch}-publish")
    final = ckpt_root(out_dir) / f"epoch-{epoch:04d}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(d, final)
    _fsync_dir(ckpt_root(out_dir))
    # Only what autok names epoch-NNNN is pruned, oldest first by number.
    ours = _numbered(ckpt_root(out_dir))
    for _, old in sorted(ours, key=lambda numbered: numbered[0])[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def discard_staging(out_dir: Path, epoch: int) -> None:
    shutil.rmtree(staging_dir(out_dir, epoch), ignore_errors=True)


def _epoch_of(path: Path) -> int | None:
    m = re.fullmatch(r"epoch-(\d{4,9})", path.name)
    return int(m.group(1)) if m else None


# name -> (shape, dtype) of each tensor of a model's state_dict (None for extra state): what a
# checkpoint's `model` must match for load_state_dict to take it
Layout = dict[str, tuple[tuple[int, ...], torch.dtype] | None]


def model_layout(model: torch.nn.Module) -> Layout:
    return {
        k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else None
        for k, v in model.state_dict().items()
    }


def _shown(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{str(dtype).removeprefix('torch.')} {list(shape)}"


def _layout_differs(model: Any, layout: Layout) -> str | None:
    """How a checkpoint's model state differs from the model's layout, or None."""
    if not isinstance(model, dict):
        return "its model is not a state_dict"
    if missing := sorted(set(layout) - set(model)):
        return f"its model has no {missing[0][:80]!r}"
    if extra := sorted(str(k) for k in set(model) - set(layout)):
        return f"its model has {extra[0][:80]!r}, which the model has not"
    for name, want in layout.items():
        t = model[name]
        if want is None or not isinstance(t, torch.Tensor):
            continue
        if (tuple(t.shape), t.dtype) != want:
            return (
                f"its model's {name[:80]!r} is {_shown(tuple(t.shape), t.dtype)}, the model's "
                f"{_shown(*want)}"
            )
    return None


def _loads_safely(path: Path, layout: Layout | None = None) -> str | None:
    """Why the rank file cannot be loaded as plain tensors and containers, or None. The
    restricted unpickler runs no code from the file (a crafted pickle is refused here). With
    `layout`, its model's tensors must have the model's names, shapes and dtypes: a file whose
    checksums were recomputed after a change would otherwise pass, and fail in every worker."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # UnpicklingError, RuntimeError: what the file is does not matter
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        return f"{path.name} is not a plain-tensor checkpoint ({type(exc).__name__}: {first})"
    # plain tensors, but the trainer's (Trainer.state_dict): a resume must not launch workers
    # to find a KeyError in each
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        return f"{path.name} is not an autok checkpoint (no {missing[0]!r})"
    if layout is not None and (why := _layout_differs(state["model"], layout)):
        return f"{path.name}: {why}"
    return None


def verify(path: Path, world_size: int, layout: Layout | None = None) -> str | None:
    """Why the checkpoint at `path` cannot be used, or None.

    The manifest must name exactly one file per rank, each must match its SHA-256 and load
    with weights_only=True. (The checksums catch truncation and corruption; they are no
    signature: whoever can write the run directory can write a manifest too, which is why
    loading never unpickles code.)"""
    epoch = _epoch_of(path)
    if epoch is None:
        return "not a checkpoint directory name (epoch-NNNN)"
    try:
        manifest_path = path / "manifest.json"
        if not manifest_path.is_file():  # a FIFO or a directory: opening one would hang or fail
            raise OSError("not a regular file")
        if manifest_path.stat().st_size > MANIFEST_MAX:  # a few hundred bytes per rank
            raise ValueError(f"over {MANIFEST_MAX} bytes")
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        return f"no readable manifest ({exc.__class__.__name__})"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return "malformed manifest (expected an object with a 'files' object)"
    if manifest.get("format") != FORMAT:
        return f"written in checkpoint format {manifest.get('format')!r}; this autok reads {FORMAT}"
    if manifest.get("epoch") != epoch:
        return f"manifest says epoch {manifest.get('epoch')!r}, the directory {epoch}"
    written_by = manifest.get("world_size")
    if written_by != world_size:
        return f"written by {written_by} workers, this run has {world_size}"
    files = manifest["files"]
    expected = {f"rank{r}.pt" for r in range(world_size)}
    if set(files) != expected:
        return f"manifest lists {sorted(files)[:4]}, expected one file per rank"
    for name in sorted(expected):
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if sha256(f) != files[name]:
            return f"{name} does not match its checksum (truncated or corrupted)"
        if why := _loads_safely(f, layout):
            return why
    return None


@dataclass(frozen=True)
class Found:
    path: Path | None
    epoch: int  # -1 when none
    refused: tuple[tuple[str, str], ...]  # (checkpoint, why) for each one skipped


def latest_valid(out_dir: Path, world_size: int, layout: Layout | None = None) -> Found:
    """The newest checkpoint `verify` accepts (with `layout`: whose model fits it), and why
    each newer one was refused: an older good one is used (docs/design.md §7, checkpoints/)."""
    refused: list[tuple[str, str]] = []
    candidates = [p for p in ckpt_root(out_dir).glob("epoch-*") if p.is_dir()]
    # newest first by the number in the name; names that are not epoch-NNNN sort last
    candidates.sort(key=lambda p: (_epoch_of(p) is not None, _epoch_of(p) or 0), reverse=True)
    for path in candidates:
        why = verify(path, world_size, layout)
        if why is None:
            epoch = _epoch_of(path)
            assert epoch is not None  # verify accepts epoch-NNNN names only
            return Found(path, epoch, tuple(refused))
        refused.append((path.name, why))
    return Found(None, -1, tuple(refused))


def resume_point(out_dir: Path, world_size: int, layout: Layout | None = None) -> Found:
    """For `--resume`, before anything is launched: the checkpoint to continue from, or a
    CheckpointError that says why none can be used (the run is left as it is)."""
    found = latest_valid(out_dir, world_size, layout)
    if found.path is not None:
        return found
    if not found.refused:
        raise CheckpointError(f"{out_dir} has no checkpoint to resume from ({ckpt_root(out_dir)})")
    name, why = found.refused[0]
    more = f" (and {len(found.refused) - 1} older refused)" if len(found.refused) > 1 else ""
    raise CheckpointError(f"no usable checkpoint in {out_dir}: {name}: {why}{more}")


def load_rank_file(path: Path, rank: int) -> dict[str, Any]:
    # Never weights_only=False: a checkpoint is data a user may have been handed.
    return torch.load(path / f"rank{rank}.pt", map_location="cpu", weights_only=True)
