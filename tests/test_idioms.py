"""The idioms users bring to `autok.Sync` (docs/design.md §3, Public API): gradient accumulation,
torch.compile, the outer state off the model's device. Real gloo process groups, the public API."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import autok
from autok.trainer.engine.exact_sums import N_SCALARS
from autok.trainer.engine.flat_buffer import FlatBuffer
from autok.trainer.engine.fused_grads import FusedGrads
from tests.dist import run_dist

pytestmark = pytest.mark.dist


def _model() -> nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _batches(rank: int, n: int, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    out = []
    for _ in range(n):
        x = torch.randn(batch, 8, generator=g)
        out.append((x, x.sum(1, keepdim=True).sin()))
    return out


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ----- torch.compile ----------------------------------------------------------------------------


def _graph_breaks(run) -> list[str]:
    """The first line of each graph break's reason (with its explanation) while `run()` runs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    run()
    return sorted(" ".join(k.split("\n")[:2]) for k in counters["graph_break"])


def _compile_worker(rank, world):
    out = {}
    # the built-in gradient path (ddp, cpdp: no link) and the comm hook (an emulated link)
    for strategy, link in (("ddp", "none"), ("cpdp", "none"), ("localsgd", "wan")):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        k = 1 if strategy == "ddp" else 2
        sync = autok.Sync(model, opt, strategy=strategy, sync_period=k, link=link)
        compiled = torch.compile(sync.model, backend="eager")
        steps = []

        def under_sync(sync=sync, opt=opt, compiled=compiled, steps=steps):
            for x, y in _batches(rank, 4):
                with sync.step() as s:
                    opt.zero_grad()
                    nn.functional.mse_loss(compiled(x), y).backward()
                    opt.step()
                t = sync.last_step
                steps.append((s.is_boundary, t.grad_synced, t.forward_seconds > 0))

        breaks = _graph_breaks(under_sync)
        sync.close()
        out[strategy] = breaks, steps
    plain_compiled = torch.compile(DistributedDataParallel(_model()), backend="eager")

    def plain():
        for x, y in _batches(rank, 4):
            nn.functional.mse_loss(plain_compiled(x), y).backward()

    return out, _graph_breaks(plain)


def test_compiling_sync_model_breaks_no_graph_of_autoks():
    """torch.compile(sync.model) breaks its graph only where a plain DDP's does: autok's clock
    points (the forward's end, the gradient hook it arms) are outside the traced frames, and
    the step is still timed (its forward measured, its gradient sync seen)."""
    for out, plain in run_dist(_compile_worker, 2):
        for strategy, (ours, steps) in out.items():
            assert not [r for r in ours if r not in plain], (strategy, ours, plain)
            assert not [r for r in ours if "perf_counter" in r], (strategy, ours)
            assert all(forward for _, _, forward in steps), (strategy, steps)
        ddp, cpdp, local = (out[s][1] for s in ("ddp", "cpdp", "localsgd"))
        assert [(b, synced) for b, synced, _ in ddp] == [(True, True)] * 4, ddp
        # cpdp (two-phase: SGD fused sends gradients in the average) and localsgd: K = 2
        assert [b for b, _, _ in cpdp] == [b for b, _, _ in local] == [False, True] * 2
        assert not any(synced for _, synced, _ in local), local


# ----- gradient accumulation --------------------------------------------------------------------


def _accumulated(sync, opt, batches, n: int) -> list[tuple[bool, bool]]:
    """A user's loop with accumulation: n micro-batches per optimizer step, their losses
    scaled so that the step's gradient is the batch's mean."""
    log = []
    for x, y in batches:
        with sync.step() as s:
            for xm, ym in zip(x.chunk(n), y.chunk(n), strict=True):
                (nn.functional.mse_loss(sync.model(xm), ym) / n).backward()
            opt.step()
            opt.zero_grad()
        log.append((s.is_boundary, sync.last_step.grad_synced))
    return log


def _accumulation_worker(rank, world):
    batches = _batches(rank, 6)
    out = {}
    # ddp, 4 micro-batches of 4 per step, against DDP by hand with no_sync() on the first 3
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = autok.Sync(model, opt, strategy="ddp", accumulation_steps=4)
    out["ddp_log"] = _accumulated(sync, opt, batches, 4)
    out["ddp_counts"] = (sync.grad_syncs, sync.collectives)
    sync.close()
    out["params"] = _flat(model)
    by_hand = _model()
    ddp = DistributedDataParallel(by_hand)
    opt = torch.optim.SGD(by_hand.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches:
        micro = list(zip(x.chunk(4), y.chunk(4), strict=True))
        for xm, ym in micro[:-1]:
            with ddp.no_sync():
                (nn.functional.mse_loss(ddp(xm), ym) / 4).backward()
        xm, ym = micro[-1]
        (nn.functional.mse_loss(ddp(xm), ym) / 4).backward()
        opt.step()
        opt.zero_grad()
    out["by_hand"] = _flat(by_hand)
    # the collectives of N = 1 on the same optimizer steps: ddp, and cpdp with both boundaries
    # (two-phase under AdamW: a gradient all-reduce in the boundary's backward; fused under SGD)
    for name, strategy, make in (
        ("ddp", "ddp", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
        ("two-phase", "cpdp", lambda p: torch.optim.AdamW(p, lr=0.01)),
        ("fused", "cpdp", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    ):
        counts = []
        for n in (1, 4):
            model = _model()
            opt = make(model.parameters())
            k = 1 if strategy == "ddp" else 2
            sync = autok.Sync(model, opt, strategy=strategy, sync_period=k, accumulation_steps=n)
            log = _accumulated(sync, opt, batches, n)
            counts.append((log, sync.grad_syncs, sync.param_syncs, sync.collectives))
            sync.close()
        out[name] = counts
    # a short step says so; a step of another number of passes is refused at its close
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = autok.Sync(model, opt, strategy="ddp", accumulation_steps=4)
    x, y = batches[0]
    with sync.step(micro_batches=2):
        for xm, ym in zip(x.chunk(2), y.chunk(2), strict=True):
            nn.functional.mse_loss(sync.model(xm), ym).backward()
        opt.step()
    out["short"] = (sync.global_step, sync.last_step.grad_synced, sync.collectives)
    try:
        with sync.step():
            for xm, ym in zip(x.chunk(2), y.chunk(2), strict=True):
                nn.functional.mse_loss(sync.model(xm), ym).backward()
            opt.step()
    except RuntimeError as exc:
        out["refused"] = str(exc)
    out["flag_restored"] = sync.model.require_backward_grad_sync
    sync.close()
    sync = autok.Sync(model, opt, strategy="ddp")  # N = 1: a step of one pass may say so
    with sync.step(micro_batches=1):
        nn.functional.mse_loss(sync.model(x), y).backward()
        opt.step()
    out["one"] = sync.global_step
    out["bad_micro"] = []
    for bad in (0, 5, True, 2.0):
        try:
            sync.step(micro_batches=bad)
        except autok.OptionError as exc:
            out["bad_micro"].append(str(exc))
    sync.close()
    return out


def test_accumulation_communicates_once_per_optimizer_step_and_equals_no_sync_by_hand():
    """accumulation_steps=4: the first 3 passes under no_sync(), the last all-reduces. ddp
    gives the parameters of DDP by hand with no_sync() on the first 3 bit for bit (the same
    gradients accumulated, the same all-reduce: tolerance 0), and every strategy sends the
    collectives of one pass per step, as with N = 1; K counts optimizer steps."""
    for out in run_dist(_accumulation_worker, 2):
        assert torch.equal(out["params"], out["by_hand"])
        assert out["ddp_log"] == [(True, True)] * 6
        assert out["ddp_counts"] == (6, 6)  # one bucket per step, as at N = 1
        for name in ("ddp", "two-phase", "fused"):
            one, four = out[name]
            assert one == four, (name, one, four)  # boundaries, syncs and collectives
        assert [b for b, _ in out["fused"][0][0]] == [False, True] * 3
        assert out["short"] == (1, True, 1)
        assert out["refused"].startswith("accumulation_steps: 2 forward passes"), out
        assert out["flag_restored"] is True
        assert out["one"] == 1
        assert len(out["bad_micro"]) == 4, out["bad_micro"]
        assert all(m.startswith("micro_batches: ") for m in out["bad_micro"]), out["bad_micro"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"accumulation_steps": 0}, "--accumulation-steps: input should be greater than"),
        ({"accumulation_steps": 1 << 20}, "--accumulation-steps: input should be less than"),
        ({"accumulation_steps": True}, "--accumulation-steps: True is a boolean"),
        ({"outer_state_device": "gpu"}, "--outer-state-device: input should be"),
        ({"outer_state_device": "cpu", "strategy": "ddp"}, "--outer-state-device: cpu: ddp"),
        (
            {"outer_state_device": "cpu", "strategy": "localsgd", "fragment_delay": 1},
            "--outer-state-device: cpu: a delayed average",
        ),
    ],
)
def test_bad_idiom_options_are_refused_in_one_line_naming_them(options, said):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(autok.OptionError) as caught:
        autok.Sync(model, opt, **options)  # refused before any process group is needed
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


# ----- the outer state off the model's device ---------------------------------------------------


def _held(obj, params, depth: int = 3, seen=None) -> dict[int, torch.Tensor]:
    """The tensors `obj` holds (its attributes, and their tuples, lists and dicts, and the
    averager's parts that hold its buffers), by storage, but the parameters' own storages
    (views of them are no memory of the holder's)."""
    seen = {} if seen is None else seen
    values = obj.values() if isinstance(obj, dict) else obj
    if not isinstance(obj, dict | list | tuple):
        values = vars(obj).values()
    for v in values:
        if isinstance(v, torch.Tensor):
            ptr = v.untyped_storage().data_ptr()
            if ptr not in params and v.untyped_storage().nbytes():
                seen[ptr] = v
        elif depth and isinstance(v, dict | list | tuple | FlatBuffer | FusedGrads):
            _held(v, params, depth - 1, seen)
    return seen


_SCALAR_BYTES = N_SCALARS * 4  # the buffer's float32 tail: the boundary's statistics
_MEMORY_CASES = {
    # name: (strategy, optimizer, options)
    "localsgd": ("localsgd", "sgd", {}),
    "localsgd nesterov": ("localsgd", "sgd", {"outer_optimizer": "nesterov"}),
    "cpdp adamw": ("cpdp", "adamw", {}),
    "cpdp sgd (fused)": ("cpdp", "sgd", {}),
}


def _memory_worker(rank, world):
    out = {}
    for name, (strategy, kind, options) in _MEMORY_CASES.items():
        for where in ("model", "cpu"):
            model = nn.Sequential(nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 1))
            torch.manual_seed(0)
            for p in model.parameters():
                nn.init.normal_(p, std=0.1)
            if kind == "sgd":
                opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=0.01)
            sync = autok.Sync(
                model, opt, strategy=strategy, sync_period=2, outer_state_device=where, **options
            )
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
            ratios = []
            for x, y in _batches(rank, 7):
                with sync.step():
                    opt.zero_grad()
                    nn.functional.mse_loss(sync.model(x), y).backward()
                    opt.step()
                held = _held(sync.averager, params)
                if where == "cpu":  # θ_ref and the velocity: host memory, however the model's
                    home = [sync.averager.ref, sync.averager.velocity]
                    for t in (t for t in home if t is not None):
                        assert t.device.type == "cpu"
                        held.pop(t.untyped_storage().data_ptr())
                # in parameter bytes, less the boundary's scalars riding in the buffer
                extra = sum(t.untyped_storage().nbytes() for t in held.values()) - _SCALAR_BYTES
                ratios.append(extra / nbytes)
            sync.sync_now()
            state = sync.state_dict()["averager"]
            out[name, where] = (
                max(ratios),
                _flat(model),
                state["ref"].clone(),
                None if state["velocity"] is None else state["velocity"].clone(),
                [s["momentum_buffer"].clone() for s in opt.state.values() if "momentum_buffer" in s]
                + [s["exp_avg"].clone() for s in opt.state.values() if "exp_avg" in s],
            )
            sync.close()
    return out


def test_the_outer_state_on_the_cpu_leaves_the_device_two_params_at_most_bit_for_bit():
    """outer_state_device="cpu": θ_ref and the velocity in host memory, staged for a boundary
    only; what autok holds on the model's device between steps is at most 2x the parameters'
    bytes (the fused buffer [θ | g]), where it was 3x (localsgd), 4x (nesterov; cpdp + AdamW)
    and 5x (cpdp + SGD); and every parameter, θ_ref, velocity and optimizer state is the same
    bit for bit."""
    expected_default = {
        "localsgd": 3.0,
        "localsgd nesterov": 4.0,
        "cpdp adamw": 4.0,
        "cpdp sgd (fused)": 5.0,
    }
    for out in run_dist(_memory_worker, 2):
        for name, default in expected_default.items():
            on_model, on_cpu = out[name, "model"], out[name, "cpu"]
            assert on_model[0] == default, (name, on_model[0])
            assert on_cpu[0] <= 2.0, (name, on_cpu[0])
            assert torch.equal(on_model[1], on_cpu[1]), name
            assert torch.equal(on_model[2], on_cpu[2]), name
            assert (on_model[3] is None) == (on_cpu[3] is None), name
            if on_model[3] is not None:
                assert torch.equal(on_model[3], on_cpu[3]), name
            assert all(map(torch.equal, on_model[4], on_cpu[4])), name


# ----- a forward between backward() and the optimizer step ---------------------------------------


def _forward_after_backward_worker(rank, world):
    out = {}
    # the built-in gradient path (no link) and the comm hook (an emulated link)
    for strategy, link in (("ddp", "none"), ("ddp", "lan"), ("cpdp", "none")):
        for look in (False, True):
            model = _model()
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            k = 1 if strategy == "ddp" else 2
            sync = autok.Sync(model, opt, strategy=strategy, sync_period=k, link=link)
            for x, y in _batches(rank, 6):
                with sync.step() as s:
                    loss = ((sync.model(x) - y) ** 2).mean()
                    loss.backward()
                    if look:  # the loop looks at its model before stepping
                        with torch.no_grad():
                            sync.model(x)
                    opt.step()
                    opt.zero_grad()
                    s.loss = loss
            out[(strategy, link, look)] = (sync.grad_syncs, sync.collectives)
            sync.close()
    return out


def test_a_forward_between_backward_and_step_keeps_the_gradient_sync_counted():
    """A forward the loop runs after backward() (under no_grad) moves the step's end of forward
    past the buckets' all-reduce: the sync is still counted, as without that forward (it was
    dropped, and with it the virtual clock's booking of the all-reduce)."""
    for out in run_dist(_forward_after_backward_worker, 2):
        for strategy, link in (("ddp", "none"), ("ddp", "lan"), ("cpdp", "none")):
            assert out[(strategy, link, True)] == out[(strategy, link, False)], out
        assert out[("ddp", "none", False)][0] == 6, out
