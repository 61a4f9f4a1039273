"""What the console, the summary, the report and the plots call things: the exposed sync's
source (the network, or peers when no link is emulated), epochs counted from 0 everywhere, the
axis a grid varies, the runs that did not finish, and `autok report` on one run's directory.
No training: synthetic records, the plots' Axes inspected."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import autok.report
import autok.trainer.loop.plots
from autok.report import StoppedRun, collect, exposed_waits, render, table_rows
from autok.trainer.engine.link import exposed_wait
from autok.trainer.loop.runlog import epoch_line
from autok.trainer.loop.sinks import summary_table
from tests.test_report import fake_run

PEERS = "peers (no link emulated)"


@pytest.fixture
def figures(monkeypatch):
    """Each figure a plot would save, kept open for inspection (by file name)."""
    import matplotlib.pyplot as plt

    kept = {}

    def keep(fig, path: Path) -> Path:
        fig.canvas.draw()
        kept[path.name] = fig
        return path

    monkeypatch.setattr(autok.trainer.loop.plots, "save", keep)
    monkeypatch.setattr(autok.report, "save", keep)
    yield kept
    for fig in kept.values():
        plt.close(fig)


def texts(fig) -> list[str]:
    import matplotlib.text

    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]


# ----- exposed sync: waiting on what ----------------------------------------------------------


def test_exposed_sync_names_peers_when_no_link_is_emulated():
    assert exposed_wait("none", virtual=False) == PEERS
    assert exposed_wait("none,none@epoch=2", virtual=False) == PEERS
    assert exposed_wait("wan", virtual=False) == "the network"
    assert exposed_wait("none,wan@epoch=2", virtual=False) == "the network"
    assert exposed_wait("custom", virtual=False) == "the network"  # numbers were set
    assert exposed_wait("none", virtual=True) == "the modelled link"


SUMMARY = {
    "strategy": "cpdp",
    "policy": "fixed",
    "world_size": 4,
    "link": "none",
    "peak_test_accuracy": 0.9,
    "final_test_accuracy": 0.89,
    "wall_seconds": 10.0,
    "compute_seconds": 3.0,
    "exposed_sync_seconds": 6.0,
    "boundaries": 12,
    "grad_syncs": 6,
    "param_syncs": 6,
    "final_sync_period": 2,
    "param_digest_per_rank": [1.0, 1.0, 1.0, 1.0],
    "out_dir": "r",
}


def test_the_console_summary_says_what_the_exposed_sync_waited_on():
    assert f"60% of wall), waiting on {PEERS}" in summary_table(SUMMARY)
    assert "waiting on the network" in summary_table(SUMMARY | {"link": "wan"})


def _grid(root: Path, link: str | None) -> list:
    for label, k in (("ddp", 1), ("cpdp-k4", 4)):
        fake_run(root, label, 1, 0.9, 10.0 / k, k)
        if link is not None:
            path = root / label / "seed-1" / "summary.json"
            path.write_text(json.dumps(json.loads(path.read_text()) | {"link": link}))
    return collect(root)


def test_the_report_table_and_time_split_name_peers_on_a_run_with_no_link(tmp_path, figures):
    runs = _grid(tmp_path, "none")
    assert exposed_waits(runs) == PEERS
    assert f"Exposed sync: time waiting on {PEERS}." in render(table_rows(runs), "t", waits=PEERS)
    autok.report.plots(runs, tmp_path)
    (ax,) = [a for a in figures["exposed_vs_compute.png"].axes]
    assert f"exposed sync (waiting on {PEERS})" in ax.get_legend_handles_labels()[1]


def test_a_report_over_emulated_links_keeps_the_network(tmp_path):
    assert exposed_waits(_grid(tmp_path, "lan,wan@epoch=1")) == "the network"


# ----- epochs: counted from 0 everywhere --------------------------------------------------------


def test_the_epoch_line_numbers_epochs_as_the_files_and_schedules_do():
    row = {
        "epoch": 2,
        "test_accuracy": 0.5,
        "train_loss": 1.0,
        "epoch_seconds": 2.0,
        "overhead_seconds": 0.0,
        "sync_seconds": 1.0,
        "sync_period": 4,
    }
    assert epoch_line(row, 6).startswith("epoch 2 (3 of 6)  loss 1.0000")


def _k_lr(tmp_path: Path, config: dict) -> list[tuple[int, int, int, float, int]]:
    (tmp_path / "config.json").write_text(json.dumps(config))
    # four epochs of ten steps, a boundary every two steps
    return [(10 * e + 2 * j, 10 * e + 2 * j + 1, 2, 0.1, e) for e in range(4) for j in range(5)]


def test_k_lr_marks_link_changes_and_the_k_cap(tmp_path, figures):
    config = {"link_schedule": "lan,wan@epoch=2", "max_sync_period": 16, "policy": "exposed-sync"}
    bs = _k_lr(tmp_path, config)
    plots = autok.trainer.loop.plots
    plots.plot_k_and_lr(tmp_path / "k_lr.png", bs, {"link": config["link_schedule"]})
    fig = figures["k_lr.png"]
    ax_k, ax_lr = fig.axes[:2]
    for ax in (ax_k, ax_lr):
        changes = [ln for ln in ax.get_lines() if ln.get_label() == "link change"]
        assert [list(ln.get_xdata()) for ln in changes] == [[20, 20]]  # epoch 2's first step
    assert " wan" in [t.get_text() for t in ax_k.texts]
    (cap,) = [ln for ln in ax_k.get_lines() if ln.get_label().startswith("K cap")]
    assert list(cap.get_ydata()) == [16, 16]
    assert ax_k.get_ylim()[1] >= 16
    # the epoch numbers on top count from 0, as the schedule's @epoch=2 does
    top = [c for c in ax_k.child_axes if hasattr(c, "get_xticklabels")][0]
    assert [t.get_text() for t in top.get_xticklabels()] == ["0", "1", "2", "3"]


def test_k_lr_draws_no_cap_for_a_fixed_k_and_no_change_without_a_schedule(tmp_path, figures):
    bs = _k_lr(tmp_path, {"max_sync_period": 64, "policy": "fixed"})
    autok.trainer.loop.plots.plot_k_and_lr(tmp_path / "k_lr.png", bs, {"link": "wan"})
    labels = [ln.get_label() for ax in figures["k_lr.png"].axes for ln in ax.get_lines()]
    assert not any(lb.startswith("K cap") or lb == "link change" for lb in labels)


# ----- frontier: the axis the grid varies, and what did not finish ------------------------------


def _beta_grid(root: Path) -> list:
    for beta in (0.0, 0.5, 0.9):
        label = f"slowmo-k4 outer_momentum={beta}"
        fake_run(root, label, 1, 0.8 + beta / 10, 20.0 - beta, 4)
        path = root / label.replace(" ", "_") / "seed-1" / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"outer_momentum": beta}))
    return collect(root)


def test_the_frontier_names_the_axis_the_grid_varies_and_lists_what_did_not_finish(
    tmp_path, figures
):
    runs = _beta_grid(tmp_path)
    assert autok.report.varied_settings(runs) == ["outer_momentum"]
    stopped = [StoppedRun("slowmo-k4 outer_momentum=0.99", 1, 2, 0.5, "training diverged")]
    autok.report.plots(runs, tmp_path, stopped)
    fig = figures["frontier.png"]
    ax = fig.axes[0]
    assert "frontier over outer_momentum" in ax.get_title()
    assert "over K" not in ax.get_title()
    assert [a.get_ylabel() for a in fig.axes[1:]] == ["outer_momentum"]  # the colour bar
    note = [t for t in texts(fig) if t.startswith("did not finish")]
    assert note and "slowmo-k4 outer_momentum=0.99 seed 1: training diverged" in note[0]


def test_a_grid_over_k_keeps_k(tmp_path, figures):
    runs = _grid(tmp_path, None)
    autok.report.plots(runs, tmp_path)
    fig = figures["frontier.png"]
    assert "frontier over K, method" in fig.axes[0].get_title()
    assert "K (sync period)" in [a.get_ylabel() for a in fig.axes[1:]]
    assert not any(t.startswith("did not finish") for t in texts(fig))


# ----- `autok report` on one run's directory ----------------------------------------------------


def _finished_run(d: Path) -> Path:
    """The files `autok train --out d` leaves (docs/design.md §7), small."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"strategy": "cpdp", "sync_period": 2}))
    (d / "summary.json").write_text(json.dumps(SUMMARY | {"out_dir": str(d)}))
    with open(d / "epochs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "test_accuracy", "epoch_seconds"])
        w.writerow([0, 0.9, 1.0])
    (d / "boundaries.jsonl").write_text(json.dumps({"global_step": 1, "epoch": 0}) + "\n")
    return d


def test_report_on_a_finished_run_points_to_its_files_and_exits_0(tmp_path, capsys):
    from autok.cli import main

    d = _finished_run(tmp_path / "r")
    before = sorted(p.name for p in d.iterdir())
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    assert "peak / final test acc" in out  # the run's own summary
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"autok: {d} is one finished run")
    assert "summary.json, epochs.csv, boundaries.jsonl" in last
    assert sorted(p.name for p in d.iterdir()) == before  # nothing written into the run


def test_one_run_is_not_taken_for_an_experiment_and_a_bad_summary_still_refuses(tmp_path):
    from autok.report import ReportError, one_run

    assert one_run(tmp_path) is None  # no summary.json: the experiment path decides
    fake_run(tmp_path, "ddp", 1, 0.9, 10.0)
    assert one_run(tmp_path / "ddp" / "seed-1") is None  # an experiment's run: experiment.json
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "summary.json").write_text(json.dumps({"wall_seconds": -1}))
    with pytest.raises(ReportError, match="wall_seconds"):
        one_run(bad)
