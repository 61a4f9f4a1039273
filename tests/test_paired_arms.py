"""benchmarks/paired_arms.py: two arms of a panel.csv, paired by seed."""

from __future__ import annotations

import math

import pytest

from benchmarks import paired_arms

HEAD = "regime,method,seed,target,time_to_target,final,wall_seconds,bytes,mean_k,run_dir\n"


def write(path, rows):
    path.write_text(
        HEAD + "".join(f"{g},{m},{s},2.7,{t},{f},5.0,1,{k},x\n" for g, m, s, t, f, k in rows)
    )
    return path


def test_final_reached_and_time_on_the_seeds_both_reached(tmp_path, capsys):
    csv = write(
        tmp_path / "panel.csv",
        [
            ("gpt", "a", 1, 2.0, 2.50, 4),
            ("gpt", "a", 2, 4.0, 2.60, 4),
            ("gpt", "a", 3, "", 2.90, 4),  # not reached under A
            ("gpt", "b", 1, 1.0, 2.40, 2),
            ("gpt", "b", 2, 1.0, 2.70, 2),
            ("gpt", "b", 3, 3.0, 2.60, 2),
            ("other", "a", 1, 1.0, 1.0, 1),  # a regime B never ran: left out
        ],
    )
    c = paired_arms.compare(paired_arms.read(csv, "a"), paired_arms.read(csv, "b"))
    assert list(c) == ["gpt"]
    g = c["gpt"]
    assert g["seeds"] == 3 and g["a_higher"] == 2 and g["reached"] == (2, 3)
    assert g["final_diff"] == pytest.approx((0.1 - 0.1 + 0.3) / 3)
    assert g["final_diff_range"] == pytest.approx((-0.1, 0.3))
    r = g["time_ratio"]  # seeds 1 and 2: ratios 2 and 4, geometric mean √8
    assert r.n == 2 and r.ratio == pytest.approx(math.sqrt(8))
    assert g["mean_k"] == (4, 2)
    assert paired_arms.main([str(csv), "a", "b"]) == 0
    assert capsys.readouterr().out.startswith("gpt: a - b, 3 seeds: final +0.1000")


def test_one_arm_against_another_files_and_bad_input(tmp_path, capsys):
    new = write(tmp_path / "new.csv", [("r", "es", 5, 1.0, 0.9, 6), ("r", "es", 6, 2.0, 0.8, 6)])
    old = write(tmp_path / "old.csv", [("r", "es", 5, 1.0, 0.9, 6), ("r", "es", 6, 2.0, 0.8, 6)])
    assert paired_arms.main([str(new), "es", "es", "--b-csv", str(old)]) == 0
    out = capsys.readouterr().out
    assert (
        "final +0.0000" in out and "paired p nan" in out and "time A/B 1.000 (1.000-1.000)" in out
    )
    assert paired_arms.main([str(new), "es", "nope"]) == 1
    assert paired_arms.main([str(tmp_path / "gone.csv"), "es", "es"]) == 2
    assert "gone.csv: no such file" in capsys.readouterr().err
