"""benchmarks/skew_signal.py on a made-up panel directory: the fall of the drift ratio with K is
fitted within each regime and seed, and the index puts every K on the K = 4 scale."""

import json
import math

import yaml

from autok.report import BOUNDARY_COUNTS, BOUNDARY_NUMBERS
from benchmarks import skew_signal


def _run(root, label, seed, settings, ratios):
    run = root / label / f"seed-{seed}"
    run.mkdir(parents=True)
    (run / "run.yaml").write_text(yaml.safe_dump({"strategy": "cpdp", "seed": seed, **settings}))
    base = dict.fromkeys((*BOUNDARY_COUNTS, *BOUNDARY_NUMBERS), 0)  # what autok report checks
    lines = [
        json.dumps({**base, "boundary": i, "global_step": step, "drift_ratio": r})
        for i, (step, r) in enumerate(ratios)
    ]
    (run / "boundaries.jsonl").write_text("\n".join(lines) + "\n")


def test_the_fall_with_k_is_fitted_and_the_index_is_the_ratio_at_k_4(tmp_path, capsys):
    level = {"mild": 2.0, "strong": 3.0}  # the ratio each reads at K = 4
    for regime, at4 in level.items():
        for seed, shift in ((1, 1.0), (2, 1.1)):  # seeds differ by a factor, not in slope
            for k in (2, 4, 8, 16):
                r = at4 * shift * (k / 4) ** -0.3
                # the last boundary is past --steps and reads 100: left out
                _run(tmp_path, f"k{k}_regime={regime}", seed, {"sync_period": k},
                     [(0, r), (8, r), (64, 100.0)])  # fmt: skip
    # K = 1, a policy, and the best fixed K (the same run under another label) are not new points
    _run(tmp_path, "k1_regime=mild", 1, {"sync_period": 1}, [(0, 0.9)])
    _run(tmp_path, "exposed-sync_regime=mild", 1, {"policy": "exposed-sync"}, [(0, 50.0)])
    ratios = skew_signal.early_ratios(tmp_path, steps=64)
    assert len(ratios) == 16 and all(k >= 2 for _, k, _ in ratios)
    assert math.isclose(ratios[("strong", 8, "seed-2")], 3.3 * 2**-0.3)
    gamma = skew_signal.fall_with_k(ratios)
    assert math.isclose(gamma, 0.3, rel_tol=1e-9)
    assert skew_signal.main([str(tmp_path), "--steps", "64"]) == 0
    out = capsys.readouterr().out
    assert "K^-0.30" in out
    assert "| mild | 16 | 2 | 1.32-1.45 | 2.00-2.20 |" in out
    assert "| strong | 2 | 2 | 3.69-4.06 | 3.00-3.30 |" in out


def test_a_directory_without_fixed_k_runs_says_so(tmp_path, capsys):
    _run(tmp_path, "exposed-sync_regime=a", 1, {"policy": "exposed-sync"}, [(0, 2.0)])
    assert skew_signal.main([str(tmp_path)]) == 1
    assert "no fixed-K run" in capsys.readouterr().out


def test_the_judged_window_is_exposed_syncs_first_four_boundaries_and_32_steps_at_k_2_or_more(
    tmp_path,
):
    run = tmp_path / "exposed-sync_regime=mild" / "seed-1"
    run.mkdir(parents=True)
    (run / "run.yaml").write_text(yaml.safe_dump({"strategy": "cpdp", "policy": "exposed-sync"}))
    base = dict.fromkeys((*BOUNDARY_COUNTS, *BOUNDARY_NUMBERS), 0)
    # K = 1 (left out), K = 4 once (started again by the K = 1 after it), then K = 8 four times
    # (32 steps: judged), then a boundary past the window
    ks = [(1, 0.9), (4, 9.0), (1, 0.9), (8, 2.0), (8, 2.2), (8, 1.8), (8, 2.0), (8, 50.0)]
    lines = [
        json.dumps({**base, "boundary": i, "sync_period": k, "interval_steps": k, "drift_ratio": r})
        for i, (k, r) in enumerate(ks)
    ]
    (run / "boundaries.jsonl").write_text("\n".join(lines) + "\n")
    (got,) = skew_signal.judged_windows(tmp_path)["mild"]
    assert math.isclose(got[0], 2.0) and got[1] == 8.0 and got[2] == "seed-1"
    table = skew_signal.judged_table({"mild": [got]}, 0.5)
    assert "| mild | 1 | 8.0-8.0 | 2.00-2.00 | 2.83-2.83 |" in table  # 2 x (8/4)^0.5
    # a longer window takes the boundary after it too; one longer than the run reads nothing
    (longer,) = skew_signal.judged_windows(tmp_path, rounds=5, steps=40)["mild"]
    assert math.isclose(longer[0], (2.0 + 2.2 + 1.8 + 2.0 + 50.0) / 5)
    assert skew_signal.judged_windows(tmp_path, rounds=6, steps=48) == {}
    table = skew_signal.judged_table({"mild": [longer]}, 0.5, 5, 40, per_seed=True)
    assert table[0] == "exposed-sync's window of its first 5 boundaries and 40 steps at K >= 2"
    assert table[-1].endswith("| 1 11.60 |")
    # an arm with options of its own is a row of its own, not pooled with the default's
    arm = tmp_path / "exposed-sync-graded_regime=mild" / "seed-1"
    arm.mkdir(parents=True)
    (arm / "run.yaml").write_text(yaml.safe_dump({"strategy": "cpdp", "policy": "exposed-sync"}))
    (arm / "boundaries.jsonl").write_text((run / "boundaries.jsonl").read_text())
    assert set(skew_signal.judged_windows(tmp_path)) == {"mild", "mild (exposed-sync-graded)"}
