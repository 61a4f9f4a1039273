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
    # On a GPU the hook runs when backward has *queued* the bucket's kernels, not when they ran:
    # a CUDA event recorded on the autograd stream marks the real end of backward compute.
    last_ready_event: torch.cuda.Event | None = None
    nbytes: int = 0  # payload all-reduced since the last reset
    buckets: int = 0  # collectives (one per DDP bucket) since the last reset

    def reset(self) -> None:
        self.last_ready = None
        self.last_ready_event = None
        self.nbytes = 0
        self.buckets = 0

    def exposed_wait(self, backward_start: float, backward_end: float) -> float | None:
        """Seconds `backward()` spent blocked on gradient buckets after its compute ended, or
        None when no bucket was all-reduced in this backward. `backward_end` must be taken after
        the device has finished its queued work (trainer.profiler.Clock does that on a GPU)."""
        ready = self.last_ready
        if ready is None or ready <= backward_start:
            return None
        if self.last_ready_event is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            wait = self.last_ready_event.elapsed_time(end) / 1e3
            return min(max(0.0, wait), backward_end - backward_start)
        return backward_end - ready


def _first(values: list[torch.Tensor]) -> torch.Tensor:
    return values[0]


def emulated_allreduce_hook(
    state: GradSyncState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    state.last_ready = time.perf_counter()
    tensor = bucket.buffer()
    if tensor.is_cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the stream that computed the bucket's gradients
        state.last_ready_event = event
    nbytes = tensor.numel() * tensor.element_size()
    state.nbytes += nbytes
    state.buckets += 1
    # Same arithmetic as DDP's built-in hook (pre-divide, then SUM), so K=1 cpdp == ddp exactly.
    tensor.div_(state.world_size)
    # The process group's own allreduce (SUM): dist.all_reduce's Python wrapper costs about 30 µs
    # of checks per call on every step (issue 17), which DDP's built-in C++ hook never pays.
    if state.process_group is None:  # looked up once, not on every bucket of every step
        state.process_group = dist.distributed_c10d._get_default_group()
    fut = state.process_group.allreduce([tensor]).get_future()
    if state.clock is None:
        return fut.then(lambda f: f.value()[0])
    return delayed(fut, state.clock.reserve(nbytes), _first, device=tensor.device)
