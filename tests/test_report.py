"""`autok experiment` and `autok report`: statistics against scipy, rendering, end to end."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from autok.report import collect, mean_std, render, report, table_rows, welch_p
from tests.test_cli import autok


def fake_run(
    root: Path, label: str, seed: int, peak: float, wall: float, k: int = 1, policy: str = "fixed"
) -> None:
    d = root / label.replace(" ", "_") / f"seed-{seed}"
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"label": label, "seed": seed}))
    (d / "config.json").write_text(
        json.dumps(
            {
                "sync_period": k,
                "policy": policy,
                "lr": 0.1,
                "strategy": label.split()[0],
                "warmup_epochs": 1,
            }
        )
    )
    (d / "summary.json").write_text(
        json.dumps(
            {
                "peak_test_accuracy": peak,
                "final_test_accuracy": peak - 0.01,
                "wall_seconds": wall,
                "compute_seconds": wall / 3,
                "exposed_sync_seconds": wall / 2,
                "boundaries": 10,
                "grad_syncs": 10,
                "param_syncs": 0,
                "final_sync_period": k,
            }
        )
    )
    fields = ["epoch", "test_accuracy", "epoch_seconds", "grad_syncs", "param_syncs"]
    with open(d / "epochs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for e in range(3):
            w.writerow(
                {
                    "epoch": e,
                    "test_accuracy": peak * (e + 1) / 3,
                    "epoch_seconds": 1.0,
                    "grad_syncs": 2,
                    "param_syncs": 2 if k > 1 else 0,
                }
            )
    # two boundaries per epoch over three epochs; the first epoch is warmup
    (d / "boundaries.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "global_step": 4 * i,
                    "epoch": i // 2,
                    "sync_period": k * (1 + i // 2),
                    "exposed_sync_seconds": 0.01 * (i + 1),
                    "compute_seconds": 0.1,
                }
            )
            + "\n"
            for i in range(6)
        )
    )


@pytest.fixture
def synthetic(tmp_path):
    rng = random.Random(0)
    peaks = {}
    for label, mu, k in (("ddp", 0.90, 1), ("cpdp-k4", 0.92, 4), ("localsgd-k4", 0.88, 4)):
        peaks[label] = [mu + rng.gauss(0, 0.01) for _ in range(3)]
        for seed, p in zip((42, 123, 777), peaks[label], strict=True):
            fake_run(tmp_path, label, seed, p, 100 / k + seed / 100, k)
    fake_run(tmp_path, "cpdp-es", 42, 0.91, 30, 4, policy="exposed-sync")
    return tmp_path, peaks


def test_statistics_match_scipy(synthetic):
    root, peaks = synthetic
    rows = {r.label: r for r in table_rows(collect(root))}
    for label, values in peaks.items():
        mean, std = rows[label].peak
        assert mean == pytest.approx(np.mean(values))
        assert std == pytest.approx(np.std(values, ddof=1))
    want = stats.ttest_ind(peaks["cpdp-k4"], peaks["ddp"], equal_var=False).pvalue
    assert rows["cpdp-k4"].p_value == pytest.approx(want)
    assert rows["cpdp-k4"].delta == pytest.approx(
        100 * (np.mean(peaks["cpdp-k4"]) - np.mean(peaks["ddp"]))
    )
    assert math.isnan(rows["ddp"].p_value) and math.isnan(rows["ddp"].delta)
    assert math.isnan(rows["cpdp-es"].p_value)  # one seed: no test
    assert mean_std([0.5]) == (0.5, 0.0)
    assert math.isnan(welch_p([1.0], [1.0, 2.0]))


def test_report_renders_tables_csv_and_plots(synthetic):
    root, _ = synthetic
    stopped = root / "cpdp-k2_beta=0.9" / "seed-1"
    stopped.mkdir(parents=True)
    (stopped / "experiment.json").write_text(json.dumps({"label": "cpdp-k2 beta=0.9", "seed": 1}))
    (stopped / "epochs.csv").write_text("epoch,test_accuracy\n0,0.25\n1,0.31\n2,0.02\n")
    (stopped / "train.log").write_text(
        "W1130 noise\nautok: training failed: trainer.divergence.Diverged: training diverged: "
        "loss 8.3 is more than 4x its running minimum 2.0 (boundary 94); lower --lr\n"
    )
    text = report(root)
    assert "1 run(s) of the grid did not finish" in text
    assert (
        "| cpdp-k2 beta=0.9 | 1 | 3 | 31.00 | training diverged: loss 8.3 is more than 4x its "
        "running minimum 2.0 (boundary 94) |" in text
    )
    assert "| cpdp-k4 | 3 |" in text and "Δ vs DDP" in text
    md = (root / "report.md").read_text()
    for png in ("frontier", "accuracy_vs_time", "k_paths", "exposed_vs_compute"):
        assert (root / f"{png}.png").stat().st_size > 1000 and f"({png}.png)" in md
    rows = list(csv.DictReader((root / "report.csv").open()))
    assert len(rows) == 10 and {"label", "seed", "peak_test_accuracy"} <= set(rows[0])


def test_sync_profile_counts_the_epochs_after_warmup(synthetic):
    from autok.report import sync_profile

    root, _ = synthetic
    prof = {p.label: p for p in sync_profile(collect(root))}
    # epochs 1 and 2 (after the one warmup epoch): boundaries 2..5, exposed 0.03..0.06 s
    assert prof["cpdp-k4"].boundaries == pytest.approx(2.0)
    assert prof["cpdp-k4"].events == pytest.approx(4.0)  # 2 gradient + 2 parameter syncs
    assert prof["ddp"].events == pytest.approx(2.0)
    assert prof["ddp"].exposed == pytest.approx((0.03 + 0.04 + 0.05 + 0.06) / 2)
    assert prof["ddp"].per_boundary_ms == pytest.approx(1000 * 0.18 / 4)
    assert prof["ddp"].compute == pytest.approx(0.2)
    assert "## Synchronization profile" in report(root)


def test_render_formats_percent_and_delta():
    from autok.report import Row

    text = render(
        [Row("cpdp-k4", 3, (0.9, 0.01), (0.89, 0.01), (10, 1), (5, 0.5), 2.44, 0.012, [], 1.5)],
        "t",
    )
    assert (
        "| cpdp-k4 | 3 | 90.00 ± 1.00 | 89.00 ± 1.00 | 10.0 ± 1.0 | 5.0 ± 0.5 | +2.44 | 0.012 "
        "| 1.50× |" in text
    )


def test_rows_in_natural_order_against_the_single_ddp_row(tmp_path):
    for k, peak, wall in ((16, 0.7, 10.0), (2, 0.9, 30.0), (4, 0.85, 20.0)):
        fake_run(tmp_path, f"cpdp sync_period={k}", 42, peak, wall, k)
    fake_run(tmp_path, "ddp", 42, 0.88, 40.0)
    rows = table_rows(collect(tmp_path))
    assert [r.label for r in rows] == [
        "cpdp sync_period=2",
        "cpdp sync_period=4",
        "cpdp sync_period=16",
        "ddp",
    ]
    by = {r.label: r for r in rows}
    assert by["cpdp sync_period=2"].delta == pytest.approx(2.0)
    assert by["cpdp sync_period=16"].speedup == pytest.approx(4.0)
    assert math.isnan(by["ddp"].speedup) and math.isnan(by["ddp"].delta)


def test_a_tiny_experiment_end_to_end(tmp_path):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "seeds": [1],
                "quick": {
                    "base": {
                        "dataset": "mnist1d",
                        "mnist1d_samples": 500,
                        "workers": 2,
                        "link": "none",
                        "epochs": 2,
                        "warmup_epochs": 1,
                    }
                },
                "runs": [
                    {"name": "ddp", "strategy": "ddp"},
                    {"name": "cpdp-k3", "strategy": "cpdp", "sync_period": 3},
                ],
            }
        )
    )
    out = tmp_path / "out"
    res = autok("experiment", "run", str(exp), "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "[2/2]" in res.stdout
    again = autok("experiment", "run", str(exp), "--out", str(out), timeout=600)
    assert again.returncode == 0 and again.stdout.count("skipped") == 2
    res = autok("report", str(out))
    assert res.returncode == 0, res.stderr
    assert "| cpdp-k3 | 1 |" in (out / "report.md").read_text()
    bad = autok("experiment", "run", "no-such-experiment", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "no-such-experiment" in bad.stderr


def test_the_named_experiments_expand_to_valid_runs():
    from autok.experiment import available, expand, load_experiment

    assert set(available()) >= {"paper-wan", "k-sweep", "beta-sensitivity", "profiler", "scaling"}
    for name in available():
        exp = load_experiment(name)
        quick = expand(exp, "quick")
        assert quick and all(r.settings["dataset"] in ("mnist1d", "digits") for r in quick)
        full = exp["full"]["base"]
        assert full["dataset"] == "cifar100" and full["model"] == "resnet50"
    labels = {r.label for r in expand(load_experiment("paper-wan"), "quick")}
    assert {
        "ddp lr=0.1",
        "ddp lr=0.4",
        "localsgd-slowmo-k4 lr=0.1",
        "cpdp-exposed-sync lr=0.4",
    } <= labels
    # a setting a run fixes is not varied for it: one DDP row in the K sweep
    ksweep = [r.label for r in expand(load_experiment("k-sweep"), "quick")]
    assert ksweep.count("ddp") == 1 and "ddp sync_period=2" not in ksweep
    assert {f"cpdp sync_period={k}" for k in (1, 2, 4, 8, 16, 32, 64)} <= set(ksweep)
    assert len(ksweep) == 15


def as_task_run(d: Path, metric: str = "perplexity") -> None:
    """Rewrite a fake run's files as a --task run judged by `metric` (lower is better): the
    summary's metric keys (DESIGN §5) and epochs.csv's test_metric column."""
    summary = json.loads((d / "summary.json").read_text())
    best = 10 - 5 * summary.pop("peak_test_accuracy")  # higher accuracy -> lower perplexity
    summary.pop("final_test_accuracy")
    summary |= {
        "metric": {"name": metric, "higher_is_better": False},
        "peak_test_metric": best,
        "final_test_metric": best + 0.1,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    rows = list(csv.DictReader((d / "epochs.csv").open()))
    with open(d / "epochs.csv", "w", newline="") as f:
        fields = ["epoch", "test_loss", "test_metric", "epoch_seconds", "grad_syncs", "param_syncs"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for i, r in enumerate(rows):
            w.writerow(
                {**{k: r[k] for k in fields if k in r}, "test_metric": best + 2 - i, "test_loss": 1}
            )


def test_a_task_metric_is_reported_in_its_own_units_and_direction(tmp_path):
    for label, ppl_like, seeds in (("ddp", 0.90, (1, 2)), ("cpdp-k4", 0.92, (1, 2))):
        for seed in seeds:
            fake_run(tmp_path, label, seed, ppl_like + seed / 1000, 50.0, 4)
            as_task_run(tmp_path / label / f"seed-{seed}")
    stopped = tmp_path / "localsgd" / "seed-1"
    stopped.mkdir(parents=True)
    (stopped / "experiment.json").write_text(json.dumps({"label": "localsgd", "seed": 1}))
    (stopped / "epochs.csv").write_text("epoch,test_loss,test_metric\n0,2,7.5\n1,2,6.25\n")
    text = report(tmp_path)
    assert "judged by test perplexity (lower is better)" in text
    assert "| method | n | best perplexity | final perplexity |" in text
    rows = {r.label: r for r in table_rows(collect(tmp_path))}
    ddp = np.mean([10 - 5 * (0.90 + s / 1000) for s in (1, 2)])
    cpdp = np.mean([10 - 5 * (0.92 + s / 1000) for s in (1, 2)])
    assert rows["cpdp-k4"].peak[0] == pytest.approx(cpdp)
    assert rows["cpdp-k4"].delta == pytest.approx(cpdp - ddp)  # in perplexity, not x100
    assert f"| cpdp-k4 | 2 | {cpdp:.4f} ± " in text and f"| {cpdp - ddp:+.4f} |" in text
    assert "| localsgd | 1 | 2 | 6.2500 |" in text  # a stopped run's best is its lowest
    assert (tmp_path / "metric_vs_time.png").stat().st_size > 1000
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert {r["metric"] for r in rows} == {"perplexity"} and rows[0]["peak_test_accuracy"] == ""


def test_runs_judged_by_different_metrics_are_not_mixed_in_one_table(tmp_path):
    fake_run(tmp_path, "ddp", 1, 0.9, 50.0)
    fake_run(tmp_path, "cpdp-k4", 1, 0.9, 50.0, 4)
    as_task_run(tmp_path / "cpdp-k4" / "seed-1")
    with pytest.raises(ValueError, match=r"different metrics \(accuracy, perplexity\)"):
        report(tmp_path)
