"""The DiLoCo family against today's cpdp and DDP (`autok bench --only diloco`).

On the emulated `wan`, world 2, one seed, two workloads:

- mnist1d: ddp; cpdp K=4 (today's default: fused boundary, SlowMo 0.3); localsgd/cpdp K=4 with
  --compress none|fp16|int8 and DiLoCo's outer Nesterov; localsgd K=8 with --fragments 1|4 and
  --compress none|fp16|int8, and F = 4 with --fragment-delay 1;
- the tiny GPT task (examples.tiny_gpt:short_task, AdamW 3e-3, batch 16, as the controller
  panel runs it): ddp; cpdp K=8 (today); localsgd K=8 plain, with SlowMo and with DiLoCo's outer
  Nesterov; localsgd K=8 F=4 (fp32, int8, and int8 with Nesterov).

Per run: bytes per boundary (what one rank puts on the wire for the averaging, plus the gradient
buckets of a two-phase boundary; median after warmup), the peak bytes per sync between epoch
ends (with F = 4: the peak over fragment syncs) and the size of a whole-model sync (epoch ends
always sync the whole model, whatever F), training wall-clock, exposed sync, and the final
quality (accuracy on mnist1d; validation loss and perplexity on the GPT task).
Then the scaling of the averaging's collective with N (`scaling`): bytes each rank sends and the
link model's time for a 124M-parameter model on `wan`, fp32 ring all-reduce against int8's
quantized all-reduce (and the all-gather it replaced), counted on real gloo at N = 2, 4, 8 and
from the link model at N = 64, 512. Writes benchmarks/results/diloco.{json,md}.
"""

from __future__ import annotations

import json
import statistics

from autok.config import TrainConfig
from autok.launch import run_workers
from autok.trainer.engine.compress import Layout
from autok.trainer.engine.link import PROFILES
from benchmarks.engine import RESULTS, _run, machine

COMMAND = "autok bench --only diloco"
WORLD = 2
SEED = 0
INT8_GOAL = 0.27  # the goal: int8 carries at most this share of fp32's bytes
MNIST = dict(link="wan", epochs=3, warmup_epochs=1, mnist1d_samples=2000, seed=SEED)
# The controller panel's GPT workload (experiments/controller-panel.yaml, `gpt`).
GPT = dict(
    task="examples.tiny_gpt:short_task",
    optimizer="adamw",
    lr=0.003,
    batch_size=16,
    link="wan",
    epochs=6,
    warmup_epochs=0,
    seed=SEED,
)

K8 = dict(strategy="localsgd", sync_period=8)
F4 = dict(K8, fragments=4)
NESTEROV = dict(outer_optimizer="nesterov")
MNIST_CASES: dict[str, dict] = {
    "ddp": dict(strategy="ddp"),
    # fused named on both: --boundary auto keeps two-phase under --compress (the gradients'
    # all-reduce stays fp32), so only the named fused twin compares one collective with one
    "cpdp K=4 (today)": dict(strategy="cpdp", sync_period=4, boundary="fused"),
    "cpdp K=4 int8": dict(strategy="cpdp", sync_period=4, compress="int8", boundary="fused"),
    "localsgd K=4": dict(strategy="localsgd", sync_period=4),
    "localsgd K=4 fp16": dict(strategy="localsgd", sync_period=4, compress="fp16"),
    "localsgd K=4 int8": dict(strategy="localsgd", sync_period=4, compress="int8"),
    "localsgd K=4 nesterov (DiLoCo)": dict(strategy="localsgd", sync_period=4, **NESTEROV),
    "localsgd K=4 nesterov int8": dict(
        strategy="localsgd", sync_period=4, compress="int8", **NESTEROV
    ),
    "localsgd K=8": K8,
    "localsgd K=8 fp16": dict(K8, compress="fp16"),
    "localsgd K=8 int8": dict(K8, compress="int8"),
    "localsgd K=8 F=4": F4,
    "localsgd K=8 F=4 fp16": dict(F4, compress="fp16"),
    "localsgd K=8 F=4 int8": dict(F4, compress="int8"),
    "localsgd K=8 F=4 τ=1": dict(F4, fragment_delay=1),
}
GPT_CASES: dict[str, dict] = {
    "ddp": dict(strategy="ddp"),
    "cpdp K=8 (today)": dict(strategy="cpdp", sync_period=8),
    "localsgd K=8": K8,
    "localsgd K=8 SlowMo": dict(K8, slowmo_beta=0.3),
    "localsgd K=8 nesterov (DiLoCo)": dict(K8, **NESTEROV),
    "localsgd K=8 F=4": F4,
    "localsgd K=8 F=4 int8": dict(F4, compress="int8"),
    "localsgd K=8 F=4 int8 nesterov": dict(F4, compress="int8", **NESTEROV),
}
WORKLOADS = {"mnist1d": (MNIST, MNIST_CASES), "gpt": (GPT, GPT_CASES)}
INNER = ("optimizer", "lr", "momentum", "weight_decay", "batch_size", "lr_schedule")

# The runs the text compares (names above).
F1, F4_NAME, TAU1 = "localsgd K=8", "localsgd K=8 F=4", "localsgd K=8 F=4 τ=1"
SLOWMO, DILOCO = "localsgd K=8 SlowMo", "localsgd K=8 nesterov (DiLoCo)"


def outer_of(settings: dict, options: dict) -> dict:
    """The resolved outer step of a case: kind ("average" where θ_new = θ_avg), α and μ."""
    if options.get("strategy") == "ddp":
        return {"kind": "none", "lr": None, "momentum": None}
    o = TrainConfig(workers=WORLD, progress=False, **settings, **options).outer
    kind = "average" if o.is_plain_average else o.kind
    return {"kind": kind, "lr": o.lr, "momentum": o.momentum}


def measure(res: dict, warmup: int) -> dict:
    """One run's row: bytes from its boundary records after warmup, the rest from its summary.

    The last boundary of each epoch is its end, a whole-model sync whatever F; the peak per sync
    is taken over the others (with F > 1: the fragment syncs)."""
    records = res["records"]
    last = {}
    for r in records:
        last[r.epoch] = max(last.get(r.epoch, -1), r.boundary)
    after = [r for r in records if r.epoch >= warmup]
    periodic = [r.bytes_communicated for r in after if r.boundary != last[r.epoch]]
    whole = [r.bytes_communicated for r in after if r.fragment < 0]
    s = res["summary"]
    row = {
        "bytes_per_boundary": statistics.median(r.bytes_communicated for r in after),
        "peak_bytes_per_sync": max(periodic or whole),
        "whole_model_sync_bytes": max(whole),
        "fragment_syncs": sum(1 for r in after if r.fragment >= 0),
        "whole_model_syncs": len(whole),
        "boundaries": s["boundaries"],
        "wall_seconds": s["wall_seconds"],
        "exposed_sync_seconds": s["exposed_sync_seconds"],
        "metric": s["metric"],
        "final_test_metric": s["final_test_metric"],
        "peak_test_metric": s["peak_test_metric"],
    }
    losses = [r["test_loss"] for r in res["rows"] if "test_loss" in r]
    if losses:  # a task judged by another metric reports its validation loss beside it
        row |= {"final_test_loss": losses[-1], "best_test_loss": min(losses)}
    return row


# The scaling table: GPT-2 small's parameters on the study's link; the tail of float32 statistics
# every averaging carries; the world sizes counted on gloo and those from the link model only.
SCALING_PARAMS = 124_000_000
SCALING_TAIL = 12
SCALING_MEASURED = (2, 4, 8)
SCALING_MODELLED = (64, 512)
SCALING_SAMPLE = 1 << 20  # the parameters actually all-reduced on gloo (bytes scale linearly)


def _count_worker(rank: int, world: int, n: int, tail: int) -> dict:
    """The bytes this rank sends in one fp32 all-reduce and one int8 quantized all-reduce of
    n + tail values, counted at the collectives: an all-reduce's ring sends 2(N − 1)/N of its
    buffer, an all-to-all (N − 1)/N of its input, an all-gather its input to N − 1 peers."""
    import torch
    import torch.distributed as dist

    from autok.trainer.engine.compress import Buffers, quantized_allreduce_

    sent = {"none": 0, "int8": 0}
    buf = torch.randn(n + tail, generator=torch.Generator().manual_seed(rank)) * 1e-3
    sent["none"] = int(2 * (world - 1) / world * buf.numel() * 4)
    dist.all_reduce(buf.clone())
    layout = Layout("int8", (n,), tail, world)
    mem = Buffers(layout, buf.device)
    real_a2a, real_gather = dist.all_to_all_single, dist.all_gather
    try:

        def a2a(out, inp, *a, **k):
            sent["int8"] += (world - 1) * inp.numel() // world
            return real_a2a(out, inp, *a, **k)

        def gather(outs, inp, *a, **k):
            sent["int8"] += (world - 1) * inp.numel()
            return real_gather(outs, inp, *a, **k)

        dist.all_to_all_single, dist.all_gather = a2a, gather
        quantized_allreduce_(buf, layout, mem, rank, torch.zeros(n), torch.zeros(n))
    finally:
        dist.all_to_all_single, dist.all_gather = real_a2a, real_gather
    return sent


def _scaling_row(world: int, counted: dict | None) -> dict:
    """Bytes each rank sends per averaging for the 124M-parameter model, and the link model's
    time: counted at the collectives (scaled from SCALING_SAMPLE parameters) or from the plan."""
    wan = PROFILES["wan"]
    fp32 = 4 * (SCALING_PARAMS + SCALING_TAIL)
    p = Layout("int8", (SCALING_PARAMS,), SCALING_TAIL, world).nbytes
    share = 2 * (world - 1) / world
    row = {
        "world_size": world,
        "source": "counted on gloo" if counted else "link model",
        "fp32_bytes_per_rank": share * fp32,
        "int8_bytes_per_rank": share * p,
        "allgather_bytes_per_rank": (world - 1) * p,  # the all-gather int8 used before
        "fp32_seconds": wan.allreduce_seconds(fp32, world),
        "int8_seconds": wan.quantized_allreduce_seconds(p, world),
        "allgather_seconds": wan.allgather_seconds(p, world),
        "allgather_receive_buffer_bytes": world * p,
    }
    if counted:
        scale = SCALING_PARAMS / SCALING_SAMPLE
        row["fp32_bytes_per_rank"] = counted["none"] * scale
        row["int8_bytes_per_rank"] = counted["int8"] * scale
    return row


def scaling() -> list[dict]:
    """The averaging's bytes per rank and modelled time against N (docs/design.md §7)."""
    rows = []
    for world in SCALING_MEASURED:
        counted = run_workers(_count_worker, world, SCALING_SAMPLE, SCALING_TAIL)
        worst = {k: max(c[k] for c in counted) for k in ("none", "int8")}
        rows.append(_scaling_row(world, worst))
    return rows + [_scaling_row(world, None) for world in SCALING_MODELLED]


def scaling_table(rows: list[dict]) -> list[str]:
    head = [
        "N",
        "source",
        "fp32 MB / rank",
        "int8 MB / rank",
        "int8 / fp32",
        "fp32 s",
        "int8 s",
        "int8 all-gather (before) MB / rank",
        "its s",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            str(r["world_size"]),
            r["source"],
            f"{r['fp32_bytes_per_rank'] / 1e6:.0f}",
            f"{r['int8_bytes_per_rank'] / 1e6:.0f}",
            f"{r['int8_bytes_per_rank'] / r['fp32_bytes_per_rank']:.3f}",
            f"{r['fp32_seconds']:.2f}",
            f"{r['int8_seconds']:.2f}",
            f"{r['allgather_bytes_per_rank'] / 1e6:.0f}",
            f"{r['allgather_seconds']:.2f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def diloco(world: int = WORLD) -> dict:
    out: dict = {
        "world_size": world,
        "command": COMMAND,
        "int8_goal": INT8_GOAL,
        "workloads": {},
    }
    for workload, (settings, cases) in WORKLOADS.items():
        cfg = TrainConfig(workers=world, progress=False, **settings)
        inner = {k: getattr(cfg, k) for k in INNER}
        runs, steps = {}, None
        for name, options in cases.items():
            res = _run(world, **settings, **options)
            runs[name] = {"options": options, "outer": outer_of(settings, options)}
            runs[name] |= measure(res, settings["warmup_epochs"])
            steps = res["steps"]
        out["workloads"][workload] = {
            "settings": settings,
            "inner": inner,
            "steps_per_epoch": steps,
            "runs": runs,
        }
    out["scaling"] = scaling()
    return out


# ----- rendering (pure: a results dict in, markdown out) ------------------------------------------


def reference(runs: dict, name: str, drop: tuple[str, ...]) -> str | None:
    """The run whose options are `name`'s without the keys `drop` (None if there is none, or if
    `name` has none of them)."""
    options = runs[name]["options"]
    if not any(k in options for k in drop):
        return None
    want = {k: v for k, v in options.items() if k not in drop}
    for other, r in runs.items():
        if r["options"] == want:
            return other
    return None


def ratio(runs: dict, name: str, key: str, drop: tuple[str, ...]) -> float | None:
    """runs[name][key] over the same field of its reference run (see `reference`)."""
    ref = reference(runs, name, drop)
    return None if ref is None else runs[name][key] / runs[ref][key]


COMPRESS = ("compress",)
FRAGMENTS = ("fragments", "fragment_delay")


def _f(x: float | None, spec: str = ".3f") -> str:
    return "" if x is None else format(x, spec)


def _outer(o: dict, kind: bool = True) -> str:
    if o["kind"] in ("none", "average"):
        return o["kind"] if o["kind"] == "average" else ""
    return (f"{o['kind']} " if kind else "") + f"(α {o['lr']:g}, μ {o['momentum']:g})"


def _quality(r: dict) -> list[str]:
    if "final_test_loss" in r:
        return [f"{r['final_test_loss']:.4f}", f"{r['best_test_loss']:.4f}"]
    return [f"{r['final_test_metric']:.3f}", f"{r['peak_test_metric']:.3f}"]


def table(runs: dict, vs_ddp: bool) -> list[str]:
    ddp = runs.get("ddp")
    first = next(iter(runs.values()))
    if "final_test_loss" in first:
        name = first["metric"]["name"]
        quality = ["final val loss", "best val loss", f"final {name}"]
    else:
        quality = ["final acc", "peak acc"]
    head = [
        "run",
        "outer",
        "bytes / boundary",
        "peak bytes / sync",
        "vs F=1",
        "whole-model sync bytes",
        "vs fp32",
        "fragment syncs",
        "boundaries",
        "wall s",
        *(["vs ddp"] if vs_ddp else []),
        "exposed sync s",
        *quality,
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in runs.items():
        cells = [
            name,
            _outer(r["outer"]),
            f"{r['bytes_per_boundary']:.0f}",
            f"{r['peak_bytes_per_sync']:.0f}",
            _f(ratio(runs, name, "peak_bytes_per_sync", FRAGMENTS)),
            f"{r['whole_model_sync_bytes']:.0f}",
            _f(ratio(runs, name, "bytes_per_boundary", COMPRESS)),
            str(r["fragment_syncs"]),
            str(r["boundaries"]),
            f"{r['wall_seconds']:.1f}",
        ]
        if vs_ddp:
            cells.append(_f(r["wall_seconds"] / ddp["wall_seconds"]) if ddp else "")
        cells.append(f"{r['exposed_sync_seconds']:.1f}")
        cells += _quality(r)
        if "final_test_loss" in r:
            cells.append(f"{r['final_test_metric']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def int8_ratios(runs: dict) -> dict[str, float]:
    """Each int8 run's bytes per boundary over its fp32 twin's."""
    out = {}
    for name, r in runs.items():
        if r["options"].get("compress") == "int8":
            x = ratio(runs, name, "bytes_per_boundary", COMPRESS)
            if x is not None:
                out[name] = x
    return out


def _int8_sentence(runs: dict, goal: float) -> str:
    r8 = int8_ratios(runs)
    if not r8:
        return ""
    worst = max(r8, key=r8.get)
    verdict = "met" if r8[worst] <= goal else "not met"
    return (
        f"int8 carries at most {r8[worst]:.3f}x the bytes of its fp32 twin ({worst}; the goal "
        f"is <= {goal:g}x: {verdict}). "
    )


def _compare(a: float, b: float, lower_better: bool, unit: str) -> str:
    d = a - b
    if d == 0:
        return "the same as"
    better = (d < 0) == lower_better
    return f"{abs(d):.4f}{unit} {'better than' if better else 'worse than'}"


def _latency_sentence(runs: dict, f4: str) -> str:
    """Exposed sync of the F = 1 and F > 1 runs: F times as many syncs, each paying the RTT."""
    if F1 not in runs or f4 not in runs:
        return ""
    a, b = runs[F1], runs[f4]
    return (
        f"Exposed sync: {b['exposed_sync_seconds']:.2f} s with F = {b['options']['fragments']} "
        f"({b['boundaries']} boundaries) against {a['exposed_sync_seconds']:.2f} s with F = 1 "
        f"({a['boundaries']}): every sync pays the link's round trip, however small. "
    )


def mnist_text(w: dict, goal: float) -> list[str]:
    runs, s, inner = w["runs"], w["settings"], w["inner"]
    out = []
    if F1 in runs and F4_NAME in runs:
        f1, f4 = runs[F1], runs[F4_NAME]
        frags = f4["options"]["fragments"]
        k = f4["options"]["sync_period"]
        fall = f4["peak_bytes_per_sync"] / f1["peak_bytes_per_sync"]
        out.append(
            f"Fragments (K = {k}): the peak bytes per sync is {f4['peak_bytes_per_sync']:.0f} "
            f"with F = {frags} against {f1['peak_bytes_per_sync']:.0f} with F = 1, "
            f"{fall:.3f}x ({1 / fall:.2f}-fold lower; 1/F = {1 / frags:.3f}). That peak is over "
            f"the syncs between epoch ends ({f4['fragment_syncs']} fragment syncs after warmup); "
            f"the {f4['whole_model_syncs']} epoch-end syncs after warmup still move the whole "
            f"model ({f4['whole_model_sync_bytes']:.0f} bytes), so the peak over every boundary "
            "is the whole-model column. "
        )
        twins = []
        for n, r in runs.items():
            o = r["options"]
            if o.get("fragments") == frags and "compress" in o and "fragment_delay" not in o:
                x = ratio(runs, n, "peak_bytes_per_sync", FRAGMENTS)
                if x is not None:
                    twins.append(f"{o['compress']} {x:.3f}x")
        if twins:
            out.append(
                f"Compressed, the F = {frags} peak is " + ", ".join(twins) + " its F = 1 twin's. "
            )
        out.append(_latency_sentence(runs, F4_NAME))
    out.append(_int8_sentence(runs, goal))
    if TAU1 in runs and F4_NAME in runs:
        t, f4 = runs[TAU1], runs[F4_NAME]
        out.append(
            f"With --fragment-delay {t['options']['fragment_delay']} the exposed sync is "
            f"{t['exposed_sync_seconds']:.2f} s against {f4['exposed_sync_seconds']:.2f} s at "
            f"τ = 0, final accuracy {t['final_test_metric']:.3f} against "
            f"{f4['final_test_metric']:.3f}. "
        )
    base = "localsgd K=4"
    nest = "localsgd K=4 nesterov (DiLoCo)"
    if base in runs and nest in runs:
        o = runs[nest]["outer"]
        out.append(
            f"DiLoCo's outer defaults (α {o['lr']:g}, μ {o['momentum']:g}) over this inner "
            f"{inner['optimizer']} (momentum {inner['momentum']:g}) at "
            f"K = {runs[nest]['options']['sync_period']} reach a peak accuracy of "
            f"{runs[nest]['peak_test_metric']:.3f} against plain averaging's "
            f"{runs[base]['peak_test_metric']:.3f} in {s['epochs']} epochs; DiLoCo pairs them "
            "with inner AdamW (the GPT table below)."
        )
    return ["".join(out).strip()]


def gpt_text(w: dict, goal: float) -> list[str]:
    runs = w["runs"]
    out = []
    if "ddp" in runs:
        ddp = runs["ddp"]
        parts = [
            f"{n} {r['wall_seconds'] / ddp['wall_seconds']:.2f}x"
            for n, r in runs.items()
            if n != "ddp"
        ]
        out.append(
            f"Training wall-clock against ddp's {ddp['wall_seconds']:.1f} s: "
            + ", ".join(parts)
            + ". "
        )
        out.append(
            "Final validation loss (nats per byte): "
            + ", ".join(f"{n} {r['final_test_loss']:.4f}" for n, r in runs.items())
            + ". "
        )
    if SLOWMO in runs and DILOCO in runs:
        a, b = runs[DILOCO], runs[SLOWMO]
        out.append(
            f"DiLoCo's outer Nesterov {_outer(a['outer'], kind=False)} ends "
            f"{_compare(a['final_test_loss'], b['final_test_loss'], True, ' nats')} SlowMo "
            f"{_outer(b['outer'], kind=False)} on the final validation loss (perplexity "
            f"{a['final_test_metric']:.3f} against {b['final_test_metric']:.3f}). "
        )
    f4 = "localsgd K=8 F=4 int8"
    if f4 in runs and F1 in runs:
        r, ref = runs[f4], runs[F1]
        out.append(
            f"F = {r['options']['fragments']} with int8 moves "
            f"{r['peak_bytes_per_sync']:.0f} bytes at peak per sync against "
            f"{ref['peak_bytes_per_sync']:.0f} for fp32 F = 1 "
            f"({r['peak_bytes_per_sync'] / ref['peak_bytes_per_sync']:.3f}x). "
        )
    out.append(_latency_sentence(runs, F4_NAME))
    out.append(_int8_sentence(runs, goal))
    out.append(
        "One seed: run-to-run variation is not measured here, so small differences in loss "
        "are not resolved."
    )
    return ["".join(out).strip()]


def _inner(w: dict) -> str:
    i = w["inner"]
    mom = f" momentum {i['momentum']:g}," if i["optimizer"] == "sgd" else ""
    return (
        f"inner {i['optimizer']} lr {i['lr']:g} ({i['lr_schedule']}),{mom} weight decay "
        f"{i['weight_decay']:g}, batch {i['batch_size']} per worker"
    )


def _steps(w: dict) -> str:
    n = w.get("steps_per_epoch")
    return "" if n is None else f", {n} steps per epoch per rank"


def render(res: dict) -> str:
    m, d = res["machine"], res["diloco"]
    mn, gpt = d["workloads"].get("mnist1d"), d["workloads"].get("gpt")
    lines = [
        "# DiLoCo family: outer optimizers, compressed pseudo-gradients, streaming fragments",
        "",
        f"Machine: {m['cpus']} CPUs, {m['platform']}, torch {m['torch']}, {m['date']}",
        "",
        f"Command: `{d['command']}`, world {d['world_size']}, one run each. Bytes are what one "
        "rank sends per boundary, after warmup. *peak bytes / sync* is the peak over the syncs "
        "between epoch ends (with F > 1: the fragment syncs); every epoch end syncs the whole "
        "model, whose size is *whole-model sync bytes* (the peak over every boundary). *vs F=1*: "
        "the peak per sync over that of the same run with F = 1; *vs fp32*: bytes per boundary "
        "over the same run's with --compress none. A cpdp boundary also all-reduces the "
        "boundary step's gradients (in the same buffer when fused, SGD; a second collective when "
        "two-phase, AdamW), so its bytes count both.",
    ]
    if mn is not None:
        s = mn["settings"]
        lines += [
            "",
            f"## mnist1d ({s['mnist1d_samples']} samples)",
            "",
            f"Link `{s['link']}`, {_inner(mn)}, {s['epochs']} epochs "
            f"({s['warmup_epochs']} at K = 1){_steps(mn)}, seed {s['seed']}.",
            "",
            *table(mn["runs"], vs_ddp=False),
            "",
            *mnist_text(mn, d["int8_goal"]),
        ]
    if gpt is not None:
        s = gpt["settings"]
        lines += [
            "",
            f"## tiny GPT (`{s['task']}`)",
            "",
            f"Link `{s['link']}`, {_inner(gpt)}, {s['epochs']} epochs "
            f"({s['warmup_epochs']} at K = 1){_steps(gpt)}, seed {s['seed']}. Validation loss "
            "is the mean next-byte NLL on the held-out text (log perplexity).",
            "",
            *table(gpt["runs"], vs_ddp=True),
            "",
            *gpt_text(gpt, d["int8_goal"]),
        ]
    if d.get("scaling"):
        lines += ["", *scaling_text(d["scaling"])]
    return "\n".join(lines) + "\n"


def scaling_text(rows: list[dict]) -> list[str]:
    return [
        "## The averaging's collective against N (124M parameters, `wan`)",
        "",
        "Bytes each rank sends per averaging (and receives: the same), and the link model's time "
        "for it, on `wan` (16.6 ms, 1 Gbit/s): fp32's ring all-reduce, int8's quantized "
        "all-reduce (all-to-all, reduce in fp32, requantize, all-gather), and the all-gather "
        "of every rank's int8 payload that int8 used before. Counted at the collectives on gloo "
        f"for {SCALING_SAMPLE} parameters and scaled, or from the plan and the link model.",
        "",
        *scaling_table(rows),
    ]


def main() -> dict:
    res = {"machine": machine(), "diloco": diloco()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "diloco.json").write_text(json.dumps(res, indent=2) + "\n")
    text = render(res)
    (RESULTS / "diloco.md").write_text(text)
    print(text)
    return res
