"""Compressed pseudo-gradients (docs/design.md §2, Compression): the codec, error feedback, bytes,
and the engine on real gloo process groups (replicas identical on every rank, close to the
uncompressed run)."""

from __future__ import annotations

import pytest
import torch

from autok.trainer.engine.compress import (
    CHUNK,
    Buffers,
    Layout,
    _decode,
    _feedback,
    _quantize,
    quantized_allreduce_,
)
from autok.trainer.engine.link import PROFILES, phases
from tests.dist import run_dist


def _roundtrip(layout: Layout, x: torch.Tensor, residual=None):
    """One rank's quantization of x (world 1: its whole share) and its decoding."""
    row = torch.zeros(layout.row_bytes, dtype=torch.uint8)
    work = torch.empty(layout.work_numel)
    out = torch.empty(layout.n_comp)
    if residual is None:
        _quantize(layout, 0, x.clone(), row, work)
    else:
        _feedback(layout, 0, x.clone(), row, residual, 0, work, torch.empty(layout.n_comp))
    _decode(layout, 0, row, out, work, add=False)
    return out


@pytest.mark.parametrize("kind, rel", [("int8", 1 / 254), ("fp16", 2**-11)])
def test_quantization_error_is_within_half_a_step_of_each_block(kind, rel):
    g = torch.Generator().manual_seed(0)
    n = 3 * CHUNK + 17  # a partial last block
    x = torch.randn(n, generator=g) * torch.logspace(-6, 0, n)  # blocks of very different size
    x[CHUNK : 2 * CHUNK] = 0.0  # an all-zero block decodes to exact zeros
    dec = _roundtrip(Layout(kind, (n,), 0, 1), x)
    assert torch.equal(dec[CHUNK : 2 * CHUNK], x[CHUNK : 2 * CHUNK])
    padded = torch.zeros(4 * CHUNK)
    padded[:n] = x
    amax = padded.view(-1, CHUNK).abs().amax(1).repeat_interleave(CHUNK)[:n]
    assert ((dec - x).abs() <= amax * rel * 1.001).all(), ((dec - x).abs() / amax).max()


@pytest.mark.parametrize("kind", ["int8", "fp16"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_value_decodes_non_finite_so_the_divergence_guard_sees_it(kind, bad):
    """int8 turns a nan into 0: only a scale that stays non-finite keeps the block non-finite."""
    x = torch.linspace(-1, 1, 2 * CHUNK)
    x[CHUNK + 5] = bad
    dec = _roundtrip(Layout(kind, (2 * CHUNK,), 0, 1), x)
    assert torch.isfinite(dec[:CHUNK]).all()  # the other block is untouched
    assert not torch.isfinite(dec[CHUNK:]).all()


def test_fp16_keeps_its_relative_precision_for_values_far_below_the_blocks_largest():
    """Scaled to ±1, a value under 2^-14 of its block's largest would be an fp16 subnormal (1e-6
    of it: a relative error up to 3%); scaled to ±2^15 it is normal down to 2^-29 of it."""
    x = torch.zeros(CHUNK)
    x[0] = 1.0
    x[1:] = torch.logspace(-8, -1, CHUNK - 1) * torch.tensor([1.0, -1.0]).repeat(CHUNK)[1:CHUNK]
    dec = _roundtrip(Layout("fp16", (CHUNK,), 0, 1), x)
    rel = ((dec - x).abs() / x.abs()).max()
    assert rel <= 2**-11 * 1.001, rel  # half an fp16 ulp, relative, for every value
    # a block whose scale would underflow: scale 1, no inf/nan
    dec = _roundtrip(Layout("fp16", (CHUNK,), 0, 1), torch.full((CHUNK,), 1e-42))
    assert torch.isfinite(dec).all()


@pytest.mark.parametrize("kind", ["int8", "fp16"])
def test_error_feedback_loses_nothing_and_its_error_stays_bounded(kind):
    """Σ sent = Σ Δ − e_T after T boundaries, and e_T is within half a step of the last block
    scale, however many boundaries ran (the error does not accumulate)."""
    g = torch.Generator().manual_seed(1)
    n = 2 * CHUNK
    layout = Layout(kind, (n,), 0, 1)
    residual = torch.zeros(n)
    sent, total = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    no_feedback = torch.zeros(n, dtype=torch.float64)
    for _ in range(200):
        x = torch.randn(n, generator=g) * 1e-3 + 2e-4  # a drift the quantizer rounds away
        step = (x + residual).abs().max() * (1 / 127 if kind == "int8" else 2**-10)
        dec = _roundtrip(layout, x, residual)
        sent += dec.double()
        total += x.double()
        no_feedback += _roundtrip(layout, x).double()
        assert residual.abs().max() <= step  # bounded by the quantization step, every time
    assert torch.allclose(sent, total - residual.double(), atol=1e-9)
    # ...whereas without feedback the per-boundary rounding accumulates
    assert (total - sent).abs().max() < (total - no_feedback).abs().max()


def test_a_scale_never_spans_the_fused_boundarys_delta_and_gradients():
    """The fused cpdp boundary compresses [Δ | g]: Δ is K local steps' worth of small values,
    g a gradient hundreds of times larger. A block straddling the seam would scale Δ by the
    gradients' largest and round it away; each segment keeps its own scales, at any N."""
    n = 300  # < CHUNK: a single block for both, were the seam ignored
    delta = torch.linspace(-1e-4, 1e-4, n)
    grads = torch.linspace(-1.0, 1.0, n)
    for world in (1, 2, 3):
        layout = Layout("int8", (n, n), 0, world)
        for pieces in layout.pieces:
            assert all(b <= n or a >= n for a, b, _ in pieces), pieces
    layout = Layout("int8", (n, n), 0, 1)
    dec = _roundtrip(layout, torch.cat([delta, grads]))
    assert (dec[:n] - delta).abs().max() <= 1e-4 / 254 * 1.001
    assert (dec[n:] - grads).abs().max() <= 1.0 / 254 * 1.001


@pytest.mark.parametrize("world", [2, 4, 8, 64, 512])
def test_int8_carries_at_most_027_of_fp32_bytes_and_fp16_half_at_any_world_size(world):
    n, tail = 200_000, 12  # parameters of a small model; the scalar tail
    fp32 = 4 * (n + tail)
    assert Layout("int8", (n,), tail, world).nbytes <= 0.27 * fp32
    assert Layout("fp16", (n,), tail, world).nbytes <= 0.51 * fp32


def test_the_link_books_the_quantized_allreduces_two_phases():
    """An all-to-all of the payload P, then an all-gather of P/N: each (N − 1)/N·P per rank, each
    way, and N − 1 latencies each: together the ring all-reduce's time for P, at any N (the old
    all-gather of P paid (N − 1)·P/B)."""
    wan = PROFILES["wan"]
    p, world = 1_000_000, 4
    a2a, gather = phases(wan, p, world, quantized=True)
    assert a2a == pytest.approx(3 * (8.3e-3 + p / 4 / 125e6))
    assert gather == pytest.approx(3 * (8.3e-3 + p / 4 / 125e6))
    for n in (2, 8, 64, 512):
        assert wan.quantized_allreduce_seconds(p, n) == pytest.approx(wan.allreduce_seconds(p, n))
    assert PROFILES["none"].quantized_allreduce_seconds(p, world) == 0.0


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
        # asked for: the gradients ride the quantized collective too
        "int8-fused": {"strategy": "cpdp", "compress": "int8", "boundary": "fused"},
        "none-fused": {"strategy": "cpdp"},
        # auto never quantizes the gradients: under --compress it keeps two-phase
        "int8-auto": {"strategy": "cpdp", "compress": "int8"},
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
        assert res["int8-fused"]["fused"] and res["none-fused"]["fused"]
        assert not res["int8-auto"]["fused"]
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
            # 161 parameters beside 12 float32 scalars, so the tail weighs 7% here, and each
            # rank's share its own scale and 4-byte padding. The last boundary: cpdp's first is
            # two-phase (auto), its gradient bucket uncompressed
            ratio = got["bytes"][-1] / base["bytes"][-1]
            assert ratio <= (0.56 if name == "fp16" else 0.33), (name, ratio)
    for name in res:  # every rank ends with the same parameters, overlap included: close()
        # settles a pending overlapped average by writing θ_new, not θ_i + (θ_new − θ_sent)
        a, b = results[0][name]["params"], results[1][name]["params"]
        assert torch.equal(a, b), name


# ----- the quantized all-reduce at world 4 ------------------------------------------------------


class _Wire:
    """What this rank's collectives move, each counted by what it sends: a ring all-reduce of S
    sends 2(N − 1)/N·S, an all-to-all (N − 1)/N of its input, an all-gather its input to N − 1
    peers. Wraps torch.distributed's functions; the collectives themselves run as they are."""

    def __init__(self, world: int) -> None:
        import torch.distributed as dist

        self.sent = 0
        self._saved = {}
        n = world

        def count(name, share):
            real = getattr(dist, name)
            self._saved[name] = real

            def wrapped(*args, **kwargs):
                t = args[1]  # (output, input) for all three
                self.sent += int(share * t.numel() * t.element_size())
                return real(*args, **kwargs)

            setattr(dist, name, wrapped)

        count("all_to_all_single", (n - 1) / n)
        count("all_gather", n - 1)
        real_ar = dist.all_reduce
        self._saved["all_reduce"] = real_ar

        def all_reduce(t, *args, **kwargs):
            self.sent += int(2 * (n - 1) / n * t.numel() * t.element_size())
            return real_ar(t, *args, **kwargs)

        dist.all_reduce = all_reduce

    def close(self) -> None:
        import torch.distributed as dist

        for name, real in self._saved.items():
            setattr(dist, name, real)


def _allreduce_worker(rank, world):
    """Three boundaries of the quantized all-reduce on each rank's own data (a Δ segment with
    error feedback, a gradient segment without, an exact float32 tail)."""
    n, tail = 5000, 7
    layout = Layout("int8", (n, 1000), tail, world)
    mem = Buffers(layout, torch.device("cpu"))
    residual, residual2 = torch.zeros(n), torch.zeros(n)
    g = torch.Generator().manual_seed(rank)
    sent = torch.zeros(n, dtype=torch.float64)
    results = []
    wire = _Wire(world)
    for _ in range(3):
        x = torch.cat([torch.randn(n + 1000, generator=g) * 1e-3, torch.arange(tail) + rank])
        sent += x[:n].double()
        buf = x.clone()
        quantized_allreduce_(buf, layout, mem, rank, residual, residual2)
        results.append(buf)
    wire.close()
    return {
        "results": results,
        "sent": sent,
        "residuals": residual.double() + residual2.double(),
        "wire": wire.sent,
        "fp32_wire": int(2 * (world - 1) / world * 4 * (n + 1000 + tail)),
    }


@pytest.mark.dist
def test_the_quantized_allreduce_is_identical_on_every_rank_and_exact_in_the_error_feedback_sense():
    world, n, tail = 4, 5000, 7
    res = run_dist(_allreduce_worker, world)
    for r in res[1:]:  # every rank decodes the same bytes: the same sums, bit for bit
        for a, b in zip(res[0]["results"], r["results"], strict=True):
            assert torch.equal(a, b)
    applied = sum(b[:n].double() for b in res[0]["results"])
    true = sum(r["sent"] for r in res)
    owed = sum(r["residuals"] for r in res)
    # nothing is lost: what every rank applied is what they all sent, less what is still owed
    assert torch.allclose(applied, true - owed, atol=1e-9), (applied - true + owed).abs().max()
    assert owed.abs().max() > 0  # (it did quantize)
    tails = torch.stack([b[-tail:] for b in res[0]["results"]])
    assert torch.equal(tails, (torch.arange(tail) * world + 6).expand(3, tail).float())  # exact
    for r in res:  # each rank sends at most 0.3x what a ring all-reduce of the fp32 buffer sends
        assert r["wire"] <= 0.3 * 3 * r["fp32_wire"], r["wire"] / (3 * r["fp32_wire"])


class _Records:
    def __init__(self) -> None:
        self.rows: list = []

    def on_boundary(self, stats, decision) -> None:
        self.rows.append(stats)


def _engine_bytes_worker(rank, world):
    """localsgd at world 4 on the modelled wan, fp32 against int8: the bytes its collectives
    move, the records' bytes_communicated, the modelled exposed time, and the parameters."""
    import torch.distributed as dist
    from torch import nn

    import autok
    from tests.test_api import _batches, _flat

    out = {}
    for compress in ("none", "int8"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 512), nn.Tanh(), nn.Linear(512, 1))  # 5121 parameters
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        rec = _Records()
        sync = autok.Sync(
            model,
            opt,
            strategy="localsgd",
            sync_period=3,
            compress=compress,
            link="wan",
            clock="virtual",
            compute_ms=10.0,
            model_bytes=500_000_000,  # a 124M-parameter model on the modelled link
            observers=[rec],
        )
        wire = _Wire(world)
        for x, y in _batches(rank, 9):
            with sync.step():
                opt.zero_grad()
                nn.functional.mse_loss(sync.model(x), y).backward()
                opt.step()
        wire.close()
        sync.close()
        params = [torch.empty(5121) for _ in range(world)]
        dist.all_gather(params, _flat(model))
        out[compress] = {
            "wire": wire.sent,
            "bytes": [r.bytes_communicated for r in rec.rows],
            "exposed": [r.exposed_sync_seconds for r in rec.rows],
            "params": params,
        }
    return out


@pytest.mark.dist
def test_int8_at_world_4_moves_under_03x_the_bytes_of_fp32_and_the_modelled_link_sees_it():
    res = run_dist(_engine_bytes_worker, 4)
    for r in res:
        fp32, int8 = r["none"], r["int8"]
        assert len(int8["bytes"]) == len(fp32["bytes"]) == 3
        # counted by what the collectives move, each rank: at most 0.3x (0.25 and the scales)
        assert int8["wire"] <= 0.3 * fp32["wire"], int8["wire"] / fp32["wire"]
        # the records count the payload each rank contributes, in the unit of fp32's buffer
        for a, b in zip(int8["bytes"], fp32["bytes"], strict=True):
            assert a <= 0.3 * b, (a, b)
        # and the modelled link's time (the averaging's exposed wait) shrinks with them
        assert sum(int8["exposed"]) <= 0.3 * sum(fp32["exposed"]), (
            int8["exposed"],
            fp32["exposed"],
        )
        for params in (fp32["params"], int8["params"]):
            assert all(torch.equal(params[0], p) for p in params)  # identical on every rank
    assert torch.allclose(res[0]["int8"]["params"][0], res[0]["none"]["params"][0], atol=5e-3)


def _fused_seam_worker(rank, world):
    """cpdp's fused boundary (Δ and gradients in one compressed collective) with a small LR, so
    that Δ is far smaller than the gradients: the first boundary's update, int8 against fp32."""
    from torch import nn

    import autok
    from tests.test_api import _batches, _flat, _model

    out = {}
    for compress in ("none", "int8"):
        model = _model()
        start = _flat(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        sync = autok.Sync(
            model, opt, strategy="cpdp", sync_period=3, boundary="fused", compress=compress
        )
        assert sync.strategy.fused_gradients
        for x, y in _batches(rank, 3):
            with sync.step():
                opt.zero_grad()
                nn.functional.mse_loss(sync.model(x), y).backward()
                opt.step()
        out[compress] = _flat(model) - start
        state = sync.state_dict()
        sync.close()
    # a state saved before the second residual existed loads with it at zero
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=3, boundary="fused", compress="int8")
    out["had_residual2"] = isinstance(state["averager"].pop("residual2", None), torch.Tensor)
    sync.load_state_dict(state)
    out["residual2_zero"] = bool((sync.averager._residual2 == 0).all())
    sync.close()
    return out


@pytest.mark.dist
def test_fused_int8_gives_delta_its_own_scales_apart_from_the_gradients():
    for r in run_dist(_fused_seam_worker, 2):
        update, got = r["none"], r["int8"]
        err = (got - update).abs().max() / update.abs().max()
        assert err <= 0.02, err  # a shared scale rounded most of Δ away (err near 1)
        assert r["had_residual2"] and r["residual2_zero"]
