"""Run a function on N real processes joined by a gloo process group on localhost."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autok.launch import free_port


def _entry(rank: int, world_size: int, port: int, fn, args, result_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
    )
    try:
        out = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    torch.save(out, Path(result_dir) / f"{rank}.pt")


def run_dist(fn, world_size: int, *args):
    """fn(rank, world_size, *args) on every rank; returns the list of per-rank return values."""
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(
            _entry,
            args=(world_size, free_port(), fn, args, d),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        return [torch.load(Path(d) / f"{r}.pt", weights_only=False) for r in range(world_size)]
