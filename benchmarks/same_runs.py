"""Are two experiment directories' shared runs the same, record for record? On the virtual clock
a run is a function of its seed and settings (docs/design.md §4), whatever the machine's load or
`--jobs`; this checks it on real outputs.

    python -m benchmarks.same_runs DIR_A DIR_B [--ignore FIELD ...]
    python -m benchmarks.same_runs DIR --panel-csv PANEL_CSV

For every run directory (`LABEL/seed-N`) present in both, compares `epochs.csv` byte for byte
and `boundaries.jsonl` record for record, leaving out the `--ignore`d fields (e.g. one that a
later version added). Wall-clock files (summary.json's times, train.log) are not compared.
Prints how many were compared and which differ; exits 1 if any differ.

With `--panel-csv`, DIR's runs are compared with the rows of a panel's `panel.csv` (autok/panel.py
`write_csv`) of the same regime, method and seed, where the runs that wrote it are gone: time to
the row's target, final quality, training seconds, bytes and mean K, each as the CSV writes it
(to the last digit).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autok.report import RunResult, collect, read_boundaries

# panel.csv's columns a run determines (the rest name it, or are the regime's target)
CSV_COLUMNS = ("time_to_target", "final", "wall_seconds", "bytes", "mean_k")


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


def csv_values(r: RunResult, target: float) -> dict[str, str]:
    """What panel.csv holds for run `r` at `target`, written as its csv.writer writes it."""
    from autok import panel
    from autok.report import training_seconds

    judge = panel.Judge(accuracy=r.summary["metric"]["name"] == "accuracy")
    t = panel.time_to_target(r, judge, target)
    values = {
        "time_to_target": "" if t is None else t,
        "final": judge.value(r.epochs[-1]),
        "wall_seconds": training_seconds(r.summary),
        "bytes": panel.bytes_sent(r),
        "mean_k": panel.mean_k_after_warmup(r),
    }
    return {k: str(v) for k, v in values.items()}


def against_csv(runs: list[RunResult], rows: list[dict[str, str]]) -> tuple[int, list[str]]:
    """(how many runs have a row, those whose values differ from it: "regime method seed")."""
    by_key = {(r["regime"], r["method"], r["seed"]): r for r in rows}
    n, differ = 0, []
    for run in runs:
        key = (run.variant.partition("=")[2], run.method, str(run.seed))
        if (row := by_key.get(key)) is None:
            continue
        n += 1
        mine = csv_values(run, float(row["target"]))
        if any(mine[c] != row[c] for c in CSV_COLUMNS):
            differ.append(" ".join(key))
    return n, differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path, nargs="?")
    p.add_argument("--ignore", nargs="*", default=[], help="boundary record fields to leave out")
    p.add_argument("--panel-csv", type=Path, help="compare DIR's runs with this panel.csv's rows")
    args = p.parse_args(argv)
    if (args.b is None) == (args.panel_csv is None):
        p.error("give DIR_B, or --panel-csv PANEL_CSV")
    for d in (args.a, args.b):
        if d is not None and not d.is_dir():
            p.error(f"{d}: not a directory")
    if args.panel_csv is not None:
        import csv

        if not args.panel_csv.is_file():
            p.error(f"--panel-csv: {args.panel_csv}: not a file")
        with open(args.panel_csv, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        n, differ = against_csv(collect(args.a), rows)
    else:
        n, differ = compare(args.a, args.b, set(args.ignore))
    print(f"compared {n} runs present in both; {len(differ)} differ")
    for d in differ:
        print(f"  differs: {d}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
