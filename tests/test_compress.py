"""Compressed pseudo-gradients (docs/design.md §2, Compression): the codec, error feedback, bytes,
and the engine on real gloo process groups (replicas identical on every rank, close to the
uncompressed run)."""

from __future__ import annotations

import pytest
import torch

from autok.trainer.engine.compress import CHUNK, Codec
from autok.trainer.engine.link import PROFILES
from tests.dist import run_dist


def _roundtrip(codec: Codec, x: torch.Tensor, raw: torch.Tensor, residual=None):
    payload = torch.empty(codec.nbytes, dtype=torch.uint8)
    codec.encode(x.clone(), raw, payload, residual, feedback=slice(0, codec.n_comp))
    out = torch.empty(codec.n_comp + codec.n_raw)
    codec.decode_sum([payload], out)
    return out[: codec.n_comp], out[codec.n_comp :]


@pytest.mark.parametrize("kind, rel", [("int8", 1 / 254), ("fp16", 2**-11)])
def test_quantization_error_is_within_half_a_step_of_each_chunk(kind, rel):
    g = torch.Generator().manual_seed(0)
    n = 3 * CHUNK + 17  # a partial last chunk
    x = torch.randn(n, generator=g) * torch.logspace(-6, 0, n)  # chunks of very different size
    x[CHUNK : 2 * CHUNK] = 0.0  # an all-zero chunk decodes to exact zeros
    raw = torch.tensor([1.0, 2.5e-30, -3.0])
    codec = Codec(kind, n, 3)
    dec, raw_out = _roundtrip(codec, x, raw)
    assert torch.equal(raw_out, raw)  # the float32 tail is carried exactly
    assert torch.equal(dec[CHUNK : 2 * CHUNK], x[CHUNK : 2 * CHUNK])
    padded = torch.zeros(codec.chunks * CHUNK)
    padded[:n] = x
    amax = padded.view(-1, CHUNK).abs().amax(1).repeat_interleave(CHUNK)[:n]
    assert ((dec - x).abs() <= amax * rel * 1.001).all(), ((dec - x).abs() / amax).max()


def test_fp16_keeps_its_relative_precision_for_values_far_below_the_chunks_largest():
    """Scaled to ±1, a value under 2^-14 of its chunk's largest would be an fp16 subnormal (1e-6
    of it: a relative error up to 3%); scaled to ±2^15 it is normal down to 2^-29 of it."""
    x = torch.zeros(CHUNK)
    x[0] = 1.0
    x[1:] = torch.logspace(-8, -1, CHUNK - 1) * torch.tensor([1.0, -1.0]).repeat(CHUNK)[1:CHUNK]
    dec, _ = _roundtrip(Codec("fp16", CHUNK, 0), x, torch.empty(0))
    rel = ((dec - x).abs() / x.abs()).max()
    assert rel <= 2**-11 * 1.001, rel  # half an fp16 ulp, relative, for every value
    tiny = Codec("fp16", CHUNK, 0)  # a chunk whose scale would underflow: scale 1, no inf/nan
    dec, _ = _roundtrip(tiny, torch.full((CHUNK,), 1e-42), torch.empty(0))
    assert torch.isfinite(dec).all()


@pytest.mark.parametrize("kind", ["int8", "fp16"])
def test_error_feedback_loses_nothing_and_its_error_stays_bounded(kind):
    """Σ sent = Σ Δ − e_T after T boundaries, and e_T is within half a step of the last chunk
    scale, however many boundaries ran (the error does not accumulate)."""
    g = torch.Generator().manual_seed(1)
    n = 2 * CHUNK
    codec = Codec(kind, n, 0)
    residual = torch.zeros(n)
    sent, total = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    no_feedback = torch.zeros(n, dtype=torch.float64)
    for _ in range(200):
        x = torch.randn(n, generator=g) * 1e-3 + 2e-4  # a drift the quantizer rounds away
        dec, _ = _roundtrip(codec, x, torch.empty(0), residual)
        sent += dec.double()
        total += x.double()
        no_feedback += _roundtrip(codec, x, torch.empty(0))[0].double()
        step = (x + residual).abs().max() * (1 / 127 if kind == "int8" else 2**-10)
        assert residual.abs().max() <= step  # bounded by the quantization step, every time
    assert torch.allclose(sent, total - residual.double(), atol=1e-9)
    # ...whereas without feedback the per-boundary rounding accumulates
    assert (total - sent).abs().max() < (total - no_feedback).abs().max()


def test_int8_carries_at_most_027_of_fp32_bytes_and_fp16_half():
    n, tail = 100_000, 10  # parameters of a small model; the scalar tail
    fp32 = 4 * (n + tail)
    assert Codec("int8", n, tail).nbytes <= 0.27 * fp32
    assert Codec("fp16", n, tail).nbytes <= 0.51 * fp32


def test_the_link_models_the_allgather_of_the_compressed_payload():
    wan = PROFILES["wan"]
    s, world = 1_000_000, 4
    assert wan.allgather_seconds(s, world) == pytest.approx(3 * (8.3e-3 + s / 125e6))
    assert PROFILES["none"].allgather_seconds(s, world) == 0.0
    # int8 on 4 ranks: N − 1 latencies instead of 2(N − 1), and (N − 1)·S/4 bytes instead of
    # 2(N − 1)/N·S: exactly half the fp32 ring all-reduce's time
    half = wan.allreduce_seconds(s, world) / 2
    assert wan.allgather_seconds(s // 4, world) == pytest.approx(half)


# ----- through the engine -----------------------------------------------------------------------


class Bytes:
    def __init__(self) -> None:
        self.nbytes: list[int] = []

    def on_boundary(self, stats, decision) -> None:
        self.nbytes.append(stats.bytes_communicated)


def _compress_worker(rank, world):
    import autok
    from tests.test_api import _batches, _flat, _model, _train

    out = {}
    cases = {
        "default": {"strategy": "localsgd"},
        "none": {"strategy": "localsgd", "compress": "none"},
        "fp16": {"strategy": "localsgd", "compress": "fp16"},
        "int8": {"strategy": "localsgd", "compress": "int8"},
        "int8-fused": {"strategy": "cpdp", "compress": "int8"},  # gradients compressed too
        "none-fused": {"strategy": "cpdp"},
        "int8-overlap": {"strategy": "localsgd", "compress": "int8", "overlap_boundary": True},
        "none-overlap": {"strategy": "localsgd", "overlap_boundary": True},
        "int8-nesterov": {
            "strategy": "localsgd",
            "compress": "int8",
            "outer_optimizer": "nesterov",
        },
        "none-nesterov": {"strategy": "localsgd", "outer_optimizer": "nesterov"},
    }
    for name, options in cases.items():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        bytes_log = Bytes()
        sync = autok.Sync(model, opt, sync_period=3, link="none", observers=[bytes_log], **options)
        log = _train(sync, opt, _batches(rank, 15))
        sync.close()
        out[name] = {
            "params": _flat(model),
            "agree": [ok for b, ok in log if b and ok is not None],
            "bytes": bytes_log.nbytes,
            "fused": sync.strategy.fused_gradients,
        }
    return out


@pytest.mark.dist
def test_compressed_averaging_keeps_replicas_identical_and_close_to_fp32():
    results = run_dist(_compress_worker, 2)
    for res in results:
        # compress none is today's boundary, bit for bit
        assert torch.equal(res["none"]["params"], res["default"]["params"])
        assert res["int8-fused"]["fused"]
        for name in ("fp16", "int8", "int8-fused", "int8-overlap", "int8-nesterov"):
            got = res[name]
            base = res["none-" + name.split("-")[1] if "-" in name else "none"]
            if "overlap" not in name:  # overlap: identical once applied, a step later (below)
                assert got["agree"] and all(got["agree"]), name  # identical after each boundary
            assert torch.allclose(got["params"], base["params"], rtol=0, atol=5e-3), (
                name,
                (got["params"] - base["params"]).abs().max(),
            )
            assert not torch.equal(got["params"], base["params"]), name  # it did compress
            # bytes per boundary: the compressed payload against the fp32 buffer; this model has
            # 161 parameters beside 12 float32 scalars, so the tail weighs 7% here. The last
            # boundary: cpdp's first is two-phase (auto), its gradient bucket uncompressed
            ratio = got["bytes"][-1] / base["bytes"][-1]
            assert ratio <= (0.56 if name == "fp16" else 0.32), (name, ratio)
    for name in res:  # every rank ends with the same parameters, overlap included: close()
        # settles a pending overlapped average by writing θ_new, not θ_i + (θ_new − θ_sent)
        a, b = results[0][name]["params"], results[1][name]["params"]
        assert torch.equal(a, b), name
