"""What a run says, in the terminal and in OUT/train.log (rank 0): a start line, one line per
epoch (epoch, loss, the test metric, K, exposed-sync share, seconds), checkpoints, rollbacks and
the summary. Python's `logging`, so a user's own handlers can take the same lines; the progress
bar (ProgressSink) is separate, and `--no-progress` hides only the bar.

Terminal lines go through tqdm.write, which prints above a live bar instead of through it; the
file gets whole lines only, never a bar's carriage-return redraws.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

LOGGER = "autok.run"


class _AboveTheBar(logging.Handler):
    """stdout, printed above a tqdm bar when one is drawn (and plainly when none is)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stdout)
            sys.stdout.flush()
        except Exception:  # a closed stdout must not stop training
            self.handleError(record)


def run_logger(out_dir: Path | None, terminal: bool = True) -> logging.Logger:
    """The run's logger: stdout (unless `terminal` is False) and OUT/train.log, appended (a
    resumed run continues its log). Idempotent per process: handlers are replaced, not added."""
    log = logging.getLogger(LOGGER)
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    if terminal:
        log.addHandler(_AboveTheBar())
    if out_dir is not None:
        file = logging.FileHandler(out_dir / "train.log", mode="a", encoding="utf-8")
        file.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        log.addHandler(file)
    return log


def close_run_logger() -> None:
    log = logging.getLogger(LOGGER)
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """One epoch as one line: what a reader checks while a run goes. The epoch is numbered
    from 0, as epochs.csv, boundaries.jsonl and `--link-schedule …@epoch=N` number it
    (docs/design.md §5), with its place in the run beside it: "epoch 2 (3 of 6)"."""
    if "test_accuracy" in row:
        quality = f"acc {row['test_accuracy']:.4f}"
    else:
        quality = f"{row['metric_name']} {row['test_metric']:.4g}  val loss {row['test_loss']:.4f}"
    busy = row["epoch_seconds"] - row["overhead_seconds"]
    share = row["sync_seconds"] / busy if busy > 0 else 0.0
    return (
        f"epoch {row['epoch']} ({row['epoch'] + 1} of {epochs})  "
        f"loss {row['train_loss']:.4f}  {quality}  "
        f"K {row['sync_period']}  exposed sync {share:.0%}  {row['epoch_seconds']:.1f} s"
    )


class RunLog:
    """The observer that writes the lines (rank 0)."""

    def __init__(self, log: logging.Logger, epochs: int) -> None:
        self.log, self.epochs = log, epochs

    def on_epoch(self, row: dict[str, Any]) -> None:
        self.log.info(epoch_line(row, self.epochs))

    def on_stop(self, epoch: int) -> None:
        done = f"{epoch + 1} of {self.epochs} done"
        self.log.info(f"stopped after epoch {epoch} ({done}) with a checkpoint")
