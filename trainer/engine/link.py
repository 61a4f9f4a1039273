"""WAN link emulator: hold every collective until a modelled network time has passed (docs/design.md
§5).

A ring AllReduce of S bytes over N ranks takes T(S, N) = 2(N-1) * (rtt/2 + S / (N * bandwidth)).
Each rank keeps a link clock: a collective issued at time a completes no earlier than
max(a, link_free) + T (+ seeded jitter), and never before the real collective has completed.
Waiting is sleeping, so it costs almost no CPU and a 2-core machine can emulate many ranks
faithfully: only the last HOLD_POLL seconds of a hold poll the clock (see hold_until).

A link may change during a run (`--link-schedule lan,wan@epoch=2,lan@epoch=4`): a schedule of
profiles by optimizer step or by epoch. Positions are steps and epochs, not seconds, so every
rank (which counts the same steps) models the same link for the same collective, and every
method of a comparison meets each profile for the same share of its training.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import math
import os
import queue
import random
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autok.trainer.engine.handoff import hand, hand_callback

if TYPE_CHECKING:  # torch loads on first use: `autok --help` reads PROFILES without it
    import torch
    import torch.distributed as dist


@dataclass(frozen=True)
class LinkProfile:
    name: str
    rtt_ms: float
    bandwidth_gbps: float
    jitter_ms: float = 0.0

    @property
    def is_ideal(self) -> bool:
        return self.rtt_ms == 0 and math.isinf(self.bandwidth_gbps) and self.jitter_ms == 0

    def allreduce_seconds(self, nbytes: int, world_size: int) -> float:
        """Modelled ring AllReduce time T(S, N), without jitter."""
        if world_size <= 1 or self.is_ideal:
            return 0.0
        bytes_per_second = self.bandwidth_gbps * 1e9 / 8
        hop = self.rtt_ms / 2e3 + nbytes / (world_size * bytes_per_second)
        return 2 * (world_size - 1) * hop

    def allgather_seconds(self, nbytes: float, world_size: int) -> float:
        """Modelled ring AllGather of `nbytes` per rank: (N − 1)·(rtt/2 + S/B), without jitter."""
        if world_size <= 1 or self.is_ideal:
            return 0.0
        return (world_size - 1) * (self.rtt_ms / 2e3 + nbytes / (self.bandwidth_gbps * 1e9 / 8))

    def alltoall_seconds(self, nbytes: float, world_size: int) -> float:
        """Modelled pairwise AllToAll of `nbytes` per rank (S/N to each peer, one peer a round):
        (N − 1)·(rtt/2 + S/(N·B)), without jitter."""
        return self.allgather_seconds(nbytes / max(1, world_size), world_size)

    def quantized_allreduce_seconds(self, nbytes: float, world_size: int) -> float:
        """Modelled quantized all-reduce of a payload of `nbytes` per rank (compressed averaging,
        trainer/engine/compress.py), without jitter: both phases (`phases`), each moving
        (N − 1)/N·S per rank, so the sum is T(S, N) of a ring all-reduce of S."""
        return sum(phases(self, nbytes, world_size, quantized=True))


def phases(profile: LinkProfile, nbytes: float, world_size: int, quantized: bool) -> list[float]:
    """The modelled durations of one averaging's collectives, without jitter: an all-reduce of
    `nbytes`, or a quantized all-reduce's all-to-all of its payload and all-gather of one N-th of
    it (trainer/engine/compress.py): what actually crosses the link, each phase (N − 1)/N of it."""
    size = int(nbytes)
    if not quantized:
        return [profile.allreduce_seconds(size, world_size)]
    share = -(-size // max(1, world_size))
    return [
        profile.alltoall_seconds(size, world_size),
        profile.allgather_seconds(share, world_size),
    ]


PROFILES: dict[str, LinkProfile] = {
    "none": LinkProfile("none", 0.0, math.inf),
    "lan": LinkProfile("lan", 0.1, 10.0),
    # The study's Nancy-Sophia link.
    "wan": LinkProfile("wan", 16.6, 1.0),
    # An intercontinental link: ~6x the study's latency, a tenth of its bandwidth.
    "slow-wan": LinkProfile("slow-wan", 100.0, 0.1),
}

SCHEDULE_UNITS = ("step", "epoch")
SCHEDULE_MAX_SEGMENTS = 64


@dataclass(frozen=True)
class LinkSchedule:
    """Profiles in force from a position on: segments[i] = (start, profile), starts increasing,
    the first at 0. `unit` is "step" (global optimizer steps, from 0) or "epoch" (as numbered in
    epochs.csv and the boundary records, from 0)."""

    unit: str
    segments: tuple[tuple[int, LinkProfile], ...]

    @property
    def text(self) -> str:
        return ",".join(
            p.name if i == 0 else f"{p.name}@{self.unit}={start}"
            for i, (start, p) in enumerate(self.segments)
        )

    @property
    def is_ideal(self) -> bool:
        return all(p.is_ideal for _, p in self.segments)

    def at(self, step: int, epoch: int) -> LinkProfile:
        pos = step if self.unit == "step" else epoch
        current = self.segments[0][1]
        for start, profile in self.segments:
            if start > pos:
                break
            current = profile
        return current


def static_schedule(profile: LinkProfile) -> LinkSchedule:
    return LinkSchedule("step", ((0, profile),))


def parse_schedule(text: str) -> LinkSchedule:
    """`lan,wan@epoch=2,lan@epoch=4` or `wan,lan@step=300`; a ValueError says what is wrong."""
    parts = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in parts):
        raise ValueError("give PROFILE,PROFILE@epoch=N,... (e.g. lan,wan@epoch=2,lan@epoch=4)")
    if len(parts) > SCHEDULE_MAX_SEGMENTS:
        raise ValueError(f"at most {SCHEDULE_MAX_SEGMENTS} segments (got {len(parts)})")
    segments: list[tuple[int, LinkProfile]] = []
    unit = None
    for i, part in enumerate(parts):
        name, _, where = part.partition("@")
        if name not in PROFILES:
            raise ValueError(f"unknown profile {name[:40]!r}; choose from {list(PROFILES)}")
        if i == 0:
            if where:
                raise ValueError(f"the first profile applies from the start: drop @{where[:40]}")
            segments.append((0, PROFILES[name]))
            continue
        u, _, n = where.partition("=")
        # ASCII digits only: str.isdigit() also takes '٣' (which int() reads as 3) and '²'
        if u not in SCHEDULE_UNITS or not (n.isascii() and n.isdigit()) or len(n) > 9:
            raise ValueError(f"{part[:60]!r}: give PROFILE@epoch=N or PROFILE@step=N")
        if unit is not None and u != unit:
            raise ValueError("use one unit (epoch or step) for the whole schedule")
        unit = u
        if int(n) <= segments[-1][0]:
            raise ValueError(f"{part[:60]!r}: positions must increase, starting above 0")
        segments.append((int(n), PROFILES[name]))
    return LinkSchedule(unit or "step", tuple(segments))


def exposed_wait(link: str, virtual: bool) -> str:
    """What a run's exposed sync waited on, named from its link (the summary's `link`: a
    profile, a schedule's text, or 'custom') and its clock. With no link emulated there is no
    network to wait on: the time is workers waiting on each other (a slower rank, shared cores),
    and calling it "the network" misleads (docs/design.md §5 and §4: the link is emulated or
    modelled)."""
    if virtual:
        return "the modelled link"
    try:
        ideal = parse_schedule(link).is_ideal
    except ValueError:  # 'custom' (overridden numbers) or an unknown name: a link was set
        ideal = False
    return "peers (no link emulated)" if ideal else "the network"


def resolve_profile(
    name: str,
    rtt_ms: float | None = None,
    bandwidth_gbps: float | None = None,
    jitter_ms: float | None = None,
) -> LinkProfile:
    """A named profile with any of its three numbers overridden ('custom' once overridden)."""
    base = PROFILES[name]
    if rtt_ms is None and bandwidth_gbps is None and jitter_ms is None:
        return base
    return LinkProfile(
        "custom",
        base.rtt_ms if rtt_ms is None else rtt_ms,
        base.bandwidth_gbps if bandwidth_gbps is None else bandwidth_gbps,
        base.jitter_ms if jitter_ms is None else jitter_ms,
    )


class LinkClock:
    """One rank's model of the shared link. Every rank issues the same collectives in the same
    order and draws jitter from the same seed, so all ranks model the same completion times."""

    def __init__(self, profile: LinkProfile | LinkSchedule, world_size: int, seed: int) -> None:
        self.schedule = profile if isinstance(profile, LinkSchedule) else static_schedule(profile)
        self.profile = self.schedule.segments[0][1]  # the profile in force now
        self.world_size = world_size
        self._rng = random.Random(seed)
        self._link_free = 0.0
        self._lock = threading.Lock()

    def move_to(self, step: int, epoch: int) -> LinkProfile:
        """The training position of the collectives issued from now on (a schedule's clock)."""
        if len(self.schedule.segments) > 1:
            with self._lock:
                self.profile = self.schedule.at(step, epoch)
        return self.profile

    def reserve(self, nbytes: int, quantized: bool = False) -> float:
        """Book the link for one collective issued now (an all-reduce of `nbytes`, or with
        `quantized` the two phases of a quantized all-reduce of a payload of `nbytes`, each with
        its own jitter); return its modelled completion time."""
        with self._lock:
            start = max(time.perf_counter(), self._link_free)
            duration = sum(
                self._jittered(s) for s in phases(self.profile, nbytes, self.world_size, quantized)
            )
            self._link_free = start + duration
            return self._link_free

    def _jittered(self, seconds: float) -> float:
        # every rank is in the same segment for the same collective: the draws stay aligned
        if self.profile.jitter_ms > 0:
            seconds += self._rng.uniform(0.0, self.profile.jitter_ms) / 1e3
        return seconds

    def reserve_when(self, reached, nbytes: int) -> Booking:
        """Book the link for an all-reduce of `nbytes` once the device reaches `reached` (a CUDA
        event recorded after the data's kernels): a comm hook runs when backward has *queued* a
        bucket's kernels, which the GPU may run tens of ms later, and a transfer cannot start
        before its data exists; booked at the hook, the host's lead would pass for link time.
        Booked on one thread in the order asked, the order every rank asks in, so the ranks'
        jitter draws stay aligned."""
        booking = Booking()

        def book() -> None:
            try:
                device = getattr(reached, "device", None)  # a CUDA event's (a test's has none)
                if device is not None and device.type == "cuda":
                    _use_device(device)
                reached.synchronize()
                deadline = self.reserve(nbytes)
            except BaseException as exc:  # noqa: BLE001 - whoever waits on the future gets it
                booking.settle(None, exc)
            else:
                booking.settle(deadline, None)

        _get_in_order().put(book)
        return booking

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.setstate(state["rng"])


# A sleep wakes late: about 0.2 ms past its deadline at the median on this project's 2-core VM
# (the kernel's timer slack and the hypervisor's timer; `python -m benchmarks.link_hold`), 1% of
# a WAN boundary's T and a fifth of the 5% the link's fidelity goal allows (`autok bench --only i`).
# So a hold sleeps to HOLD_POLL before its deadline and polls the clock for the rest, yielding the
# core at every turn to whatever else is runnable on it (another rank, the loop's own thread).
HOLD_POLL = 0.0004
_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))  # Unix; elsewhere a 0 sleep


def hold_until(deadline: float) -> None:
    """Return at `deadline` (a perf_counter time), within microseconds where the core is free."""
    remaining = deadline - time.perf_counter()
    if remaining > HOLD_POLL:
        time.sleep(remaining - HOLD_POLL)
    while time.perf_counter() < deadline:
        _yield()


_thread = threading.local()  # the CUDA device each of the link's threads has made current


def _use_device(device: torch.device) -> None:
    """Make `device` this thread's CUDA device, once per thread: a CUDA call on a thread that
    has none current makes a context on device 0 (hundreds of MB) in a rank that runs on
    another. The link's own threads (booking, releaser) are not the rank's main thread."""
    if getattr(_thread, "device", None) != device:
        import torch

        torch.cuda.set_device(device)
        _thread.device = device


class _Releaser:
    """One daemon thread that completes futures at their deadlines.

    A DDP comm hook must not sleep: its callback may run inline on the autograd thread and would
    stall backward compute, which is exactly the overlap the emulator must keep real.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, torch.futures.Future, Any]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._streams: dict = {}  # CUDA device -> the side stream futures are completed on
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="autok-link", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and wait for it (at exit; see EXIT_JOIN_SECONDS). Futures still held
        are dropped: the interpreter is going and no one waits for them."""
        if not self._thread.is_alive():  # (a forked child's copy: its lock may be held for ever)
            return
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=EXIT_JOIN_SECONDS)

    def release_at(
        self, deadline: float, fut: torch.futures.Future, value: Any, ready=None
    ) -> None:
        """Complete `fut` with `value` at `deadline`; `ready` is a CUDA event that the value's
        producer recorded (the device stream of whoever consumes `fut` must wait for it)."""
        with self._cv:
            heapq.heappush(self._heap, (deadline, next(self._seq), fut, (value, ready)))
            self._cv.notify()

    def _hand_over(self, fut: torch.futures.Future, value: Any, ready) -> None:
        """Complete a CUDA-aware `fut` once the device has run the collective (`ready`).

        set_result records the value's readiness on this thread's current stream, which a
        consumer's stream waits for when it takes the value. That stream must wait for the
        collective first (on the device, not here on the host), and it must be a side stream of
        this thread's own: were it the device's default stream, where the training loop runs,
        every kernel queued after the release would wait for the real collective too, and a
        delayed averaging would serialise the local steps behind it."""
        import torch

        stream = self._streams.get(ready.device)
        if stream is None:  # (only this thread reads or writes _streams)
            stream = self._streams[ready.device] = torch.cuda.Stream(ready.device)
        _use_device(ready.device)  # leaving the stream context restores a stream, and its device
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            fut.set_result(value)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                deadline, _, fut, value = self._heap[0]
                delay = deadline - time.perf_counter()
                if delay > HOLD_POLL:  # asleep: a new, earlier deadline wakes it (notify)
                    self._cv.wait(timeout=delay - HOLD_POLL)
                    continue
                if delay <= 0:
                    heapq.heappop(self._heap)
            if delay > 0:  # the last HOLD_POLL: polled outside the lock, then the heap again
                hold_until(deadline)
                continue
            value, ready = value
            try:
                if isinstance(value, BaseException):
                    fut.set_exception(value)
                    continue
                if ready is not None:
                    self._hand_over(fut, value, ready)
                    continue
                fut.set_result(value)
            except BaseException as exc:  # noqa: BLE001 - this thread must outlive any one future
                # Whoever waits on `fut` gets the error; a dead releaser would hang every
                # later collective silently.
                if not fut.done():
                    fut.set_exception(exc)


class Booking:
    """A link reservation made on the booking thread (LinkClock.reserve_when): its deadline, or
    the error that stopped it, once that thread has run it; and what to run then."""

    __slots__ = ("deadline", "error", "_lock", "_then")

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._then = None

    def settle(self, deadline: float | None, error: BaseException | None) -> None:
        with self._lock:
            self.deadline, self.error = deadline, error
            then, self._then = self._then, None
        if then is not None:
            then()

    def then(self, job) -> None:
        """Run `job` once booked: now if it is, else on the booking thread when it is (its own
        booking only: a release never waits for a later bucket's)."""
        with self._lock:
            if self.deadline is None and self.error is None:
                self._then = job
                return
        job()


class _InOrder:
    """One daemon thread that runs jobs one at a time in the order they were put."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="autok-link-booking", daemon=True)
        self._thread.start()

    def put(self, job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """End the thread once the jobs already put have run, and wait for it (at exit)."""
        if not self._thread.is_alive():
            return
        self._jobs.put(None)
        self._thread.join(timeout=EXIT_JOIN_SECONDS)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()  # each job delivers its own errors to its waiter
            except BaseException:  # noqa: BLE001 - a dead thread would hang every later booking
                traceback.print_exc()


_releaser: _Releaser | None = None
_in_order: _InOrder | None = None
_threads_lock = threading.Lock()

# The link's threads are daemons (a run must never hang at exit for them), but each is stopped
# and joined at exit, before the interpreter finalizes. A daemon thread still inside a torch call
# that released the GIL then (Future.set_result and the callbacks it runs, on either thread) is
# killed by Python 3.11 with pthread_exit as it takes the GIL back; the unwind meets a noexcept
# C++ frame and the process aborts ("terminate called without an active exception"), after a
# run that had succeeded. atexit handlers run after the main thread's last statement, while the
# daemons still run: the join lets the thread leave torch and return. Bounded, so that a
# callback that never returns costs EXIT_JOIN_SECONDS at exit (per thread), not a hang.
EXIT_JOIN_SECONDS = 10.0


def _forget_threads() -> None:
    """In a forked child: the parent's threads are not there; the first use starts its own."""
    global _releaser, _in_order, _threads_lock
    _releaser = _in_order = None
    _threads_lock = threading.Lock()  # (perhaps held, at the fork, by a thread now gone)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_threads)


def _get_in_order() -> _InOrder:
    global _in_order
    if _in_order is not None:  # (every bucket on a GPU asks: no lock once it runs)
        return _in_order
    with _threads_lock:  # a comm hook may ask first from autograd's thread
        if _in_order is None:
            _in_order = _InOrder()
            atexit.register(_in_order.stop)
        return _in_order


def _get_releaser() -> _Releaser:
    global _releaser
    if _releaser is not None:  # (every bucket asks: no lock once it runs)
        return _releaser
    with _threads_lock:  # one thread, whichever thread asks first
        if _releaser is None:
            _releaser = _Releaser()
            atexit.register(_releaser.stop)
        return _releaser


def delayed(
    fut: torch.futures.Future,
    deadline: float | Booking,
    pick=lambda v: v,
    device: torch.device | None = None,
) -> torch.futures.Future:
    """A future that resolves to pick(fut.value()) once fut is done AND deadline has passed. A
    Booking's deadline is awaited first: the release is put once that booking is made. A failed
    collective's error is delivered at once, whatever the deadline.

    With a CUDA `device` the returned future is CUDA-aware (DDP requires that of a comm hook's
    future, and completing a device-less future with CUDA tensors fails): the value is handed
    over with an event, so consumers' streams wait for the real collective."""
    import torch

    cuda = device is not None and device.type == "cuda"
    out: torch.futures.Future = torch.futures.Future(
        devices=[device] if cuda and device is not None else None
    )
    releaser = _get_releaser()

    def _on_done(f: torch.futures.Future) -> None:
        ready = None
        try:
            value = pick(f.value())  # on a GPU: this thread's stream now waits for the work
            if cuda:
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(device))
        except Exception as exc:  # surface collective errors to whoever waits on `out`
            value = exc.with_traceback(None)  # (its traceback: handoff.hand_callback)
        if isinstance(value, BaseException):  # a failed collective: its error, at once
            releaser.release_at(0.0, out, value, None)
        elif not isinstance(deadline, Booking):
            releaser.release_at(deadline, out, value, ready)
        else:
            deadline.then(lambda: _release_booked(releaser, deadline, out, value, ready))

    fut.add_done_callback(hand_callback(_on_done))  # (gloo's thread drops it after the run)
    return out


def _release_booked(releaser: _Releaser, booking: Booking, out, value, ready) -> None:
    if booking.error is not None:  # the device failed before the data existed: that error
        releaser.release_at(0.0, out, booking.error, None)
    else:
        # settled without an error: a deadline (Booking.then runs only once settled)
        assert booking.deadline is not None
        releaser.release_at(booking.deadline, out, value, ready)


def allreduce_sum_(
    tensor: torch.Tensor, clock: LinkClock | None, group: dist.ProcessGroup | None = None
) -> float:
    """Blocking SUM all-reduce in place, held until the modelled link time; returns wall time."""
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    deadline = clock.reserve(tensor.numel() * tensor.element_size()) if clock else 0.0
    hand(tensor)  # the backend's thread may drop it after this returns (handoff.py)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    hold_until(deadline)
    return time.perf_counter() - t0


def __getattr__(name: str) -> Any:
    """`autok.trainer.engine.link.torch` and `autok.trainer.engine.link.dist` as before the imports
    became lazy."""
    if name in ("torch", "dist"):
        import torch
        import torch.distributed

        return torch if name == "torch" else torch.distributed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
