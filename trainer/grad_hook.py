"""DDP comm hook: gradient buckets through the link emulator, with the timing the profiler needs.

Exposed gradient sync (DESIGN §3) is the wait between the end of backward compute and the
completion of the last bucket. The hook is called when a bucket's gradients are all computed, so
the latest call marks the end of backward compute; `loss.backward()` returns only once DDP has
waited for every bucket's future. The difference is what the step spent blocked on the network.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as real types.
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer.link import LinkClock, delayed


@dataclass
class GradSyncState:
    world_size: int
    clock: LinkClock | None
    process_group: dist.ProcessGroup | None = None
    last_ready: float | None = None  # perf_counter of the latest bucket-ready call
    nbytes: int = 0  # payload all-reduced since the last reset

    def reset(self) -> None:
        self.last_ready = None
        self.nbytes = 0


def _first(values: list[torch.Tensor]) -> torch.Tensor:
    return values[0]


def emulated_allreduce_hook(
    state: GradSyncState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    state.last_ready = time.perf_counter()
    tensor = bucket.buffer()
    nbytes = tensor.numel() * tensor.element_size()
    state.nbytes += nbytes
    # Same arithmetic as DDP's built-in hook (pre-divide, then SUM), so K=1 cpdp == ddp exactly.
    tensor.div_(state.world_size)
    fut = dist.all_reduce(tensor, group=state.process_group, async_op=True).get_future()
    if state.clock is None:
        return fut.then(lambda f: f.value()[0])
    return delayed(fut, state.clock.reserve(nbytes), _first)
