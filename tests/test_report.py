"""`autok experiment` and `autok report`: statistics against scipy, rendering, end to end."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from autok.report import collect, mean_std, render, report, table_rows, welch_p
from autok.trainer.loop.environment import environment
from tests.test_cli import autok


def fake_run(
    root: Path,
    label: str,
    seed: int,
    peak: float,
    wall: float,
    k: int = 1,
    policy: str = "fixed",
    order: int | None = None,
) -> None:
    d = root / label.replace(" ", "_") / f"seed-{seed}"
    d.mkdir(parents=True)
    meta = {"label": label, "seed": seed} | ({} if order is None else {"order": order})
    (d / "experiment.json").write_text(json.dumps(meta))
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
    # the difference DDP's spread resolves: t(0.975, 4) * s * sqrt(2/3), in points
    from autok.report import render_resolution

    res = stats.t.ppf(0.975, 4) * np.std(peaks["ddp"], ddof=1) * (2 / 3) ** 0.5 * 100
    text = render_resolution(list(rows.values()))
    assert f"ddp: {res:.2f} pp (std {100 * np.std(peaks['ddp'], ddof=1):.2f})" in text
    one = [dataclasses.replace(rows["ddp"], n=1, peaks=peaks["ddp"][:1])]
    assert render_resolution(one).startswith("One seed per row")
    # no DDP row (a grid over one method's settings): the best seeded row is the reference
    others = [r for r in rows.values() if r.label != "ddp"]
    steady = max((r for r in others if r.n >= 2), key=lambda r: r.peak[0])
    text = render_resolution(others)
    assert f"as steady as its best row ({steady.label})" in text
    res = stats.t.ppf(0.975, 4) * np.std(peaks[steady.label], ddof=1) * (2 / 3) ** 0.5 * 100
    assert f"{steady.label}: {res:.2f} pp" in text


def test_report_renders_tables_csv_and_plots(synthetic):
    root, _ = synthetic
    stopped = root / "cpdp-k2_beta=0.9" / "seed-1"
    stopped.mkdir(parents=True)
    (stopped / "experiment.json").write_text(json.dumps({"label": "cpdp-k2 beta=0.9", "seed": 1}))
    (stopped / "epochs.csv").write_text("epoch,test_accuracy\n0,0.25\n1,0.31\n2,0.02\n")
    (stopped / "train.log").write_text(
        "W1130 noise\nautok: training failed: autok.trainer.engine.divergence.Diverged: "
        "training diverged: "
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
    # what ran at the boundary: SlowMo's beta, or the outer optimizer and compression given instead
    assert {"slowmo_beta", "outer_optimizer", "outer_lr", "compress"} <= set(rows[0])
    assert all(r["wall_seconds"] and r["final_sync_period"] for r in rows)
    assert {r["run_dir"] for r in rows if r["label"] == "ddp"} == {
        f"ddp/seed-{s}" for s in (42, 123, 777)
    }  # relative to the experiment directory, so the CSV moves with it


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


def test_rows_in_natural_order_after_the_single_ddp_row(tmp_path):
    for k, peak, wall in ((16, 0.7, 10.0), (2, 0.9, 30.0), (4, 0.85, 20.0)):
        fake_run(tmp_path, f"cpdp sync_period={k}", 42, peak, wall, k)
    fake_run(tmp_path, "ddp", 42, 0.88, 40.0)
    rows = table_rows(collect(tmp_path))
    assert [r.label for r in rows] == [  # no order recorded: DDP opens, then natural order
        "ddp",
        "cpdp sync_period=2",
        "cpdp sync_period=4",
        "cpdp sync_period=16",
    ]
    by = {r.label: r for r in rows}
    assert by["cpdp sync_period=2"].delta == pytest.approx(2.0)
    assert by["cpdp sync_period=16"].speedup == pytest.approx(4.0)
    assert math.isnan(by["ddp"].speedup) and math.isnan(by["ddp"].delta)


def test_a_tiny_experiment_end_to_end(tmp_path):
    """...including a run whose divergence is its result (SlowMo beta 0.9 at a huge LR): the
    experiment still exits 0, so `autok experiment run ... && autok report ...` reports it."""
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
                    # non-finite at its first boundary: the trainer's guard stops it
                    {
                        "name": "diverges",
                        "strategy": "cpdp",
                        "sync_period": 2,
                        "slowmo_beta": 0.9,
                        "lr": 1e6,
                    },
                ],
            }
        )
    )
    out = tmp_path / "out"
    # ddp as an interrupted first attempt left it, before its first checkpoint: it starts over
    # in the directory autok made (its marker), cleared of autok's files, its log kept
    from autok.experiment import MARKER, ensure_secret, start_over

    out.mkdir()
    start_over(out / "ddp" / "seed-1", "ddp/seed-1", ensure_secret(out))
    for name in ("config.json", "epochs.csv", "run.yaml", "experiment.json"):
        (out / "ddp" / "seed-1" / name).write_text("from the first attempt")
    (out / "ddp" / "seed-1" / "console.log").write_text("the first attempt\n")
    res = autok("experiment", "run", str(exp), "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "[3/3]" in res.stdout and res.stdout.count(": done") == 2, res.stdout
    assert "diverges seed 1: diverged: training diverged: " in res.stdout, res.stdout
    assert "autok: 2 of 3 runs finished, 1 diverged; " in res.stdout, res.stdout
    assert (out / "ddp" / "seed-1" / "console.log").read_text().startswith("the first attempt")
    assert (out / "ddp" / "seed-1" / "summary.json").exists()
    assert (out / "cpdp-k3" / "seed-1" / MARKER).exists()  # every run dir autok makes
    again = autok("experiment", "run", str(exp), "--out", str(out), timeout=600)
    assert again.returncode == 0 and again.stdout.count("skipped") == 2, again.stdout
    # the same grid with another setting: refused, the finished runs kept (not "skipped" and
    # reported as if they were this grid's)
    other = tmp_path / "other.yaml"
    other.write_text(exp.read_text().replace("epochs: 2", "epochs: 3"))
    before = (out / "cpdp-k3" / "seed-1" / "summary.json").read_bytes()
    changed = autok("experiment", "run", str(other), "--out", str(out), timeout=600)
    assert changed.returncode == 2, changed.stdout[-2000:] + changed.stderr[-2000:]
    assert "holds a run made with epochs 2, this experiment gives 3" in changed.stderr
    assert (out / "cpdp-k3" / "seed-1" / "summary.json").read_bytes() == before
    res = autok("report", str(out))
    assert res.returncode == 0, res.stderr
    assert "| cpdp-k3 | 1 |" in (out / "report.md").read_text()
    assert "| diverges | 1 | 0 |" in (out / "report.md").read_text()  # with why it stopped
    bad = autok("experiment", "run", "no-such-experiment", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "no-such-experiment" in bad.stderr


def test_a_finished_run_saved_with_an_option_it_never_read_stands_for_the_run_without_it(
    tmp_path,
):
    """check_run_dirs compares a kept run's run.yaml as it ran (autok.space.as_ran): one saved
    before autok refused --target-sync-share under the fixed policy is this experiment's run
    without it; a setting that changed the run still refuses it."""
    from autok.config import ConfigError
    from autok.experiment import Run, check_run_dirs

    settings = {"strategy": "cpdp", "sync_period": 3, "epochs": 2, "workers": 2}
    run = Run("cpdp-k3", 1, settings)
    run_dir = tmp_path / run.dir
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"environment": environment()}))
    (run_dir / "run.yaml").write_text(yaml.safe_dump(settings | {"target_sync_share": 0.3}))
    check_run_dirs([run], tmp_path)
    (run_dir / "run.yaml").write_text(yaml.safe_dump(settings | {"epochs": 3}))
    with pytest.raises(ConfigError, match="holds a run made with epochs 3"):
        check_run_dirs([run], tmp_path)


def test_a_kept_run_that_started_at_another_default_k_does_not_stand_for_this_one(tmp_path):
    """Its run.yaml matches, but it left K to a default that has since changed (exposed-sync
    started at 4 before it started at 1): the K it started at (config.json) is compared too."""
    import json

    from autok.config import ConfigError
    from autok.controllers import revision
    from autok.experiment import Run, check_run_dirs

    settings = {"strategy": "cpdp", "policy": "exposed-sync", "epochs": 2, "workers": 2}
    run = Run("exposed-sync", 1, settings)
    run_dir = tmp_path / run.dir
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"environment": environment()}))
    (run_dir / "run.yaml").write_text(yaml.safe_dump(settings))
    # what a config.json made now records (the rule's revision: tests/test_rule_revision.py)
    now = {**settings, "link_drop": 3.0, "policy_revision": revision("exposed-sync")}
    (run_dir / "config.json").write_text(json.dumps({**now, "sync_period": 1}))
    check_run_dirs([run], tmp_path)  # started where these settings start
    (run_dir / "config.json").write_text(json.dumps({**now, "sync_period": 4}))
    with pytest.raises(ConfigError, match="started at K = 4, these settings now start at K = 1"):
        check_run_dirs([run], tmp_path)
    given = Run("exposed-sync", 1, {**settings, "sync_period": 4})  # K given: run.yaml says it
    (run_dir / "run.yaml").write_text(yaml.safe_dump(given.settings))
    check_run_dirs([given], tmp_path)


def test_a_kept_run_with_another_default_floor_does_not_stand_for_this_one(tmp_path):
    """Its run.yaml matches, but it left K's floor to a default that has since changed (1, now
    the optimizer's: 2 under AdamW): the floor it ran with (config.json; none recorded: 1) is
    compared too; under SGD the floor is 1 then and now."""
    import json

    from autok.config import ConfigError
    from autok.controllers import revision
    from autok.experiment import Run, check_run_dirs

    settings = {"strategy": "cpdp", "policy": "exposed-sync", "epochs": 2, "workers": 2}
    for optimizer, floor in (("sgd", 1), ("adamw", 2)):
        run = Run("exposed-sync", 1, settings | {"optimizer": optimizer})
        run_dir = tmp_path / optimizer / run.dir
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"environment": environment()}))
        (run_dir / "run.yaml").write_text(yaml.safe_dump(run.settings))
        now = {"link_drop": 3.0, "policy_revision": revision("exposed-sync")}
        config = {**run.settings, "sync_period": floor, **now}
        (run_dir / "config.json").write_text(json.dumps(config))  # no floor recorded: 1
        if floor == 1:
            check_run_dirs([run], tmp_path / optimizer)
            continue
        with pytest.raises(ConfigError, match="K's floor at 1, these settings now keep it at 2"):
            check_run_dirs([run], tmp_path / optimizer)
        (run_dir / "config.json").write_text(json.dumps(config | {"k_floor": 2}))
        check_run_dirs([run], tmp_path / optimizer)


def test_a_kept_run_made_with_other_package_versions_does_not_stand_for_this_one(tmp_path):
    """On the virtual clock a run is a function of its seed and settings on one installation:
    a finished run whose summary.json records another environment (or none) is refused, in one
    line naming --out and the first difference; one made here is kept."""
    from autok.config import ConfigError
    from autok.experiment import Run, check_run_dirs

    settings = {"strategy": "cpdp", "sync_period": 3, "epochs": 2, "workers": 2}
    run = Run("cpdp-k3", 1, settings)
    run_dir = tmp_path / run.dir
    run_dir.mkdir(parents=True)
    (run_dir / "run.yaml").write_text(yaml.safe_dump(settings))
    here = environment()
    assert here["python"] and here["torch"] and here["numpy"]  # installed: versions, not None
    (run_dir / "summary.json").write_text(json.dumps({"environment": here}))
    check_run_dirs([run], tmp_path)
    other = here | {"numpy": "1.0.0"}
    (run_dir / "summary.json").write_text(json.dumps({"environment": other}))
    with pytest.raises(ConfigError, match="made with numpy 1.0.0, this environment has "):
        check_run_dirs([run], tmp_path)
    for old in ({}, {"environment": "torch 2"}, [1]):  # before autok recorded it; not a record
        (run_dir / "summary.json").write_text(json.dumps(old))
        with pytest.raises(ConfigError, match="--out: .* no record of its package versions"):
            check_run_dirs([run], tmp_path)
    # one to be resumed (no summary yet) is read by the config.json it started with
    from autok.experiment import made_elsewhere

    (run_dir / "config.json").write_text(json.dumps({"environment": other}))
    assert "numpy 1.0.0" in (made_elsewhere(run_dir, finished=False) or "")
    (run_dir / "config.json").write_text(json.dumps({"environment": here}))
    assert made_elsewhere(run_dir, finished=False) is None


def test_a_diverged_run_is_told_from_a_failed_one_by_the_line_autok_train_ends_with():
    from autok.experiment import failure

    diverged = (
        "autok: training failed: autok.trainer.engine.divergence.Diverged: "
        "training diverged: non-finite "
        "values at boundary 0 (loss 8.7e+18, drift nan, update inf); lower --lr or --slowmo-beta"
    )
    why = "training diverged: non-finite values at boundary 0 (loss 8.7e+18, drift nan, update"
    # the CLI's line, then what a shutting-down interpreter may still print
    assert failure(["W1204 noise", diverged, "/usr/lib/python3.11/x.py: UserWarning: leak"], 1) == (
        f"diverged: {why} inf); lower --lr or --slowmo-beta"
    )
    crash = "autok: training failed: RuntimeError: Connection reset by peer"
    assert failure(["W1204 noise", crash], 1) == f"FAILED: {crash}"
    # a failure that only quotes a divergence (a user's task raising its own) is a failure
    quoted = "autok: training failed: ValueError: my task says Diverged: no"
    assert failure([quoted], 1) == f"FAILED: {quoted}"
    assert failure([], 137) == "FAILED: 137"


def test_experiment_list_shows_each_forms_runs_and_a_time_it_can_stand_behind(capsys):
    """Each experiment: its description, then per form the runs of its grid (as `expand` makes
    them) and a time that is measured (docs/reproduction.md), scaled from a measurement, or
    said to be untimed."""
    from autok.cli import main
    from autok.experiment import available, count_runs, estimate, expand, load_experiment

    assert main(["experiment", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(available())
    entries = dict(zip(lines[::2], lines[1::2], strict=True))
    for name in available():
        exp = load_experiment(name)
        head = next(h for h in entries if h.split()[0] == name)
        assert exp["description"] in head
        forms = entries[head]
        assert forms.startswith(" " * 19 + "quick: ") and "; full: " in forms, forms
        for form in ("quick", "full"):
            assert f"{form}: {count_runs(exp, form)} runs" in forms, (name, form)
        full = count_runs(exp, "full")
        if (timed := exp.get("measured", {}).get("full")) is not None:  # the panel's full form
            said = (
                f"about {timed['minutes']} min (measured"
                if timed["runs"] == full  # else a plan grown since it was timed
                else f"(scaled from {timed['minutes']} min measured for {timed['runs']} runs"
            )
            assert f"full: {full} runs, " in forms and said in forms, forms
        else:
            assert f"full: {full} runs, not timed" in forms, forms
    assert len(expand(load_experiment("k-sweep"), "quick")) == count_runs(
        load_experiment("k-sweep"), "quick"
    )
    paper = entries[next(h for h in entries if h.startswith("paper-wan "))]
    assert "quick: 48 runs, about 31 min (measured on 2 cores, docs/reproduction.md)" in paper
    # a grid changed since it was timed: the time per run scales, and says from what
    exp = load_experiment("paper-wan")
    grown = {**exp, "seeds": [1, 2, 3, 4, 5, 6]}  # twice the measured three seeds
    assert estimate(grown, "quick") == (
        "quick: 96 runs, about 62 min (scaled from 31 min measured for 48 runs on 2 cores, "
        "docs/reproduction.md)"
    )


def test_the_named_experiments_expand_to_valid_runs():
    from autok.experiment import available, expand, load_experiment

    assert set(available()) >= {"paper-wan", "k-sweep", "beta-sensitivity", "profiler", "scaling"}
    for name in available():
        exp = load_experiment(name)
        quick = expand(exp, "quick")
        # every quick run trains on embedded data: a built-in small dataset or the shipped LM task
        assert quick and all(
            r.settings.get("dataset") in ("mnist1d", "digits")
            or str(r.settings.get("task", "")).startswith("autok.examples.tiny_gpt:")
            for r in quick
        ), name
        if name == "controller-panel":  # its full form is larger, not the paper's workload
            assert len(expand(exp, "full")) > len(quick)
            continue
        if name == "flip-link-confirm":  # one regime of the panel, confirmed as it ran
            assert len(expand(exp, "full")) == len(quick)
            continue
        full = exp["full"]["base"]
        assert full["dataset"] == "cifar100" and full["model"] == "resnet50"
    labels = {r.label for r in expand(load_experiment("paper-wan"), "quick")}
    assert {
        "ddp lr=0.1",
        "ddp lr=0.2",
        "localsgd-slowmo-k4 lr=0.1",
        "cpdp-exposed-sync lr=0.2",
    } <= labels
    # a setting a run fixes is not varied for it: one DDP row in the K sweep
    runs = expand(load_experiment("k-sweep"), "quick")
    seeds = sorted({r.seed for r in runs})
    ksweep = [r.label for r in runs if r.seed == seeds[0]]
    assert ksweep.count("ddp") == 1 and "ddp sync_period=2" not in ksweep
    assert {f"cpdp sync_period={k}" for k in (1, 2, 4, 8, 16, 32, 64)} <= set(ksweep)
    assert len(ksweep) == 15 and len(runs) == 15 * len(seeds)


def as_task_run(d: Path, metric: str = "perplexity") -> None:
    """Rewrite a fake run's files as a --task run judged by `metric` (lower is better): the
    summary's metric keys (docs/design.md §7) and epochs.csv's test_metric column."""
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


# ----- the experiment's order, single seeds, the plots -------------------------------------------

PAPER_WAN = ["ddp", "localsgd-k2", "cpdp-k4", "cpdp-exposed-sync"]  # its file's order of runs


def paper_wan_like(root: Path, seeds=(1, 2), with_order: bool = True) -> None:
    """The grid as autok/experiment.py expands it: runs x LRs x seeds, in that order."""
    order = 0
    for name in PAPER_WAN:
        for lr in (0.1, 0.4):
            for seed in seeds:
                k = 1 if name == "ddp" else 4 if name != "localsgd-k2" else 2
                policy = "exposed-sync" if name == "cpdp-exposed-sync" else "fixed"
                peak = (0.8 if lr == 0.1 else 0.2) + seed / 100
                label = f"{name} lr={lr}"
                fake_run(root, label, seed, peak, 40 / k, k, policy, order if with_order else None)
                cfg = root / label.replace(" ", "_") / f"seed-{seed}" / "config.json"
                cfg.write_text(json.dumps(json.loads(cfg.read_text()) | {"lr": lr}))
                order += 1


def test_rows_follow_the_experiment_in_blocks_that_open_with_their_ddp_row(tmp_path):
    paper_wan_like(tmp_path / "ordered")
    labels = [r.label for r in table_rows(collect(tmp_path / "ordered"))]
    assert labels == [f"{name} lr=0.1" for name in PAPER_WAN] + [
        f"{name} lr=0.4" for name in PAPER_WAN
    ]
    # Runs written before the order was recorded: still one block per LR, DDP first.
    paper_wan_like(tmp_path / "old", with_order=False)
    labels = [r.label for r in table_rows(collect(tmp_path / "old"))]
    assert labels == [
        "ddp lr=0.1",
        "cpdp-exposed-sync lr=0.1",
        "cpdp-k4 lr=0.1",
        "localsgd-k2 lr=0.1",
        "ddp lr=0.4",
        "cpdp-exposed-sync lr=0.4",
        "cpdp-k4 lr=0.4",
        "localsgd-k2 lr=0.4",
    ]
    # The K sweep: one DDP row for all, then each method's K in the file's order.
    for i, (label, k) in enumerate(
        [("ddp", 1), ("cpdp sync_period=2", 2), ("cpdp sync_period=16", 16)]
        + [("localsgd sync_period=2", 2), ("localsgd sync_period=16", 16)]
    ):
        fake_run(tmp_path / "ksweep", label, 42, 0.8, 40 / k, k, order=i)
    labels = [r.label for r in table_rows(collect(tmp_path / "ksweep"))]
    assert labels == [
        "ddp",
        "cpdp sync_period=2",
        "cpdp sync_period=16",
        "localsgd sync_period=2",
        "localsgd sync_period=16",
    ]


def test_a_single_seed_row_shows_its_value_without_a_spread():
    from autok.report import Row

    text = render(
        [
            Row("ddp", 1, (0.9, 0.0), (0.89, 0.0), (10, 0), (5, 0), math.nan, math.nan, [0.9]),
            Row("cpdp-k4", 2, (0.9, 0.01), (0.89, 0.0), (10, 1), (5, 0.5), 1.0, math.nan, []),
        ],
        "t",
    )
    assert "| ddp | 1 | 90.00 | 89.00 | 10.0 | 5.0 | — | — | — |" in text
    assert "| cpdp-k4 | 2 | 90.00 ± 1.00 | 89.00 ± 0.00 | 10.0 ± 1.0 | 5.0 ± 0.5 |" in text


@pytest.fixture
def drawn(monkeypatch):
    """Every figure autok saves, checked as it is saved: no text under 8 pt, and every tick
    label of a log2 (K) axis a whole number. Yields {file name: figure's texts}."""
    import matplotlib.text

    import autok.trainer.loop.plots

    seen: dict[str, list[str]] = {}
    real_save = autok.trainer.loop.plots.save

    def checking_save(fig, path):
        fig.canvas.draw()  # tick labels exist once drawn
        texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
        small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < 8]
        assert not small, f"{path.name}: text under 8 pt: {small[:5]}"
        k_labels = [
            t.get_text()
            for ax in fig.axes
            for axis in (ax.xaxis, ax.yaxis)
            if axis.get_scale() == "log" and axis._scale.base == 2
            for t in axis.get_ticklabels()
            if t.get_visible() and t.get_text()
        ]
        assert all(x.isdigit() for x in k_labels), (path.name, k_labels)
        seen[path.name] = [t.get_text() for t in texts]
        return real_save(fig, path)

    monkeypatch.setattr(autok.trainer.loop.plots, "save", checking_save)
    import autok.report

    monkeypatch.setattr(autok.report, "save", checking_save)
    return seen


def test_every_plot_is_readable_and_says_what_it_shows(tmp_path, drawn):
    paper_wan_like(tmp_path, seeds=(1, 2, 3))
    report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    names = ("frontier", "accuracy_vs_time", "k_paths", "exposed_vs_compute")
    for name in names:
        assert f"({name}.png)" in md and (tmp_path / f"{name}.png").is_file()
    assert sorted(drawn) == sorted(f"{n}.png" for n in names)
    frontier = drawn["frontier.png"]
    # numbered points keyed to the table's rows, the seeds said, the front drawn, LR encoded
    assert "1  ddp lr=0.1" in frontier and "5  ddp lr=0.4" in frontier
    assert {str(i) for i in range(1, 9)} <= {n for t in frontier for n in t.split(",")}
    assert "3,4" in frontier  # cpdp-k4 and cpdp-exposed-sync coincide here: one label
    assert any(t.startswith("mean over seeds (n = 3)") for t in frontier)
    assert any(t.startswith("Pareto front") for t in frontier)
    assert {"LR 0.1", "LR 0.4"} <= set(frontier)
    # every seed, not the first: the legend says mean ± band; one panel per LR
    assert any("band ± 1 std" in t for t in drawn["accuracy_vs_time.png"])
    assert {"LR 0.1", "LR 0.4"} <= set(drawn["accuracy_vs_time.png"])
    assert any("2 seeds" in t or "3 seeds" in t for t in drawn["k_paths.png"])


def test_no_k_paths_plot_without_an_adaptive_policy_and_no_link_to_a_missing_image(tmp_path):
    fake_run(tmp_path, "ddp", 1, 0.9, 40.0)
    fake_run(tmp_path, "cpdp-k4", 1, 0.9, 10.0, 4)
    report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert not (tmp_path / "k_paths.png").exists() and "(k_paths.png)" not in md
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", md):
        assert (tmp_path / link).is_file(), link


def test_the_time_plots_share_the_tables_clock(tmp_path):
    from autok.report import epoch_clock

    fake_run(tmp_path, "ddp", 1, 0.9, 7.5)  # three epochs of 1 s each, 4.5 s of the rest
    (run,) = collect(tmp_path)
    assert epoch_clock(run) == pytest.approx([2.5, 5.0, 7.5])


def test_k_ticks_are_whole_powers_of_two():
    from autok.trainer.loop.plots import k_ticks

    assert k_ticks([1, 4]) == [1, 2, 4]
    assert k_ticks([1]) == [1, 2]
    assert k_ticks([3, 5]) == [2, 4, 8]
    wide = k_ticks([1, 1024])
    assert len(wide) <= 8 and wide[0] == 1 and wide[-1] == 1024
    assert all(t & (t - 1) == 0 for t in wide)


def test_labels_are_placed_without_overlaps():
    from autok.trainer.loop.plots import _overlap, clusters, place_labels

    # a dense 4 x 3 grid of markers 22 pt apart, labels "10".."21"
    points = [(100.0 + 22 * (i % 4), 100.0 + 22 * (i // 4)) for i in range(12)]
    sizes = [(12.0, 9.0)] * len(points)
    boxes = place_labels(points, sizes, radius=4.5, bounds=(0, 0, 400, 400))
    markers = [(x - 4.5, y - 4.5, x + 4.5, y + 4.5) for x, y in points]
    for i, a in enumerate(boxes):
        assert all(_overlap(a, b) == 0 for b in boxes[i + 1 :]), i
        assert all(_overlap(a, m) == 0 for m in markers), i
        assert min(a[0], a[1]) >= 0 and max(a[2], a[3]) <= 400
    # points on top of each other get one label
    assert clusters([(0, 0), (50, 0), (1, 1), (51, 1.5)], within=4) == [[0, 2], [1, 3]]


def _step(global_step: int, next_lr: float):
    """What FileSink.on_step reads: the step's numbers."""
    from autok.trainer.engine.observer import StepInfo
    from autok.trainer.engine.step import StepTimes

    return StepInfo(global_step=global_step, is_boundary=False, times=StepTimes(), next_lr=next_lr)


def test_k_lr_knows_the_lr_of_every_step_and_marks_epochs_and_warmup(tmp_path, drawn):
    from autok.controllers.base import BoundaryStats
    from autok.trainer.engine.optim import lr_factor
    from autok.trainer.loop.plots import epoch_starts, lr_per_step
    from autok.trainer.loop.sinks import FileSink

    (tmp_path / "config.json").write_text(json.dumps({"warmup_epochs": 1, "lr_warmup_epochs": 1}))
    sink = FileSink(tmp_path)
    per_epoch, epochs = 8, 3
    total = per_epoch * epochs

    def lr(step: int) -> float:
        return 0.1 * lr_factor(step, total, per_epoch, "cosine")

    stats = {f.name: 0 for f in dataclasses.fields(BoundaryStats)}
    start = 0
    for step in range(total):
        epoch = step // per_epoch
        k = 1 if epoch == 0 else 4
        if step == 2 * per_epoch:
            # a rollback to the end of epoch 0 trains epoch 1 again: its LRs are recorded once
            for again in range(per_epoch, step):
                sink.on_step(_step(again + 1, lr(again + 1)))
        if (step + 1) % k == 0 or (step + 1) % per_epoch == 0:
            s = stats | {"global_step": step, "interval_steps": step - start + 1, "epoch": epoch}
            sink.on_boundary(BoundaryStats(**s | {"sync_period": k, "lr": lr(step)}), _decision())
            start = step + 1
        sink.on_step(_step(step + 1, lr(step + 1)))
    steps, lrs = lr_per_step(sink._path, sink._lr_first, sink._lrs)
    assert steps == list(range(total + 1))  # step 0 from its boundary record, the rest recorded
    assert lrs == pytest.approx([lr(s) for s in steps])
    assert epoch_starts(sink._path) == {0: 0, 1: 8, 2: 16, 3: 24}
    sink.on_end({"strategy": "cpdp", "policy": "fixed", "link": "wan", "world_size": 2})
    assert (tmp_path / "k_lr.png").stat().st_size > 1000
    texts = drawn["k_lr.png"]
    assert "warmup: K = 1 (1 epoch)" in texts and "LR (every step)" in texts
    assert {"0", "1", "2"} <= set(texts)  # the epochs, numbered on top from 0 as in epochs.csv
    assert "4" in texts  # K's whole-number ticks


def _decision():
    from autok.controllers.base import SyncDecision

    return SyncDecision(next_sync_period=4, reason="test")


def test_the_profile_counts_collectives_apart_from_logical_syncs(synthetic):
    from autok.report import render_profile, sync_profile

    root, _ = synthetic
    for d in (root / "cpdp-k4").iterdir():  # fused boundaries: one collective for two syncs
        rows = list(csv.DictReader((d / "epochs.csv").open()))
        with open(d / "epochs.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[*rows[0], "collectives"])
            w.writeheader()
            w.writerows({**r, "collectives": int(r["param_syncs"])} for r in rows)
    prof = {p.label: p for p in sync_profile(collect(root))}
    assert prof["cpdp-k4"].events == pytest.approx(4.0)  # 2 gradient + 2 parameter syncs
    assert prof["cpdp-k4"].collectives == pytest.approx(2.0)  # in 2 collectives
    assert math.isnan(prof["ddp"].collectives)  # written before the column: not guessed
    text = render_profile(list(prof.values()))
    assert "| cpdp-k4 | 2.0 | 4.0 | 2.0 |" in text and "| ddp | 2.0 | 2.0 | — |" in text


REPORT_FILES = (
    "report.md",
    "report.csv",
    "frontier.png",
    "accuracy_vs_time.png",
    "k_paths.png",
    "exposed_vs_compute.png",
)


def test_the_report_replaces_links_and_never_writes_through_them(synthetic, tmp_path_factory):
    """Each of the report's names linked to a user's file (or to a path that does not exist):
    the report replaces the link with its own file, and the user's files stay as they were."""
    root, _ = synthetic
    mine = tmp_path_factory.mktemp("mine")
    for i, name in enumerate(REPORT_FILES):
        target = mine / f"{name}.mine"
        if i % 2 == 0:
            target.write_text(f"the user's {name}\n")
        (root / name).symlink_to(target)  # odd ones dangle: writing through would create them
    report(root)
    for i, name in enumerate(REPORT_FILES):
        assert not (root / name).is_symlink() and (root / name).is_file(), name
        target = mine / f"{name}.mine"
        if i % 2 == 0:
            assert target.read_text() == f"the user's {name}\n", name
        else:
            assert not target.exists(), name
    assert "frontier.png" in (root / "report.md").read_text()
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]  # no temporary left


def stopped_run(root: Path, log: str = "console.log") -> Path:
    d = root / "cpdp-k2" / "seed-1"
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"label": "cpdp-k2", "seed": 1}))
    (d / "epochs.csv").write_text("epoch,test_accuracy\n0,0.25\n")
    return d / log


@pytest.mark.timeout(120)  # the old read of a FIFO waited for a writer forever
def test_a_running_run_whose_log_is_a_fifo_is_reported_without_reading_it(synthetic):
    import os

    root, _ = synthetic
    os.mkfifo(stopped_run(root))
    text = report(root)
    assert "| cpdp-k2 | 1 | 1 | 25.00 | no summary (running, or killed) |" in text


def test_only_the_tail_of_a_regular_log_is_read(tmp_path):
    from autok.report import LOG_TAIL_BYTES, collect_stopped, read_log_tail

    log = stopped_run(tmp_path)
    noise = "".join(f"W1204 step {i} of some very chatty library\n" for i in range(100_000))
    last = "autok: training failed: ValueError: boom; advice\n"
    log.write_text("autok: an old line\n" + noise + last)
    tail = read_log_tail(log)
    assert 0 < len(tail.encode()) <= LOG_TAIL_BYTES
    assert tail.startswith("W1204 step ") and tail.endswith("boom; advice\n")  # whole lines
    assert [s.why for s in collect_stopped(tmp_path)] == ["boom"]
    # anything but a regular file is not read: a device that never ends, a link, a directory
    (tmp_path / "zero").symlink_to("/dev/zero")
    assert read_log_tail(tmp_path / "zero") == "" and read_log_tail(tmp_path) == ""
    assert read_log_tail(tmp_path / "missing") == ""


def test_a_value_that_does_not_exist_is_null_in_strict_json_and_read_back_as_nan(tmp_path):
    """A metric that counted nothing has no value: summary.json says null (json.dump would
    write NaN, which is no JSON), and the report reads it as a run without that value."""
    from autok.trainer.loop.sinks import write_json_atomic

    fake_run(tmp_path, "ddp", 1, 0.9, 10.0)
    d = tmp_path / "ddp" / "seed-1"
    summary = json.loads((d / "summary.json").read_text())
    summary |= {"metric": {"name": "mse", "higher_is_better": False}}
    summary |= {"peak_test_metric": math.nan, "final_test_metric": math.nan}
    summary["k_path"] = [{"sync_period": 1, "seconds": math.inf, "steps": 3}]
    write_json_atomic(d / "summary.json", summary)

    def refuse(token: str):
        raise AssertionError(f"not strict JSON: {token}")

    strict = json.loads((d / "summary.json").read_text(), parse_constant=refuse)
    assert strict["peak_test_metric"] is None and strict["final_test_metric"] is None
    assert strict["k_path"] == [{"sync_period": 1, "seconds": None, "steps": 3}]
    assert strict["wall_seconds"] == 10.0
    (run,) = collect(tmp_path)
    assert math.isnan(run.summary["peak_test_metric"])
    assert math.isnan(run.summary["final_test_metric"])


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    from autok.trainer.loop.atomic_write import replacing, write_text

    path = tmp_path / "report.md"
    write_text(path, "old\n")
    with pytest.raises(RuntimeError), replacing(path) as f:
        f.write("half of the new")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old\n" and sorted(tmp_path.iterdir()) == [path]


def test_a_report_says_when_its_runs_were_made_in_more_than_one_installation(tmp_path):
    """The same settings and seed give other numbers in another installation: a report over runs
    of two (or of one and of none recorded) says so at its top; runs of one say nothing, nor do
    runs that all predate the record. `environment` is never a plotted axis."""
    from autok.report import NOT_AN_AXIS, installations

    here = environment()
    for s in (1, 2):
        fake_run(tmp_path, "cpdp k4", s, 0.9, 10.0, k=4)
    assert installations(collect(tmp_path)) is None  # none recorded: nothing to tell
    for d in sorted(tmp_path.glob("*/seed-*")):
        summary = json.loads((d / "summary.json").read_text())
        seed_1 = d.name == "seed-1"
        summary["environment"] = here | ({"numpy": "1.0.0"} if seed_1 else {})
        (d / "summary.json").write_text(json.dumps(summary))
    line = installations(collect(tmp_path))
    assert line is not None and "2 installations" in line
    assert f"numpy 1.0.0 and {here['numpy']}" in line or f"numpy {here['numpy']} and 1.0.0" in line
    assert line in report(tmp_path)
    for d in sorted(tmp_path.glob("*/seed-*")):
        summary = json.loads((d / "summary.json").read_text())
        summary["environment"] = here
        (d / "summary.json").write_text(json.dumps(summary))
    assert installations(collect(tmp_path)) is None
    assert "environment" in NOT_AN_AXIS


def test_no_k_floor_reads_as_a_floor_of_1_in_the_grids_axes():
    """A fixed K (no floor: null in config.json) beside exposed-sync on SGD (floor 1) varies
    the policy, not the floor; a floor of 2 beside 1 is an axis."""
    from types import SimpleNamespace

    from autok.report import varied_settings

    def run(**config):
        return SimpleNamespace(config=config)

    fixed, sgd = run(policy="fixed", k_floor=None), run(policy="exposed-sync", k_floor=1)
    assert varied_settings([fixed, sgd]) == ["policy"]
    adamw = run(policy="exposed-sync", k_floor=2)
    assert varied_settings([fixed, sgd, adamw]) == ["policy", "k_floor"]


def test_a_kept_runs_deeply_nested_config_json_is_no_traceback(tmp_path):
    """A config.json of nested lists under the small-file cap (RecursionError in json) leaves the
    floor and start checks nothing to compare: the run.yaml check stands alone."""
    import json

    from autok.experiment import Run, started_elsewhere

    settings = {"strategy": "cpdp", "policy": "exposed-sync", "epochs": 2, "workers": 2}
    run = Run("exposed-sync", 1, settings)
    run_dir = tmp_path / run.dir
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text("[" * 2000 + "]" * 2000)
    assert started_elsewhere(run_dir, run) is None
    (run_dir / "config.json").write_text(
        json.dumps({**settings, "sync_period": 1, "link_drop": 3.0})
    )
    assert started_elsewhere(run_dir, run) is None
