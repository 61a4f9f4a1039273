"""A byte-level GPT on Python standard-library source, as an autok task.

    autok train --task autok.examples.tiny_gpt:task --optimizer adamw --lr 3e-3 --batch-size 32

(from any directory: examples/ ships inside the package as `autok.examples`; in the checkout's
root `examples.tiny_gpt:task` names the same file). A small nanoGPT-style causal
transformer learns to predict the next byte of a fixed list of pure-Python stdlib modules: text
every machine with Python has offline, so the task needs no download. It is judged by
perplexity (lower is better); the loop's test_loss is the mean next-byte NLL, log(perplexity).

Only the public API (`autok`) is used: this is what a user's own task looks like.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import sysconfig
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import autok

__all__ = [
    "CORPUS_FILES",
    "CORPUS_SHA256",
    "GPT",
    "GPTConfig",
    "corpus",
    "corpus_sha256",
    "read_corpus",
    "splits",
    "task",
]

# The corpus: these stdlib files, concatenated in this order. Pure-Python modules that every
# CPython 3.11 install ships (no platform-specific ones, nothing distributions patch). The
# SHA-256 of each is the file as shipped with CPython 3.11.7; another patch release may have
# edited a few, which changes the corpus and so the numbers (see read_corpus).
CORPUS_FILES: dict[str, str] = {
    "textwrap.py": "62867e40cdea6669b361f72af4d7daf0359f207c92cbeddfc7c7506397c1f31c",
    "string.py": "24aeae1f0526250f442022022bf98df9a823b1cb330543ee79e70e44907462e9",
    "json/__init__.py": "d5d41e2c29049515d295d81a6d40b4890fbec8d8482cfb401630f8ef2f77e4d5",
    "json/decoder.py": "9f02654649816145bc76f8c210a5fe3ba1de142d4d97a1c93105732e747c285b",
    "json/encoder.py": "7c358788fbb2a6a07f66f1f8446c52396f35fc201108f666d5be002d86f31af2",
    "abc.py": "e558702a95cdce3febd289da021715d2b92bc43995b8a1bc58dfa1c3d8010287",
    "bisect.py": "e5b2ff166f48a06e70ae831d8c9b47283fcd0c254306eee12d3dae9c55e11526",
    "heapq.py": "6d43277e5c76fc0f073cd388fcff852d14d068f6bb6d4886c340f8b75a1229a9",
    "fnmatch.py": "6683da36e47af523f3f41e18ad244d837783e19e98911cc0b7415dea81494ebc",
    "shlex.py": "42ab6060f316e121e374e6621d8c1c98b8db323903c3df289a810c45a8ae46a7",
    "fractions.py": "b11e850e354808b882d13a70a911c29accd1dbdd41757566704e3b7206c74edb",
    "statistics.py": "889a066f1b8063e73387ceb84018efc507a89b365b56c6afb9cc15b2ed25c2d9",
    "calendar.py": "b3b140864fd122a575ffcc9342b824fbe4f8a38fdf3f4fcd964f26e52725358f",
    "csv.py": "6c68a5186e3b85e6e267a7ef96479327a45ae2b40bf5e9f2017e4b2282b3f5b1",
    "copy.py": "27dcfc53a4b9d4fbc3d90c74e549eb6eca9301524d6d2fbff9a6589cf51b6fd5",
    "functools.py": "6d80018a3fa9fed44c5b78f881987ee3ab3fb1238b077b4e6dcb4b76da7db73b",
    "contextlib.py": "d732c045bc7450997f97b2f79cfdb1546b68d2655e89ab3170f3b19b3930d83c",
    "random.py": "b931a2d452db89ab9e1f79d59b66ce194dbd6748049cfe44699726da52b9c956",
    "base64.py": "7de2ffc30db7b791f482ee8e6cba30a7b69452324d466231f29395be00154b4b",
    "colorsys.py": "d9800f8e81d46e63ca6f2e7d6ac5f344d85afb92c3cf6d103b5f977f1ad66ac2",
    "graphlib.py": "7bd338c5a475d1101064603d3baa5507446d3c5e73f741f6d6e77c6204c1eb65",
    "queue.py": "f6c37fc37cd7440979f7d22d40ee818fa3b714c573610c08fa52911d541193f0",
    "sched.py": "edfb309483d7cb05e06ad86d1fdeb819629f71402dc6710a1bec36c7afcaac50",
    "glob.py": "fa579f8a50a66313d34d339f10be0821c9b4fed6207e8ba8e29ed1c5e119f740",
}
# The whole corpus (all of the above, concatenated) on CPython 3.11.7: 411,360 bytes.
CORPUS_SHA256 = "ffc4487bc9f8f3564c46db79cef0c39a8fb5dcbed89c209b79e9d39c9a5f3746"
RECORDED_ON = "CPython 3.11.7"

CONTEXT = 64  # tokens the model sees; a sample is CONTEXT + 1 bytes (inputs and shifted targets)
VAL_FRACTION = 0.1  # the last 10% of the corpus: held-out text, never trained on


def read_corpus(stdlib: str | os.PathLike[str] | None = None) -> bytes:
    """The corpus bytes, read from `stdlib` (default: this interpreter's standard library).

    A missing file is an error (the corpus would silently be another one); a file whose hash
    differs from the recorded one (another Python patch release) gives one warning and is used:
    the run still works, but its numbers are not comparable with runs on the recorded corpus.
    """
    root = os.fspath(stdlib) if stdlib is not None else sysconfig.get_paths()["stdlib"]
    parts: list[bytes] = []
    differ: list[str] = []
    for name, expected in CORPUS_FILES.items():
        path = os.path.join(root, *name.split("/"))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ValueError(f"tiny_gpt: corpus file {name} missing under {root}") from None
        if hashlib.sha256(data).hexdigest() != expected:
            differ.append(name)
        parts.append(data)
    if differ:
        shown = ", ".join(differ[:3]) + (", ..." if len(differ) > 3 else "")
        warnings.warn(
            f"tiny_gpt: {len(differ)} of {len(CORPUS_FILES)} corpus files differ from "
            f"{RECORDED_ON}'s ({shown}); results are not comparable with the recorded ones",
            stacklevel=2,
        )
    return b"".join(parts)


@functools.cache
def corpus() -> bytes:
    """The corpus of this interpreter's stdlib, read (and checked) once per process."""
    return read_corpus()


@functools.cache
def corpus_sha256() -> str:
    """SHA-256 of the corpus this process uses; equal to CORPUS_SHA256 on the recorded one.
    Report it with a run's results so they can be matched to the text they came from."""
    return hashlib.sha256(corpus()).hexdigest()


def _windows(tokens: torch.Tensor) -> TensorDataset:
    # Non-overlapping windows of CONTEXT + 1 bytes; x is a window without its last byte, y the
    # same window shifted by one (next-byte targets). A tail shorter than a window is dropped.
    n = len(tokens) // (CONTEXT + 1)
    w = tokens[: n * (CONTEXT + 1)].view(n, CONTEXT + 1)
    return TensorDataset(w[:, :-1].contiguous(), w[:, 1:].contiguous())


def splits(data: bytes | None = None) -> tuple[TensorDataset, TensorDataset]:
    """(train, validation) datasets of (x, y) long tensors of shape (CONTEXT,).

    A pure function of the corpus: identical on every rank and for every seed (the loop's
    DistributedSampler shards and shuffles them). The split is by position (validation is the
    corpus's last 10%), so no validation window shares a byte with a training one.
    """
    data = corpus() if data is None else data
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = len(tokens) - int(len(tokens) * VAL_FRACTION)
    return _windows(tokens[:cut]), _windows(tokens[cut:])


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256  # bytes: no tokenizer to ship or version
    context: int = CONTEXT
    layers: int = 2
    width: int = 96
    heads: int = 4


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.width % cfg.heads == 0
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)  # one matmul for q, k and v
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        # (B, T, C) -> (B, heads, T, C / heads): each head attends on its own slice.
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        # is_causal: position i attends to positions <= i only, so the model cannot read the
        # byte it must predict. No mask buffer (nothing for the sync to average or broadcast)
        # and the fused kernel where one exists.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-LayerNorm residual block: normalising the branch inputs, not the residual stream,
    keeps gradients well-scaled through the skips, so it trains without LR warmup."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Bytes (B, T) -> next-byte logits (B, T, 256). No dropout: with the loop's seeding, a
    run's training is then deterministic (no per-step random masks to differ between runs)."""

    def __init__(self, cfg: GPTConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GPTConfig()
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.context, cfg.width)  # learned positions, as GPT-2
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        # Weight tying: the output layer is the embedding, transposed. Saves vocab × width
        # parameters (a tenth of this model) and shares what is learnt about each byte.
        self.head.weight = self.tok.weight
        self.apply(self._init)
        # GPT-2's scaled init: each block adds two branches to the residual stream, so their
        # output projections start 1/sqrt(2 · layers) smaller and the stream's variance stays
        # about constant with depth.
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        # Small normal weights (GPT-2): PyTorch's default fan-in init gives the tied embedding /
        # head too large logits at the start.
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[-1]
        if t > self.cfg.context:
            raise ValueError(f"tiny_gpt: {t} tokens exceed the context of {self.cfg.context}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def task(cfg: Any) -> autok.Task:
    """`--task autok.examples.tiny_gpt:task`. The data ignore cfg (same windows for every seed and
    rank); the model's initial weights come from the global RNG, which the loop seeds from
    cfg.seed before calling this."""
    train, val = splits()
    # The default loss (cross-entropy over the last dimension, reshaped) already fits
    # (B, T, 256) logits against (B, T) targets: the mean next-byte NLL.
    return autok.Task(GPT(), train, val, metric=autok.PERPLEXITY)


def short_task(cfg: Any) -> autok.Task:
    """`--task autok.examples.tiny_gpt:short_task`: the first sixth of the training windows (the
    validation set unchanged), so six short epochs take as many steps as one epoch of `task` and
    validate six times on the way: what the controller panel needs for time-to-target."""
    train, val = splits()
    sixth = TensorDataset(*(t[: len(train) // 6] for t in train.tensors))
    return autok.Task(GPT(), sixth, val, metric=autok.PERPLEXITY)
