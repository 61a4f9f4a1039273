"""Streaming fragment sync (docs/design.md §2, Fragments): the split and the schedule as pure
functions, the options, and the engine on real gloo process groups (equivalences bit for bit, the
schedule in the boundary records, bytes per fragment, identical replicas at epoch ends, exact
resume)."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest
import torch

from autok.trainer.engine.exact_sums import N_SCALARS
from autok.trainer.engine.fragments import (
    FRAGMENTS_MAX,
    WHOLE,
    fragment_at,
    fragment_bounds,
    fragment_gap,
    fragment_offsets,
    walk,
)
from autok.trainer.engine.options import OptionError, sync_options
from tests.dist import run_dist

# ----- the split and the schedule ---------------------------------------------------------------


@pytest.mark.parametrize("numel, frags", [(161, 4), (10, 10), (7, 1), (1000, 3), (5, 2)])
def test_fragments_are_contiguous_near_equal_and_cover_the_vector(numel, frags):
    bounds = fragment_bounds(numel, frags)
    assert len(bounds) == frags and bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # contiguous
    sizes = [b - a for a, b in bounds]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_more_fragments_than_elements_is_an_error():
    with pytest.raises(ValueError):
        fragment_bounds(3, 4)


@pytest.mark.parametrize("k, frags", [(4, 1), (8, 4), (7, 3), (5, 5), (12, 5), (9, 2), (64, 7)])
def test_the_engines_walk_is_the_schedule_formula_and_counts_each_fragment(k, frags):
    """Fragment j syncs at the steps p where p − ⌊j·K/F⌋ is a multiple of K; over N steps that
    is ⌊(N − o_j)/K⌋ + 1 times for j ≥ 1 (once N ≥ o_j) and ⌊N/K⌋ times for fragment 0."""
    steps = 5 * k + 3
    got = walk(steps, k, frags)
    if frags == 1:
        assert got == [WHOLE if p % k == 0 else None for p in range(1, steps + 1)]
        return
    assert got == [fragment_at(p, k, frags) for p in range(1, steps + 1)]
    counts = Counter(f for f in got if f is not None)
    offsets = fragment_offsets(k, frags)
    for j in range(frags):
        expected = steps // k if j == 0 else (steps - offsets[j]) // k + 1
        assert counts[j] == expected, (j, counts)
    # gaps are ⌊K/F⌋ or ⌈K/F⌉ and one round is K steps
    gaps = [fragment_gap(q, k, frags) for q in range(1, frags + 1)]
    assert sum(gaps) == k and set(gaps) <= {k // frags, -(-k // frags)}


def test_rounding_of_offsets_when_k_over_f_is_not_an_integer():
    assert fragment_offsets(7, 3) == [0, 2, 4]  # ⌊7/3⌋ = 2, ⌊14/3⌋ = 4
    assert [fragment_gap(q, 7, 3) for q in (1, 2, 3)] == [2, 2, 3]
    assert walk(7, 7, 3) == [None, 1, None, 2, None, None, 0]


def test_a_new_k_applies_from_the_next_gap_and_each_fragment_still_syncs_once_per_round():
    # K = 8 for 6 steps (fragments 1, 2, 3 at steps 2, 4, 6), then K = 4: gaps of 1
    got = walk(12, [8] * 6 + [4] * 6, 4)
    assert got == [None, 1, None, 2, None, 3, 0, 1, 2, 3, 0, 1]
    # K below F: the whole model every K steps, then the round starts again from fragment 1
    got = walk(10, [2] * 4 + [4] * 6, 4)
    assert got == [None, WHOLE, None, WHOLE, 1, 2, 3, 0, 1, 2]


def test_every_built_in_model_has_more_parameters_than_fragments_max():
    """So the CLI need not build a built-in model to refuse F above its parameter count."""
    from autok.trainer.loop.models import build_model

    smallest = [("cnn1d", (1, 40)), ("mlp", (1, 40)), ("cnn", (1, 8, 8)), ("mlp", (3, 8, 8))]
    for name, shape in smallest:
        numel = sum(p.numel() for p in build_model(name, shape, 2).parameters())
        assert numel > FRAGMENTS_MAX, (name, numel)


# ----- options ----------------------------------------------------------------------------------


def test_fragment_options_and_their_defaults():
    o = sync_options(strategy="localsgd", fragments=4, sync_period=8, fragment_delay=2)
    assert (o.fragments, o.fragment_delay, o.delay) == (4, 2, 2)
    assert sync_options().delay == 0 and sync_options(overlap_boundary=True).delay == 1
    # τ = K/F is allowed: the average lands just before the next fragment's sync starts
    assert sync_options(strategy="localsgd", fragments=2, sync_period=4, fragment_delay=2)
    # a saved config validates again unchanged (a resume)
    dumped = o.model_dump()
    assert sync_options(**dumped).model_dump() == dumped


@pytest.mark.parametrize(
    "options, flag_name",
    [
        ({"fragments": 0}, "--fragments"),
        ({"fragments": FRAGMENTS_MAX + 1, "strategy": "localsgd"}, "--fragments"),
        ({"fragment_delay": -1}, "--fragment-delay"),
        ({"fragments": 2}, "--fragments"),  # cpdp (the default strategy)
        ({"fragments": 2, "strategy": "ddp"}, "--fragments"),
        ({"fragments": 5, "strategy": "localsgd", "sync_period": 4}, "--fragments"),
        (
            {"fragments": 2, "strategy": "localsgd", "sync_optimizer_state": True},
            "--sync-optimizer-state",
        ),
        ({"fragments": 2, "strategy": "localsgd", "fragment_delay": 3}, "--fragment-delay"),
        ({"strategy": "localsgd", "fragment_delay": 5}, "--fragment-delay"),
        ({"fragment_delay": 1, "overlap_boundary": True}, "--overlap-boundary"),
        ({"fragment_delay": 1, "strategy": "ddp"}, "--fragment-delay"),
        ({"fragment_delay": 1, "boundary": "fused"}, "--fragment-delay"),
    ],
)
def test_bad_fragment_settings_are_refused_in_one_line_naming_the_flag(options, flag_name):
    with pytest.raises(OptionError) as info:
        sync_options(**options)
    msg = str(info.value)
    assert msg.startswith(flag_name) and "\n" not in msg, msg


# ----- through the engine -----------------------------------------------------------------------


class Records:
    """What the boundaries record: fragment, bytes, interval steps (every rank's own copy)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_boundary(self, stats, decision) -> None:
        self.rows.append(stats.as_dict() | {"next": decision.next_sync_period})


def _epochs(sync, opt, batches, steps_per_epoch):
    """A user's loop with epochs: the last step of each is a forced boundary, then sync_now()
    (as the built-in loop does). Returns the parameters at each epoch end."""
    from tests.test_api import _flat

    ends = []
    for start in range(0, len(batches), steps_per_epoch):
        chunk = batches[start : start + steps_per_epoch]
        for i, (x, y) in enumerate(chunk):
            with sync.step(boundary=i == len(chunk) - 1) as s:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(sync.model(x), y)
                loss.backward()
                opt.step()
                s.loss = loss
        sync.sync_now()
        ends.append(_flat(sync.module).clone())
    return ends


def _equivalence_worker(rank, world):
    """F = 1, τ = 0 against a hand-written LocalSGD (exact mean every K steps), and
    --overlap-boundary against F = 1, τ = 1, records included."""
    import torch.distributed as dist

    import autok
    from tests.test_api import _batches, _flat, _model, _train

    out = {}
    batches = _batches(rank, 14)
    # by hand: local SGD steps, every K = 4 steps θ ← mean_i θ_i (one all_reduce, / N)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if (i + 1) % 4 == 0:
            with torch.no_grad():
                for p in model.parameters():
                    dist.all_reduce(p)  # test-only collective
                    p.div_(world)
    out["hand"] = _flat(model)
    for name, options in {
        "today": {},
        "f1t0": {"fragments": 1, "fragment_delay": 0},
        "overlap": {"overlap_boundary": True},
        "f1t1": {"fragments": 1, "fragment_delay": 1},
    }.items():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        rec = Records()
        sync = autok.Sync(
            model,
            opt,
            strategy="localsgd",
            sync_period=4,
            link="none",
            observers=[rec],
            **options,
        )
        _train(sync, opt, batches)
        out[name] = (_flat(model), list(rec.rows))  # before close() adds a boundary
        sync.close()
    return out


_TIMES = ("compute_seconds", "exposed_sync_seconds")


def _same_records(a: list[dict], b: list[dict]) -> bool:
    strip = [{k: v for k, v in r.items() if k not in _TIMES} for r in (*a, *b)]
    return strip[: len(a)] == strip[len(a) :]


@pytest.mark.dist
def test_f1_tau0_is_todays_boundary_and_overlap_is_f1_tau1_bit_for_bit():
    for res in run_dist(_equivalence_worker, 2):
        # 14 steps, K = 4: boundaries at 4, 8, 12 (the hand loop has none at 14 either)
        assert torch.equal(res["today"][0], res["hand"])
        assert torch.equal(res["f1t0"][0], res["hand"])
        assert _same_records(res["today"][1], res["f1t0"][1])
        assert all(r["fragment"] == WHOLE for r in res["today"][1])
        # the one delayed path: --overlap-boundary is --fragments 1 --fragment-delay 1
        assert torch.equal(res["overlap"][0], res["f1t1"][0])
        assert _same_records(res["overlap"][1], res["f1t1"][1])
        assert len(res["f1t1"][1]) == 3
        assert not torch.equal(res["overlap"][0], res["today"][0])  # the delay acts


def _stream_worker(rank, world, out_dir):
    """F = 4, τ = 2, K = 8 over 2 epochs of 20 steps on the emulated LAN: the schedule, bytes,
    the link's bookings and identical replicas at every epoch end."""
    import autok
    from tests.test_api import _agree, _batches, _model

    model = _model()  # 161 parameters: fragments of 40, 40, 40, 41
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rec = Records()
    sync = autok.Sync(
        model,
        opt,
        strategy="localsgd",
        sync_period=8,
        fragments=4,
        fragment_delay=2,
        outer_optimizer="nesterov",  # per-fragment outer step on its slice of θ_ref and v
        link="lan",
        observers=[rec],
        out_dir=out_dir if rank == 0 else None,
    )
    booked = []
    reserve = sync.clock.reserve

    def watched(nbytes, allgather=False):
        booked.append(nbytes)
        return reserve(nbytes, allgather)

    sync.clock.reserve = watched
    ends = _epochs(sync, opt, _batches(rank, 40), 20)
    agree = [_agree(t) for t in ends]
    sync.close()
    return {"rows": rec.rows, "agree": agree, "booked": booked, "digest": sync.averager.ref}


@pytest.mark.dist
def test_fragments_stream_the_model_in_turn_with_bytes_per_fragment_and_identical_epoch_ends(
    tmp_path,
):
    results = run_dist(_stream_worker, 2, str(tmp_path))
    for res in results:
        assert res["agree"] == [True, True]  # every epoch ends with identical replicas
        rows = res["rows"]
        frags = [r["fragment"] for r in rows]
        # per epoch: the walk over its first 19 steps, then the forced whole-model boundary
        epoch = [f for f in walk(19, 8, 4) if f is not None] + [WHOLE]
        assert frags == epoch * 2, frags
        per_epoch = Counter(epoch)
        assert per_epoch == {1: 3, 2: 2, 3: 2, 0: 2, WHOLE: 1}  # steps 2,10,18 / 4,12 / ...
        # bytes: a fragment sync moves its slice (+ the 10 float32 statistics), the whole model
        # at the epoch end moves all 161 parameters; F fragment syncs = one whole sync
        size = dict(enumerate([40, 40, 40, 41])) | {WHOLE: 161}
        for r in rows:
            assert r["bytes_communicated"] == 4 * (size[r["fragment"]] + N_SCALARS), r
        whole = 4 * (161 + N_SCALARS)
        assert sum(4 * (size[j] + N_SCALARS) for j in range(4)) == whole + 3 * 4 * N_SCALARS
        frag_bytes = [r["bytes_communicated"] for r in rows if r["fragment"] != WHOLE]
        assert max(frag_bytes) <= whole / 4 + 4 * N_SCALARS
        # the link emulator books exactly what each averaging sends (no gradient buckets here)
        assert res["booked"] == [r["bytes_communicated"] for r in rows]
        # each fragment record's interval is its gap (2 steps); K stays 8
        assert all(r["interval_steps"] == 2 for r in rows if r["fragment"] != WHOLE)
        assert {r["sync_period"] for r in rows} == {8}
    assert torch.equal(results[0]["digest"], results[1]["digest"])
    logged = [json.loads(line) for line in (tmp_path / "boundaries.jsonl").open()]
    assert [r["fragment"] for r in logged] == [r["fragment"] for r in results[0]["rows"]]


def _resume_worker(rank, world, cases):
    """Stop mid-epoch (mid-round: some fragments synced, others not; a delayed average in
    flight or not), save with weights_only, load into fresh objects, continue: the run must
    equal the uninterrupted one at both epoch ends."""
    import autok
    from tests.test_api import _batches, _flat, _model

    batches = _batches(rank, 30)

    def fresh(options):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, opt, autok.Sync(model, opt, link="none", **options)

    def steps(sync, opt, chunk, last_ends_epoch):
        for i, (x, y) in enumerate(chunk):
            with sync.step(boundary=last_ends_epoch and i == len(chunk) - 1) as s:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(sync.model(x), y)
                loss.backward()
                opt.step()
                s.loss = loss

    out = {}
    for name, (options, stop) in cases.items():
        model, opt, sync = fresh(options)
        whole = _epochs(sync, opt, batches, 15)
        sync.close()
        model, opt, sync = fresh(options)
        first = _epochs(sync, opt, batches[:15], 15)  # epoch 0 whole
        steps(sync, opt, batches[15 : 15 + stop], False)  # part of epoch 1
        in_flight = sync._pending is not None
        buf = io.BytesIO()
        torch.save({"m": model.state_dict(), "o": opt.state_dict(), "s": sync.state_dict()}, buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=True)
        model, opt, sync = fresh(options)
        model.load_state_dict(state["m"])
        opt.load_state_dict(state["o"])
        sync.load_state_dict(state["s"])
        steps(sync, opt, batches[15 + stop :], True)
        sync.sync_now()
        out[name] = (whole, [*first, _flat(model)], in_flight)
        sync.close()
    return out


RESUME_CASES = {
    # K = 8, F = 4, τ = 1: syncs at 2, 4, 6 (applied at 3, 5, 7); stopped after 7 steps,
    # before fragment 0's sync, nothing in flight; DiLoCo's outer step and int8 error feedback
    # per fragment
    "F4-tau1-nesterov-int8-between": (
        {
            "strategy": "localsgd",
            "sync_period": 8,
            "fragments": 4,
            "fragment_delay": 1,
            "outer_optimizer": "nesterov",
            "compress": "int8",
        },
        7,
    ),
    # ...stopped after 6: fragment 3's compressed average is in flight (saved, decoded)
    "F4-tau1-nesterov-int8-in-flight": (
        {
            "strategy": "localsgd",
            "sync_period": 8,
            "fragments": 4,
            "fragment_delay": 1,
            "outer_optimizer": "nesterov",
            "compress": "int8",
        },
        6,
    ),
    # K/F not an integer (gaps 2, 2, 3); τ = 2 = ⌊7/3⌋; stopped after 5 steps, fragment 2's
    # average launched at 4 and one step old
    "F3-tau2-K7-in-flight": (
        {"strategy": "localsgd", "sync_period": 7, "fragments": 3, "fragment_delay": 2},
        5,
    ),
    # the lerp merge, strided fragments: stopped after 5 steps, fragment 2's average launched
    # at 4 and one step old; it lands after the resume as lerp (the saved state says so)
    "F4-tau2-lerp-strided-in-flight": (
        {
            "strategy": "localsgd",
            "sync_period": 8,
            "fragments": 4,
            "fragment_delay": 2,
            "fragment_merge": "lerp",
            "fragment_alpha": 0.5,
            "fragment_by": "strided",
            "outer_optimizer": "nesterov",
        },
        5,
    ),
    # --overlap-boundary, stopped right after a boundary launched its average (age 0)
    "overlap-in-flight": ({"strategy": "localsgd", "sync_period": 4, "overlap_boundary": True}, 4),
}


@pytest.mark.dist
@pytest.mark.parametrize("names", [list(RESUME_CASES)[:2], list(RESUME_CASES)[2:]])
def test_resume_mid_epoch_with_fragments_and_delay_is_bit_for_bit(names):
    cases = {name: RESUME_CASES[name] for name in names}
    for res in run_dist(_resume_worker, 2, cases):
        for name, (whole, resumed, in_flight) in res.items():
            assert in_flight == name.endswith("in-flight"), name
            assert len(whole) == len(resumed) == 2
            for a, b in zip(whole, resumed, strict=True):
                assert torch.equal(a, b), name


def _loop_worker(rank, world):
    """The built-in loop: warmup syncs the whole model (K = 1 < F), then fragments in turn with
    the K capped at the epoch's steps; every epoch ends with a whole-model boundary."""
    from autok.trainer.loop.run import Trainer
    from tests.helpers import tiny_cfg

    cfg = tiny_cfg(
        strategy="localsgd",
        sync_period=8,
        fragments=4,
        fragment_delay=2,
        epochs=3,
        warmup_epochs=1,
        workers=world,
    )
    rec = Records()
    tr = Trainer(cfg, rank, world, None, observers=[rec])
    summary = tr.run()
    return rec.rows, summary, tr.steps_per_epoch


@pytest.mark.dist
def test_the_built_in_loop_streams_fragments_after_warmup_and_ends_epochs_whole():
    rows, summary, steps = run_dist(_loop_worker, 2)[0]
    k = min(8, steps)  # capped at the steps of an epoch
    for epoch in range(3):
        got = [r["fragment"] for r in rows if r["epoch"] == epoch]
        if epoch == 0:  # warmup: K = 1, below F
            assert got == [WHOLE] * steps
        else:
            assert got == [f for f in walk(steps - 1, k, 4) if f is not None] + [WHOLE], got
    assert len(set(summary["param_digest_per_rank"])) == 1


# ----- what a fragment is (--fragment-by) and how a delayed average lands (--fragment-merge) ----


def test_module_fragments_cut_only_between_tensors_near_equal_by_bytes():
    from autok.trainer.engine.fragments import fragment_plan

    numels = [10, 3, 3, 10, 1]  # ends 10, 13, 16, 26, 27 elements
    order, bounds = fragment_plan(numels, [4] * 5, 2, "module")
    assert order == [0, 1, 2, 3, 4] and bounds == [(0, 13), (13, 27)]  # 13 nearest 13.5
    # every cut falls on a tensor's end, and F = T gives one tensor each
    _, bounds = fragment_plan(numels, [4] * 5, 5, "module")
    assert bounds == [(0, 10), (10, 13), (13, 16), (16, 26), (26, 27)]
    # by bytes, not elements: a float64 tensor weighs twice its count
    _, bounds = fragment_plan([4, 4, 4], [8, 4, 4], 2, "module")
    assert bounds == [(0, 4), (4, 12)]
    # a fragment is never empty, however lopsided the sizes
    _, bounds = fragment_plan([1, 1, 1, 100], [4] * 4, 3, "module")
    assert bounds == [(0, 2), (2, 3), (3, 103)]
    with pytest.raises(ValueError):
        fragment_plan(numels, [4] * 5, 6, "module")


def test_strided_fragments_take_every_fth_tensor_laid_out_fragment_by_fragment():
    from autok.trainer.engine.fragments import fragment_plan

    order, bounds = fragment_plan([10, 3, 3, 10, 1], [4] * 5, 2, "strided")
    assert order == [0, 2, 4, 1, 3]  # fragment 0: tensors 0, 2, 4; fragment 1: 1, 3
    assert bounds == [(0, 14), (14, 27)]
    order, bounds = fragment_plan([5] * 7, [4] * 7, 3, "strided")
    assert order == [0, 3, 6, 1, 4, 2, 5] and bounds == [(0, 15), (15, 25), (25, 35)]
    # element is the contiguous near-equal split, in model order
    order, bounds = fragment_plan([10, 3, 3, 10, 1], [4] * 5, 3, "element")
    assert order == [0, 1, 2, 3, 4] and bounds == fragment_bounds(27, 3)


def test_merge_and_fragment_by_options_and_their_defaults():
    o = sync_options(strategy="localsgd", fragments=4, sync_period=8, fragment_delay=2)
    assert (o.fragment_merge, o.fragment_alpha, o.fragment_by) == ("keep", 0.0, "element")
    o = sync_options(
        strategy="localsgd",
        fragments=4,
        sync_period=8,
        fragment_delay=2,
        fragment_merge="lerp",
        fragment_alpha=0.5,
        fragment_by="strided",
    )
    dumped = o.model_dump()  # a saved config validates again unchanged (a resume)
    assert sync_options(**dumped).model_dump() == dumped
    # lerp on --overlap-boundary's delay (F = 1, τ = 1), with torchft's default α = 0
    assert sync_options(strategy="localsgd", overlap_boundary=True, fragment_merge="lerp")


@pytest.mark.parametrize(
    "options, start",
    [
        ({"strategy": "localsgd", "fragment_merge": "lerp"}, "--fragment-merge: lerp mixes"),
        (
            {"strategy": "localsgd", "fragments": 2, "fragment_merge": "lerp"},
            "--fragment-merge: lerp mixes",
        ),
        (
            {"strategy": "localsgd", "fragment_delay": 1, "fragment_alpha": 0.5},
            "--fragment-alpha: --fragment-merge keep does not read it",
        ),
        (
            {
                "strategy": "localsgd",
                "overlap_boundary": True,
                "fragment_merge": "lerp",
                "fragment_alpha": 1.5,
            },
            "--fragment-alpha",
        ),
        ({"strategy": "localsgd", "fragment_merge": "mix"}, "--fragment-merge"),
        ({"strategy": "localsgd", "fragment_by": "module"}, "--fragment-by: module cuts"),
        ({"strategy": "localsgd", "fragments": 2, "fragment_by": "layer"}, "--fragment-by"),
    ],
)
def test_bad_merge_and_fragment_by_settings_are_refused_in_one_line(options, start):
    with pytest.raises(OptionError) as info:
        sync_options(**options)
    msg = str(info.value)
    assert msg.startswith(start) and "\n" not in msg, msg
    assert "not an option" not in msg  # (the flag exists)


def test_a_pending_average_saved_with_another_merge_is_refused_before_it_lands():
    from autok.trainer.engine.averaging import ParameterAverager
    from autok.trainer.engine.pending import pending_refusal

    params = [torch.zeros(3), torch.zeros(2)]
    lerp = ParameterAverager(params, rank=0, world_size=2, fragments=2, merge_alpha=0.5)
    saved = {  # a state that passes every check before the merge's
        "reduced": None,
        "snapshot": None,
        "n_grads": 0,
        "n_avg": 0,
        "n_bc": 0,
        "lr": 0.1,
        "overlap": True,
        "fragment": 0,
        "nbytes": 0,
        "compressed": False,
    }
    why = pending_refusal(lerp, saved)  # saved before the merge existed: keep
    assert why is not None and why.startswith("merge: saved in flight with --fragment-merge keep")
    keep = ParameterAverager(params, rank=0, world_size=2, fragments=2)
    why = pending_refusal(keep, saved | {"merge_alpha": 0.25})
    assert why is not None and "lerp with α = 0.25" in why and "with keep" in why
    assert not (pending_refusal(lerp, saved | {"merge_alpha": 0.5}) or "").startswith("merge")


def _merge_worker(rank, world, alpha):
    """K = 4, F = 2, τ = 1 with DiLoCo's outer step: at each step where a delayed average lands
    (a record appears), compare the landed fragment with θ_local just before it landed and
    θ_global (θ_ref after it, the outer step's result)."""
    import autok
    from tests.test_api import _agree, _batches, _flat, _model

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rec = Records()
    merge = {} if alpha is None else {"fragment_merge": "lerp", "fragment_alpha": alpha}
    sync = autok.Sync(
        model,
        opt,
        strategy="localsgd",
        sync_period=4,
        fragments=2,
        fragment_delay=1,
        outer_optimizer="nesterov",
        link="none",
        observers=[rec],
        **merge,
    )
    landed = []
    for x, y in _batches(rank, 12):
        before = len(rec.rows)
        with sync.step() as s:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(sync.model(x), y)
            loss.backward()
            opt.step()
            s.loss = loss
            local = _flat(model).clone()  # θ_local: the step taken, the average not yet landed
        if len(rec.rows) > before:
            a, b = sync.averager.bounds[rec.rows[-1]["fragment"]]
            now, ref = _flat(model)[a:b], sync.averager.ref[a:b].clone()
            landed.append((local[a:b], ref, now.clone(), _agree(now), not torch.equal(ref, now)))
    sync.close()
    return landed


@pytest.mark.dist
def test_lerp_merge_lands_as_torchfts_mix_of_global_and_local_and_keep_is_unchanged():
    for alpha in (0.0, 0.5):
        for landed in run_dist(_merge_worker, 2, alpha):
            assert len(landed) == 5  # syncs at steps 2, 4, 6, 8, 10 land at 3, 5, 7, 9, 11
            for local, ref, now, agree, _ in landed:
                # (1 − α)·θ_global + α·θ_local, as θ_global.lerp_(θ_local, α)
                assert torch.equal(now, torch.lerp(ref, local, alpha))
                if alpha == 0.0:  # the local steps are discarded: θ_global on every rank
                    assert torch.equal(now, ref) and agree
                else:
                    assert not agree
    for landed in run_dist(_merge_worker, 2, None):  # keep: the local steps stay on top
        assert len(landed) == 5
        assert all(differs and not agree for _, _, _, agree, differs in landed)


def _by_worker(rank, world, by):
    """τ = 0, K = 4, F = 2: right after fragment 1's sync at step 2, exactly its tensors agree
    across the ranks; the bytes of each record are its fragment's."""
    import autok
    from tests.test_api import _agree, _batches, _model

    model = _model()  # tensors of 128, 16, 16, 1 elements
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rec = Records()
    sync = autok.Sync(
        model,
        opt,
        strategy="localsgd",
        sync_period=4,
        fragments=2,
        fragment_by=by,
        link="none",
        observers=[rec],
    )
    for x, y in _batches(rank, 2):
        with sync.step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(sync.model(x), y).backward()
            opt.step()
    agree = [_agree(p.detach()) for p in model.parameters()]
    sync.close()
    return agree, [(r["fragment"], r["bytes_communicated"]) for r in rec.rows]


@pytest.mark.dist
def test_module_and_strided_fragments_move_whole_tensors_through_the_engine():
    (agree, rows), _ = run_dist(_by_worker, 2, "strided")
    assert agree == [False, True, False, True]  # fragment 1: tensors 1 and 3
    assert rows[0] == (1, 4 * (16 + 1 + N_SCALARS))
    (agree, rows), _ = run_dist(_by_worker, 2, "module")
    # module: 161 elements cut nearest 80.5 at a tensor end: [128 | 16, 16, 1]
    assert agree == [False, True, True, True]
    assert rows[0] == (1, 4 * (16 + 16 + 1 + N_SCALARS))
    (agree, rows), _ = run_dist(_by_worker, 2, "element")  # today's: a cut inside tensor 0
    assert agree == [False, True, True, True] and rows[0] == (1, 4 * (81 + N_SCALARS))


def test_module_fragments_above_the_tensor_count_are_refused_naming_the_flag():
    from autok.trainer.engine.build import check_fragments
    from tests.test_api import _model

    opts = sync_options(strategy="localsgd", sync_period=8, fragments=5, fragment_by="module")
    with pytest.raises(OptionError) as info:
        check_fragments(opts, _model())  # 4 tensors
    assert str(info.value).startswith("--fragments: 5 fragments by module of a model with 4 ")
    check_fragments(opts.model_copy(update={"fragment_by": "element"}), _model())


def _fragment_by_resume_worker(rank: int, world_size: int) -> list[str]:
    import autok
    from tests.test_api import _model

    def build(by: str) -> autok.Sync:
        torch.manual_seed(0)
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return autok.Sync(
            model, opt, strategy="localsgd", sync_period=4, fragments=2, fragment_by=by,
            link="none",
        )  # fmt: skip

    said = []
    strided, element = build("strided"), build("element")
    old = element.state_dict()
    del old["kind"]["fragment_by"]  # as saved before the layout was recorded: element order
    for state, into in ((strided.state_dict(), element), (old, strided)):
        with pytest.raises(OptionError) as info:
            into.load_state_dict(state)
        said.append(str(info.value))
    element.load_state_dict(old)  # an old state loads where its layout is the engine's
    strided.close()
    element.close()
    return said


@pytest.mark.dist
def test_a_state_laid_out_by_another_fragment_by_is_refused_not_loaded_scrambled():
    """strided lays θ_ref, the velocity and the residuals out fragment by fragment: a state of
    one layout loaded into the other would measure Δ against a permuted θ_ref."""
    (said,) = run_dist(_fragment_by_resume_worker, 1)
    assert "saved with fragment_by 'strided'; this Sync has 'element'" in said[0]
    assert "saved with fragment_by 'element'; this Sync has 'strided'" in said[1]
