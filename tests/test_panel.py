"""What the controller panel (docs/design.md §6) needs: a link that changes during the run, a random
K policy of a given mean, the direct share rule, and experiments whose regimes are bundles of
settings with runs mean-matched to other runs."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from autok.controllers import PolicyOptions, build_controller
from autok.controllers.exposed_sync import ExposedSyncController, direct_sync_period
from autok.controllers.random_k import RandomController, draw
from autok.experiment import Run, expand, mean_k_used, with_matched_mean
from autok.trainer.engine.link import PROFILES, LinkClock, parse_schedule
from autok.trainer.engine.options import OptionError, sync_options
from tests.dist import run_dist
from tests.helpers import tiny_cfg
from tests.test_controllers import drive

# ----- the link schedule ------------------------------------------------------------------------


def test_a_schedule_names_the_profile_in_force_at_each_epoch_or_step():
    plan = parse_schedule("lan,wan@epoch=2,slow-wan@epoch=4")
    assert plan.unit == "epoch" and plan.text == "lan,wan@epoch=2,slow-wan@epoch=4"
    names = [plan.at(step=10_000, epoch=e).name for e in range(6)]
    assert names == ["lan", "lan", "wan", "wan", "slow-wan", "slow-wan"]
    steps = parse_schedule("wan,lan@step=3")
    assert [steps.at(s, 0).name for s in range(5)] == ["wan", "wan", "wan", "lan", "lan"]
    assert parse_schedule("none").is_ideal and not plan.is_ideal


def test_the_clock_models_the_profile_of_its_position():
    clock = LinkClock(parse_schedule("lan,slow-wan@step=2"), world_size=2, seed=0)
    nbytes = 10_000
    assert clock.move_to(0, 0).name == "lan"
    assert clock.move_to(2, 0).name == "slow-wan"
    assert clock.profile.allreduce_seconds(nbytes, 2) == PROFILES["slow-wan"].allreduce_seconds(
        nbytes, 2
    )
    assert clock.move_to(1, 0).name == "lan"  # a rollback moves it back


def test_slow_wan_is_100_ms_and_100_mbit():
    p = PROFILES["slow-wan"]
    assert (p.rtt_ms, p.bandwidth_gbps) == (100.0, 0.1)
    # 1 MB over 2 ranks: 2 * (50 ms + 0.5 MB / 12.5 MB/s) = 180 ms
    assert p.allreduce_seconds(1_000_000, 2) == pytest.approx(0.18)


def test_options_record_the_schedule_and_start_on_its_first_profile():
    o = sync_options(link_schedule="wan,lan@epoch=1")
    assert o.link == "wan" and o.link_profile.name == "wan"
    assert o.link_name == "wan,lan@epoch=1" and len(o.link_plan.segments) == 2
    # a resume passes the saved `link` back with the schedule: consistent, so accepted
    assert sync_options(link="wan", link_schedule="wan,lan@epoch=1").link == "wan"
    with pytest.raises(OptionError, match="^--link: "):
        sync_options(link="lan", link_schedule="wan,lan@epoch=1")


# ----- random K ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mean", [1.0, 2.5, 4.0, 7.3, 60.0])
def test_random_draws_have_the_given_mean_and_stay_in_range(mean):
    rng = random.Random(7)
    ks = [draw(rng, mean, 64) for _ in range(40_000)]
    assert min(ks) >= 1 and max(ks) <= 64
    # the seed is fixed: this is a deterministic check of E[K], with 1% of room for the sample
    assert statistics.fmean(ks) == pytest.approx(mean, rel=0.01)
    if mean > 1:
        assert len(set(ks)) > 1


def test_random_is_seeded_identically_on_every_rank_and_resumes_exactly():
    a, b = RandomController(5.0, 64, seed=3), RandomController(5.0, 64, seed=3)
    assert drive(a, 50) == drive(b, 50)
    assert drive(RandomController(5.0, 64, seed=4), 50) != drive(
        RandomController(5.0, 64, seed=3), 50
    )
    state = json.loads(json.dumps(a.state_dict()))  # survives a checkpoint's plain types
    c = RandomController(5.0, 64, seed=99)
    c.load_state_dict(state)
    assert drive(c, 30) == drive(a, 30)


def test_random_defaults_to_the_starting_k_and_keeps_a_rollback_cap():
    c = build_controller("random", 8, PolicyOptions(seed=1))
    assert c.mean == 8 and c.sync_period == 8
    c.rollback(2)
    assert set(drive(c, 40)) <= {1, 2}


# ----- the direct share rule --------------------------------------------------------------------


def test_direct_rule_jumps_to_the_k_that_meets_the_target():
    # share 60% at K=4: r = 1.5, r_t = 0.25, so K* = 4 * 1.5 / 0.25 = 24
    assert direct_sync_period(4, 0.6, target=0.2, max_k=64)[0] == 24
    assert direct_sync_period(4, 0.6, target=0.2, max_k=16)[0] == 16
    assert direct_sync_period(4, 0.6, target=0.2, max_k=64, ceiling=8)[0] == 8
    assert direct_sync_period(16, 0.05, target=0.2, max_k=64)[0] == 3  # K* = 3.37: lowered
    assert direct_sync_period(4, 0.22, target=0.2, max_k=64)[0] == 4  # within the margin
    assert direct_sync_period(1, 0.01, target=0.2, max_k=64)[0] == 1
    # the guard backs off by --k-growth under either rule (it was K/2 whatever the flag)
    assert direct_sync_period(16, 0.9, target=0.2, max_k=64, guard_reason="drift", growth=4)[0] == 4
    k, why = direct_sync_period(8, 0.9, target=0.2, max_k=64, guard_reason="drift")
    assert k == 4 and why.startswith("back off")


def test_direct_controller_settles_in_one_window_and_follows_a_faster_link():
    # 5 ms per step, 100 ms per boundary: the share is 20% at K = 80, capped at 64
    c = ExposedSyncController(sync_period=4, target=0.2, window=2, rule="direct", skew_drift=0)
    ks = drive(c, 5, step_compute=0.005, sync=0.1)
    assert ks == [64, 64, 64, 64, 64]  # K* from the first boundary's times, then windows of 2
    # the link gets 10x faster: K* = 8; doubling would need --k-lowering and three windows
    ks = drive(c, 4, step_compute=0.005, sync=0.01)
    assert ks[-1] == 8, ks
    doubling = ExposedSyncController(sync_period=4, target=0.2, window=2)
    assert drive(doubling, 6, step_compute=0.005, sync=0.1) == [4, 8, 8, 16, 16, 32]


def test_direct_rule_lowers_no_further_than_its_floor():
    # K* = 3.37 from K=16, but the floor (the K the user started from) is 8
    assert direct_sync_period(16, 0.05, target=0.2, max_k=64, floor=8)[0] == 8
    k, why = direct_sync_period(8, 0.01, target=0.2, max_k=64, floor=8)
    assert k == 8 and why.startswith("hold")
    # below the floor after a guard back-off: it may rise again, never lowers further
    assert direct_sync_period(2, 0.01, target=0.2, max_k=64, floor=8)[0] == 2
    assert direct_sync_period(2, 0.6, target=0.2, max_k=64, floor=8)[0] == 12


def test_the_direct_controller_floors_at_its_start_unless_lowering_is_on():
    # a fast link from the start: share 2% at K=4 (K* < 1), so the floored rule holds at 4
    floored = ExposedSyncController(sync_period=4, target=0.2, window=2, rule="direct")
    assert set(drive(floored, 6, step_compute=0.005, sync=0.0004)) == {4}
    lowering = ExposedSyncController(sync_period=4, target=0.2, window=2, rule="direct", lower=True)
    assert drive(lowering, 6, step_compute=0.005, sync=0.0004)[-1] == 1


# ----- experiments: bundles and mean-matched runs ---------------------------------------------

PANEL = {
    "name": "t",
    "seeds": [1, 2],
    "quick": {
        "base": {"workers": 2},
        "vary": {
            "regime": [
                {"name": "fast", "link": "lan", "lr": 0.05},
                {"name": "changing", "link_schedule": "lan,wan@epoch=1"},
            ]
        },
    },
    "runs": [
        {"name": "es", "policy": "exposed-sync"},
        {"name": "rnd", "policy": "random", "random_mean": {"mean_k_of": "es"}},
    ],
}


def test_a_bundle_sets_all_its_settings_and_labels_the_run_by_its_name():
    runs = expand(PANEL, "quick")
    assert [r.label for r in runs[:2]] == ["es regime=fast", "es regime=fast"]
    fast = runs[0].settings
    assert fast["link"] == "lan" and fast["lr"] == 0.05 and "regime" not in fast
    assert runs[2].settings["link_schedule"] == "lan,wan@epoch=1"
    rnd = [r for r in runs if r.label.startswith("rnd")]
    assert [r.mean_k_of for r in rnd] == ["es regime=fast"] * 2 + ["es regime=changing"] * 2
    assert "random_mean" not in rnd[0].settings  # known only once `es` has run


def _boundaries(path: Path, ks: list[tuple[int, int]], warmup_epochs: int) -> None:
    """boundaries.jsonl as the sink writes it: (K, epoch) per record, no warmup flag."""
    path.mkdir(parents=True)
    path.joinpath("config.json").write_text(json.dumps({"warmup_epochs": warmup_epochs}))
    path.joinpath("boundaries.jsonl").write_text(
        "".join(json.dumps({"sync_period": k, "epoch": e}) + "\n" for k, e in ks)
    )


def test_the_matched_mean_is_the_k_the_source_used_after_warmup(tmp_path):
    src = Run("es regime=fast", 1, {})
    _boundaries(tmp_path / src.dir, [(1, 0), (1, 0), (4, 1), (8, 1), (8, 2)], warmup_epochs=1)
    assert mean_k_used(tmp_path / src.dir) == pytest.approx(20 / 3)
    follower = Run("rnd regime=fast", 1, {"policy": "random"}, 5, "es regime=fast")
    with pytest.raises(ValueError, match="did not finish"):
        with_matched_mean(follower, tmp_path)
    (tmp_path / src.dir / "summary.json").write_text("{}")
    matched = with_matched_mean(follower, tmp_path)
    assert matched.settings["random_mean"] == pytest.approx(6.6667)
    assert matched.order == 5 and matched.mean_k_of is None


# ----- on real processes ------------------------------------------------------------------------


def _schedule_worker(rank, world):
    from autok.trainer.loop.run import Trainer

    cfg = tiny_cfg(
        strategy="cpdp",
        policy="random",
        random_mean=3.0,
        link_schedule="none,wan@epoch=1,none@epoch=2",
        epochs=3,
        warmup_epochs=0,
        mnist1d_samples=600,
    )
    records = []

    class Keep:
        def on_boundary(self, stats, decision):
            records.append(stats)

    tr = Trainer(cfg, rank, world, None, observers=[Keep()])
    summary = tr.run()
    return records, summary


@pytest.mark.dist
def test_a_changing_link_is_modelled_and_recorded_and_random_k_agrees_across_ranks():
    (r0, s0), (r1, _) = run_dist(_schedule_worker, 2)
    assert [(r.epoch, r.link) for r in r0] == [(r.epoch, r.link) for r in r1]
    assert {r.epoch: r.link for r in r0} == {0: "none", 1: "wan", 2: "none"}
    assert [r.sync_period for r in r0] == [r.sync_period for r in r1]
    assert len({r.sync_period for r in r0}) > 1  # drawn, not fixed
    assert s0["link"] == "none,wan@epoch=1,none@epoch=2"
    # The emulator holds each wan boundary (one fused collective) for at least its modelled
    # time: a lower bound, which a slow machine cannot break. A record counts the averaging of
    # the boundary before it, so the first record of epoch 1 holds the last one on `none`.
    wan = PROFILES["wan"]
    in_wan = [r for r in r0 if r.epoch == 1][1:]
    assert in_wan
    for r in in_wan:
        modelled = wan.allreduce_seconds(r.bytes_communicated, 2)
        assert r.exposed_sync_seconds >= 0.95 * modelled, (r.exposed_sync_seconds, modelled)


# ----- the panel's report -----------------------------------------------------------------------


def _run(method, seed, accs, epoch_seconds, policy="fixed", schedule=None, ks=(4,), regime="r"):
    """A finished run as the report reads it: accuracy per epoch, time per epoch, K per boundary."""
    from autok.report import RunResult

    epochs = [
        {"test_accuracy": str(a), "epoch_seconds": str(epoch_seconds), "test_loss": "1.0"}
        for a in accs
    ]
    boundaries = [
        {
            "sync_period": 1,
            "epoch": 0,
            "bytes_communicated": 1000,
            "compute_seconds": 0.1,
            "exposed_sync_seconds": 0.05,
            "link": "lan",
        }
    ]
    boundaries += [
        {
            "sync_period": k,
            "epoch": 1,
            "bytes_communicated": 1000 // k,
            "compute_seconds": 0.1 * k,
            "exposed_sync_seconds": 0.05,
            "link": "lan",
        }
        for k in ks
    ]  # fmt: skip; the first record is warmup's (epoch 0), left out of mean K and the K path
    return RunResult(
        f"{method} regime={regime}",
        seed,
        Path("."),
        {"policy": policy, "link_schedule": schedule, "warmup_epochs": 1},
        {"wall_seconds": epoch_seconds * len(accs), "metric": {"name": "accuracy"}},
        epochs,
        boundaries,
    )


def test_time_to_target_and_the_goals_are_judged_against_the_best_fixed_k():
    from autok import panel

    runs = [
        # k1: the best final accuracy (0.90): target 0.873; reached at its 3rd epoch, 3 s each
        *[_run("k1", s, [0.5, 0.8, 0.88, 0.90], 3.0) for s in (1, 2)],
        # k8: reaches the target just before its 2nd epoch's end, 1 s each: the fastest fixed K
        *[_run("k8", s, [0.6, 0.875, 0.88, 0.88], 1.0, ks=(8,)) for s in (1, 2)],
        # the policy: 3% and 1% slower than k8 on the two seeds: within 5% by its upper bound?
        *[_run("exposed-sync", s, [0.6, 0.875, 0.895, 0.895], f, "exposed-sync", ks=(4, 16))
          for s, f in ((1, 1.03), (2, 1.01))],
        # random never reaches it
        *[_run("random", s, [0.5, 0.6, 0.7, 0.8], 1.0, "random", ks=(3, 9, 6)) for s in (1, 2)],
    ]  # fmt: skip
    assert panel.is_panel(runs)
    (g,) = panel.build_regimes(runs)
    assert g.target == pytest.approx(0.97 * 0.90)
    # the crossing is interpolated between evaluations: k8 passes 0.873 between 0.6 at 1 s and
    # 0.875 at 2 s
    crossing = 1.0 + (0.97 * 0.90 - 0.6) / (0.875 - 0.6)
    assert g.best_fixed.name == "k8" and g.best_fixed.ttt == pytest.approx([crossing] * 2)
    es = g.method("exposed-sync")
    assert es.ttt == pytest.approx([1.03 * crossing, 1.01 * crossing]) and es.mean_k == [10, 10]
    assert g.method("random").ttt == [None, None]
    summary = panel.summary_data([g])
    (goal,) = panel.goals(summary, [g])
    # two seeds, log ratios 0.0296 and 0.00995: the t interval (12.7 x sd/sqrt 2) reaches 1.15
    assert goal.ratio == pytest.approx(math.sqrt(1.03 * 1.01))
    assert goal.ci_high > 1.05 and not goal.within and goal.faster == []
    text = panel.render([g], summary)
    assert "| exposed-sync | 2.0 ± 0.0 | 2/2 |" in text and "| random | — | 0/2 |" in text
    assert "4 → 16" in text  # the K path
    assert "| method | r (k8) |" in text  # the summary names the best fixed K
    assert "| exposed-sync | 1.02x |" in text and "| random | n/r 0/2 |" in text
    assert "| r | 1.020 |" in text and "Within 5% everywhere: **no**" in text


def test_a_policy_resolvably_faster_counts_and_one_within_5_percent_meets_the_goal():
    from autok import panel

    runs = [
        *[_run("k8", s, [0.6, 0.88, 0.9], 1.0) for s in (1, 2, 3)],
        *[_run("exposed-sync", s, [0.6, 0.88, 0.9], f, "exposed-sync")
          for s, f in ((1, 1.01), (2, 1.0), (3, 1.02))],
        *[_run("qsr", s, [0.6, 0.88, 0.9], f, "qsr") for s, f in ((1, 0.8), (2, 0.82), (3, 0.81))],
    ]  # fmt: skip
    (g,) = panel.build_regimes(runs)
    summary = panel.summary_data([g])
    (goal,) = panel.goals(summary, [g])
    assert goal.within and goal.ci_high <= panel.GOAL_WITHIN
    assert goal.faster == ["qsr"]  # its upper bound is below 0.90
    # 3 seeds already bound it under 1.05; the plan for the next panel says how few would
    assert goal.seeds_for_within == summary["regimes"]["r"]["exposed-sync"]["seeds_for_within"]
    assert goal.seeds_for_within is not None and 2 <= goal.seeds_for_within <= 3
    assert f"| qsr | {goal.seeds_for_within} |" in panel.render_goals([goal])
    assert "| r | 1.010 |" in panel.render_goals([goal])


def test_a_policy_faster_by_the_same_ratio_in_every_seed_is_resolvably_faster():
    from types import SimpleNamespace

    from autok import panel

    # no spread: CI [0.8, 0.8] and p 0 (Holm 0): certain, not "no p, so 1"
    g = SimpleNamespace(plan={"prediction": {"expect": {"faster": ["qsr"]}}, "arms": ["k8"],
                              "best_fixed": "k8"})  # fmt: skip
    sure = {"qsr": {"ratio": 0.8, "ci_low": 0.8, "ci_high": 0.8, "p_holm": 0.0, "reached": 1.0}}
    assert panel.resolve(g, sure)[0] == "confirms"  # type: ignore[arg-type]
    untested = {
        "qsr": {"ratio": 0.8, "ci_low": 0.7, "ci_high": 0.9, "p_holm": None, "reached": 1.0}
    }
    assert panel.resolve(g, untested)[0] == "unresolved"  # type: ignore[arg-type]
    # a seed it missed enters the ratio at its run's end: not shown faster, however low the CI
    missed = {"qsr": {**sure["qsr"], "reached": 0.9}}
    assert panel.resolve(g, missed)[0] == "unresolved"  # type: ignore[arg-type]


def test_a_policy_that_missed_the_target_in_a_seed_is_not_shown_faster():
    """A run that never reaches the target enters the paired ratio at its end: one that ends
    early (larger K, less time in sync) reads "faster" without crossing. Such a policy does not
    count towards the goal, and the nearest-to-faster line says why."""
    from autok import panel

    runs = [
        *[_run("k8", s, [0.6, 0.88, 0.9], 1.0) for s in (1, 2, 3, 4)],
        # reaches in three seeds, 20% sooner; the fourth never reaches and ends at 0.5 of the time
        *[_run("adacomm", s, [0.6, 0.88, 0.9], 0.8, "adacomm") for s in (1, 2, 3)],
        _run("adacomm", 4, [0.5, 0.6, 0.7], 0.5, "adacomm"),
        *[_run("exposed-sync", s, [0.6, 0.88, 0.9], 1.0, "exposed-sync") for s in (1, 2, 3, 4)],
    ]
    (g,) = panel.build_regimes(runs)
    summary = panel.summary_data([g])
    e = summary["regimes"]["r"]["adacomm"]
    assert e["ci_high"] <= panel.GOAL_FASTER and e["reached"] == 0.75  # "faster" by the bound
    (goal,) = panel.goals(summary, [g])
    assert goal.faster == [] and not panel.shown_faster(e)
    assert panel.shown_faster({**e, "reached": 1.0})
    why = panel.render_why([goal], [g], summary)
    assert "- r: adacomm, " in why and "reached in 75% of seeds" in why and "not counted" in why


def test_a_run_that_did_not_finish_is_a_seed_that_did_not_reach_the_target():
    """A diverged main-seed run has no summary: it counts as not reaching (the goal's 'reached
    in every seed' fails) and drops out of the ratio, rather than vanishing from the panel."""
    from autok import panel
    from autok.report import StoppedRun

    runs = [
        *[_run("k8", s, [0.6, 0.88, 0.9], 1.0) for s in (1, 2, 3)],
        *[_run("exposed-sync", s, [0.6, 0.88, 0.9], 1.0, "exposed-sync") for s in (1, 2)],
    ]
    stopped = [StoppedRun("exposed-sync regime=r", 3, 2, 0.7, "training diverged")]
    regimes = panel.build_regimes(runs)
    summary = panel.summary_data(regimes, stopped=stopped)
    e = summary["regimes"]["r"]["exposed-sync"]
    assert e["reached"] == pytest.approx(2 / 3) and e["did_not_finish"] == 1 and e["n"] == 2
    (goal,) = panel.goals(summary, regimes)
    assert not goal.within
    assert "| 2/2 (+1 did not finish) |" in panel.render(regimes, summary)
    # a pilot run that stopped is no main seed; nor is another regime's, nor a non-regime label
    others = [StoppedRun("exposed-sync regime=q", 3, 2, 0.7, "x"),
              StoppedRun("exposed-sync other=r", 3, 2, 0.7, "x"),
              StoppedRun("exposed-sync regime=r", 3, 2, 0.7, "x", stage="pilot")]  # fmt: skip
    e = panel.summary_data(regimes, stopped=others)["regimes"]["r"]["exposed-sync"]
    assert e["reached"] == 1.0 and e["did_not_finish"] == 0
    # the baseline's seed that did not finish is not charged to the method; every seed of a
    # method that never finished: the whole entry, no ratio
    base = [StoppedRun("k8 regime=r", 4, 1, 0.5, "x"),
            StoppedRun("exposed-sync regime=r", 4, 1, 0.5, "x"),
            StoppedRun("exposed-sync regime=r", 5, 1, 0.5, "x"),
            StoppedRun("qsr regime=r", 1, 1, 0.5, "x")]  # fmt: skip
    summary = panel.summary_data(regimes, stopped=base)["regimes"]["r"]
    assert summary["exposed-sync"]["did_not_finish"] == 1  # seed 4: both stopped; 5: no k8
    assert summary["qsr"]["ratio"] is None and summary["qsr"]["n"] == 0
    assert summary["qsr"]["did_not_finish"] == 1 and summary["qsr"]["seeds_for_within"] is None


def test_a_run_that_crossed_the_target_before_it_stopped_reached_it_then():
    """Time to target is the first crossing: a main-seed run that crossed the target and then
    diverged reached it at that crossing (read from the epochs it finished), counted among the
    runs that did not finish; one whose epochs never crossed it did not reach it."""
    from autok import panel
    from autok.report import StoppedRun

    runs = [
        *[_run("k8", s, [0.6, 0.88, 0.9], 1.0) for s in (1, 2, 3)],
        *[_run("exposed-sync", s, [0.6, 0.88, 0.9], 1.0, "exposed-sync") for s in (1, 2)],
    ]
    rows = tuple({"test_accuracy": a, "epoch_seconds": "1.0"} for a in ("0.6", "0.88"))
    crossed = StoppedRun("exposed-sync regime=r", 3, 2, 0.88, "training diverged", epochs=rows)
    regimes = panel.build_regimes(runs)
    (g,) = regimes
    o = panel.stopped_outcome(crossed, g.judge, g.target)
    assert o.time == pytest.approx(1.0 + (g.target - 0.6) / (0.88 - 0.6)) and not o.finished
    e = panel.summary_data(regimes, stopped=[crossed])["regimes"]["r"]["exposed-sync"]
    assert e["reached"] == 1.0 and e["n"] == 3 and e["ratio"] == pytest.approx(1.0)
    assert e["did_not_finish"] == 1 and e["reached_then_stopped"] == 1
    summary = panel.summary_data(regimes, stopped=[crossed])
    (goal,) = panel.goals(summary, regimes)
    assert goal.within and goal.did_not_finish == goal.reached_then_stopped == 1
    assert "(+1 did not finish, 1 after crossing the target)" in panel.render(regimes, summary)
    assert "; it had crossed the target at 1.98 s" in panel.crossed_before(crossed, regimes)
    # the goal's "why" counts apart only the stopped runs among the seeds that missed it
    both = [crossed, StoppedRun("exposed-sync regime=r", 4, 1, 0.6, "x", epochs=rows[:1])]
    regimes4 = panel.build_regimes([*runs, _run("k8", 4, [0.6, 0.88, 0.9], 1.0)])
    summary = panel.summary_data(regimes4, stopped=both)
    (goal,) = panel.goals(summary, regimes4)
    why = panel.render_why([goal], regimes4, summary)
    assert "missed in 25% of the seeds (1 of them stopped before the end)" in why
    # a last row cut short (a crash) does not hide a crossing the rows before it made
    cut = StoppedRun("exposed-sync regime=r", 3, 3, 0.88, "x", epochs=(*rows, {"test_acc": "0"}))
    assert panel.stopped_outcome(cut, g.judge, g.target) == o
    # epochs that never met it, or rows it cannot read: not reached, as before
    short = StoppedRun("exposed-sync regime=r", 3, 1, 0.6, "x", epochs=rows[:1])
    torn = StoppedRun("exposed-sync regime=r", 3, 1, 0.6, "x", epochs=({"test_accuracy": "0.9"},))
    for s in (short, torn):
        e = panel.summary_data(regimes, stopped=[s])["regimes"]["r"]["exposed-sync"]
        assert e["reached"] == pytest.approx(2 / 3) and e["reached_then_stopped"] == 0
        assert e["n"] == 2 and panel.crossed_before(s, regimes) == ""


def test_a_policy_that_misses_the_target_in_one_seed_fails_and_says_so():
    from autok import panel

    runs = [
        *[_run("k8", s, [0.6, 0.88, 0.9], 1.0) for s in (1, 2)],
        _run("exposed-sync", 1, [0.6, 0.88, 0.9], 1.0, "exposed-sync"),
        _run("exposed-sync", 2, [0.6, 0.7, 0.8], 1.0, "exposed-sync"),  # never reaches 0.873
    ]
    regimes = panel.build_regimes(runs)
    (goal,) = panel.goals(panel.summary_data(regimes), regimes)
    assert goal.reached == 0.5 and not goal.within
    assert "| 50% | **no** |" in panel.render_goals([goal])


def test_panel_csv_has_a_row_per_run_with_its_directory_relative_to_the_experiment(tmp_path):
    import csv
    import dataclasses

    from autok import panel

    runs = [
        dataclasses.replace(
            _run("k8", s, [0.6, 0.88, 0.9], 1.0), dir=tmp_path / "k8_regime=r" / f"seed-{s}"
        )
        for s in (1, 2)
    ]
    panel.write_csv(panel.build_regimes(runs), tmp_path / "panel.csv")
    rows = list(csv.DictReader((tmp_path / "panel.csv").read_text().splitlines()))
    assert [r["run_dir"] for r in rows] == ["k8_regime=r/seed-1", "k8_regime=r/seed-2"]
    crossing = 1.0 + (0.97 * 0.9 - 0.6) / (0.88 - 0.6)  # interpolated between evaluations
    assert rows[0]["method"] == "k8"
    assert float(rows[0]["time_to_target"]) == pytest.approx(crossing)


def test_the_resolvable_difference_follows_the_spread_and_the_seeds():
    from scipy import stats as st

    from autok.panel import resolvable

    v = [0.90, 0.91, 0.92]
    assert resolvable(v, 3) == pytest.approx(st.t.ppf(0.975, 4) * 0.01 * (2 / 3) ** 0.5)
    assert math.isnan(resolvable([0.9], 1))


# ----- the panel's statistics (autok/panel_stats.py) --------------------------------------------


def test_the_crossing_is_interpolated_exactly_on_a_line():
    from autok.panel_stats import crossing_time

    times, accs = [1.0, 2.0, 3.0, 4.0], [0.2, 0.4, 0.6, 0.8]  # acc = 0.2 t
    assert crossing_time(times, accs, 0.5, higher_is_better=True) == pytest.approx(2.5)
    assert crossing_time(times, accs, 0.1, higher_is_better=True) == 1.0  # met at once
    assert crossing_time(times, accs, 0.9, higher_is_better=True) is None
    losses = [2.0, 1.5, 1.0, 0.5]  # lower is better: loss = 2.5 − 0.5 t
    assert crossing_time(times, losses, 1.2, higher_is_better=False) == pytest.approx(2.6)


def test_holm_on_a_textbook_example():
    from autok.panel_stats import holm

    # sorted 0.005, 0.01, 0.03, 0.04 -> 4x, 3x, 2x, 1x = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    adjusted = holm([0.01, 0.04, 0.03, 0.005, math.nan])
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(adjusted[4])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1


def test_the_paired_ratio_ci_and_p_are_scipys_on_the_log_times():
    from scipy import stats as st

    from autok.panel_stats import paired_log_ratio

    method, base = [10.0, 12.0, 9.0, 11.5, 10.2], [11.0, 12.5, 10.5, 11.0, 12.0]
    d = [math.log(a / b) for a, b in zip(method, base, strict=True)]
    res = st.ttest_1samp(d, 0.0)
    lo, hi = res.confidence_interval(0.95)
    r = paired_log_ratio(method, base)
    assert r.ratio == pytest.approx(math.exp(statistics.fmean(d)))
    assert (r.ci_low, r.ci_high) == pytest.approx((math.exp(lo), math.exp(hi)))
    assert r.p == pytest.approx(st.ttest_rel(np_log(method), np_log(base)).pvalue)
    assert r.n == 5 and r.ci_low < r.ratio < r.ci_high


def test_a_paired_ratio_without_spread_is_certain_and_a_tie_has_p_1():
    from autok.panel_stats import paired_log_ratio

    tie = paired_log_ratio([10.0, 12.0, 9.0], [10.0, 12.0, 9.0])  # a policy run as the fixed K
    assert (tie.ratio, tie.ci_low, tie.ci_high, tie.p, tie.sd_log) == (1.0, 1.0, 1.0, 1.0, 0.0)
    slower = paired_log_ratio([20.0, 24.0, 18.0], [10.0, 12.0, 9.0])
    assert slower.ratio == pytest.approx(2.0) and slower.ci_high == pytest.approx(2.0)
    assert slower.p == 0.0


def np_log(xs):
    return [math.log(x) for x in xs]


def test_the_resolvable_ratio_has_80_percent_power():
    from scipy import stats as st

    from autok.panel_stats import resolvable_ratio, resolvable_ratio_unpaired

    sd, n = 0.1, 6
    delta = math.log(resolvable_ratio(sd, n))
    # The paired t-test's power at that true log ratio, from the noncentral t: about 0.8 (the
    # formula is the standard approximation, exact up to the central-t quantile it reuses)
    crit, nc = st.t.ppf(0.975, n - 1), delta / (sd / math.sqrt(n))
    power = 1 - st.nct.cdf(crit, n - 1, nc) + st.nct.cdf(-crit, n - 1, nc)
    assert 0.77 < power < 0.83
    assert resolvable_ratio(sd, 24) < resolvable_ratio(sd, n)
    assert math.isnan(resolvable_ratio(sd, 1))
    a, b = [0.0, 0.1, 0.2], [0.0, 0.2, 0.4]  # variances 0.01 and 0.04
    se = math.sqrt(0.01 / 3 + 0.04 / 3)
    expect = math.exp((st.t.ppf(0.975, 4) + st.t.ppf(0.8, 4)) * se)
    assert resolvable_ratio_unpaired(a, b) == pytest.approx(expect)


def test_seeds_for_a_bound_are_the_fewest_with_80_percent_power():
    """The seed count that plans the next panel: at that n the paired t-test of 'ratio <
    bound' has about 80% power (noncentral t), at n − 1 it has less."""
    from scipy import stats as st

    from autok.panel_stats import seeds_for_bound

    ratio, sd, bound = 0.97, 0.073, 1.05  # the last panel's iid-wan, as measured
    n = seeds_for_bound(ratio, sd, bound)
    assert n == 9

    def power(m):  # one-sided at 0.025: the CI's upper bound under `bound`
        nc = (math.log(bound) - math.log(ratio)) / (sd / math.sqrt(m))
        return 1 - st.nct.cdf(st.t.ppf(0.975, m - 1), m - 1, nc)

    assert power(n) > 0.78 and power(n - 1) < 0.78  # 0.81 and 0.75 here
    assert seeds_for_bound(1.0, sd, bound) > n  # the closer to the bound, the more seeds
    assert seeds_for_bound(1.05, sd, bound) is None and seeds_for_bound(1.2, sd, bound) is None
    assert seeds_for_bound(0.97, math.nan, bound) is None
    assert seeds_for_bound(1.0499, 1.0, bound) is None  # out of any panel's reach


def test_summary_json_pairs_seeds_against_the_best_fixed_k_and_marks_censored_runs(tmp_path):
    from autok import panel

    runs = [
        *[_run("k1", s, [0.5, 0.8, 0.88, 0.90], 3.0) for s in (1, 2)],
        *[_run("k8", s, [0.6, 0.875, 0.88, 0.88], 1.0, ks=(8,)) for s in (1, 2)],
        # seed 1 at 1.05x the best fixed K's time, seed 2 at 1.2x (epochs of 1.05 s and 1.2 s)
        _run("exposed-sync", 1, [0.6, 0.875, 0.895, 0.895], 1.05, "exposed-sync"),
        _run("exposed-sync", 2, [0.6, 0.875, 0.895, 0.895], 1.2, "exposed-sync"),
        *[_run("random", s, [0.5, 0.6, 0.7, 0.8], 1.0, "random") for s in (1, 2)],
    ]
    panel.report(tmp_path, runs, [])  # `autok report` on a panel: summary.json by report.md
    assert (tmp_path / "report.md").exists()
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["default_policy"] == "exposed-sync" and data["baseline"] == {"r": "k8"}
    r = data["regimes"]["r"]
    assert set(r) == {"k1", "k8", "exposed-sync", "random"}
    es = r["exposed-sync"]
    assert es["ratio"] == pytest.approx(math.sqrt(1.05 * 1.2))  # geometric mean of the pairs
    assert es["ci_low"] < es["ratio"] < es["ci_high"] and es["reached"] == 1.0
    assert not es["censored"] and 0 < es["p_holm"] <= 1
    # k8 crosses 0.873 at 1 + 0.273/0.275 s (interpolated); random never: its run end, 4 s
    cross = 1 + (0.97 * 0.9 - 0.6) / 0.275
    assert r["random"]["ratio"] == pytest.approx(4.0 / cross)
    assert r["random"]["reached"] == 0.0 and r["random"]["censored"]
    assert r["k8"]["ratio"] == 1.0 and r["k8"]["p_holm"] is None
    assert set(es) >= {"ratio", "ci_low", "ci_high", "p_holm", "reached"}


def test_the_evidence_table_gives_the_policy_s_k_network_share_and_drift_beside_the_best_k():
    """Why a goal is met or missed, from the records: the network share leaves out the wait for a
    slower rank (what exposed-sync steers), and the drift ratio is the records' mean."""
    from autok import panel

    def with_records(r, drift, peer):
        for b in r.boundaries:
            b["drift_ratio"], b["peer_wait_seconds"] = drift, peer
        return r

    runs = [
        *[with_records(_run("k8", s, [0.6, 0.88, 0.9], 1.0, ks=(8, 8)), 2.0, 0.0) for s in (1, 2)],
        *[with_records(_run("exposed-sync", s, [0.6, 0.7, 0.8], 1.0, "exposed-sync", ks=(4, 16)),
                       3.0, 0.025) for s in (1, 2)],
    ]  # fmt: skip
    regimes = panel.build_regimes(runs)
    text = panel.render_evidence(regimes)
    # k8, after warmup: compute 0.8 + 0.8, exposed 0.05 + 0.05, no peer wait: 0.1 / 1.7 = 6%
    # (the first epoch after warmup: epochs.csv's second row, 1 s in both)
    assert "| r | k8 | 8.0 | 6% | 2.00 | 1 s | 2/2 | 90.00 |" in text
    # exposed-sync: compute 0.4 + 1.6, network (0.05 - 0.025) x 2 = 0.05: 0.05 / 2.05 = 2%
    assert "| r | exposed-sync | 10.0 | 2% | 3.00 | 1 s | 0/2 | 80.00 |" in text
    assert panel.render(regimes, panel.summary_data(regimes)).count("### The evidence") == 1


def test_same_runs_finds_the_runs_whose_records_differ_and_ignores_a_named_field(tmp_path):
    """benchmarks/same_runs.py: the check behind docs/controller-panel's "the results do not
    depend on the machine"."""
    from benchmarks.same_runs import compare

    def run(root, name, lr, extra):
        d = root / name / "seed-1"
        d.mkdir(parents=True)
        (d / "epochs.csv").write_text("epoch,test_accuracy\n0,0.5\n")
        rec = {"epoch": 0, "global_step": 3, "sync_period": 4, "lr": lr, **extra}
        rec |= {"exposed_sync_seconds": 0.1, "compute_seconds": 0.2}
        (d / "boundaries.jsonl").write_text(json.dumps(rec) + "\n")

    a, b = tmp_path / "a", tmp_path / "b"
    run(a, "k4_regime=r", 0.1, {})
    run(b, "k4_regime=r", 0.1, {"peer_wait_seconds": 0.0})  # a field the later run added
    run(a, "es_regime=r", 0.1, {})
    run(b, "es_regime=r", 0.2, {})
    run(a, "only_in_a", 0.1, {})
    assert compare(a, b, {"peer_wait_seconds"}) == (2, ["es_regime=r/seed-1"])
    assert compare(a, b, set()) == (2, ["es_regime=r/seed-1", "k4_regime=r/seed-1"])


def test_runs_compared_with_a_panel_csv_column_by_column(tmp_path):
    """benchmarks/same_runs.py --panel-csv: runs that panel.csv was written from agree with it in
    every column; a run whose curve moved, or whose bytes did, is named."""
    import csv
    import dataclasses

    from autok import panel
    from benchmarks.same_runs import against_csv

    runs = [
        *[_run("k1", s, [0.5, 0.8, 0.88, 0.90], 3.0) for s in (1, 2)],
        *[_run("es", s, [0.6, 0.875, 0.895, 0.9], 1.0, "exposed-sync", ks=(4, 16)) for s in (1, 2)],
    ]
    panel.write_csv(panel.build_regimes(runs), tmp_path / "panel.csv")
    with open(tmp_path / "panel.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert against_csv(runs, rows) == (4, [])
    moved = dataclasses.replace(runs[2], epochs=[{**e} for e in runs[2].epochs])
    moved.epochs[1]["test_accuracy"] = "0.7"  # crosses the target an epoch later
    fewer = dataclasses.replace(runs[3], boundaries=runs[3].boundaries[:-1])
    assert against_csv([runs[0], moved, fewer], rows) == (3, ["r es 1", "r es 2"])
    assert against_csv([_run("other", 1, [0.5], 1.0)], rows) == (0, [])


def test_why_a_goal_was_missed_is_read_from_the_records_case_by_case():
    """The report says why the default policy missed "within 5%" (docs/design.md §6): quality
    where it missed the target, time where it was resolvably slower, or that the seeds cannot
    tell; with its K, share, drift and decisions beside the best fixed K's, and what would
    change it."""
    from autok import panel

    def judged(runs):
        regimes = panel.build_regimes(runs)
        summary = panel.summary_data(regimes)
        gs = panel.goals(summary, regimes)
        return gs[0], regimes[0], panel.render_why(gs, regimes, summary)

    def held(r, reasons):
        for b, why in zip(r.boundaries[1:], reasons, strict=True):  # after warmup's record
            b["reason"] = why
        return r

    best = [_run("k8", s, [0.6, 0.88, 0.9], 1.0, ks=(8, 8)) for s in (1, 2, 3)]
    # quality: at a mean K of 16 one seed never reaches the target
    quality = [
        _run("exposed-sync", s, accs, 1.0, "exposed-sync", ks=(16, 16))
        for s, accs in ((1, [0.6, 0.88, 0.9]), (2, [0.6, 0.88, 0.9]), (3, [0.6, 0.7, 0.8]))
    ]
    goal, g, text = judged(best + quality)
    assert "**quality**: the target missed in 33% of the seeds; " in text
    assert "mean K of 16.0, above the best fixed K's 8" in text and "a K nearer" in text
    # time: resolvably slower (1.2x in every seed but one, 1.22x) at K = 2, held at a cap in half
    # its decisions and backed off once a run
    slow = [held(_run("exposed-sync", s, [0.6, 0.88, 0.9], f, "exposed-sync", ks=(2, 2)),
                 ["hold: sync share 40% > target, K at its cap 2", "back off: loss rose"])
            for s, f in ((1, 1.2), (2, 1.22), (3, 1.2))]  # fmt: skip
    goal, g, text = judged(best + slow)
    assert goal.ci_low > 1.0 and panel.decisions(g.method("exposed-sync")) == (0.5, 1.0)
    assert "**time**: resolvably slower" in text and "below the best fixed K's 8" in text
    assert "50% of its decisions held K at a cap, 1.0 back-offs a run" in text
    assert "a larger K here" in text
    # the seeds cannot tell: 1.03x and 0.99x at the same K; qsr the nearest to 10% faster
    close = [_run("exposed-sync", s, [0.6, 0.88, 0.9], f, "exposed-sync", ks=(8, 8))
             for s, f in ((1, 1.03), (2, 0.99), (3, 1.04))]  # fmt: skip
    qsr = [_run("qsr", s, [0.6, 0.88, 0.9], f, "qsr") for s, f in ((1, 0.95), (2, 0.96), (3, 0.9))]
    goal, g, text = judged(best + close + qsr)
    assert goal.ci_low < 1.0 < goal.ci_high and not goal.within
    assert "**not resolved**" in text and "near the best fixed K's 8" in text
    assert f"about {goal.seeds_for_within} seeds would bound it at 1.05" in text
    assert "- r: qsr, 0.936×" in text
    # the best fixed K missed it in a seed too: not "it reached it at fixed K"
    missing = best[:2] + [_run("k8", 3, [0.6, 0.7, 0.8], 1.0, ks=(8, 8))]
    goal, g, text = judged(missing + quality)
    assert not goal.baseline_reached and "and by the best fixed K in some" in text
    assert "the best fixed K missed the target in some seed too" in text
    # one seed: no CI, said so
    goal, g, text = judged(best[:1] + close[:1])
    assert "**not resolved**: 1.030× with no CI (fewer than 2 paired seeds)" in text
    # a ratio above 1.05 with a CI spanning 1: more seeds alone would not bound it
    wide = [_run("exposed-sync", s, [0.6, 0.88, 0.9], f, "exposed-sync", ks=(8, 8))
            for s, f in ((1, 0.9), (2, 1.3), (3, 1.0))]  # fmt: skip
    goal, g, text = judged(best + wide)
    assert goal.ci_low < 1.0 < goal.ratio and goal.ratio > 1.05
    assert "its ratio is above 1.05, so more seeds alone would not bound it there" in text
    # met: no line of its own
    met = [_run("exposed-sync", s, [0.6, 0.88, 0.9], 1.0, "exposed-sync") for s in (1, 2, 3)]
    goal, g, text = judged(best + met)
    assert goal.within and panel.why_missed(goal, g) is None
    assert "- exposed-sync met it in every regime." in text


def test_a_k_set_in_hindsight_is_no_policy_for_the_goals_and_an_epoch_cap_is_not_the_policys():
    """A `scheduled` arm (K per phase, chosen after the run: the phase oracle) is a bound, not a
    policy: it is not counted 10% faster, nor named the nearest. The engine's cap at an epoch's
    length is not a cap the policy held K at."""
    from autok import panel

    best = [_run("k8", s, [0.6, 0.88, 0.9], 1.0, ks=(8, 8)) for s in (1, 2, 3)]
    es = [_run("exposed-sync", s, [0.6, 0.88, 0.9], f, "exposed-sync", ks=(8, 8))
          for s, f in ((1, 1.0), (2, 0.97), (3, 0.99))]  # fmt: skip
    oracle = [_run("sched-1-8", s, [0.6, 0.88, 0.9], f, "scheduled")
              for s, f in ((1, 0.8), (2, 0.81), (3, 0.8))]  # fmt: skip
    regimes = panel.build_regimes(best + es + oracle)
    summary = panel.summary_data(regimes)
    (goal,) = panel.goals(summary, regimes)
    assert summary["regimes"]["r"]["sched-1-8"]["ci_high"] <= panel.GOAL_FASTER
    assert goal.faster == []
    assert panel.nearest_faster(summary, regimes[0])[0] == "exposed-sync"
    # the goal's line says what even K set in hindsight showed: here a bound it passed
    text = panel.render_why([goal], regimes, summary)
    assert "- r: exposed-sync, 0.987× (0.949–1.025); K set in hindsight" in text
    assert "K set in hindsight, at best sched-1-8, 0.803×" in text
    assert "shown 10% faster, so a policy following its segments could be" in text
    slow = [_run("sched-1-8", s, [0.6, 0.88, 0.9], f, "scheduled")
            for s, f in ((1, 0.95), (2, 0.97), (3, 0.96))]  # fmt: skip
    slower = [_run("sched-1-4", s, [0.6, 0.88, 0.9], f, "scheduled")
              for s, f in ((1, 0.99), (2, 1.0), (3, 0.98))]  # fmt: skip
    regimes = panel.build_regimes(best + es + slow + slower)
    summary = panel.summary_data(regimes)
    text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
    assert "at best sched-1-8, 0.960×" in text and "sched-1-4" not in text
    assert "not shown 10% faster either, so no policy that sets K per segment from these K" in text
    # its bound met in the seeds it finished, but a seed lost (a run that diverged at the jump)
    from autok.report import StoppedRun

    lost = [
        _run("sched-1-4", s, [0.6, 0.88, 0.9], f, "scheduled") for s, f in ((1, 0.8), (2, 0.81))
    ]
    stopped = [StoppedRun("sched-1-4 regime=r", 3, 2, 0.7, "training diverged")]
    regimes = panel.build_regimes(best + es + lost)
    summary = panel.summary_data(regimes, stopped=stopped)
    assert summary["regimes"]["r"]["sched-1-4"]["ci_high"] <= panel.GOAL_FASTER
    text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
    assert "its bound is met but it reached the target in 67% of seeds, so not shown" in text
    # no K set in hindsight: the line names the nearest policy alone
    regimes = panel.build_regimes(best + es)
    summary = panel.summary_data(regimes)
    text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
    assert "- r: exposed-sync, 0.987× (0.949–1.025)\n" in text and "hindsight" not in text
    for b in es[0].boundaries[1:]:
        b["reason"] = "raise: sync share 30% > target 20%: K* 40; K 40 capped at 32, the steps "
    assert panel.decisions(regimes[0].method("exposed-sync"))[0] == pytest.approx(0.0)


def test_where_the_default_missed_within_5_the_line_says_whether_k_set_in_hindsight_met_it():
    """A goal-1 miss in a regime that ran K set in hindsight also says whether even its best
    was within 5% by the goal's own test: if so a policy following its segments could
    be; if not, the miss is not the following alone."""
    from autok import panel

    best = [_run("k8", s, [0.6, 0.88, 0.9], 1.0, ks=(8, 8)) for s in (1, 2, 3)]
    slow = [_run("exposed-sync", s, [0.6, 0.88, 0.9], f, "exposed-sync", ks=(4, 4))
            for s, f in ((1, 1.2), (2, 1.22), (3, 1.21))]  # fmt: skip
    near = [_run("sched-8-16", s, [0.6, 0.88, 0.9], f, "scheduled")
            for s, f in ((1, 0.98), (2, 0.99), (3, 0.985))]  # fmt: skip
    far = [_run("sched-6-16", s, [0.6, 0.88, 0.9], f, "scheduled")
           for s, f in ((1, 1.1), (2, 1.12), (3, 1.11))]  # fmt: skip

    def line(runs):
        regimes = panel.build_regimes(runs)
        summary = panel.summary_data(regimes)
        text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
        return next(t for t in text.splitlines() if t.startswith("- r: **time**"))

    met = line(best + slow + near + far)
    assert met.endswith(
        "K set in hindsight, at best sched-8-16, 0.985× (0.973–0.997), was within 5%, "
        "so a policy following its segments with these K could be."
    )
    assert line(best + slow + far).endswith(
        "K set in hindsight, at best sched-6-16, 1.110× (1.085–1.135), was not shown "
        "within 5% either."
    )
    assert "hindsight" not in line(best + slow)
    # a lower bound from an arm that lost a seed does not hide one that was within 5%
    from autok.report import StoppedRun

    lost = [
        _run("sched-1-4", s, [0.6, 0.88, 0.9], f, "scheduled") for s, f in ((1, 0.8), (2, 0.81))
    ]
    stopped = [StoppedRun("sched-1-4 regime=r", 3, 2, 0.7, "training diverged")]
    regimes = panel.build_regimes(best + slow + near + lost)
    summary = panel.summary_data(regimes, stopped=stopped)
    assert summary["regimes"]["r"]["sched-1-4"]["ci_high"] < 0.9
    text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
    assert "at best sched-8-16, 0.985× (0.973–0.997), was within 5%" in text
    # within by the reach clause: the best fixed K missed a seed, the schedule none
    missing = best[:2] + [_run("k8", 3, [0.6, 0.7, 0.8], 1.0, ks=(8, 8))]
    unreached = slow[:2] + [_run("exposed-sync", 3, [0.6, 0.7, 0.8], 1.0, "exposed-sync")]
    regimes = panel.build_regimes(missing + unreached + far)
    summary = panel.summary_data(regimes)
    text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
    assert summary["regimes"]["r"]["sched-6-16"]["ci_high"] > 1.05
    assert "reached the target in every seed where the best fixed K did not, so a policy" in text
    # within by the reach clause on one seed, so with no CI: still found, not passed over
    one = [_run("sched-2-8", 1, [0.6, 0.88, 0.9], 1.2, "scheduled")]
    regimes = panel.build_regimes(missing + unreached + one)
    summary = panel.summary_data(regimes)
    assert summary["regimes"]["r"]["sched-2-8"]["ci_high"] is None
    text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
    assert "at best sched-2-8, 1.200× (—), reached the target in every seed where" in text


def test_regimes_follow_the_plans_order_whatever_order_kept_runs_carry():
    """Runs kept from another experiment's directory carry that experiment's grid order: the
    report still lists the regimes as the plan (the experiment's pilots, in turn) does; regimes
    the plan does not name follow, in the runs' order."""
    from dataclasses import replace

    from autok import panel

    def regime(name, order):
        return [
            replace(_run(m, s, [0.6, 0.88, 0.9], 1.0, regime=name), order=order)
            for m in ("k8", "k16")
            for s in (1, 2)
        ]

    runs = regime("b", 0) + regime("c", 1) + regime("a", 2)
    assert [g.name for g in panel.build_regimes(runs)] == ["b", "c", "a"]
    plan = {
        f"regime={n}": {"target": 0.85, "best_fixed": "k8", "arms": {"k8": {"sync_period": 4}}}
        for n in ("a", "b")
    }
    assert [g.name for g in panel.build_regimes(runs, plan)] == ["a", "b", "c"]


def _planned_grid(root: Path, arms: dict[str, int], prediction: dict | None = None) -> None:
    """A regime grid on disk, main seeds 1-3 of each arm (name -> fixed K), and the plan.json
    its pilot would have written (pilot.choose's fields)."""
    from autok import pilot
    from tests.test_report import fake_run

    for name, k in arms.items():
        for s in (1, 2, 3):
            fake_run(root, f"{name} regime=r", s, 0.9, 3.0, k=k)
    arm = {"sync_period": 8, "times": [2.0], "reached": 1, "geo_mean_time": 2.0, "sd_log": None}
    entry = {
        "target": 0.5,
        "metric": "accuracy",
        "target_of": "k8",
        "target_at": 0.5,
        "target_evaluation": 1,
        "rising": True,
        "best_fixed": "k8",
        "best_reached_every_seed": True,
        "pilot_seeds": [101],
        "arms": {"k4": arm | {"sync_period": 4, "final": 0.88}, "k8": arm | {"final": 0.89}},
    }
    pilot.write_entry(root, "regime=r", entry | ({"prediction": prediction} if prediction else {}))


def test_a_panel_of_fixed_arms_alone_is_read_as_a_panel_where_a_pilot_planned_it(tmp_path):
    """A grid of regimes whose arms are all fixed K (a null arm beside the best fixed K) is
    judged on the panel's paired statistics when the pilot planned it, and read as a plain grid
    without a plan; no goals (the default ran nowhere) and no K-path plot (no policy moved K)."""
    from autok import panel
    from autok.report import collect, report

    _planned_grid(tmp_path, {"best-fixed": 8, "nudged": 8})
    plan = tmp_path / "plan.json"
    saved = plan.read_text()
    plan.unlink()
    report(tmp_path)
    plain = (tmp_path / "report.md").read_text()
    assert "time / best fixed K (paired)" not in plain and not (tmp_path / "summary.json").exists()
    plan.write_text(saved)
    runs = collect(tmp_path)
    assert not panel.is_panel(runs) and panel.is_panel(runs, planned=True)
    report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| method | r (best-fixed) |\n|---|---|\n| nudged | 1.00x |" in text  # the summary
    assert "| nudged | 1.000 | 1.000–1.000 |" in text  # the paired table, with no prediction
    assert "## The goals" not in text and "Result:" not in text
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["baseline"] == {"r": "best-fixed"}
    assert set(data["regimes"]["r"]) == {"best-fixed", "nudged"}
    assert not (tmp_path / "panel_k_paths.png").exists() and "panel_k_paths" not in text


def test_a_pilot_alone_is_a_plain_grid_and_a_verdict_on_the_pilot_needs_no_main_arm(tmp_path):
    """A directory where only the pilot ran (its plan written, no main seed yet) reports as a
    grid of fixed K, not as an empty panel; a prediction judged on the pilot's choice alone
    (interior-fixed) keeps its verdict where the best fixed K is the main seeds' only arm."""
    from autok.report import report

    _planned_grid(tmp_path, {"k4": 4, "k8": 8})
    for meta in tmp_path.glob("*/seed-*/experiment.json"):
        meta.write_text(json.dumps(json.loads(meta.read_text()) | {"stage": "pilot"}))
    report(tmp_path)
    assert not (tmp_path / "summary.json").exists()  # the plain grid's report, no crash

    (tmp_path / "alone").mkdir()
    _planned_grid(
        tmp_path / "alone",
        {"best-fixed": 8},
        {"says": "the largest K", "expect": "largest-fixed"},
    )
    report(tmp_path / "alone")
    text = (tmp_path / "alone" / "report.md").read_text()
    assert "**Result: confirms** the prediction: the pilot's best fixed K is k8 of k4, k8" in text


def test_the_first_epoch_s_cost_is_paired_by_seed_and_said_where_it_alone_passes_the_bound():
    """An online policy measures the link before it raises K: the report's why-line gives its
    first epoch after warmup against the best fixed K's, paired by seed, as seconds and as a
    share of the best fixed K's time to the target (geometric over seeds, as goal 1 averages
    ratios), and says where that alone is over the 5% goal 1 allows: only where the best fixed
    K reached every seed (else goal 1 reads reach) and crossed after that epoch ended
    (docs/design.md §6, "why a goal was missed")."""
    from autok import panel

    accs = [0.6, 0.7, 0.88, 0.9]  # warmup's epoch, then the target (0.873) crossed in epoch 2

    def run(method, seed, first, policy="fixed", curve=accs):
        r = _run(method, seed, curve, 1.0, policy, ks=(8, 8) if policy == "fixed" else (4,))
        r.epochs[1]["epoch_seconds"] = str(first)  # epochs.csv's row after warmup's
        return r

    def judged(best, mine):
        regimes = panel.build_regimes(best + mine)
        g = regimes[0]
        summary = panel.summary_data(regimes)
        text = panel.render_why(panel.goals(summary, regimes), regimes, summary)
        return g, panel.start_cost(g.method("exposed-sync"), g.best_fixed), text

    best = [run("k8", s, 1.0) for s in (1, 2, 3)]
    g, cost, text = judged(best, [run("exposed-sync", s, 1.2, "exposed-sync") for s in (1, 2, 3)])
    t = g.best_fixed.ttt[0]
    assert 2.0 < t < 3.0 and cost.seconds == pytest.approx(0.2) and cost.past
    assert cost.share == pytest.approx(0.2 / t) and (cost.timed, cost.paired) == (3, 3)
    assert f"its first epoch took 0.2 s more than the best fixed K's ({0.2 / t:.1%} of" in text
    assert "that alone is over the 5% the goal allows" in text
    evidence = panel.render_evidence(
        regimes=panel.build_regimes(best + [run("exposed-sync", 1, 1.2, "exposed-sync")])
    )
    assert " | 1.2 s | 1/1 |" in evidence and " | 1 s | 3/3 |" in evidence
    # shares of 15.5%, 0 and 0: a mean of 5.2%, but goal 1's geometric mean is 4.9%: not said
    shares = [run("exposed-sync", 1, 1 + 0.155 * t, "exposed-sync")]
    shares += [run("exposed-sync", s, 1.0, "exposed-sync") for s in (2, 3)]
    g, cost, text = judged(best, shares)
    assert cost.share == pytest.approx(1.155 ** (1 / 3) - 1) and "alone" not in text
    # paired by seed, not by place: seed 2 of the best fixed K is not seed 3's pair
    odd = [run("k8", 1, 1.0), run("k8", 2, 1.5), run("k8", 3, 1.0)]
    g, cost, _ = judged(odd, [run("exposed-sync", s, 1.2, "exposed-sync") for s in (1, 3)])
    assert cost.seconds == pytest.approx(0.2) and cost.paired == 2
    # the best fixed K missed a seed: goal 1 reads reach there, and the share is over the rest
    missed = best[:2] + [run("k8", 3, 1.0, curve=[0.6, 0.7, 0.8, 0.8])]
    mine = [run("exposed-sync", s, 1.2, "exposed-sync") for s in (1, 2, 3)]
    g, cost, text = judged(missed, mine)
    assert (cost.timed, cost.paired) == (2, 3)
    said = panel.start_text(cost, bounded=False)
    assert "time to the target, on the 2 seeds it reached)" in said and "alone" not in said
    # crossed inside that epoch: the extra delays the crossing by less than its whole
    early = [run("k8", s, 1.0, curve=[0.6, 0.88, 0.9]) for s in (1, 2, 3)]
    late = [run("exposed-sync", s, 1.2, "exposed-sync", curve=[0.6, 0.88, 0.9]) for s in (1, 2, 3)]
    g, cost, text = judged(early, late)
    assert not cost.past and cost.share > 0.05 and "alone" not in text
    # the same seconds in every seed; a smaller one said as less; no epoch after warmup: nothing
    assert panel.start_cost(g.best_fixed, g.best_fixed).same
    assert panel.start_text(panel.start_cost(g.best_fixed, g.best_fixed), True) == (
        "; its first epoch took the best fixed K's seconds"
    )
    g, cost, _ = judged(best, [run("exposed-sync", s, 0.9, "exposed-sync") for s in (1, 2, 3)])
    assert panel.start_text(cost, True).startswith("; its first epoch took 0.1 s less than")
    bare = [_run("exposed-sync", s, [0.6], 1.0, "exposed-sync") for s in (1, 2, 3)]
    assert judged(best, bare)[1] is None and panel.start_text(None, True) == ""


def test_the_pilot_s_choice_is_checked_against_other_fixed_k_on_the_main_seeds():
    """Where fixed arms at other K ran on the main seeds, the one most surely faster than the
    pilot's choice (the lowest upper bound under 1, the target reached in every seed it ran) is
    named and every other arm is read again against it, paired by seed, by the goals' own tests;
    a fixed K faster by its bound that missed a seed, or whose run did not finish, is not; a
    policy is never the baseline; with no other fixed K there is nothing to check (docs/design.md
    §6, "the pilot's choice, checked")."""
    from autok import panel_stats, pilot_check
    from autok.panel_stats import DID_NOT_FINISH, Outcome

    def arm(times, end=3.0):
        return {s: Outcome(t, end) for s, t in zip((1, 2, 3), times, strict=True)}

    outcomes = {
        "k16": arm([2.0, 2.2, 2.1]),  # the pilot's choice
        "k8": arm([1.8, 2.0, 1.9]),  # faster in every seed, by a nearly constant ratio
        "k2": arm([1.4, 1.8, 1.6]),  # a lower ratio, but a wider CI: less surely faster
        "k4": arm([1.5, 1.6, None], end=1.7),  # faster by its bound, but a seed missed
        "k1": {1: Outcome(1.5, 3.0), 2: Outcome(1.6, 3.0), 3: DID_NOT_FINISH},  # one stopped
        "k32": arm([2.1, 2.3, 2.2]),  # slower in every seed
        # surely faster on the seeds it shares with k16, but it missed a seed k16 did not run
        "k6": arm([1.7, 1.9, 1.8]) | {4: Outcome(None, 3.0)},
        "es": arm([1.5, 1.65, 1.58]),  # a policy, faster than any fixed K: never the baseline
    }
    entries = {m: panel_stats.compare(o, outcomes["k16"]) for m, o in outcomes.items()}
    e = entries
    assert e["k2"]["ratio"] < e["k8"]["ratio"] and e["k8"]["ci_high"] < e["k2"]["ci_high"] < 1
    assert e["k4"]["ci_high"] < 1 and e["k1"]["ci_high"] < 1 and e["es"]["ci_high"] < 0.8
    assert e["k6"]["ci_high"] < e["k8"]["ci_high"] and e["k6"]["reached"] == 1.0
    fixed = ["k16", "k8", "k2", "k4", "k1", "k32", "k6"]
    c = pilot_check.check("k16", fixed, entries, outcomes)
    assert c["faster"] == "k8" and set(c["fixed"]) == set(fixed) - {"k16"}
    assert set(c["against_it"]) == {"k2", "k4", "k1", "k32", "k6", "es"}  # not k16, nor k8
    es = c["against_it"]["es"]
    paired = panel_stats.compare(outcomes["es"], outcomes["k8"])
    assert (es["ratio"], es["ci_low"], es["ci_high"]) == (
        paired["ratio"],
        paired["ci_low"],
        paired["ci_high"],
    )
    ratio = math.exp(
        statistics.fmean(
            math.log(a / b) for a, b in zip([1.5, 1.65, 1.58], [1.8, 2, 1.9], strict=True)
        )
    )
    assert es["ratio"] == pytest.approx(ratio) and (es["seeds"], es["seeds_reached"]) == (3, 3)
    assert set(es) == set(pilot_check.KEPT) | {"seeds", "seeds_reached"}  # no p before Holm
    assert c["fixed"]["k4"]["seeds_reached"] == 2 and c["fixed"]["k1"]["seeds_reached"] == 2
    # k8 and k2 missing a seed too: nothing faster that reached every seed
    outcomes["k8"] = arm([1.8, 2.0, None], end=2.0)
    outcomes["k2"] = arm([1.4, 1.8, None], end=1.7)
    entries = {m: panel_stats.compare(o, outcomes["k16"]) for m, o in outcomes.items()}
    c = pilot_check.check("k16", fixed, entries, outcomes)
    assert c["faster"] is None and c["against_it"] == {}
    assert pilot_check.check("k16", ["k16"], entries, outcomes) is None
    text = pilot_check.render({"r": c}, {"r": "k16"}, {})
    assert "- r: against the pilot's k16: k8 " in text and "none was faster" in text
    assert f"k8 {c['fixed']['k8']['ratio']:.3f}× (" in text and ", 2 of 3 reached), k2 " in text

    # the verdicts are the goals' own tests, against a fixed K that reached every seed
    def said(high, reached=3, seeds=3):
        return pilot_check.verdict(
            {"ci_high": high, "reached": reached / seeds, "seeds": seeds, "seeds_reached": reached}
        )

    assert said(0.89) == "at least 10% faster" and said(0.95) == "within 5%"
    assert said(1.06) == "not within 5%" and said(None).startswith("no CI")
    # 79 of 80 prints as a count, not a share rounded up to 100%
    assert said(0.8, 79, 80) == (
        "the target reached in 79 seeds of 80: neither within 5% nor 10% faster"
    )


def test_the_report_reads_the_arms_again_against_a_fixed_k_faster_than_the_pilot_s(tmp_path):
    """On disk, through `autok report`: the pilot chose K = 8 (the arm best-fixed); K = 4 on the
    main seeds crossed the target sooner in every seed, so summary.json's `pilot_check` names it,
    the report says so, and the default policy is read against it; a fixed arm at the pilot's
    own K (a null arm) is no other K, however fast; the goals stay against the pilot's choice.
    Without a plan there is no check."""
    from autok.report import report
    from tests.test_report import fake_run

    _planned_grid(tmp_path, {"best-fixed": 8})
    # fake_run's accuracy climbs to `peak` in three 1 s epochs: a higher peak crosses 0.5 sooner
    for s in (1, 2, 3):
        fake_run(tmp_path, "k4 regime=r", s, 0.99, 3.0, k=4)
        fake_run(tmp_path, "nudged regime=r", s, 0.995, 3.0, k=8)
        fake_run(tmp_path, "exposed-sync regime=r", s, 0.95, 3.0, k=4, policy="exposed-sync")
    report(tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    c = data["pilot_check"]["r"]
    crossing = {p: 1 + (0.5 - p / 3) / (p / 3) for p in (0.9, 0.99, 0.95)}
    assert c["faster"] == "k4" and set(c["fixed"]) == {"k4"}
    assert c["fixed"]["k4"]["ratio"] == pytest.approx(crossing[0.99] / crossing[0.9])
    mine = c["against_it"]["exposed-sync"]
    assert mine["ratio"] == pytest.approx(crossing[0.95] / crossing[0.99])
    assert data["regimes"]["r"]["exposed-sync"]["ratio"] == pytest.approx(
        crossing[0.95] / crossing[0.9]
    )  # the goals' baseline is still the pilot's
    text = (tmp_path / "report.md").read_text()
    assert "**k4 was faster than the pilot's best-fixed (K = 8)**, 0.909×" in text
    r = f"{mine['ratio']:.3f}"
    assert f"\n  - exposed-sync: {r}× ({r}–{r}), within 5%\n" in text
    assert "\n  - nudged: " in text and ", fixed: " in text
    assert text.index("## The pilot's choice, checked") < text.index("## The goals")
    (tmp_path / "plan.json").unlink()
    report(tmp_path)
    assert "checked on the main seeds" not in (tmp_path / "report.md").read_text()
