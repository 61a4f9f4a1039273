"""Outer optimizers (docs/design.md §2): the pure rule against torch.optim.SGD and SlowMo, the
options, and the equivalences through the engine on real gloo process groups."""

from __future__ import annotations

import pytest
import torch

from autok.trainer.engine.options import OptionError, SyncOptions, sync_options
from autok.trainer.engine.outer import OuterOptimizer, outer_step_
from autok.trainer.engine.slowmo import slowmo_update_
from tests.dist import run_dist


def _averages(steps: int, n: int = 257, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    theta0 = torch.randn(n, generator=g)
    return theta0, [torch.randn(n, generator=g) * 0.01 for _ in range(steps)]


def _run_outer(spec: OuterOptimizer, steps: int = 6, inner_lr: float = 0.1) -> torch.Tensor:
    """θ after `steps` boundaries whose θ_avg is θ_ref plus a fixed sequence of moves."""
    theta0, moves = _averages(steps)
    ref = theta0.clone()
    vel = torch.zeros_like(ref) if spec.needs_velocity else None
    for move in moves:
        avg = ref + move
        outer_step_(spec, ref, vel, avg, inner_lr, delta=avg - ref)
    return ref


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("lr, momentum", [(0.7, 0.9), (1.0, 0.5), (0.3, 0.0)])
def test_outer_sgd_and_nesterov_are_torch_sgd_on_the_pseudo_gradient(nesterov, lr, momentum):
    """θ_ref as a parameter whose gradient is Δ = θ_ref − θ_avg, stepped by torch.optim.SGD."""
    theta0, moves = _averages(6)
    p = torch.nn.Parameter(theta0.clone())
    opt = torch.optim.SGD(
        [p], lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0, foreach=False
    )
    for move in moves:
        avg = p.detach() + move
        p.grad = p.detach() - avg
        opt.step()
    kind = "nesterov" if nesterov else "sgd"
    ours = _run_outer(OuterOptimizer(kind, lr, momentum))
    assert torch.equal(ours, p.detach()), (ours - p.detach()).abs().max()


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.9])
def test_sgd_lr1_momentum_beta_is_slowmo_beta_bit_for_bit(beta):
    theta0, moves = _averages(8)
    ref, vel = theta0.clone(), torch.zeros_like(theta0)
    for move in moves:  # today's SlowMo, called directly
        slowmo_update_(ref, vel, ref + move, beta, 0.1)
    assert torch.equal(_run_outer(OuterOptimizer("sgd", 1.0, beta), steps=8), ref)
    assert torch.equal(_run_outer(OuterOptimizer("slowmo", 1.0, beta), steps=8), ref)


def test_nesterov_momentum0_lr1_is_the_average_itself():
    spec = OuterOptimizer("nesterov", 1.0, 0.0)
    theta0 = torch.tensor([1.0, 1e-8, 3.0])
    avg = torch.tensor([0.1 + 1e-9, 2.0, -7.3])
    out = outer_step_(spec, theta0.clone(), None, avg, 0.1)
    assert torch.equal(out, avg)  # copied: θ_ref − (θ_ref − θ_avg) would round
    assert not torch.equal(theta0 - (theta0 - avg), avg)


def test_slowmo_outer_lr_scales_the_slowmo_step():
    """--outer-lr on slowmo is SlowMo's slow LR α: θ = θ_ref + α·u (u the SlowMo velocity)."""
    theta0, moves = _averages(1)
    for lr_aware, inner in ((False, 0.1), (True, 0.1)):
        spec = OuterOptimizer("slowmo", 0.5, 0.5, lr_aware)
        ref, vel = theta0.clone(), torch.zeros_like(theta0)
        outer_step_(spec, ref, vel, theta0 + moves[0], inner)
        assert torch.allclose(ref, theta0 + 0.5 * moves[0], atol=1e-7)


# ----- options ----------------------------------------------------------------------------------


def test_the_outer_defaults_and_the_slowmo_beta_spelling():
    assert SyncOptions().outer == OuterOptimizer("slowmo", 1.0, 0.3, False)
    assert SyncOptions(strategy="localsgd").outer == OuterOptimizer("slowmo", 1.0, 0.0, False)
    o = SyncOptions(outer_optimizer="nesterov")
    assert (o.outer_lr, o.outer_momentum, o.slowmo_beta) == (0.7, 0.9, None)
    assert SyncOptions(outer_optimizer="sgd").outer == OuterOptimizer("sgd", 1.0, 0.0)
    # a saved config (every default filled) validates again unchanged: what --resume does
    for given in ({}, {"outer_optimizer": "nesterov"}, {"outer_optimizer": "average"}):
        dumped = SyncOptions(**given).model_dump()
        assert SyncOptions(**dumped).model_dump() == dumped


@pytest.mark.parametrize(
    "options, flag_name",
    [
        ({"outer_optimizer": "sgd", "slowmo_beta": 0.3}, "--slowmo-beta"),
        ({"outer_lr": 0.7}, "--outer-lr"),
        ({"outer_momentum": 0.9}, "--outer-momentum"),
        ({"outer_optimizer": "average", "outer_lr": 0.7}, "--outer-lr"),
        ({"outer_optimizer": "average", "outer_momentum": 0.5}, "--outer-momentum"),
        ({"outer_optimizer": "nesterov", "slowmo_lr_aware": True}, "--slowmo-lr-aware"),
        ({"outer_optimizer": "nesterov", "strategy": "ddp"}, "--outer-optimizer"),
        ({"outer_optimizer": "sgd", "outer_momentum": 1.0}, "--outer-momentum"),
        ({"outer_optimizer": "sgd", "outer_lr": 0.0}, "--outer-lr"),
        ({"outer_optimizer": "sgd", "outer_lr": 11.0}, "--outer-lr"),
        ({"outer_optimizer": "adam"}, "--outer-optimizer"),
    ],
)
def test_bad_outer_settings_are_refused_in_one_line_naming_the_flag(options, flag_name):
    with pytest.raises(OptionError) as info:
        sync_options(**options)
    msg = str(info.value)
    assert msg.startswith(flag_name) and "\n" not in msg, msg


# ----- through the engine -----------------------------------------------------------------------


def _final_worker(rank, world):
    """Every variant in one process group: autok.Sync over a tiny regression, 12 steps, K = 3."""
    import autok
    from tests.test_api import _batches, _flat, _model, _train

    out = {}
    variants = {
        "slowmo": {"slowmo_beta": 0.5},
        "sgd": {"outer_optimizer": "sgd", "outer_lr": 1.0, "outer_momentum": 0.5},
        "average": {"outer_optimizer": "average"},
        "slowmo0": {"slowmo_beta": 0.0},
        "nesterov0": {"outer_optimizer": "nesterov", "outer_lr": 1.0, "outer_momentum": 0.0},
        "diloco": {"outer_optimizer": "nesterov"},
    }
    for strategy, boundary in (("cpdp", "two-phase"), ("localsgd", "auto")):
        for name, options in variants.items():
            model = _model()
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            sync = autok.Sync(
                model,
                opt,
                strategy=strategy,
                boundary=boundary,
                sync_period=3,
                link="none",
                **options,
            )
            _train(sync, opt, _batches(rank, 12))
            sync.close()
            out[strategy, name] = _flat(model)
    return out


@pytest.mark.dist
def test_engine_equivalences_bit_for_bit():
    """sgd α=1 μ=β ≡ SlowMo β; nesterov μ=0 α=1 ≡ average ≡ SlowMo β=0 (world 2, cpdp two-phase
    and localsgd)."""
    results = run_dist(_final_worker, 2)
    for res in results:
        for strategy in ("cpdp", "localsgd"):
            got = {name: t for (s, name), t in res.items() if s == strategy}
            assert torch.equal(got["slowmo"], got["sgd"]), strategy
            assert torch.equal(got["average"], got["nesterov0"]), strategy
            assert torch.equal(got["average"], got["slowmo0"]), strategy
            # ...and the outer step really acts: momentum and DiLoCo's defaults end elsewhere
            assert not torch.equal(got["slowmo"], got["average"]), strategy
            assert not torch.equal(got["diloco"], got["average"]), strategy
    assert all(torch.equal(t, results[1][key]) for key, t in results[0].items())  # replicas


def _resume_worker(rank, world, options):
    """Stop mid-interval, save with weights_only, load into fresh objects, continue: the outer
    state (θ_ref, velocity) must come back exactly."""
    import io

    import autok
    from tests.test_api import _batches, _flat, _model, _train

    batches = _batches(rank, 11)

    def fresh():
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # DiLoCo's inner optimizer
        return model, opt, autok.Sync(model, opt, sync_period=3, link="none", **options)

    model, opt, sync = fresh()
    _train(sync, opt, batches)
    whole = _flat(model)
    sync.close()
    model, opt, sync = fresh()
    _train(sync, opt, batches[:7])  # one step after the boundary at 6: mid-interval
    buf = io.BytesIO()
    torch.save({"m": model.state_dict(), "o": opt.state_dict(), "s": sync.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    model, opt, sync = fresh()
    model.load_state_dict(state["m"])
    opt.load_state_dict(state["o"])
    sync.load_state_dict(state["s"])
    _train(sync, opt, batches[7:])
    resumed = _flat(model)
    sync.close()
    return whole, resumed


@pytest.mark.dist
@pytest.mark.parametrize(
    "options",
    [
        {"outer_optimizer": "nesterov"},
        # the error-feedback residual is state too
        {"outer_optimizer": "nesterov", "compress": "int8", "strategy": "localsgd"},
    ],
    ids=["nesterov", "nesterov-int8"],
)
def test_state_dict_resume_with_outer_state_is_bit_for_bit(options):
    for whole, resumed in run_dist(_resume_worker, 2, options):
        assert torch.equal(whole, resumed)


SCALED = [
    ("slowmo", 1.0, 0.6, False),
    ("slowmo", 1.0, 0.6, True),
    ("slowmo", 0.7, 0.6, False),
    ("slowmo", 0.7, 0.6, True),
    ("slowmo", 0.7, 0.0, False),  # no velocity: θ_ref + α·Δ
    ("sgd", 0.7, 0.6, False),
    ("sgd", 0.7, 0.0, False),
    ("nesterov", 0.7, 0.9, False),
    ("nesterov", 0.7, 0.0, False),
]


@pytest.mark.parametrize("spec", SCALED, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_outer_step_on_the_ranks_sum_with_a_power_of_two_scale_is_the_step_on_their_mean(
    spec, n, dtype
):
    """The averager hands the outer step Σ_i Δ_i and 1/N instead of dividing (a pass fewer,
    docs/design.md §3; for sgd and nesterov the negation folds in too): for N a power of two the
    result is bit-identical to the step on the mean, velocity included, in every dtype it folds
    (float16 is not folded), signed zeros too."""
    g = torch.Generator().manual_seed(n)
    spec = OuterOptimizer(*spec)
    ref0 = torch.randn(3000, generator=g).to(dtype)
    vel0 = torch.randn(3000, generator=g).to(dtype)
    total = (torch.randn(3000, generator=g) * 1e-3 * n).to(dtype)
    total[:4] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    ref0[:4] = torch.tensor([0.0, 0.0, -0.0, -0.0])
    mean = total / n
    velocity = (lambda: vel0.clone()) if spec.needs_velocity else (lambda: None)
    a_ref, a_vel = ref0.clone(), velocity()
    outer_step_(spec, a_ref, a_vel, None, 0.05, delta=mean.clone())
    b_ref, b_vel = ref0.clone(), velocity()
    outer_step_(spec, b_ref, b_vel, None, 0.05, delta=total.clone(), scale=1.0 / n)
    assert torch.equal(a_ref, b_ref)
    assert torch.equal(a_ref.signbit(), b_ref.signbit())  # equal treats -0.0 as 0.0
    assert (a_vel is None and b_vel is None) or torch.equal(a_vel, b_vel)
    assert not torch.equal(a_ref, ref0)  # the step moved θ_ref
    with pytest.raises(ValueError, match="not a power of two"):
        outer_step_(spec, ref0.clone(), velocity(), None, 0.05, delta=total.clone(), scale=1 / 3)


@pytest.mark.parametrize("spec", SCALED, ids=lambda s: "-".join(map(str, s)))
def test_the_outer_step_on_a_velocity_decayed_before_the_collective_is_the_same_step(spec):
    """The averager takes the outer step's μ·v in start(), before the collective (docs/design.md
    §3): outer_step_(decayed=True) on that velocity gives the step bit for bit, velocity included,
    over several boundaries (a second decay, or none, would show from the first)."""
    g = torch.Generator().manual_seed(7)
    spec = OuterOptimizer(*spec)
    moves = [torch.randn(1000, generator=g) * 1e-2 for _ in range(4)]
    ref0 = torch.randn(1000, generator=g)
    a_ref, b_ref = ref0.clone(), ref0.clone()
    a_vel = torch.zeros(1000) if spec.needs_velocity else None
    b_vel = torch.zeros(1000) if spec.needs_velocity else None
    for move in moves:
        outer_step_(spec, a_ref, a_vel, None, 0.05, delta=move.clone(), scale=0.5)
        if b_vel is not None:
            b_vel.mul_(spec.momentum)  # what start() does
        outer_step_(
            spec, b_ref, b_vel, None, 0.05, delta=move.clone(), scale=0.5, decayed=b_vel is not None
        )
        assert torch.equal(a_ref, b_ref)
        assert (a_vel is None and b_vel is None) or torch.equal(a_vel, b_vel)
    assert not torch.equal(a_ref, ref0)


def _decayed_boundaries_worker(rank, world, spec_args):
    """Three boundaries of a ParameterAverager whose replicas move apart, against the outer step
    applied by hand to the mean of the ranks' moves (torch.equal: bit for bit)."""
    import torch.distributed as dist

    from autok.trainer.engine.averaging import IntervalTotals, ParameterAverager

    spec = OuterOptimizer(*spec_args)
    torch.manual_seed(0)
    ref0 = torch.randn(1000)
    params = [torch.nn.Parameter(ref0[:600].clone()), torch.nn.Parameter(ref0[600:].clone())]
    averager = ParameterAverager(params, rank=rank, world_size=world, outer=spec)
    ref, vel = ref0.clone(), torch.zeros(1000)
    g = torch.Generator().manual_seed(100 + rank)  # each rank moves its own way
    for _ in range(3):
        with torch.no_grad():
            for p in params:
                p.add_(0.01 * torch.randn(p.shape, generator=g))
        total = torch.cat([p.detach().reshape(-1) for p in params]) - ref
        dist.all_reduce(total)
        averager.reconcile(IntervalTotals(1.0, 1, 0.0, 0.0), lr=0.1, clock=None)
        outer_step_(spec, ref, vel, None, 0.1, delta=total / world)
        assert torch.equal(averager.ref, ref) and torch.equal(averager.velocity, vel)
        assert torch.equal(torch.cat([p.detach().reshape(-1) for p in params]), ref)
    return True


@pytest.mark.dist
@pytest.mark.parametrize("spec", [("slowmo", 1.0, 0.5, False), ("nesterov", 0.7, 0.9, False)])
def test_the_averagers_outer_step_over_boundaries_is_the_step_on_the_mean(spec):
    """The averager takes μ·v before its collective and the rest of the step after it
    (docs/design.md §3): over boundaries whose velocity is no longer zero, that is the outer step on
    the mean move."""
    assert all(run_dist(_decayed_boundaries_worker, 2, spec))


# ----- any torch.optim.Optimizer as the outer step (autok.Sync's outer_optimizer=FACTORY) --------


def _diloco(params):
    """DiLoCo's outer step written as users write it: the optimizer, not autok's name."""
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def _factory_vs_name_worker(rank, world):
    """The same loop with outer_optimizer="nesterov" (α 0.7, μ 0.9: its defaults) and with a
    factory of torch.optim.SGD at those settings, on each boundary path, 12 steps at K = 3."""
    import autok
    from tests.test_api import _batches, _flat, _model, _train

    out = {}
    for strategy, boundary in (("cpdp", "two-phase"), ("cpdp", "auto"), ("localsgd", "auto")):
        for name, outer in (("name", "nesterov"), ("factory", _diloco), ("average", "average")):
            model = _model()
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            sync = autok.Sync(
                model,
                opt,
                strategy=strategy,
                boundary=boundary,
                sync_period=3,
                link="none",
                outer_optimizer=outer,
            )
            log = _train(sync, opt, _batches(rank, 12))
            assert sum(at for at, _ in log) == 4 and all(ok for at, ok in log if at)
            sync.close()
            out[strategy, boundary, name] = _flat(model)
    return out


@pytest.mark.dist
def test_a_factory_of_torch_sgd_nesterov_is_the_nesterov_name_bit_for_bit():
    """outer_optimizer=lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9, nesterov=True) is
    outer_optimizer="nesterov" bit for bit over four boundaries (world 2; two-phase, fused and
    localsgd boundaries), and both really step (not the plain average)."""
    results = run_dist(_factory_vs_name_worker, 2)
    for res in results:
        for key in {k[:2] for k in res}:
            assert torch.equal(res[(*key, "factory")], res[(*key, "name")]), key
            assert not torch.equal(res[(*key, "name")], res[(*key, "average")]), key
    assert all(torch.equal(t, results[1][key]) for key, t in results[0].items())  # replicas


def _adam(params):
    return torch.optim.Adam(params, lr=0.01)  # no name covers it: DiLoCo-style users try it


def _adam_worker(rank, world):
    """An outer Adam: 11 steps at K = 3 (boundaries at 3, 6, 9; close() averages the last two
    steps unscheduled, without an Adam step), against the same run
    stopped mid-interval after step 7, saved (weights_only), loaded into fresh objects and
    continued; and the loads that must be refused."""
    import io

    import autok
    from tests.test_api import _agree, _batches, _flat, _model, _train

    batches = _batches(rank, 11)

    def fresh(outer=_adam):
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        return model, opt, autok.Sync(model, opt, sync_period=3, link="none", outer_optimizer=outer)

    out = {}
    model, opt, sync = fresh()
    out["agree"] = [ok for at, ok in _train(sync, opt, batches) if at]
    sync.close()
    out["whole"], out["steps"] = _flat(model), sync.state_dict()["averager"]["outer"]["state"]
    out["agree"].append(_agree(out["whole"]))
    model, opt, sync = fresh("average")
    _train(sync, opt, batches)
    sync.close()
    out["average"] = _flat(model)

    model, opt, sync = fresh()
    _train(sync, opt, batches[:7])  # one step after the boundary at 6: mid-interval
    buf = io.BytesIO()
    torch.save({"m": model.state_dict(), "o": opt.state_dict(), "s": sync.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    model, opt, sync = fresh()
    model.load_state_dict(state["m"])
    opt.load_state_dict(state["o"])
    sync.load_state_dict(state["s"])
    _train(sync, opt, batches[7:])
    sync.close()
    out["resumed"] = _flat(model)

    refused = {}
    named = fresh("nesterov")[2]
    for what, load_into, saved in (
        ("a name's state", fresh()[2], named.state_dict()),
        ("into a name", named, state["s"]),
        ("a bad moment", fresh()[2], _bad_moment(state["s"])),
    ):
        try:
            load_into.load_state_dict(saved)
        except autok.OptionError as exc:
            refused[what] = str(exc)
    out["refused"] = refused
    return out


def _bad_moment(state: dict) -> dict:
    """`state` with the outer Adam's first moment of parameter 0 cut short."""
    import copy

    state = copy.deepcopy(state)
    moments = state["averager"]["outer"]["state"][0]
    moments["exp_avg"] = moments["exp_avg"].reshape(-1)[:3]
    return state


@pytest.mark.dist
def test_an_outer_adam_trains_agrees_and_resumes_bit_for_bit():
    """torch.optim.Adam as the outer optimizer (no name covers it): it steps at every scheduled
    boundary (its step count is theirs; close()'s unscheduled sync takes none), the replicas
    agree, a resume from state_dict() mid-interval ends bit for bit where the uninterrupted run
    ends (Adam's moments are in Sync's state), and a state of another outer step is refused
    naming it."""
    results = run_dist(_adam_worker, 2)
    for out in results:
        assert all(out["agree"]), out["agree"]
        assert {int(s["step"]) for s in out["steps"].values()} == {3}
        assert not torch.equal(out["whole"], out["average"])  # Adam's step is no plain average
        assert torch.equal(out["whole"], out["resumed"])
        refused = out["refused"]
        assert refused["a name's state"].startswith(
            "load_state_dict: saved with outer_optimizer 'nesterov'; this Sync has "
            "'torch.optim.adam.Adam'"
        ), refused
        assert refused["into a name"].startswith(
            "load_state_dict: saved with outer_optimizer 'torch.optim.adam.Adam'"
        ), refused
        assert refused["a bad moment"].startswith(
            "load_state_dict: averager.outer: state[0]['exp_avg'] is not of parameter 0's shape"
        ), refused
    assert torch.equal(results[0]["whole"], results[1]["whole"])


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_a_torch_outer_steps_on_the_pseudo_gradient_as_the_names_do(scale):
    """TorchOuter's `.grad` is Δ = θ_ref − θ_avg, from scale·delta = θ_avg − θ_ref as the
    averager hands it: torch.optim.SGD(lr=α, momentum=μ) is the `sgd` name bit for bit over
    boundaries, and SGD(lr=1) lands on θ_avg (to rounding: θ_ref − Δ is computed)."""
    from autok.trainer.engine.outer import TorchOuter

    theta0, moves = _averages(6)
    shapes = [torch.Size([200]), torch.Size([19, 3])]  # 257, as the model's shapes
    for lr, momentum in ((0.7, 0.9), (1.0, 0.0)):
        outer = TorchOuter(
            lambda p, lr=lr, m=momentum: torch.optim.SGD(p, lr=lr, momentum=m),
            theta0.clone(),
            shapes,
        )
        spec = OuterOptimizer("sgd", lr, momentum)
        ref = theta0.clone()
        vel = torch.zeros_like(ref) if spec.needs_velocity else None
        for move in moves:
            avg = ref + move
            if spec.is_plain_average:
                outer.step_((avg - outer.flat) / scale, scale)
                assert torch.allclose(outer.flat, avg, rtol=0, atol=1e-6)
                ref = outer.flat.clone()
                continue
            outer_step_(spec, ref, vel, avg, 0.1, delta=(avg - ref) / scale, scale=scale)
            outer.step_((avg - outer.flat) / scale, scale)
            assert torch.equal(outer.flat, ref)
        assert all(p.grad is None for p in outer.params)  # no view of the buffer kept
        assert not torch.equal(outer.flat, theta0)
