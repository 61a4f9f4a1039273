"""The flags of `autok bench` (benchmarks/engine.py), parsed without torch.

`autok bench --help` and a refused flag answer at once: the parser, the parts and the core list
live here, apart from the measurements, which import torch only once the flags are known good
(as `autok --help` does, README "Installing it elsewhere").
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.stats import MIN_ROUNDS

# --only's parts: the name of the function in benchmarks/engine.py that measures each, and what
# it measures (benchmarks/engine.py's docstring has the whole of each)
PARTS = {
    "a": "overhead",
    "g": "local_step",  # the per-step and per-boundary goals of the hot path
    "h": "boundary_fixed",
    "i": "link_fidelity",
    "b": "boundary_cost",
    "c": "wan_vs_ideal",
    "d": "scaling",
    "e": "overlap",
    "f": "wan",
    "job": "default_job",
    "diloco": "diloco",  # benchmarks/diloco.py: writes results/diloco.{json,md}
}
PART_HELP = {
    "a": "a ddp step under autok.Sync / a plain DDP step (goal <= 1.02)",
    "g": "a local step under autok.Sync / a hand-written no_sync() step (goal <= 1.02)",
    "h": "a boundary's sync time / one bare all_reduce of its buffer (goal <= 1.2)",
    "i": "exposed sync per boundary on wan / the modelled link time (goal <= 1.05)",
    "b": "exposed sync per cpdp K=4 boundary / per ddp step on a latency-bound link",
    "c": "cpdp K=4 / ddp training time on wan, beside the ideal",
    "d": "step time against world size and model size",
    "e": "exposed sync and accuracy with and without --overlap-boundary",
    "f": "the plain WAN comparison (4 workers, with warmup)",
    "job": "the default job (make train): wall-clock and peak accuracy",
    "diloco": "outer optimizers and compression against cpdp and ddp",
}
MAX_ROUNDS = 100
MAX_CPU_ID = 1 << 16


def all_cpus() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # macOS has no affinity
        return tuple(range(os.cpu_count() or 1))


def parse_cpus(text: str, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """'0-3,6' -> (0, 1, 2, 3, 6); ValueError with a one-line reason for anything else, or for
    a core this process may not run on (`allowed`)."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a core number or a range like 0-3") from None
        if not 0 <= a <= b < MAX_CPU_ID:
            raise ValueError(f"{part.strip()!r}: a range of cores is low-high with low <= high")
        cpus.update(range(a, b + 1))
    outside = sorted(cpus - set(allowed))
    if outside:
        raise ValueError(
            f"core {outside[0]} is not one this process may run on ({','.join(map(str, allowed))})"
        )
    return tuple(sorted(cpus))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line naming the flag, exit 2, as every autok command
        print(f"autok: error: {message}", file=sys.stderr)
        sys.exit(2)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(
        prog="autok bench",
        description="Engine measurements, side by side in one run, printed as ratios; writes "
        "benchmarks/results/engine.{json,md}.",
        epilog="parts (--only; benchmarks/engine.py's docstring says how each is measured):\n"
        + "\n".join(f"  {p:7} {PART_HELP[p]}" for p in PARTS),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # one line per part
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=MIN_ROUNDS,
        help=f"interleaved rounds for every ratio (a verdict needs at least {MIN_ROUNDS})",
    )
    ap.add_argument(
        "--cpus",
        default=None,
        help="cores the ranks of both sides are pinned to, e.g. 0-3 (default: all usable)",
    )
    ap.add_argument(
        "--only",
        default=",".join(PARTS),
        metavar="PART[,PART...]",
        help=f"comma-separated parts to run, from {{{','.join(PARTS)}}} (default: all; the "
        "parts are listed below)",
    )
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        ap.error(f"--rounds: {args.rounds} is not in 1..{MAX_ROUNDS} (each round runs both loops)")
    if args.cpus is None:
        args.cpus = all_cpus()
    else:
        try:
            args.cpus = parse_cpus(args.cpus, all_cpus())
        except ValueError as e:
            ap.error(f"--cpus: {e}")
    unknown = [p for p in args.only.split(",") if p.strip() not in PARTS]
    if unknown:
        ap.error(f"--only: unknown part {unknown[0]!r}; choose from {','.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    """`autok bench`: the flags checked here, then the measurements (torch) imported."""
    args = parse(argv)
    from benchmarks.engine import run_parts

    run_parts(args)
