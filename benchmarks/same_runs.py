"""Are two experiment directories' shared runs the same, record for record? On the virtual clock
a run is a function of its seed and settings (docs/design.md §4), whatever the machine's load or
`--jobs`; this checks it on real outputs.

    python -m benchmarks.same_runs DIR_A DIR_B [--ignore FIELD ...]

For every run directory (`LABEL/seed-N`) present in both, compares `epochs.csv` byte for byte
and `boundaries.jsonl` record for record, leaving out the `--ignore`d fields (e.g. one that a
later version added). Wall-clock files (summary.json's times, train.log) are not compared.
Prints how many were compared and which differ; exits 1 if any differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autok.report import read_boundaries


def records(path: Path, ignore: set[str]) -> list[dict]:
    """The run's boundary records as `autok report` reads them, less the ignored fields."""
    return [{k: v for k, v in r.items() if k not in ignore} for r in read_boundaries(path)]


def same(a: Path, b: Path, ignore: set[str]) -> bool:
    if (a / "epochs.csv").read_bytes() != (b / "epochs.csv").read_bytes():
        return False
    return records(a / "boundaries.jsonl", ignore) == records(b / "boundaries.jsonl", ignore)


def compare(root_a: Path, root_b: Path, ignore: set[str]) -> tuple[int, list[str]]:
    """(how many runs both hold, the ones that differ)."""
    n, differ = 0, []
    for run in sorted(root_a.glob("*/seed-*")):
        other = root_b / run.relative_to(root_a)
        have = ("epochs.csv", "boundaries.jsonl")
        if not all((run / f).is_file() and (other / f).is_file() for f in have):
            continue
        n += 1
        if not same(run, other, ignore):
            differ.append(str(run.relative_to(root_a)))
    return n, differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--ignore", nargs="*", default=[], help="boundary record fields to leave out")
    args = p.parse_args(argv)
    for d in (args.a, args.b):
        if not d.is_dir():
            p.error(f"{d}: not a directory")
    n, differ = compare(args.a, args.b, set(args.ignore))
    print(f"compared {n} runs present in both; {len(differ)} differ")
    for d in differ:
        print(f"  differs: {d}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
