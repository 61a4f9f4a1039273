"""benchmarks/phase_time.py on a made-up panel directory: time, steps and steps per round per link
phase, over the seeds every arm finished, and the difference from a named arm seed by seed."""

import json

from autok.report import BOUNDARY_COUNTS, BOUNDARY_NUMBERS
from benchmarks import phase_time


def _run(root, label, seed, rounds, finished=True, accuracy=()):
    """`rounds`: (link, steps, compute seconds, exposed seconds) per boundary record; `accuracy`:
    the test accuracy at each epoch's end."""
    run = root / label / f"seed-{seed}"
    run.mkdir(parents=True)
    base = dict.fromkeys((*BOUNDARY_COUNTS, *BOUNDARY_NUMBERS), 0)  # what autok report checks
    lines, step = [], 0
    for i, (link, steps, compute, exposed) in enumerate(rounds):
        step += steps
        rec = {**base, "boundary": i, "global_step": step - 1, "sync_period": steps,
               "interval_steps": steps, "link": link, "compute_seconds": compute,
               "exposed_sync_seconds": exposed}  # fmt: skip
        lines.append(json.dumps(rec))
    (run / "boundaries.jsonl").write_text("\n".join(lines) + "\n")
    rows = ["epoch,test_accuracy,test_loss"] + [f"{i},{a},0.0" for i, a in enumerate(accuracy)]
    (run / "epochs.csv").write_text("\n".join(rows) + "\n")
    if finished:
        (run / "summary.json").write_text("{}")


def test_time_and_steps_per_round_by_link_phase_over_the_common_seeds(tmp_path, capsys):
    fast, slow = ("wan", 0.05), ("slow-wan", 0.3)
    for seed, extra in ((1, 0.0), (2, 0.4)):
        # an online rule: one round at 4 on the slow link before it moves to 8
        first = [(fast[0], 4, 0.08, fast[1])] * 2
        late = [(slow[0], 4, 0.08, slow[1] + extra)] + [(slow[0], 8, 0.16, slow[1])] * 2
        _run(tmp_path, "rule_regime=flip", seed, first + late, accuracy=(0.5, 0.7, 0.9))
        on_time = [(slow[0], 8, 0.16, slow[1])] * 2 + [(slow[0], 4, 0.08, slow[1])]
        _run(tmp_path, "sched_regime=flip", seed, first + on_time, accuracy=(0.5, 0.6, 0.7))
    # a seed only one arm finished, and an unfinished run, are not counted
    _run(tmp_path, "rule_regime=flip", 3, [(fast[0], 4, 0.08, 9.0)])
    _run(tmp_path, "sched_regime=flip", 4, [(fast[0], 4, 0.08, 9.0)], finished=False)

    # the pilot's runs, on seeds of their own, are left out
    _run(tmp_path, "k4_regime=flip", 101, first)
    (tmp_path / "plan.json").write_text(
        json.dumps({"regime=flip": {"target": 0.8, "metric": "accuracy"}})
    )

    found = phase_time.collect(tmp_path)
    rule = found["flip"]["rule"]
    assert sorted(rule) == [1, 2, 3] and sorted(found["flip"]["sched"]) == [1, 2]
    p = rule[2].phases
    assert [q.link for q in p] == ["wan", "slow-wan"]
    assert abs(p[0].seconds - 2 * 0.13) < 1e-9 and p[0].steps == 8 and p[0].rounds == 2
    assert abs(p[1].seconds - (0.38 + 0.4 + 2 * 0.46)) < 1e-9
    assert p[1].steps == 20 and p[1].rounds == 3
    # 0.7 after epoch 2, 0.9 after epoch 3: 0.8 is crossed half way, at 2.5 epochs
    assert abs(rule[2].crossed - 2.5) < 1e-9 and found["flip"]["sched"][2].crossed is None

    assert phase_time.main([str(tmp_path), "--against", "sched"]) == 0
    out = capsys.readouterr().out
    assert "2 seeds (1-2); phases: wan -> slow-wan" in out
    assert "left out, on seeds of their own: k4" in out
    assert " 2.50 (2.50–2.50; 2/2)" in out and "— (0/2)" in out  # the schedule never crossed 0.8
    assert "6.7/rd" in out  # 20 steps in 3 rounds on the slow link
    # the rule's slow phase over the schedule's: +0.0 on seed 1, +0.4 on seed 2 (same steps)
    assert "+0.20 (+0.00..+0.40)" in out
    assert "+0.00 (+0.00..+0.00)" in out  # the first phase, the same in both


def test_arms_on_other_links_are_not_compared_and_bad_input_exits_2(tmp_path, capsys):
    _run(tmp_path, "a_regime=r", 1, [("wan", 4, 0.08, 0.05)])
    _run(tmp_path, "b_regime=r", 1, [("lan", 4, 0.08, 0.001)])
    assert phase_time.main([str(tmp_path)]) == 0
    assert "do not share one sequence of links" in capsys.readouterr().out
    assert phase_time.main([str(tmp_path), "--regime", "other"]) == 2
    assert "no finished run of regime 'other'" in capsys.readouterr().err
    assert phase_time.main([str(tmp_path / "missing")]) == 2
    (tmp_path / "a_regime=r" / "seed-1" / "boundaries.jsonl").write_text("[1]\n")
    assert phase_time.main([str(tmp_path)]) == 2
    assert "not a JSON object" in capsys.readouterr().err


def test_a_loss_target_an_unknown_arm_and_no_plan(tmp_path, capsys):
    """Under a loss target the crossing is interpolated to where the loss falls to it; without a
    plan no crossing is read and none is shown; an arm named to subtract that is not there, and
    a target that is not a number, exit 2."""
    rounds = [("wan", 4, 0.08, 0.05)] * 2
    for arm in ("a", "b"):
        _run(tmp_path, f"{arm}_regime=gpt", 1, rounds)
    rows = ["epoch,test_accuracy,test_loss", "0,0,3.0", "1,0,2.0", "2,0,1.0"]
    (tmp_path / "a_regime=gpt" / "seed-1" / "epochs.csv").write_text("\n".join(rows) + "\n")
    found = phase_time.collect(tmp_path)
    assert not found["gpt"]["a"][1].judged and found["gpt"]["a"][1].crossed is None
    assert phase_time.main([str(tmp_path)]) == 0
    assert "target at epoch" not in capsys.readouterr().out
    (tmp_path / "plan.json").write_text(
        json.dumps({"regime=gpt": {"target": 2.5, "metric": "validation loss"}})
    )
    found = phase_time.collect(tmp_path)
    assert found["gpt"]["a"][1].crossed == 1.5  # 3.0 after epoch 1, 2.0 after epoch 2
    assert phase_time.main([str(tmp_path), "--against", "c"]) == 2
    assert "--against c: no such arm on the main seeds (arms: a, b)" in capsys.readouterr().err
    assert phase_time.main([str(tmp_path), "--regime", "typo", "--against", "a"]) == 2
    assert "no finished run of regime 'typo'" in capsys.readouterr().err
    (tmp_path / "plan.json").write_text(json.dumps({"regime=gpt": {"target": None}}))
    assert phase_time.main([str(tmp_path)]) == 2
    assert "regime=gpt: target None is not a number" in capsys.readouterr().err
    (tmp_path / "plan.json").unlink()
    (tmp_path / "b_regime=gpt" / "seed-1" / "boundaries.jsonl").write_text(
        json.dumps(
            {
                "epoch": 0,
                "global_step": 0,
                "sync_period": 1,
                "compute_seconds": 0,
                "exposed_sync_seconds": 0,
            }
        )
        + "\n"  # fmt: skip
    )
    assert phase_time.main([str(tmp_path)]) == 2
    assert "b_regime=gpt/seed-1: KeyError: 'interval_steps'" in capsys.readouterr().err
