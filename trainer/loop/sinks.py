"""Where a run's numbers go (rank 0): boundaries.jsonl, epochs.csv, summary.json, the progress
bar and the closing table. Files are appended as the run goes, so a crash keeps what was done."""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision
from autok.trainer.engine.link import exposed_wait
from autok.trainer.engine.observer import StepInfo

EPOCH_COLUMNS = [
    "epoch",
    "train_loss",
    "train_accuracy",
    "test_accuracy",
    "epoch_seconds",
    "samples_per_second",
    "forward_seconds",
    "backward_seconds",
    "sync_seconds",
    "overhead_seconds",
    "grad_syncs",
    "param_syncs",
    "collectives",
    "sync_period",
    "lr",
]

# A task judged by another metric (e.g. perplexity; docs/design.md §7): its loss and metric on the
# test set replace the accuracies, which mean nothing there.
TASK_EPOCH_COLUMNS = [
    {"train_accuracy": "test_loss", "test_accuracy": "test_metric"}.get(c, c) for c in EPOCH_COLUMNS
]


def epoch_columns(classifies: bool) -> list[str]:
    return EPOCH_COLUMNS if classifies else TASK_EPOCH_COLUMNS


SUMMARY_KEYS = [  # peak_test_accuracy, final_test_accuracy too, on a classification
    "strategy",
    "policy",
    "world_size",
    "metric",
    "peak_test_metric",
    "final_test_metric",
    "wall_seconds",
    "compute_seconds",
    "exposed_sync_seconds",
    "boundaries",
    "grad_syncs",
    "param_syncs",
    "final_sync_period",
    "param_digest_per_rank",
]


def strict_json(obj: Any) -> Any:
    """`obj` with every NaN or infinity as None (null): JSON has neither, and json.dump would
    write `NaN`, which strict parsers refuse. A value that does not exist (the metric of a run
    whose metric counted nothing, or that never evaluated) is null (docs/design.md §7)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    # autok's own temporary name: a stale one, or a link planted there, is removed (the link,
    # never its target) and the file made anew, so the write never follows a link
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(strict_json(obj), f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


BOUNDARY_INTS = ("epoch", "global_step", "interval_steps", "sync_period")  # what a resume reads


def _complete_lines(path: Path) -> list[str]:
    """The file's lines with their ends; a last line without one is a write a crash cut short
    (rows are always written whole with their newline): it is dropped, never parsed."""
    with open(path, encoding="utf-8", newline="") as f:  # keep csv's \r\n as written
        lines = f.read().splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines.pop()
    return lines


def _csv_epoch(path: Path, i: int, line: str, header: list[str]) -> int:
    fields = next(csv.reader([line]), [])
    if len(fields) != len(header):
        raise ValueError(f"{path} line {i}: {len(fields)} fields, the header has {len(header)}")
    for name, value in zip(header, fields, strict=False):
        try:
            float(value)
        except ValueError:
            raise ValueError(f"{path} line {i}: {name} {value[:30]!r} is not a number") from None
    if not fields[0].strip().isdigit():
        raise ValueError(f"{path} line {i}: epoch {fields[0][:30]!r} is not a whole number")
    return int(fields[0])


def _jsonl_epoch(path: Path, i: int, line: str) -> int:
    try:
        rec = json.loads(line)
    except ValueError:
        raise ValueError(f"{path} line {i}: not a JSON object") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{path} line {i}: not a JSON object")
    for key in BOUNDARY_INTS:
        if type(rec.get(key)) is not int or rec[key] < 0:
            raise ValueError(f"{path} line {i}: {key} {str(rec.get(key))[:30]!r} is not a count")
    if type(rec.get("lr")) not in (int, float):
        raise ValueError(f"{path} line {i}: lr {str(rec.get('lr'))[:30]!r} is not a number")
    return rec["epoch"]


def check_outputs(out_dir: Path) -> str | None:
    """Why the run's epochs.csv or boundaries.jsonl cannot be continued (a resume rewinds them
    and appends), or None: one reason naming the file, the line and the field."""
    try:
        _read_outputs(out_dir)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return f"cannot read the run's outputs in {out_dir} ({exc})"
    except ValueError as exc:
        return str(exc)
    return None


def _read_outputs(out_dir: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(epoch, line) of every row of epochs.csv (header first, epoch -1) and boundaries.jsonl,
    validated; ValueError names what is wrong."""
    csv_path, jsonl_path = out_dir / "epochs.csv", out_dir / "boundaries.jsonl"
    rows: list[tuple[int, str]] = []
    if csv_path.exists():
        lines = _complete_lines(csv_path)
        header = EPOCH_COLUMNS
        if lines:
            header = next(csv.reader([lines[0]]), [])
            if header not in (EPOCH_COLUMNS, TASK_EPOCH_COLUMNS):
                raise ValueError(f"{csv_path} line 1: not the header autok writes")
            rows.append((-1, lines[0]))
        for i, ln in enumerate(lines[1:], 2):
            if ln.strip():
                rows.append((_csv_epoch(csv_path, i, ln, header), ln))
    records: list[tuple[int, str]] = []
    if jsonl_path.exists():
        for i, ln in enumerate(_complete_lines(jsonl_path), 1):
            if ln.strip():
                records.append((_jsonl_epoch(jsonl_path, i, ln), ln))
    return rows, records


def rewind_outputs(out_dir: Path, last_epoch: int, columns: list[str] = EPOCH_COLUMNS) -> None:
    """Drop the rows of epochs after `last_epoch` (they are about to be trained again), so a
    resumed or rolled-back run has no duplicate and no missing row. Atomic per file. Rows that
    are not autok's are refused (ValueError naming file, line and field), never guessed at."""
    rows, records = _read_outputs(out_dir)
    csv_path, jsonl_path = out_dir / "epochs.csv", out_dir / "boundaries.jsonl"
    if rows and next(csv.reader([rows[0][1]])) != columns:
        # the task's metric changed since the file was written: rows would not fit its header
        raise ValueError(
            f"{csv_path} line 1: the columns of another kind of task (its metric changed since "
            "the run started); the run cannot continue in this file"
        )
    if csv_path.exists():
        header = [] if rows else [",".join(columns) + "\r\n"]  # a header a crash cut
        _write_atomic(csv_path, "".join(header + [ln for e, ln in rows if e <= last_epoch]))
    if jsonl_path.exists():
        _write_atomic(jsonl_path, "".join(ln for e, ln in records if e <= last_epoch))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    # autok's own temporary name: a stale one, or a link planted there, is removed (the link,
    # never its target) and the file made anew, so the write never follows a link
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def boundary_record(stats: BoundaryStats, decision: SyncDecision) -> dict[str, Any]:
    """One line of boundaries.jsonl (docs/design.md §7): the fields of §4 and the decision."""
    record = stats.as_dict()
    for key in ("warmup", "samples", "grad_syncs", "param_syncs"):
        record.pop(key)
    record["next_sync_period"] = decision.next_sync_period
    record["reason"] = decision.reason
    return record


class BoundaryLog:
    """boundaries.jsonl alone, for a user's own loop (autok.Sync(out_dir=...)): appended and
    flushed per boundary, so a crash keeps what was done."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(out_dir / "boundaries.jsonl", "a")  # noqa: SIM115

    def on_boundary(self, stats: BoundaryStats, decision: SyncDecision) -> None:
        self._jsonl.write(json.dumps(boundary_record(stats, decision)) + "\n")
        self._jsonl.flush()

    def close(self) -> None:
        self._jsonl.close()


class FileSink:
    def __init__(self, out_dir: Path, columns: list[str] = EPOCH_COLUMNS) -> None:
        from array import array

        self.out_dir, self.columns = out_dir, columns
        # The LR of every optimizer step from _lr_first on, for k_lr.png (on_step): 8 bytes a
        # step, appended as the run goes.
        self._lr_first: int | None = None
        self._lrs = array("d")
        self._open()

    def _open(self) -> None:
        out_dir = self.out_dir
        # (first step, boundary step, K in force, LR, epoch) per boundary, for k_lr.png; a
        # resumed or rewound run starts from its file.
        self._path: list[tuple[int, int, int, float, int]] = []
        if (out_dir / "boundaries.jsonl").exists():
            for line in (out_dir / "boundaries.jsonl").read_text().splitlines():
                r = json.loads(line)
                start = r["global_step"] - r["interval_steps"] + 1
                self._path.append((start, r["global_step"], r["sync_period"], r["lr"], r["epoch"]))
        # Open for the whole run (appended as it goes), closed in on_end.
        self._jsonl = open(out_dir / "boundaries.jsonl", "a")  # noqa: SIM115
        new_csv = not (out_dir / "epochs.csv").exists()
        self._csv_file = open(out_dir / "epochs.csv", "a", newline="")  # noqa: SIM115
        self._csv = csv.DictWriter(self._csv_file, fieldnames=self.columns)
        if new_csv:
            self._csv.writeheader()

    def on_boundary(self, stats: BoundaryStats, decision: SyncDecision) -> None:
        start = stats.global_step - stats.interval_steps + 1  # K held from the interval's start
        self._path.append((start, stats.global_step, stats.sync_period, stats.lr, stats.epoch))
        self._jsonl.write(json.dumps(boundary_record(stats, decision)) + "\n")

    def on_step(self, info: StepInfo) -> None:
        """The LR of the next step (the scheduler has just stepped): k_lr.png shows the schedule
        at every step, not only at boundaries. A Python float read, no device sync, O(1)."""
        step, lr = info.global_step, info.next_lr
        if self._lr_first is None or step < self._lr_first:
            self._lr_first, self._lrs = step, self._lrs[:0]
        i = step - self._lr_first
        if i < len(self._lrs):  # a rollback trains these steps again
            del self._lrs[i:]
        while len(self._lrs) < i:  # steps no call reported: unknown
            self._lrs.append(float("nan"))
        self._lrs.append(lr if type(lr) is float else float("nan"))  # a tensor LR: not read

    def on_epoch(self, row: dict[str, Any]) -> None:
        self._csv.writerow({k: row[k] for k in self.columns})
        self._csv_file.flush()
        self._jsonl.flush()

    def on_rewind(self, last_epoch: int) -> None:
        self._close()
        rewind_outputs(self.out_dir, last_epoch, self.columns)
        self._open()

    def on_stop(self, epoch: int) -> None:
        self._close()

    def _close(self) -> None:
        self._jsonl.close()
        self._csv_file.close()

    def on_end(self, summary: dict[str, Any]) -> None:
        self._close()
        write_json_atomic(self.out_dir / "summary.json", summary)
        if self._path:
            lr_first = self._lr_first if self._lr_first is not None else 0
            plot_k_and_lr(self._path, self.out_dir / "k_lr.png", summary, lr_first, self._lrs)


class ProgressSink:
    """A tqdm bar over all optimizer steps: loss, accuracy, K and the exposed-sync share."""

    def __init__(self, total_steps: int, enabled: bool, done: int = 0) -> None:
        from tqdm import tqdm

        # A bar redraws itself with carriage returns: only on a terminal, never into a file
        # or a pipe (the run's lines are in train.log and on stdout either way).
        self._bar = tqdm(
            total=total_steps,
            initial=done,
            unit="step",
            disable=not enabled or not sys.stderr.isatty(),
            dynamic_ncols=True,
        )
        self._post: dict[str, str] = {}
        self._done = done

    def on_boundary(self, stats: BoundaryStats, decision: SyncDecision) -> None:
        self._bar.update(stats.global_step + 1 - self._done)
        self._done = stats.global_step + 1
        self._post.update(loss=f"{stats.train_loss:.3f}", K=str(decision.next_sync_period))
        self._post["sync"] = f"{stats.sync_share:.0%}"
        self._bar.set_postfix(self._post, refresh=False)

    def on_epoch(self, row: dict[str, Any]) -> None:
        if "test_accuracy" in row:
            self._post["acc"] = f"{row['test_accuracy']:.3f}"
        else:
            self._post[row["metric_name"][:4]] = f"{row['test_metric']:.4g}"
        self._bar.set_postfix(self._post)

    def on_rewind(self, last_epoch: int) -> None:
        self._done = 0  # counts resume from the next boundary

    def on_stop(self, epoch: int) -> None:
        self._bar.close()

    def on_end(self, summary: dict[str, Any]) -> None:
        self._bar.close()


def plot_k_and_lr(
    path: list[tuple[int, int, int, float, int]],
    out: Path,
    summary: dict,
    lr_first: int = 0,
    lrs: Any = (),  # the LR of each step from lr_first on (an array of floats)
) -> None:
    """k_lr.png: K in force over each interval and the LR at every optimizer step, with the
    epochs and the warmup marked (drawn by trainer/loop/plots.py, which says what it answers).
    Without matplotlib (a core install training a --task) the run's files are all there and the
    plot alone is left out, said in one line: plots are an extra (autok/extras.py; trainer/ does
    not import autok, docs/design.md §3)."""
    try:
        import matplotlib  # noqa: F401  (plots.pyplot imports it next)
    except ImportError:
        import logging

        from autok.trainer.loop.runlog import LOGGER

        logging.getLogger(LOGGER).info(
            f"autok: {out.name} not drawn: matplotlib is missing (pip install 'autok[report]')"
        )
        return
    from autok.trainer.loop import plots

    plots.plot_k_and_lr(out, path, summary, lr_first, lrs)


def _wall_clock(summary: dict[str, Any]) -> str:
    """Training time, and the time the user waited: start-up (processes, data) included."""
    text = f"{summary['wall_seconds']:.1f} s training"
    if "total_seconds" in summary:
        text += (
            f"; {summary['total_seconds']:.1f} s since the command started "
            f"({summary['startup_seconds']:.1f} s start-up: processes, data, model)"
        )
    return text


def _quality_row(summary: dict[str, Any]) -> tuple[str, str]:
    if "peak_test_accuracy" in summary:
        peak, final = summary["peak_test_accuracy"], summary["final_test_accuracy"]
        return "peak / final test acc", f"{peak:.4f} / {final:.4f}"
    name = summary["metric"]["name"]
    peak, final = summary["peak_test_metric"], summary["final_test_metric"]
    return f"best / final test {name}", f"{peak:.4g} / {final:.4g}"


def _rolled_back(summary: dict[str, Any], clock: str) -> list[tuple[str, str]]:
    """The attempts divergence rollbacks discarded, where there were any: their time is in the
    run's (docs/design.md §7, "a rollback's time"); compute, sync and counts are the kept
    epochs'."""
    lost = summary.get("rolled_back_seconds") or 0.0
    if lost <= 0:
        return []
    return [("rolled back", f"{lost:.1f} s of {clock} time discarded, counted in the run's")]


def summary_table(summary: dict[str, Any]) -> str:
    # under --clock virtual the records' times are modelled: shares are of the modelled time
    virtual = summary.get("virtual_seconds")
    wall = summary["wall_seconds"] if virtual is None else virtual
    clock = "wall" if virtual is None else "virtual"
    # what the wait was on: the network, or peers when no link is emulated
    waits = exposed_wait(str(summary.get("link", "?")), virtual is not None)
    rows = [
        ("strategy / policy", f"{summary['strategy']} / {summary['policy']}"),
        ("workers, link", f"{summary['world_size']}, {summary['link']}"),
        _quality_row(summary),
        ("wall-clock", _wall_clock(summary)),
        *([] if virtual is None else [("virtual clock", f"{virtual:.1f} s modelled")]),
        *_rolled_back(summary, clock),
        ("compute (mean rank)", f"{summary['compute_seconds']:.1f} s"),
        (
            "exposed sync (mean rank)",
            f"{summary['exposed_sync_seconds']:.1f} s "
            f"({summary['exposed_sync_seconds'] / max(wall, 1e-9):.0%} of {clock}), "
            f"waiting on {waits}",
        ),
        ("boundaries", str(summary["boundaries"])),
        (
            "grad / param syncs",
            f"{summary['grad_syncs']} / {summary['param_syncs']} "
            f"({summary.get('collectives', '?')} collectives: what crossed the network)",
        ),
        ("final K", str(summary["final_sync_period"])),
        (
            "K path (time at K)",
            " -> ".join(
                f"{p['sync_period']}: {p['seconds']:.1f} s" for p in summary.get("k_path", [])
            ),
        ),
        ("replicas agree", "yes" if len(set(summary["param_digest_per_rank"])) == 1 else "NO"),
        ("output", summary["out_dir"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
