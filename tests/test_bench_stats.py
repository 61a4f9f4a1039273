"""`autok bench`'s statistics: per-round ratios, spread, verdicts, and the pure parts of the
command (core pinning, flags, the table). No process is started here."""

import pytest

from benchmarks import engine
from benchmarks.stats import (
    MIN_ROUNDS,
    fmt,
    paired_round,
    ratios,
    spread,
    summarize,
    verdict,
)

SEVEN = [1.00, 1.01, 1.05, 0.98, 1.02, 1.03, 1.014]


def test_ratios_are_per_round_not_of_medians():
    ours, plain = [2.0, 6.0, 3.0], [1.0, 6.0, 2.0]
    assert ratios(ours, plain) == [2.0, 1.0, 1.5]
    # the ratio of the medians would be 3.0 / 2.0 = 1.5; the median ratio is 1.5 here too, but
    # the spread only exists per round
    assert spread(ratios(ours, plain)) == (1.5, 1.0, 2.0)


@pytest.mark.parametrize(
    "num, den", [([1.0], [0.0]), ([1.0], [-1.0]), ([float("nan")], [1.0]), ([1.0, 2.0], [1.0])]
)
def test_ratios_refuse_bad_rounds(num, den):
    with pytest.raises(ValueError):
        ratios(num, den)


def test_spread_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no rounds"):
        spread([])


def test_spread_is_median_min_max():
    assert spread(SEVEN) == (1.014, 0.98, 1.05)
    assert spread([3.0, 1.0]) == (2.0, 1.0, 3.0)  # even count: the mean of the middle two


@pytest.mark.parametrize(
    "values, goal, direction, expected",
    [
        ([1.00, 1.01, 1.019, 0.99, 1.0, 1.005, 1.01], 1.02, "le", "met"),
        ([1.00, 1.01, 1.02, 0.99, 1.0, 1.005, 1.01], 1.02, "le", "met"),  # the goal itself
        ([1.03, 1.04, 1.021, 1.1, 1.05, 1.03, 1.06], 1.02, "le", "not met"),
        ([1.02, 1.04, 1.03, 1.1, 1.05, 1.03, 1.06], 1.02, "le", "not resolved"),  # touches it
        (SEVEN, 1.02, "le", "not resolved"),  # median 1.014 meets it, the spread crosses
        ([1.5, 1.0, 1.1, 1.2, 1.3, 1.4, 1.6], 1.0, "ge", "met"),
        ([0.9, 0.8, 0.95, 0.99, 0.7, 0.85, 0.9], 1.0, "ge", "not met"),
        ([0.9, 1.1, 1.0, 1.0, 1.0, 1.0, 1.0], 1.0, "ge", "not resolved"),
    ],
)
def test_verdict(values, goal, direction, expected):
    assert len(values) == MIN_ROUNDS
    assert verdict(values, goal, direction) == expected


def test_too_few_rounds_resolve_nothing():
    clear = [1.0] * MIN_ROUNDS
    assert verdict(clear, 1.02) == "met"
    assert verdict(clear[:-1], 1.02) == "not resolved"
    assert verdict([2.0], 1.02) == "not resolved"
    assert verdict([2.0], 1.02, min_rounds=1) == "not met"


def test_verdict_refuses_an_unknown_direction():
    with pytest.raises(ValueError, match="direction"):
        verdict(SEVEN, 1.02, "lt")


def test_summarize_and_fmt():
    s = summarize(SEVEN, goal=1.02)
    assert s == {
        "median": 1.014,
        "min": 0.98,
        "max": 1.05,
        "rounds": SEVEN,
        "goal": 1.02,
        "direction": "le",
        "verdict": "not resolved",
    }
    assert fmt(s) == "1.014× (0.980–1.050, 7 rounds; goal ≤ 1.02×): not resolved"
    assert fmt(summarize([0.5] * 7, goal=1.2)) == "0.500× (0.500–0.500, 7 rounds; goal ≤ 1.2×): met"
    no_goal = summarize([0.4, 0.5])
    assert "verdict" not in no_goal and "goal" not in no_goal
    assert fmt(no_goal) == "0.450× (0.400–0.500, 2 rounds)"
    assert fmt(summarize([2.0], goal=1.0, direction="ge")) == (
        "2.000× (2.000–2.000, 1 round; goal ≥ 1×): not resolved"
    )


# ----- the command's pure parts ------------------------------------------------------------------


def test_rank_cpus_split_or_share():
    assert engine.rank_cpus((0, 1), 2, 0) == (0,)
    assert engine.rank_cpus((0, 1), 2, 1) == (1,)
    assert engine.rank_cpus((0, 1, 2, 3, 4), 2, 1) == (2, 3)  # disjoint slices; one idle core
    assert engine.rank_cpus((0, 1), 4, 3) == (0, 1)  # fewer cores than ranks: all share them
    assert engine.rank_threads((0, 1), 2) == 1
    assert engine.rank_threads((0, 1, 2, 3), 2) == 2
    assert engine.rank_threads((0, 1), 4) == 1


def test_parse_cpus():
    allowed = (0, 1, 2, 3, 6)
    assert engine.parse_cpus("0-3", allowed) == (0, 1, 2, 3)
    assert engine.parse_cpus(" 6, 1,1 ", allowed) == (1, 6)
    for bad, why in (("x", "not a core"), ("3-1", "low <= high"), ("-1", "not a core")):
        with pytest.raises(ValueError, match=why):
            engine.parse_cpus(bad, allowed)
    with pytest.raises(ValueError, match="core 4 is not one"):
        engine.parse_cpus("2-4", allowed)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--cpus", "nope"], "--cpus"),
        (["--cpus", "100000"], "--cpus"),
        (["--rounds", "0"], "--rounds"),
        (["--only", "z"], "--only"),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        engine.parse(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"autok: error: {flag}") and err.count("\n") == 1


def test_defaults_are_seven_rounds_on_every_usable_core():
    args = engine.parse([])
    assert args.rounds == MIN_ROUNDS >= 7
    assert args.cpus == engine.all_cpus()
    assert {"a", "g", "h"} <= set(args.only.split(","))


def test_render_prints_every_ratio_with_spread_and_verdict():
    step = summarize([1.01] * 7, goal=engine.STEP_GOAL)
    res = {
        "machine": {"cpus": 2, "platform": "p", "torch": "t", "date": "d", "pinned_cpus": [0, 1]},
        "overhead": {
            "world_size": 2,
            "plain_step_s": 4e-3,
            "autok_step_s": 4.1e-3,
            "ratio": step,
            "unpaired_ratio": summarize([0.99, 1.09] * 4),
            "excess_us": [40.0, 38.5, 41.0] + [40.0] * 4,
            "trimmed_excess_us": [44.0, 42.0, 47.5] + [45.0] * 4,
            "pairs": [300, 298] + [300] * 5,
        },
        "local_step": {
            "world_size": 2,
            "k": 8,
            "plain_step_s": 3e-3,
            "autok_step_s": 3.3e-3,
            "ratio": summarize([1.1] * 7, goal=engine.STEP_GOAL),
        },
    }
    res["boundary_fixed"] = {"world_size": 2}
    for model, n in (("cnn1d", 30_000), ("mlp-3m", 3_000_000)):
        res["boundary_fixed"][model] = {
            "params": n,
            "buffer_numel": 2 * n + 8,
            "autok_boundary_s": 1e-3,
            "bare_allreduce_s": 1e-3,
            "ratio": summarize([1.1, 1.3] * 4, goal=engine.BOUNDARY_GOAL),
        }
    # the references: the floor of any averaging and torch's own, on the mlp only (results
    # saved before they existed lack them)
    res["boundary_fixed"]["mlp-3m"] |= {
        "bare_params_s": 7e-3,
        "floor_s": 8.75e-3,
        "floor_ratio": summarize([1.25] * 7),
        "torch_average_s": 1e-2,
        "torch_average_ratio": summarize([1.43] * 7),
        "bare_cpu_share": summarize([0.8] * 7),
    }
    res["boundary_fixed"]["mlp-3m"]["autok_boundary_s"] = 1.5e-3
    res["link_fidelity"] = {"link": "wan", "strategy": "cpdp K=4 fused"} | {
        w: {
            "modelled_s": 0.0174,
            "exposed_s": 0.0176,
            "ratio": summarize([r] * 7, goal=engine.LINK_GOAL),
            "held_ratio": summarize([1.012] * 7),
        }
        for w, r in (("2", 1.01), ("4", 1.08))
    }
    text = engine.render(res)
    assert "world 2 | **1.010× (1.010–1.010, 7 rounds; goal ≤ 1.05×): met**" in text
    assert "world 4 | **1.080× (1.080–1.080, 7 rounds; goal ≤ 1.05×): not met**" in text
    assert "17.60 / 17.40 ms" in text
    assert "collective held / T(S, N) | 1.012× (1.012–1.012, 7 rounds) |" in text
    assert "ranks pinned to cores 0,1" in text
    assert "**1.010× (1.010–1.010, 7 rounds; goal ≤ 1.02×): met**" in text
    assert "**1.100× (1.100–1.100, 7 rounds; goal ≤ 1.02×): not met**" in text
    assert text.count("goal ≤ 1.2×): not resolved") == 2
    assert "mlp-3m (3.00M parameters" in text and "6,000,008 floats" in text
    assert (
        "(h) mlp-3m, reference: the floor of any averaging, the parameters packed, all-reduced "
        "and written back ×1/N (8.75 ms) / bare all_reduce of their 3,000,000 floats (7.00 ms) "
        "| 1.250× (1.250–1.250, 7 rounds) |"
    ) in text
    assert "torch's `average_parameters` (10.00 ms) / the same bare all_reduce | 1.430×" in text
    # the idle rest of the bare all_reduce (20% of 1 ms) against the boundary's excess (0.5 ms)
    assert (
        "(h) mlp-3m, reference: the bare all_reduce's CPU time (all of a rank's threads) / its "
        "wall time on the rank's cores; the idle rest (0.20 ms) bounds what pipelining could "
        "hide of the boundary's excess (0.50 ms) | 0.800× (0.800–0.800, 7 rounds) |"
    ) in text
    assert text.count("the bare all_reduce's CPU time") == 1  # not for a result saved before it
    assert (
        "(a) **overhead ratio** autok / plain, paired (excess per step +40.0 µs, +38.5 to "
        "+41.0; at least 298 pairs a round) | **1.010× (1.010–1.010, 7 rounds; goal ≤ 1.02×): "
        "met**" in text
    )
    assert "(a) reference: the two sides' median steps, unpaired | 1.040× (0.990–1.090" in text
    assert (
        "(a) reference: mean paired excess per step, 1% trimmed at each end (it counts work on a "
        "few steps, which the median does not), µs | +45.0 (+42.0 to +47.5) |" in text
    )
    # the cnn1d's (h) record lacks the references; (g) saved before pairing has no excess
    assert (
        "(g) **local-step ratio** autok / no_sync(), unpaired (the two sides' median steps) | "
        "**1.100×" in text
    )
    assert text.count("reference:") == 5


def test_render_reads_results_saved_before_rounds():
    res = {
        "machine": {"cpus": 2, "platform": "p", "torch": "t", "date": "d"},
        "overhead": {"world_size": 2, "plain_step_s": 4e-3, "autok_step_s": 4.1e-3, "ratio": 1.029},
    }
    text = engine.render(res)
    assert "1.029 (1 run)" in text and "(not recorded)" in text


def test_render_says_when_each_part_was_measured_when_runs_differ():
    res = {
        "machine": {"cpus": 2, "platform": "p", "torch": "t", "date": "day 2"},
        "overhead": {"world_size": 2, "plain_step_s": 4e-3, "autok_step_s": 4.1e-3, "ratio": 1.029},
        "measured": {"overhead": "day 2", "wan": "day 1", "gone": "day 0"},
        "wan": None,
    }
    assert "Measured in separate runs: (f) on day 1; (a) on day 2." in engine.render_header(res)
    res["measured"] = {"overhead": "day 2"}  # one run: nothing to say
    assert "separate runs" not in engine.render_header(res)


def test_a_paired_round_takes_the_median_difference_and_a_trimmed_mean_counts_rare_work():
    # plain steps of 1.0 on quiet batches, 3.0 in a slow stretch (batches 60-99) that hits
    # both steps of a pair (it drops out of their difference); ours costs 0.02 more, and 0.5
    # more on every 50th batch
    plain = {k: 1.0 if k < 60 else 3.0 for k in range(100)}
    ours = {k: v + 0.02 + (0.5 if k % 50 == 0 else 0.0) for k, v in plain.items()}
    got = paired_round(ours, plain)
    assert got["pairs"] == 100 and got["plain"] == 1.0 and got["ours"] == pytest.approx(1.02)
    assert got["excess"] == pytest.approx(0.02)  # the rare 0.5s do not move the median
    assert got["ratio"] == pytest.approx(1.02)
    # 1 of 100 trimmed at each end: one 0.5 is kept, 1/98 of it shows in the mean
    assert got["trimmed_excess"] == pytest.approx(0.02 + 0.5 / 98)
    with pytest.raises(ValueError, match="different steps"):
        paired_round(ours, {k: v for k, v in plain.items() if k != 7})
    with pytest.raises(ValueError, match="no pairs"):
        paired_round({}, {})


def test_the_timing_parts_guard_judges_finiteness_but_not_the_loss():
    """(a), (g) and (h) train until the loss is near zero; a wobble up from there must not stop
    a timing run (it stopped (g) once: benchmarks/results/measurements-in-code.md), and non-finite
    parameters still must."""
    from types import SimpleNamespace

    from autok.trainer.engine.divergence import DivergenceGuard
    from tests.test_controllers import stats

    def judged(guard, losses):
        return [guard.check(stats(8, loss=x, i=i)) for i, x in enumerate(losses)]

    wobble = [2.2] * 4 + [0.008] * 4 + [0.2] * 4  # the shape of (g)'s loss at boundary 687
    assert any(judged(DivergenceGuard(), wobble))  # the default guard stops it
    sync = SimpleNamespace(divergence=DivergenceGuard())
    engine._times_only(sync)
    assert not any(judged(sync.divergence, wobble))
    nan = sync.divergence.check(stats(8, drift_ratio=float("nan"), i=0))  # diverged parameters
    assert nan == "non-finite values at boundary 0 (loss 1.0, drift nan, update 1.0)"
