#!/usr/bin/env bash
# GPU/NCCL check: run on a machine with at least one CUDA device, from the repository root:
#   bash benchmarks/gpu_check.sh            (about 3 minutes on one GPU)
# It installs nothing beyond `make`'s set-up (.venv) and prints one line per check:
# PASS/FAIL/SKIP, the job and what was checked. Exit status: the number of failed checks.
# What it exercises that CPU tests cannot: collectives on the rank's device under NCCL, the link
# emulator's CUDA-aware futures in DDP's comm hook, CUDA-event timing of a step's parts and of
# backward vs the wait (autok.trainer.engine.profiler.DeviceMarks), and the loop's sums kept on the device.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/autok ] || make -s .venv/.installed-stamp >/dev/null || { echo "FAIL setup: make"; exit 1; }
py=.venv/bin/python
gpus=$($py -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -lt 1 ]; then echo "SKIP all: no CUDA device"; exit 0; fi
out=$(mktemp -d /tmp/autok-gpu-check.XXXX)
fails=0
job=(--dataset mnist1d --mnist1d-samples 2000 --epochs 2 --batch-size 64 --backend nccl --no-progress)

check() {  # check NAME WORKERS LINK ARGS...: train, then verify replicas and times
    local name=$1 workers=$2 link=$3; shift 3
    local dir="$out/$name-w$workers-$link"
    if ! timeout 240 .venv/bin/autok train "${job[@]}" --workers "$workers" --link "$link" \
            "$@" --out "$dir" >"$dir.log" 2>&1; then
        echo "FAIL $name workers=$workers link=$link: $(tail -n 1 "$dir.log")"
        fails=$((fails + 1)); return
    fi
    if line=$($py - "$dir" "$workers" "$link" <<'PY'
import csv, json, sys
from pathlib import Path
from autok.trainer.engine.link import PROFILES
d, n, link = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = json.loads((d / "summary.json").read_text())
rows = list(csv.DictReader((d / "epochs.csv").open()))
bad = []
if len(set(s["param_digest_per_rank"])) != 1 or len(s["param_digest_per_rank"]) != n:
    bad.append(f"replicas differ {s['param_digest_per_rank']}")
for r in rows:
    f, b, sy, e = (float(r[k]) for k in
                   ("forward_seconds", "backward_seconds", "sync_seconds", "epoch_seconds"))
    if min(f, b, sy) < 0 or f + b + sy > e * 1.02 or b <= 0:
        bad.append(f"epoch {r['epoch']}: forward {f:.3f} + backward {b:.3f} + sync {sy:.3f} "
                   f"vs epoch {e:.3f}")
    # summed on the device and read at the epoch's end (trainer/loop/run.py)
    loss, acc = float(r["train_loss"]), float(r["train_accuracy"])
    if not (0 < loss < 100 and 0 < acc <= 1):
        bad.append(f"epoch {r['epoch']}: train loss {loss} or accuracy {acc} out of range")
if s["compute_seconds"] + s["exposed_sync_seconds"] > s["wall_seconds"] * 1.02:
    bad.append("compute + exposed sync exceed the wall-clock")
# on an emulated link every boundary waits at least the modelled latency
steps = sum(1 for _ in (d / "boundaries.jsonl").open())
floor = PROFILES[link].allreduce_seconds(0, n) * steps * 0.9
if s["exposed_sync_seconds"] < floor:
    bad.append(f"exposed sync {s['exposed_sync_seconds']:.3f} s below the link's {floor:.3f} s")
print("; ".join(bad) if bad else
      f"replicas agree, times add up (compute {s['compute_seconds']:.2f} s, exposed "
      f"{s['exposed_sync_seconds']:.2f} s, wall {s['wall_seconds']:.2f} s, "
      f"acc {s['final_test_accuracy']:.3f})")
sys.exit(1 if bad else 0)
PY
    ); then
        echo "PASS $name workers=$workers link=$link: $line"
    else
        echo "FAIL $name workers=$workers link=$link: $line"; fails=$((fails + 1))
    fi
}

# The pieces CPU tests cannot reach, checked directly on the device.
if line=$($py - <<'PY'
import time

import torch

from autok.trainer.engine.grad_hook import GradSyncState
from autok.trainer.engine.link import delayed

dev = torch.device("cuda", 0)
bad = []
# 1. a link-delayed future completed with CUDA tensors produced on a side stream
side = torch.cuda.Stream(dev)
x = torch.ones(1 << 22, device=dev)
with torch.cuda.stream(side):
    y = (x * 2).sqrt()
    src = torch.futures.Future(devices=[dev])
    src.set_result(y)
t0 = time.perf_counter()
v = delayed(src, t0 + 0.05, device=dev).wait()
held = time.perf_counter() - t0
if held < 0.05 or not torch.allclose(v, torch.full_like(v, 2**0.5)):
    bad.append(f"delayed future: held {held * 1e3:.1f} ms, value ok={torch.allclose(v, y)}")
# 2. exposed wait measured by CUDA events: a known device-side wait after "the last bucket"
state = GradSyncState(world_size=1, clock=None)
torch.cuda.synchronize(dev)
t1 = time.perf_counter()
state.last_ready = time.perf_counter()
state.last_ready_event = torch.cuda.Event(enable_timing=True)
state.last_ready_event.record()
torch.cuda._sleep(int(50e6))  # tens of ms of device time: the "network" wait
torch.cuda.synchronize(dev)
t2 = time.perf_counter()
wait = state.exposed_wait(t1, t2)
if wait is None or not 0.005 < wait <= t2 - t1:
    bad.append(f"exposed wait {wait} not within (5 ms, {t2 - t1:.3f} s]")
# 3. a bucket's link booking starts when the device reaches its gradients, not when queued
from autok.trainer.engine.link import PROFILES, LinkClock

clock = LinkClock(PROFILES["wan"], world_size=2, seed=0)
torch.cuda._sleep(int(50e6))  # the gradients' kernels, still running when the hook asks
ready = torch.cuda.Event()
ready.record()
asked = time.perf_counter()
booking = clock.reserve_when(ready, 1 << 20)
src = torch.futures.Future(devices=[dev])
src.set_result(x)
delayed(src, booking, device=dev).wait()
lead = booking.deadline - asked - PROFILES["wan"].allreduce_seconds(1 << 20, 2)
if lead < 0.005:
    bad.append(f"link booked {lead * 1e3:.1f} ms after the hook asked; the device had ~25 ms left")
# 4. a released future does not stall the default stream (where the loop's steps run) behind
# the collective: only whoever takes the value waits for it
torch.cuda.synchronize(dev)
with torch.cuda.stream(side):
    torch.cuda._sleep(int(200e6))  # the "collective", ~100 ms of device time
    z = x + 1
    src = torch.futures.Future(devices=[dev])
    src.set_result(z)
out = delayed(src, time.perf_counter(), device=dev)
while not out.done():
    time.sleep(0.001)
step = torch.cuda.Event()
step.record()  # a local step's work, queued on the default stream after the release
t3 = time.perf_counter()
while not step.query() and time.perf_counter() - t3 < 5:
    pass
stalled = time.perf_counter() - t3
v4 = out.wait()  # the consumer's stream now waits for the collective
if stalled > 0.02:
    bad.append(f"default stream stalled {stalled * 1e3:.1f} ms behind a released collective")
if not torch.equal(v4, torch.full_like(v4, 2.0)):  # the consumer did not wait for the collective
    bad.append(f"released value wrong: {v4[:4].tolist()}")
print("; ".join(bad) if bad else f"link future held {held * 1e3:.0f} ms; event wait "
      f"{wait * 1e3:.1f} ms; booking waited {lead * 1e3:.1f} ms for the device; default "
      f"stream free {stalled * 1e3:.1f} ms after a release")
raise SystemExit(1 if bad else 0)
PY
); then echo "PASS cuda pieces: $line"; else echo "FAIL cuda pieces: $line"; fails=$((fails + 1)); fi

worlds=(1)
if [ "$gpus" -ge 2 ]; then worlds+=(2); else
    echo "SKIP 2-process jobs: one GPU (NCCL needs a device per rank)"; fi
for w in "${worlds[@]}"; do
    for link in none wan; do
        check ddp "$w" "$link" --strategy ddp
        check localsgd "$w" "$link" --strategy localsgd --sync-period 4
        check cpdp-fused "$w" "$link" --strategy cpdp --sync-period 4 --boundary fused
        check cpdp-two-phase "$w" "$link" --strategy cpdp --sync-period 4 --boundary two-phase
    done
done
echo "gpu_check: $fails failed; logs in $out"
exit "$fails"
