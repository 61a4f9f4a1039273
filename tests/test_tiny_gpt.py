"""examples/tiny_gpt: the byte-level GPT task (model, corpus, splits, metric, a few steps)."""

from __future__ import annotations

import hashlib
import math
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import autok
from examples import tiny_gpt
from examples.tiny_gpt import CONTEXT, GPT


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT()


def test_parameter_count():
    n = sum(p.numel() for p in _model().parameters())  # the tied head counts once
    print(f"tiny_gpt parameters: {n}")
    assert 150_000 <= n <= 600_000


def test_head_is_tied_to_the_embedding():
    model = _model()
    assert model.head.weight is model.tok.weight


def _future_changes_past(model: GPT) -> bool:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(256, (2, CONTEXT), generator=g)
    x2 = x.clone()
    x2[:, 40:] = (x2[:, 40:] + 1 + torch.randint(255, (2, CONTEXT - 40), generator=g)) % 256
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert not torch.allclose(a[:, 40:], b[:, 40:])  # the change is visible where it may be
    return not torch.allclose(a[:, :40], b[:, :40], atol=1e-6, rtol=0)


def test_attention_is_causal(monkeypatch):
    model = _model().eval()
    assert not _future_changes_past(model)

    # The probe is sensitive: the same model with the causal mask dropped fails it.
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **kw: sdpa(*a, **{**kw, "is_causal": False})
    )
    assert _future_changes_past(model)


def test_longer_input_than_the_context_is_refused():
    with pytest.raises(ValueError, match="exceed the context"):
        _model()(torch.zeros(1, CONTEXT + 1, dtype=torch.long))


def test_task_through_the_task_loader():
    from autok.trainer.loop.tasks import load_task  # the path `autok train --task` takes

    task = load_task(types.SimpleNamespace(task="examples.tiny_gpt:task", seed=0))
    assert isinstance(task, autok.Task)
    assert task.metric is autok.PERPLEXITY and not task.metric.higher_is_better
    assert not task.classifies
    assert isinstance(task.model, GPT)

    # Validation as the loop does it (batches of 512): log(perplexity) is the mean NLL, which
    # is the default loss; an untrained model is about uniform over 256 bytes.
    x, y = task.test_dataset[:512]
    with torch.no_grad():
        out = task.model(x)
    total, count = task.metric.batch(out, y)
    assert count == 512 * CONTEXT
    ppl = task.metric.value(float(total) / count)
    assert math.log(ppl) == pytest.approx(float(task.loss_fn(out, y)), rel=1e-5)
    assert abs(math.log(ppl) - math.log(256)) < 0.5


def _bytes_of(ds) -> bytes:
    x, y = ds.tensors
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape and x.shape[1] == CONTEXT
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    return bytes(torch.cat([x, y[:, -1:]], dim=1).reshape(-1).to(torch.uint8).tolist())


def test_splits_are_disjoint_windows_of_the_corpus_and_deterministic():
    data = tiny_gpt.corpus()
    torch.manual_seed(123)
    train, val = tiny_gpt.splits()
    torch.manual_seed(456)  # the seed plays no part
    train2, val2 = tiny_gpt.splits()
    for a, b in ((train, train2), (val, val2)):
        assert all(torch.equal(s, t) for s, t in zip(a.tensors, b.tensors, strict=True))

    # Train windows tile the first 90% of the corpus from its start, validation windows the
    # last 10% from the cut: consecutive, non-overlapping, no byte in both.
    cut = len(data) - len(data) // 10
    train_bytes, val_bytes = _bytes_of(train), _bytes_of(val)
    assert len(train) == cut // (CONTEXT + 1)
    assert len(val) == (len(data) - cut) // (CONTEXT + 1)
    assert train_bytes == data[: len(train_bytes)] and len(train_bytes) <= cut
    assert val_bytes == data[cut : cut + len(val_bytes)]


def test_corpus_is_the_listed_files_in_order():
    data = tiny_gpt.corpus()
    assert 300_000 <= len(data) <= 500_000
    assert tiny_gpt.corpus_sha256() == hashlib.sha256(data).hexdigest()


@pytest.mark.skipif(sys.version_info[:3] != (3, 11, 7), reason="hashes recorded on 3.11.7")
def test_recorded_corpus_reads_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = tiny_gpt.read_corpus()
    assert hashlib.sha256(data).hexdigest() == tiny_gpt.CORPUS_SHA256


def test_a_changed_file_warns_once_and_is_used(monkeypatch):
    monkeypatch.setitem(tiny_gpt.CORPUS_FILES, "string.py", "0" * 64)
    monkeypatch.setitem(tiny_gpt.CORPUS_FILES, "glob.py", "1" * 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = tiny_gpt.read_corpus()
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "2 of 24 corpus files differ" in msg and "not comparable" in msg and "\n" not in msg
    assert data == tiny_gpt.corpus()


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"^tiny_gpt: corpus file textwrap.py missing under "):
        tiny_gpt.read_corpus(tmp_path)


def test_a_few_adamw_steps_reduce_the_training_loss():
    task = tiny_gpt.task(None)
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(25):
        x, y = task.train_dataset[torch.randint(len(task.train_dataset), (32,), generator=g)]
        loss = task.loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, losses


@pytest.mark.dist
def test_the_lm_loop_example_runs_at_world_2_and_resumes_bit_for_bit(tmp_path):
    """examples/lm_loop.py under torchrun at world 2: accumulation, bf16 autocast, clipping,
    a schedule, evaluation after sync_now() (the same validation loss on every rank), and its
    checkpoints: stopped mid-interval (K = 3, after step 5) and resumed, it ends bit for bit
    where the run without a stop ends."""
    import os
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "examples.lm_loop", "--steps", "8", "--accumulation", "2"]
    cmd += ["--micro-batch", "2", "--sync-period", "3", "--eval-every", "4", "--save-every", "5"]

    def run(out: str, *args: str) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [*cmd, "--out", str(tmp_path / out), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        return res

    def ends(res) -> set[tuple[str, str]]:
        # found anywhere: the ranks share torchrun's stdout, and their lines can interleave
        return set(re.findall(r"val loss ([0-9.]+), parameter sum ([-+0-9.e]+)", res.stdout))

    straight = ends(run("straight"))
    assert len(straight) == 1, straight  # both ranks: the same weights, the same val loss
    assert (tmp_path / "straight" / "boundaries.jsonl").stat().st_size > 0
    stopped = run("stopped", "--stop-after", "5")
    assert "stopped after step 5" in stopped.stdout and not ends(stopped)
    assert ends(run("stopped", "--resume")) == straight  # every digit
    for rank in (0, 1):
        a, b = (
            torch.load(tmp_path / d / f"rank{rank}.pt", weights_only=True)["model"]
            for d in ("straight", "stopped")
        )
        assert all(torch.equal(a[k], b[k]) for k in a)
