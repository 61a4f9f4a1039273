"""benchmarks/target_band.py on made-up panel runs: a band time is the geometric mean of the
times to the band's targets, and two runs that cross one target an evaluation apart read close
on the band."""

import math

import pytest

from autok import panel
from benchmarks import target_band
from tests.test_panel import _run


def test_the_band_runs_from_below_the_target_up_to_it():
    band = target_band.Band(0.04, 5)
    assert band.targets(0.9, accuracy=True) == pytest.approx([0.86, 0.87, 0.88, 0.89, 0.9])
    assert band.targets(2.0, accuracy=False) == pytest.approx([2.04, 2.03, 2.02, 2.01, 2.0])


def test_a_band_time_is_the_geometric_mean_of_the_crossings():
    # k1 ends highest (0.93): the target is 0.97 x 0.93 = 0.9021
    runs = [_run("k1", s, [0.5, 0.7, 0.9, 0.93], 1.0) for s in (1, 2)]
    (g,) = panel.build_regimes(runs)
    band = target_band.Band(0.04, 3)
    r = g.best_fixed.runs[0]
    # accuracy rises by 0.2 a second from 1 s to 3 s, then 0.03 to 4 s
    crossings = [1 + (t - 0.7) / 0.2 + 1 if t <= 0.9 else 3 + (t - 0.9) / 0.03 for t in
                 band.targets(g.target, accuracy=True)]  # fmt: skip
    expected = math.exp(sum(map(math.log, crossings)) / 3)
    assert target_band.band_time(r, g, band) == pytest.approx(expected)


def test_a_run_that_crosses_an_evaluation_later_reads_close_on_the_band():
    """The method's runs wobble at the target: one crosses it an evaluation late. On one target
    its ratio to the best fixed K swings from seed to seed; on the band it barely moves."""
    base = [0.5, 0.80, 0.86, 0.88, 0.895, 0.90, 0.92]
    late = [0.5, 0.80, 0.86, 0.88, 0.89, 0.905, 0.92]  # below the target one evaluation longer
    early = [0.5, 0.80, 0.86, 0.88, 0.90, 0.90, 0.92]
    runs = [_run("k8", s, base, 1.0) for s in (1, 2, 3)]
    runs += [_run("exposed-sync", 1, late, 1.0, "exposed-sync")]
    runs += [_run("exposed-sync", 2, early, 1.0, "exposed-sync")]
    runs += [_run("exposed-sync", 3, base, 1.0, "exposed-sync")]
    (g,) = panel.build_regimes(runs)
    assert g.best_fixed.name == "k8"
    (row,) = target_band.rows(g, target_band.Band(0.04, 9))
    assert row.method == "exposed-sync" and row.single.n == row.band.n == 3
    assert row.band.sd_log < row.single.sd_log / 2


def test_a_directory_without_a_panel_says_so(tmp_path, capsys):
    assert target_band.main([str(tmp_path)]) == 1
    assert "no regime" in capsys.readouterr().out
