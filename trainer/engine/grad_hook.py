"""DDP's gradient all-reduce, with the timing the profiler needs: through the link emulator (a
comm hook), or DDP's own C++ all-reduce with nothing to emulate.

Exposed gradient sync (docs/design.md §4) is the wait between the end of backward compute and the
completion of the last bucket; `loss.backward()` returns only once DDP has waited for every
bucket. The end of backward compute is the latest bucket-ready call of the comm hook or, on the
built-in path, a callback that runs when every node of the backward graph has run, just before
DDP's own end-of-backward wait (GradSyncState._on_grad). The wait ends where a callback queued
behind DDP's runs (GradSyncState._done, on the built-in path _done_on_host): once DDP has waited
for every bucket and written the gradients back, still inside `backward()`. The difference is
what the step spent blocked on the network. What the loop does between `backward()` and
`optimizer.step()` (GradScaler's unscale and its inf check, clipping) is the loop's compute, not
sync.

Why two paths (docs/design.md §4, Per step): any Python comm hook costs about 40-120 µs per
synchronized step against DDP's built-in C++ one (world 2, cnn1d,
`python -m benchmarks.step_parts`): the call into Python and its future's callback on the gloo
thread; torch's own Python `allreduce_hook` costs the same. With no link to emulate, on the CPU, DDP
keeps its C++ hook, and one hook on a parameter's gradient accumulation, held only while steps
synchronize, marks the time. On a GPU the comm hook stays: the end of compute there is a CUDA event
on the stream that computed the bucket, recorded as it becomes ready.

The built-in path relies on every synchronized backward reaching the first trainable parameter
DDP manages, which DDP as `Sync` builds it requires (no unused parameters); a user who turns on
DDP's private static-graph mode, its Python reducer (compiled autograd's `optimize_ddp`
"python_reducer", whose own post-accumulate hooks come first), or runs backward through a
reentrant checkpoint may see the wait counted as backward compute.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as real types.
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel

from autok.trainer.engine.handoff import hand, hand_callback
from autok.trainer.engine.link import LinkClock, delayed

# Called in every synchronized backward: looked up once. A final callback runs once every node
# of the backward graph has run, in the order queued; one queued by a final callback runs too.
_queue_callback = Variable._execution_engine.queue_callback
perf_counter = time.perf_counter


@dataclass
class GradSyncState:
    world_size: int
    clock: LinkClock | None
    process_group: dist.ProcessGroup | None = None
    # nccl completes a collective's future as it queues the work, so a `then` callback runs on
    # the hook's own thread; gloo completes it on its worker thread (looked up with the group)
    inline_futures: bool = False
    last_ready: float | None = None  # perf_counter of the latest bucket-ready call
    # perf_counter when DDP had waited for every bucket (a callback queued behind DDP's own,
    # see _done); None until a synchronized backward gets there
    sync_done: float | None = None
    # On a GPU the hook runs when backward has *queued* the bucket's kernels, not when they ran:
    # a CUDA event recorded on the autograd stream marks the real end of backward compute.
    last_ready_event: torch.cuda.Event | None = None
    sync_done_event: torch.cuda.Event | None = None  # on a GPU, sync_done's event
    nbytes: int = 0  # payload all-reduced since the last reset
    buckets: int = 0  # collectives (one per DDP bucket) since the last reset
    # The built-in path (install_grad_sync): DDP all-reduces in C++, so the counts above are
    # filled in by exposed_wait from what a synchronized backward sends.
    builtin: bool = False
    # forwards in this step with DDP's gradient sync on: each one's backward sends the gradients
    synced_forwards: int = 0
    grad_nbytes: int = 0  # the gradients' bytes: one synchronized backward's payload
    reducer: dist.Reducer | None = None
    params: list[torch.Tensor] = field(default_factory=list)  # the built-in path's
    _handle: Any = None  # its post-accumulate-grad hook, while held
    _bucket_count: int = 0
    _bucket_reads: int = 0
    _done_queued: bool = False  # the comm hook's: _queue_done queued in this backward

    def reset(self, local: bool = False) -> None:
        """A new step; `local`: its backward will not all-reduce (no_sync), so the built-in
        path's hook is dropped until a synchronized forward arms it again."""
        self.last_ready = self.sync_done = None
        self.last_ready_event = self.sync_done_event = None
        self._done_queued = False
        self.nbytes = 0
        self.buckets = 0
        self.synced_forwards = 0
        if local and self._handle is not None:
            self._handle.remove()
            self._handle = None

    def release(self) -> None:
        """Let go of the model (Sync.close): the built-in path's hook on a parameter holds this
        state, which holds the parameters and DDP's reducer (and through it the process group),
        a cycle only the cyclic GC would free."""
        self.reset(local=True)
        self.reducer = None
        self.params = []
        self.process_group = None

    def arm(self) -> None:
        """A forward ran with DDP's gradient sync on: its backward all-reduces. The built-in
        path hooks one parameter's gradient accumulation (kept while step after step
        synchronizes, as on ddp); see _on_grad."""
        self.synced_forwards += 1
        if self.builtin and self._handle is None:
            # A post-accumulate hook is handed the parameter, which has its Python object
            # already; a tensor hook is handed a new gradient tensor to wrap and its return
            # value to check, about 10-15 µs more per step here.
            self._handle = self.params[0].register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, _param: torch.Tensor) -> None:
        # Called in backward inside this parameter's gradient accumulation, before the node's
        # post hooks, among them DDP's, which marks the parameter ready and, with the last
        # bucket ready, queues its own end-of-backward callback (that waits for the buckets).
        # A callback queued here runs once every node of the graph has run, before DDP's when
        # this parameter's gradient is the last DDP waits for (the first layer's, as a rule):
        # the end of backward compute, with one Python call per backward.
        _queue_callback(self._ready)

    def _ready(self) -> None:
        self.last_ready = perf_counter()
        # DDP's end-of-backward callback (its wait for the buckets) was queued after this one,
        # or before it: a callback queued now runs after it either way, still inside backward
        _queue_callback(self._done_on_host)

    def _done_on_host(self) -> None:
        """The built-in path's _done (on the CPU): its time alone, per step on ddp."""
        self.sync_done = perf_counter()

    def _queue_done(self) -> None:
        """The comm hook's: queued at a backward's first bucket, before DDP queues its own
        end-of-backward callback (at the last bucket); it queues _done behind that one."""
        _queue_callback(self._done)

    def _done(self) -> None:
        """DDP has waited for every bucket of this backward and written the gradients back.
        On a GPU the callback runs on the stream current at `backward()`'s call, which autograd
        has made wait for the backward's streams: an event there marks the device's end."""
        self._done_queued = False
        ready = self.last_ready_event
        if ready is not None:  # on the stream current for the bucket's device at this point
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(ready.device))
            self.sync_done_event = event
        else:
            self.sync_done = perf_counter()

    def exposed_wait(
        self, backward_start: float, backward_end: float, end_event: Any = None
    ) -> float | None:
        """Seconds `backward()` spent blocked on gradient buckets after its compute ended, or
        None when no bucket was all-reduced in this backward. Host times (perf_counter) on the
        CPU; on a GPU events: from the last bucket's to the one `_done` recorded. The wait ends
        where DDP's did (`_done`), or, where no such point was reached, at `backward_end` (the
        optimizer step's start; on a GPU `end_event`, the recorded and already reached event
        there: autok.trainer.engine.profiler.DeviceMarks)."""
        ready = self.last_ready
        if ready is None:
            return None
        if self.builtin:
            times = self.synced_forwards  # each synchronized forward's backward sends it all
            if not times:  # a local step: gradients accumulated, none all-reduced
                return None
            buckets = self._bucket_count if self._bucket_reads >= 2 else self.bucket_count()
            self.nbytes, self.buckets = times * self.grad_nbytes, times * buckets
        if ready <= backward_start:
            # reset() cleared last_ready when the step opened, so the buckets were all-reduced
            # in this step; a forward the loop ran after backward (an evaluation under no_grad)
            # moved backward_start past them. Their wait cannot be told from that forward's
            # compute: the sync is counted, with none of it exposed.
            return 0.0
        start = self.last_ready_event
        if start is not None:
            # where DDP's wait ended (recorded before backward returned), else end_event
            end = self.sync_done_event if self.sync_done_event is not None else end_event
            if end is None:  # no clock points: wait here, on the bucket's device
                end = torch.cuda.Event(enable_timing=True)
                end.record(torch.cuda.current_stream(start.device))
            start.synchronize()  # each already reached, or reached soon: no stall of note
            end.synchronize()
            wait = max(0.0, start.elapsed_time(end) / 1e3)
            # with clock points the caller caps it at backward's span on the device
            return wait if end_event is not None else min(wait, backward_end - backward_start)
        done = self.sync_done
        if done is not None and ready <= done < backward_end:
            return done - ready
        return backward_end - ready

    def bucket_count(self) -> int:
        """DDP's buckets: one collective each. DDP rebuilds its buckets once, in the forward
        after the first synchronized backward, so the count is read at the first two
        synchronized steps (it allocates zeros like the buckets) and kept after that."""
        if self._bucket_reads < 2 and self.reducer is not None:
            self._bucket_count = len(self.reducer._get_zeros_like_grad_buckets())
            self._bucket_reads += 1
        return self._bucket_count


def install_grad_sync(
    ddp: DistributedDataParallel, state: GradSyncState, builtin: bool = True
) -> None:
    """The comm hook through the emulator, or with no link on the CPU the built-in path:
    DDP's C++ all-reduce, and the end of backward compute from GradSyncState.arm's hook.
    `builtin`: False where a backward may not reach the first parameter (unused parameters, a
    static graph): the comm hook then."""
    device = next(ddp.module.parameters()).device
    if state.clock is not None or device.type != "cpu" or not builtin:
        ddp.register_comm_hook(state, emulated_allreduce_hook)
        return
    # the parameters DDP all-reduces: a name in the module's _ddp_params_and_buffers_to_ignore
    # is not one, and its hook could run after DDP's end-of-backward callback
    managed = getattr(ddp, "_module_parameters", None) or list(ddp.module.parameters())
    state.params = [p for p in managed if p.requires_grad]
    state.builtin = True
    state.reducer = ddp.reducer
    state.grad_nbytes = sum(p.numel() * p.element_size() for p in state.params)


def _first(values: list[torch.Tensor]) -> torch.Tensor:
    return values[0]


def _first_of(fut: torch.futures.Future) -> torch.futures.Future:
    """fut's first value, as `fut.then(...)` would give it, but completed by a done-callback of
    fut's that handoff.py holds: gloo runs a `then` callback, and frees it with the future it
    completes, on its own thread, where a future (a Python value) cannot be watched; this
    callback stays referenced until gloo has let it go, and frees nothing there."""
    out: torch.futures.Future = torch.futures.Future()

    def _complete(f: torch.futures.Future) -> None:
        try:
            out.set_result(f.value()[0])
        except Exception as exc:  # a failed collective: its error, to whoever waits on out
            out.set_exception(exc.with_traceback(None))  # (its traceback: handoff.hand_callback)

    fut.add_done_callback(hand_callback(_complete))
    return out


def emulated_allreduce_hook(
    state: GradSyncState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    state.last_ready = perf_counter()
    if not state._done_queued:  # this backward's first bucket: mark where DDP's wait ends
        try:
            _queue_callback(state._queue_done)
        except RuntimeError:  # no backward running (DDP's join shadowing a bucket): no wait
            pass
        else:
            state._done_queued = True
    tensor = bucket.buffer()
    if tensor.is_cuda:
        # blocking: the link's booking thread waits on it (reserve_when) without spinning a core
        event = torch.cuda.Event(enable_timing=True, blocking=True)
        event.record()  # on the stream that computed the bucket's gradients
        state.last_ready_event = event
    nbytes = tensor.numel() * tensor.element_size()
    state.nbytes += nbytes
    state.buckets += 1
    # Same arithmetic as DDP's built-in hook (pre-divide, then SUM), so K=1 cpdp == ddp exactly.
    tensor.div_(state.world_size)
    # The process group's own allreduce (SUM): dist.all_reduce's Python wrapper costs about 30 µs
    # of checks per call on every step, which DDP's built-in C++ hook never pays.
    if state.process_group is None:  # looked up once, not on every bucket of every step
        state.process_group = dist.distributed_c10d._get_default_group()
        state.inline_futures = dist.get_backend(state.process_group) == "nccl"
    # The collective gets a tensor of its own over the bucket's memory, handed over and let go
    # like any other (handoff.py): DDP keeps the bucket itself, with references of its own, so
    # the count handoff would wait for on it is DDP's, not the backend's
    sent = tensor.view(tensor.shape)
    hand(sent)
    fut = state.process_group.allreduce([sent]).get_future()
    if state.clock is None and state.inline_futures:
        return fut.then(lambda f: f.value()[0])  # run, and freed, here
    if state.clock is None and not tensor.is_cuda:
        return _first_of(fut)
    if state.clock is None:  # (gloo with a CUDA tensor: a device-aware future, as delayed makes)
        return delayed(fut, 0.0, _first, device=tensor.device)
    if tensor.is_cuda:  # the link is booked when the device has the gradients, not when queued
        return delayed(fut, state.clock.reserve_when(event, nbytes), _first, device=tensor.device)
    return delayed(fut, state.clock.reserve(nbytes), _first, device=tensor.device)
