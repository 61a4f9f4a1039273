"""A checkpoint is data, never code; a resume that cannot continue leaves the run untouched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from autok.cli import main
from autok.trainer.loop.checkpoint import latest_valid, sha256, verify
from tests.test_cli import TINY, autok

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A real 2-worker run stopped after 2 of 4 epochs, with checkpoints after epochs 0 and 1."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    args = [*TINY, "--epochs", "4", "--checkpoint-every", "1", "--stop-after-epochs", "2"]
    res = autok("train", *args, "--out", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch-0000", "epoch-0001"]
    return run


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under root with its content hash and mtime: what 'untouched' means."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = (
                hashlib.sha256(p.read_bytes()).hexdigest(),
                p.stat().st_mtime_ns,
            )
    return out


class Evil:
    """Unpickling this creates `marker`: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _rewrite_manifest(ckpt: Path, edit) -> None:
    path = ckpt / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _replace_rank_files(state) -> callable:
    """Replace every rank file by torch.save(state(marker)), with a matching manifest."""

    def apply(run: Path, marker: Path) -> None:
        for ckpt in (run / "checkpoints").iterdir():
            for f in ckpt.glob("rank*.pt"):
                torch.save(state(marker), f)
            files = {f.name: sha256(f) for f in ckpt.glob("rank*.pt")}
            _rewrite_manifest(ckpt, lambda m, files=files: {**m, "files": files})

    return apply


# a code-running pickle; plain tensors that are not the trainer's state
_craft_pickles = _replace_rank_files(lambda marker: {"model": Evil(marker)})
_foreign_tensors = _replace_rank_files(lambda marker: {"x": torch.zeros(3)})


def _all_manifests(edit):
    def apply(run: Path, marker: Path) -> None:
        for ckpt in (run / "checkpoints").iterdir():
            _rewrite_manifest(ckpt, edit)

    return apply


def _truncate_all(run: Path, marker: Path) -> None:
    for f in (run / "checkpoints").glob("epoch-*/rank*.pt"):
        f.write_bytes(f.read_bytes()[:100])


def _rename_all(run: Path, marker: Path) -> None:
    for i, ckpt in enumerate(sorted((run / "checkpoints").iterdir())):
        ckpt.rename(ckpt.with_name("epoch-zzz" + "z" * i))


def _no_checkpoints(run: Path, marker: Path) -> None:
    shutil.rmtree(run / "checkpoints")


def _reshape_a_tensor(ckpts: str = "*"):
    """Give a model tensor of every rank file in `ckpts` another shape, with its manifest's
    checksums recomputed: plain tensors of autok's keys, which the model cannot load."""

    def apply(run: Path, marker: Path) -> None:
        for ckpt in (run / "checkpoints").glob(ckpts):
            for f in ckpt.glob("rank*.pt"):
                state = torch.load(f, weights_only=True)
                name = next(iter(state["model"]))
                state["model"][name] = torch.zeros(3, 3)
                torch.save(state, f)
            files = {f.name: sha256(f) for f in ckpt.glob("rank*.pt")}
            _rewrite_manifest(ckpt, lambda m, files=files: {**m, "files": files})

    return apply


def _drop_rank1(run: Path, marker: Path) -> None:
    def edit(m):
        m["files"].pop("rank1.pt")
        return m

    _all_manifests(edit)(run, marker)


CASES = {
    "crafted pickle with a matching manifest": (_craft_pickles, "not a plain-tensor checkpoint"),
    "plain tensors, not autok's state": (_foreign_tensors, "not an autok checkpoint (no 'epoch')"),
    "manifest with no files listed": (_all_manifests(lambda m: {**m, "files": {}}), "expected one"),
    "a rank file missing from the manifest": (_drop_rank1, "expected one file per rank"),
    "manifest is a list": (_all_manifests(lambda m: []), "malformed manifest"),
    "manifest files is a list": (_all_manifests(lambda m: {**m, "files": []}), "malformed"),
    "every checkpoint truncated": (_truncate_all, "checksum"),
    "directories not named epoch-NNNN": (_rename_all, "not a checkpoint directory name"),
    "no checkpoints directory": (_no_checkpoints, "no checkpoint to resume from"),
    "a tensor of another shape, checksums recomputed": (
        _reshape_a_tensor(),
        "rank0.pt: its model's 'features.0.weight' is float32 [3, 3], the model's float32 "
        "[32, 1, 5]",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_unusable_checkpoint_is_refused_before_anything_is_written(
    stopped_run, tmp_path, capsys, case
):
    damage, why = CASES[case]
    run, marker = tmp_path / "run", tmp_path / "pwned"
    shutil.copytree(stopped_run, run)
    damage(run, marker)
    before = tree(run)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autok: error: --resume: "), err
    assert why in err, err
    assert tree(run) == before  # not a row, checkpoint or summary changed or deleted
    assert not marker.exists()  # nothing in the files ran


def test_a_resume_with_an_unwritable_tensorboard_is_refused_before_anything_is_written(
    stopped_run, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    (tmp_path / "afile").write_text("")
    before = tree(run)
    argv = ["train", "--resume", str(run), "--tensorboard", str(tmp_path / "afile" / "tb")]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autok: error: --tensorboard: "), err
    assert tree(run) == before  # config.json not rewritten, no row rewound


def test_a_run_saved_with_an_option_it_never_read_resumes_without_it(stopped_run, tmp_path):
    """A run saved before autok refused options it never read (here --target-sync-share under
    --policy fixed) resumes as it ran, saying what
    it drops; its config.json then holds what the run reads."""
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    config = json.loads((run / "config.json").read_text())
    assert config["policy"] == "fixed" and config["optimizer"] == "sgd"
    config["target_sync_share"] = 0.3
    (run / "config.json").write_text(json.dumps(config))
    res = autok("train", "--resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    assert (
        f"autok: note: --resume: {run} has --target-sync-share 0.3, which it never read "
        "(--policy fixed does not read it); resuming without it\n"
    ) in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    resumed = json.loads((run / "config.json").read_text())
    assert resumed["target_sync_share"] == 0.2  # its default
    assert len((run / "epochs.csv").read_text().splitlines()) == 1 + 4  # epochs 2 and 3 too


def test_a_skew_cap_saved_with_the_skew_rule_off_is_dropped_on_a_resume():
    """--skew-cap with --skew-drift 0 is refused now (the cap is off there); a run saved before
    that resumes as it ran, without it, and says so; with the rule on it is kept."""
    from autok.config import TrainConfig
    from autok.space import as_ran

    saved = {"policy": "exposed-sync", "skew_cap": 8, "skew_drift": 0.0}
    with pytest.raises(ValueError, match="--skew-cap: shapes the soft skew cap"):
        TrainConfig(**saved)
    ran, notes = as_ran(saved)
    assert ran == {"policy": "exposed-sync", "skew_drift": 0.0}
    assert notes == [
        "--skew-cap 8, which it never read (--skew-drift is 0 (off)); resuming without it"
    ]
    assert TrainConfig(**ran).skew_cap == 4
    assert as_ran({**saved, "skew_drift": 1.4}) == ({**saved, "skew_drift": 1.4}, [])


def test_a_run_saved_before_the_link_check_resumes_without_it(stopped_run, tmp_path):
    """An exposed-sync run whose config.json has no link_shift (saved before the check of a
    changed link) resumes with it off, as it ran (its default); one that has it keeps it."""
    from autok.cli import build_parser, resume_config
    from autok.controllers import revision

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    config = json.loads((run / "config.json").read_text())
    # recorded by this version's rule, so that the resume reaches the check's reading
    ours = {"policy": "exposed-sync", "policy_revision": revision("exposed-sync")}
    config = {k: v for k, v in config.items() if k != "link_shift"} | ours
    (run / "config.json").write_text(json.dumps(config))
    assert resume_config(build_parser().parse_args(["train", "--resume", str(run)])).link_shift == 0
    (run / "config.json").write_text(json.dumps(config | {"link_shift": 4.0}))
    assert resume_config(build_parser().parse_args(["train", "--resume", str(run)])).link_shift == 4


def test_a_run_saved_before_the_optimizers_floor_resumes_with_the_floor_it_ran_with(
    stopped_run, tmp_path
):
    """An exposed-sync AdamW run whose config.json has no k_floor (saved before K's floor was
    a setting) ran with none: it resumes at floor 1, not AdamW's 2; one saved since keeps its
    floor; a fixed run saved while the default was 1 resumes without it (it never read it)."""
    from autok.cli import build_parser, resume_config
    from autok.controllers import revision

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    config = json.loads((run / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("k_floor", "momentum", "nesterov")}
    adamw = config | {"policy": "exposed-sync", "optimizer": "adamw", "sync_period": 4}
    adamw["policy_revision"] = revision("exposed-sync")  # so that the resume reads the floor
    args = ["train", "--resume", str(run)]
    (run / "config.json").write_text(json.dumps(adamw))
    assert resume_config(build_parser().parse_args(args)).k_floor == 1
    (run / "config.json").write_text(json.dumps(adamw | {"k_floor": 2}))
    assert resume_config(build_parser().parse_args(args)).k_floor == 2
    (run / "config.json").write_text(json.dumps(config | {"policy": "fixed", "k_floor": 1}))
    assert resume_config(build_parser().parse_args(args)).k_floor is None


def test_a_saved_config_is_made_to_run_as_it_ran_and_then_validates():
    """as_ran on configs saved before the refusals: each validates afterwards, with one note
    per change, a config that needs none is left as it was, and a qsr or composite policy
    whose base was above its cap chooses the K path it chose before (both ways of driving the
    controller fed the same boundaries, with a falling LR and a rising share)."""
    from autok.config import TrainConfig
    from autok.controllers import PolicyOptions, build_controller
    from autok.space import as_ran
    from tests.test_controllers import stats

    fresh = TrainConfig().model_dump(mode="json")
    ddp = {"strategy": "ddp", "sync_period": 1, "slowmo_beta": 0.0}
    localsgd = {"strategy": "localsgd", "slowmo_beta": 0.0}
    cases = [
        ({"policy": "fixed", "target_sync_share": 0.3}, {"target_sync_share": 0.2}),
        ({"optimizer": "adamw", "momentum": 0.5}, {"momentum": 0.9}),
        ({"nesterov": True, "momentum": 0.0}, {"nesterov": False}),
        ({"policy": "qsr", "qsr_base": 100, "max_sync_period": 64}, {"max_sync_period": 100}),
        ({"policy": "composite", "qsr_base": 100, "max_sync_period": 64}, {"qsr_base": 64}),
        # flags the strategy, the data set or the divergence reaction never read
        ({**ddp, "sync_optimizer_state": True}, {"sync_optimizer_state": False}),
        ({**ddp, "max_sync_period": 128}, {"max_sync_period": 64}),
        ({**localsgd, "boundary": "two-phase"}, {"boundary": "auto"}),
        ({**localsgd, "slowmo_lr_aware": True}, {"slowmo_lr_aware": False}),
        ({"on_divergence": "stop", "max_rollbacks": 5}, {"max_rollbacks": 3}),
        ({"dataset": "digits", "model": "cnn", "mnist1d_samples": 900}, {"mnist1d_samples": 5000}),
        ({"image_size": 64}, {"image_size": 32}),
    ]
    for old, changed in cases:
        saved, notes = as_ran(fresh | old)
        assert len(notes) == 1 and ("without it" in notes[0] or "at " in notes[0]), notes
        cfg = TrainConfig.model_validate(saved)
        assert cfg == TrainConfig.model_validate(fresh | old | changed), old
    assert as_ran(fresh) == (fresh, [])
    for policy in ("qsr", "composite"):
        old = {"qsr_base": 100, "max_sync_period": 64}
        now = {k: v for k, v in as_ran({"policy": policy, **old})[0].items() if k != "policy"}
        assert now != old
        paths = []
        for options in (old, now):
            ctrl = build_controller(policy, 4, PolicyOptions(peak_lr=0.1, **options))
            path, k = [], ctrl.sync_period
            for i in range(40):  # a falling LR (QSR's K rises) and a rising share
                k = ctrl.observe(stats(k, i=i, lr=0.1 * (1 - i / 40), sync=0.05 + i / 50))
                k = k.next_sync_period
                path.append(k)
            paths.append(path)
        assert paths[0] == paths[1], (policy, paths)


def test_a_resume_to_fewer_epochs_than_done_is_refused(stopped_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    before = tree(run)
    assert main(["train", "--resume", str(run), "--epochs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "autok: error: --epochs: 1, but the checkpoint has 2 epochs done; give 2 or more (the "
        "run is left as it was)\n"
    ), err
    assert tree(run) == before
    # nor a stop it has passed: it would never stop, and train to the end
    assert main(["train", "--resume", str(run), "--stop-after-epochs", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autok: error: --stop-after-epochs: 2, but the checkpoint has 2"), err
    assert tree(run) == before


def test_a_run_started_in_another_installation_is_not_continued_here(stopped_run, tmp_path, capsys):
    """config.json records the Python, packages and CPU the run started with: continued with
    other ones its numbers would mix two installations, so the resume is refused, in one line,
    before anything is written. A run saved before it was recorded resumes (nothing to compare)."""
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    config = json.loads((run / "config.json").read_text())
    assert config["environment"]["torch"]  # recorded at the start
    config["environment"]["numpy"] = "1.0.0"
    (run / "config.json").write_text(json.dumps(config))
    before = tree(run)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"autok: error: --resume: {run} was started with numpy 1.0.0, this "), err
    assert err.count("\n") == 1 and tree(run) == before
    del config["environment"]
    (run / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["environment"]["torch"]


def test_a_run_started_by_another_revision_of_its_rule_is_not_continued(
    stopped_run, tmp_path, capsys
):
    """config.json records the revision of its K policy's rule (docs/design.md §6, "the rule's
    revision"): continued by another, its K path would follow two rules, so the resume is refused
    in one line before anything is written. One saved before it was recorded ran revision 0."""
    from autok.config import ConfigError
    from autok.controllers import revision

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    config = json.loads((run / "config.json").read_text())
    assert config["policy"] == "fixed" and config["policy_revision"] == revision("fixed") == 0
    config["policy_revision"] = 7
    (run / "config.json").write_text(json.dumps(config))
    before = tree(run)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"autok: error: --resume: {run} was started by fixed's rule revision 7, this autok runs 0"
    ), err
    assert err.count("\n") == 1 and tree(run) == before
    # one that recorded none ran revision 0: refused where its policy's rule has moved since,
    # resumed where it has not (fixed K)
    from autok.cli import build_parser, resume_config

    del config["policy_revision"]
    (run / "config.json").write_text(json.dumps(config | {"policy": "exposed-sync"}))
    with pytest.raises(ConfigError, match=r"started by exposed-sync's rule revision 0 \(none"):
        resume_config(build_parser().parse_args(["train", "--resume", str(run)]))
    (run / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["policy_revision"] == 0


def test_a_manifest_that_is_not_a_regular_file_is_refused_without_opening_it(
    stopped_run, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    for ckpt in (run / "checkpoints").iterdir():  # a FIFO: reading it would wait forever
        (ckpt / "manifest.json").unlink()
        os.mkfifo(ckpt / "manifest.json")
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no readable manifest" in err, err


def test_a_resume_under_torchrun_with_another_world_size_is_refused(
    stopped_run, tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    before = tree(run)
    env = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "written by 2 workers, this run has 3" in err, err
    assert tree(run) == before


def test_a_crafted_pickle_does_not_run_when_verified(stopped_run, tmp_path):
    run, marker = tmp_path / "run", tmp_path / "pwned"
    shutil.copytree(stopped_run, run)
    _craft_pickles(run, marker)
    found = latest_valid(run, 2)
    assert found.path is None and len(found.refused) == 2
    assert not marker.exists()
    # the same file, unpickled the unsafe way, would have run: the test's crafted file is real
    ckpt = run / "checkpoints" / "epoch-0001"
    assert "not a plain-tensor checkpoint" in verify(ckpt, 2)
    torch.load(ckpt / "rank0.pt", weights_only=False)
    assert marker.exists()


def test_pruning_removes_only_what_autok_named(stopped_run, tmp_path):
    """A user's directory that merely starts with epoch- is never deleted by a checkpoint."""
    from autok.trainer.loop.checkpoint import publish, staging_dir

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    mine = run / "checkpoints" / "epoch-0000-my-notes"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    stage = staging_dir(run, 5)
    stage.mkdir()
    for r in range(2):
        shutil.copy(run / "checkpoints" / "epoch-0001" / f"rank{r}.pt", stage / f"rank{r}.pt")
    publish(run, 5, 2)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["epoch-0000-my-notes", "epoch-0001", "epoch-0005"]


@pytest.mark.parametrize("held", ["whole run", "checkpoints only"])
def test_a_torchrun_restart_into_another_runs_out_is_refused_and_leaves_it(
    stopped_run, tmp_path, held
):
    """torchrun --max-restarts runs the same command line again after a failure, such as a
    first attempt refused because --out held another run: the restart must not take that run
    over (it once rewrote its config.json and resumed it with the new flags; with only the
    run's checkpoints there, it resumed from them)."""
    import subprocess
    import sys

    run = tmp_path / "run"
    if held == "whole run":
        shutil.copytree(stopped_run, run)
        said = f"autok: error: --out: {run} holds a run this command did not"
    else:
        shutil.copytree(stopped_run / "checkpoints", run / "checkpoints")
        said = f"autok: error: --out: {run} holds another run (checkpoints)"
    before = tree(run)
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",  # never reached: the refusal comes first
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    args = ["train", "--epochs", "4", "--lr", "0.5", "--out", str(run)]
    res = subprocess.run(
        [sys.executable, "-m", "autok.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith(said), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert tree(run) == before


def test_a_fresh_run_refuses_an_out_holding_another_runs_checkpoints(stopped_run, tmp_path):
    """Only a run's checkpoints left in --out (its other files moved away): a fresh run there
    would prune them, and a torchrun restart would resume from them."""
    run = tmp_path / "run"
    shutil.copytree(stopped_run / "checkpoints", run / "checkpoints")
    before = tree(run)
    res = autok("train", *TINY, "--out", str(run), timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr == (
        f"autok: error: --out: {run} already holds a run (checkpoints); choose a new directory\n"
    )
    assert tree(run) == before


def test_under_torchrun_a_run_without_out_is_refused(tmp_path):
    """Each rank would pick its own runs/<time> (the ranks start in different seconds)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",  # never reached: the refusal comes first
    }
    res = subprocess.run(
        [sys.executable, "-m", "autok.cli", "train", "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr == (
        "autok: error: --out: under torchrun every rank must write into one run directory; "
        "give --out (the same path on every node)\n"
    )
    assert list(tmp_path.iterdir()) == []  # no runs/ made


@pytest.fixture(scope="module")
def task_run(tmp_path_factory) -> Path:
    """A real 2-worker --task run stopped after 1 of 2 epochs, with its checkpoint."""
    run = tmp_path_factory.mktemp("task") / "run"
    args = ["--task", "tests.task_fixtures:regression", "--workers", "2", "--epochs", "2"]
    args += ["--link", "none", "--no-progress", "--stop-after-epochs", "1"]
    res = autok("train", *args, "--out", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    return run


def test_a_resume_never_runs_the_task_its_config_json_names(task_run, tmp_path):
    """config.json is data: a task it names is never imported (any importable module runs its
    code at import; `builtins:input` waited on stdin). The command line's --task is used, and
    one that differs from the run's, or none, is refused before anything is imported."""
    run, marker = tmp_path / "run", tmp_path / "pwned"
    shutil.copytree(task_run, run)
    (tmp_path / "evil_task.py").write_text(f"open({str(marker)!r}, 'w').close()\ntask = print\n")
    config = json.loads((run / "config.json").read_text())
    config["task"] = "evil_task:task"
    (run / "config.json").write_text(json.dumps(config))
    before = tree(run)
    for given, says in [
        ([], f"autok: error: --task: {run} was trained with --task 'evil_task:task'; give"),
        (
            ["--task", "tests.task_fixtures:regression"],
            "autok: error: --task: 'tests.task_fixtures:regression' is not the task",
        ),
    ]:
        res = autok("train", "--resume", str(run), *given, cwd=tmp_path, timeout=120)
        assert res.returncode == 2, res.stderr[-2000:]
        assert res.stderr.startswith(says) and res.stderr.count("\n") == 1, res.stderr
        assert not marker.exists()  # nothing the run directory named ran
        assert tree(run) == before


def test_a_run_being_written_by_another_process_is_refused_until_it_exits(stopped_run, tmp_path):
    """Two processes on one run (a --resume while it still trains) would train its epochs twice
    under the same temporary names: the run's lock (an OS lock on OUT/.autok.lock, held by the
    launching process) refuses the second before it writes anything, and the kernel releases it
    however the first ends, kill -9 included."""
    import subprocess
    import sys

    run, fresh = tmp_path / "run", tmp_path / "fresh"
    shutil.copytree(stopped_run, run)
    fresh.mkdir()
    # another process holding both runs' locks, as a training launcher does
    hold = (
        "import fcntl, os, sys\n"
        "for d in sys.argv[1:]:\n"
        "    fd = os.open(os.path.join(d, '.autok.lock'), os.O_RDWR | os.O_CREAT)\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(run), str(fresh)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        before, fresh_before = tree(run), tree(fresh)
        res = autok("train", "--resume", str(run), "--no-progress", timeout=120)
        assert res.returncode == 2, res.stderr[-2000:]
        assert res.stderr == (
            f"autok: error: --resume: {run} is being written by another autok process; one "
            "process at a time trains a run\n"
        ), res.stderr
        res = autok("train", *TINY, "--out", str(fresh), timeout=120)
        assert res.returncode == 2 and res.stderr.startswith(
            f"autok: error: --out: {fresh} is being written by another autok process"
        ), res.stderr
        assert tree(run) == before and tree(fresh) == fresh_before
    finally:
        holder.kill()  # SIGKILL: no chance to unlock; the kernel does
        holder.wait()
    res = autok("train", "--resume", str(run), "--no-progress")
    assert res.returncode == 0, res.stderr[-2000:]
    assert len((run / "epochs.csv").read_text().splitlines()) == 1 + 4


def test_an_experiment_leaves_alone_a_run_another_process_trains(tmp_path):
    """`autok experiment run` twice on one --out: the second finds a run the first trains (its
    lock held) and neither clears it nor starts a second writer; it records the run as failed."""
    import subprocess
    import sys

    from autok.experiment import Run, _train, ensure_secret, start_over

    out = tmp_path / "out"
    out.mkdir()
    secret = ensure_secret(out)
    run = Run("ddp", 1, {"strategy": "ddp", "workers": 2, "epochs": 1, "link": "none"})
    run_dir = out / run.dir
    start_over(run_dir, run.dir, secret)
    (run_dir / "epochs.csv").write_text("the other process's rows\n")
    hold = (
        "import fcntl, os, sys\n"
        "fd = os.open(os.path.join(sys.argv[1], '.autok.lock'), os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        before = tree(run_dir)
        how, _ = _train(run, out, secret)
        assert how == f"FAILED: {run_dir} is being written by another autok process", how
        assert tree(run_dir) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_newest_checkpoint_the_model_cannot_load_falls_back_to_the_older_one(
    stopped_run, tmp_path
):
    """A wrong-shape tensor whose checksums were recomputed passes the manifest: checked
    against the model before launch, the checkpoint is refused in one line and the older good
    one is used, as for a corrupted file (it once launched workers that each failed to load)."""
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    _reshape_a_tensor("epoch-0001")(run, tmp_path / "unused")
    res = autok("train", "--resume", str(run), "--no-progress")
    assert res.returncode == 0, res.stderr[-2000:]
    said = (
        "autok: checkpoint epoch-0001 refused: rank0.pt: its model's 'features.0.weight' is "
        "float32 [3, 3], the model's float32 [32, 1, 5]\n"
    )
    assert res.stdout.count(said) == 1, res.stdout
    assert "resuming after epoch 0 (1 of " in res.stdout  # epoch-0000: numbered from 0
    assert len((run / "epochs.csv").read_text().splitlines()) == 1 + 4
