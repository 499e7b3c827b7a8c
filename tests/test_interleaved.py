"""Interleaved 1F1B plans (``virtual_stages``): the plan contract, the estimate's time and
memory against independent computations, and the rank layout."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import espresso as es
from espresso import _core
from espresso.errors import PlanError
from espresso.runner.launch import rank_layout

MODEL = es.ModelSpec(name="m", num_layers=24, hidden_size=2048, num_heads=16, vocab_size=32000)
JOB = es.Job(model=MODEL, seq_len=2048, global_batch_size=32, iterations=100, deadline_hours=100)
CAT = es.Catalog.builtin("gpus")


def plan(pp: int, v: int, m: int = 16, gpu: str = "A100-80GB", tp: int = 1,
         **kw: object) -> es.Plan:
    n = MODEL.num_layers // (pp * v)
    stages = tuple(es.Stage(gpu=gpu, tp=tp, layers=(i * n, (i + 1) * n)) for i in range(pp * v))
    return es.Plan(job=JOB, stages=stages, num_microbatches=m, dp=JOB.global_batch_size // m,
                   virtual_stages=v, **kw)  # type: ignore[arg-type]


def test_plan_contract_round_trips_and_counts_gpu_groups() -> None:
    p = plan(2, 3, tp=2)
    assert p.num_stages == 6 and p.pp == 2 and p.device_stages(1) == (1, 3, 5)
    assert p.gpus == {"A100-80GB": 2 * 2 * p.dp}  # two groups of tp 2, not six
    d = p.to_dict()
    assert d["virtual_stages"] == 3
    assert es.Plan.from_dict(d) == p
    assert "virtual_stages" not in plan(2, 1).to_dict()  # old readers see what they know
    layout = rank_layout(p)
    assert len(layout) == p.num_gpus
    assert {r.stages for r in layout} == {(0, 2, 4), (1, 3, 5)}


@pytest.mark.parametrize(("change", "match"), [
    (lambda p: replace(p, schedule="gpipe"), "needs the 1f1b schedule"),
    (lambda p: replace(p, stages=p.stages[:5]), "multiple of 3 stages"),
    (lambda p: replace(p, num_microbatches=3, dp=1, job=replace(JOB, global_batch_size=3)),
     "needs a multiple of 2, got 3"),
    (lambda p: replace(p, stages=(*p.stages[:3], replace(p.stages[3], gpu="H100"),
                                  *p.stages[4:])), r"stages\[3\]: runs on the GPUs of stage 1"),
])
def test_malformed_interleaving_is_refused(change: object, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        change(plan(2, 3))  # type: ignore[operator]


@pytest.mark.parametrize("m", [4, 8, 16])
def test_dp_collectives_hide_under_the_schedule_as_megatron_overlaps_them(m: int) -> None:
    """ZeRO-1 over 8 replicas: with neither overlap the whole traffic follows the pipeline;
    overlapping the reductions and the gathers never lengthens the step, leaves the
    reductions' pipeline as it was, and hides most of the traffic; the step is always the
    pipeline, the longest tail and the optimizer step."""
    def est(grad: bool, gather: bool) -> es.Estimate:
        cost = es.CostParams(overlap_grad_reduce=grad, overlap_param_gather=gather)
        p = plan(4, 3, m=m, sharding="zero1", cost_model=cost)
        p = replace(p, dp=8, job=replace(JOB, global_batch_size=8 * m))
        return es.estimate(p, CAT)

    off, grad, both = est(False, False), est(True, False), est(True, True)
    for e in (off, grad, both):
        assert e.iteration_s == pytest.approx(e.pipeline_s + e.dp_allreduce_s
                                              + e.optimizer_step_s, rel=1e-12)
        assert e.dp_allreduce_s == max(s.dp_allreduce_s for s in e.stages)
    assert grad.pipeline_s == off.pipeline_s  # reductions never stall the pipeline
    assert both.pipeline_s >= off.pipeline_s  # gathers may
    assert off.iteration_s >= grad.iteration_s >= both.iteration_s
    assert grad.dp_allreduce_s < off.dp_allreduce_s
    assert both.dp_allreduce_s < 0.25 * off.dp_allreduce_s


def test_pipeline_time_is_the_interleaved_simulation_of_the_stage_times() -> None:
    p = plan(4, 3)
    est = es.estimate(p, CAT)
    f = [s.fwd_s for s in est.stages]
    b = [s.bwd_s for s in est.stages]
    sends = [s.send_s for s in est.stages[:-1]]
    assert est.pipeline_s == pytest.approx(
        _core.interleaved_makespan(f, b, sends, sends, 4, p.num_microbatches), rel=1e-12)
    # The wrap from the last group to the first leaves the instance; the others as laid out.
    assert not est.stages[3].send_intra_node
    # Interleaving shrinks the bubble of the same GPUs.
    plain = es.estimate(plan(4, 1), CAT)
    assert est.bubble_fraction < plain.bubble_fraction
    assert est.gpus == plain.gpus and est.hourly_usd == plain.hourly_usd


def megatron_warmup(pp: int, v: int, m: int, d: int) -> int:
    """Megatron-LM's warm-up forwards of rank d (schedules.py, interleaved)."""
    return min((pp - d - 1) * 2 + (v - 1) * pp, m * v)


@settings(max_examples=30, deadline=None)
@given(pp=st.sampled_from([2, 3, 4]), v=st.sampled_from([2, 4]), rounds=st.integers(1, 4))
def test_group_memory_holds_megatrons_warm_up_plus_one(pp: int, v: int, rounds: int) -> None:
    """Uniform chunks: a group holds (warm-up + 1) chunks' activations at its peak (one more
    forward before the first backward), its stages' model states, and one transient set."""
    m = pp * rounds
    assume(MODEL.num_layers % (pp * v) == 0 and JOB.global_batch_size % m == 0)
    p = plan(pp, v, m=m)
    est = es.estimate(p, CAT)
    # One chunk's activations per micro-batch, from a plain plan with the same chunk (a
    # middle stage: no embedding, no head).
    ref = es.estimate(plan(pp * v, 1, m=m), CAT).stages[1]
    per_chunk = ref.activations_gb / ref.in_flight
    for d in range(pp):
        e = est.stages[d]
        want = min(megatron_warmup(pp, v, m, d) + 1, m * v) * per_chunk
        assert e.activations_gb == pytest.approx(want, rel=1e-9)
        chunks = [est.stages[i] for i in p.device_stages(d)]
        assert all(c.memory_gb == e.memory_gb for c in chunks)
        weights = sum(es.estimate(plan(pp * v, 1, m=m), CAT).stages[i].weights_gb
                      for i in p.device_stages(d))
        assert e.weights_gb == pytest.approx(weights, rel=1e-9)


def test_a_group_over_memory_is_named() -> None:
    big = es.ModelSpec.preset("llama2-70b")
    job = replace(JOB, model=big, global_batch_size=64)
    n = big.num_layers // 8
    stages = tuple(es.Stage(gpu="A100-80GB", tp=8, layers=(i * n, (i + 1) * n)) for i in range(8))
    est = es.estimate(es.Plan(job=job, stages=stages, num_microbatches=64, virtual_stages=4), CAT)
    assert not est.feasible
    assert any(r.startswith("GPU group 0 (A100-80GB, tp 8, stages 0, 2, 4, 6) needs")
               for r in est.reasons)


def test_interleaved_peak_checks_its_input() -> None:
    with pytest.raises(ValueError, match="interleaved_peak"):
        _core.interleaved_peak([1.0, float("nan")], 2, 0, 4)
    with pytest.raises(ValueError, match="interleaved_peak"):
        _core.interleaved_peak([1.0], 2, 2, 4)


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(1, 30), min_size=2, max_size=6), v=st.integers(2, 5))
def test_split_layers_keeps_each_groups_blocks_in_near_equal_chunks(counts: list[int],
                                                                    v: int) -> None:
    from espresso.interleave import split_layers

    ranges = split_layers(counts, v)
    pp = len(counts)
    assert ranges[0][0] == 0 and ranges[-1][1] == sum(counts)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # model order
    for d, n in enumerate(counts):
        sizes = [ranges[s][1] - ranges[s][0] for s in range(d, pp * v, pp)]
        assert sum(sizes) == n and max(sizes) - min(sizes) <= 1


def test_interleave_keeps_the_best_chunking_that_fits_and_beats_the_plan() -> None:
    from espresso.interleave import interleave, interleaved

    base = plan(4, 1).with_estimate(CAT)
    best = interleave(base, CAT, virtual_stages=(2, 3, 6))
    # Our own enumeration of the same candidates.
    options = [(es.estimate(c, CAT).total_usd, vs) for vs in (2, 3, 6)
               if (c := interleaved(base, vs)) is not None and es.estimate(c, CAT).feasible]
    want = min(options)
    assert want[0] < base.estimate.total_usd  # interleaving pays here
    assert best.virtual_stages == want[1]
    assert best.estimate is not None and best.estimate.total_usd == pytest.approx(want[0])
    assert best.stats is not None
    assert best.stats["interleaving"]["total_usd_without"] == base.estimate.total_usd
    assert [st.gpu for st in best.stages] == ["A100-80GB"] * best.num_stages
    # Not applicable: one group, gpipe, micro-batches not a multiple of the groups, too few
    # blocks per group; and a plan interleaving cannot improve comes back unchanged.
    assert interleaved(plan(1, 1), 2) is None
    assert interleaved(replace(base, schedule="gpipe"), 2) is None
    assert interleaved(plan(3, 1, m=16), 2) is None
    assert interleaved(base, 7) is None
    assert interleave(base, CAT, virtual_stages=()) is base


def test_rank_of_gives_what_the_estimate_says() -> None:
    """interleave() ranks candidates by rank_of() (the core's figures, no Estimate built):
    the same cost, hours and deadline verdict as estimate(), and None exactly when the
    estimate says the plan is not feasible (here: 2 chunks over memory, 3 and 6 not)."""
    from espresso.estimate import rank_of
    from espresso.interleave import interleaved

    wide = es.ModelSpec(name="w", num_layers=24, hidden_size=4096, num_heads=32,
                        vocab_size=32000)
    kinds = set()
    for gpu, model, seq, deadline in [("A100-80GB", MODEL, 2048, 100.0),
                                      ("A100-80GB", MODEL, 2048, 0.01),
                                      ("A100-40GB", wide, 4096, 1e6)]:
        base = replace(plan(4, 1, gpu=gpu), job=replace(JOB, model=model, seq_len=seq,
                                                         deadline_hours=deadline))
        for cand in [base, *(interleaved(base, v) for v in (2, 3, 6))]:
            assert cand is not None
            est, got = es.estimate(cand, CAT), rank_of(cand, CAT)
            kinds.add((est.feasible, est.meets_deadline))
            if not est.feasible:
                assert got is None
                continue
            assert got is not None
            assert (got.total_usd, got.total_hours, got.meets_deadline) == (
                est.total_usd, est.total_hours, est.meets_deadline)
    assert {(True, True), (True, False)} <= kinds and any(not f for f, _ in kinds)


def test_search_interleaves_its_plans_unless_told_not_to(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The search hands every plan it returns to interleave() with its chunk options (the
    proof covers the plans before it), and with virtual_stages=() it does not."""
    import importlib

    search_mod = importlib.import_module("espresso.search")

    seen = []

    def spy(p: es.Plan, catalog: object, **kw: object) -> es.Plan:
        seen.append(kw["virtual_stages"])
        return p

    monkeypatch.setattr(search_mod, "interleave", spy)
    small = es.Job(model=es.ModelSpec.preset("gpt3-1.3b"), seq_len=1024, global_batch_size=8,
                   iterations=10, deadline_hours=10)
    es.search(small, CAT, time_limit_s=20, interleave_after=(2, 4))
    assert seen == [(2, 4)]
    es.search(small, CAT, time_limit_s=20, interleave_after=())
    assert seen == [(2, 4)]
    with pytest.raises(es.SpecError, match="interleave_after"):
        es.search(small, CAT, interleave_after=(1,))
    with pytest.raises(es.SpecError, match="virtual_stages"):
        es.search(small, CAT, virtual_stages=())
    with pytest.raises(es.SpecError, match="virtual_stages"):
        es.search(small, CAT, virtual_stages=(0, 2))


def interleavable_instance(seed: int, max_stages: int) -> tuple[es.Job, es.Catalog]:
    """1-3 GPU types on fast links, 4-12 sequences per step (so several micro-batches per
    stage), memory from tight to ample and a deadline near the fastest plan: instances where
    interleaving often wins (about one in six here)."""
    import random

    from test_search import BASE, SMALL

    rng = random.Random(seed)
    batch = rng.choice([4, 8, 12])
    model = es.ModelSpec(name=f"i{seed}", num_layers=rng.randint(6, 12), hidden_size=256,
                         num_heads=8, ffn_hidden_size=1024, vocab_size=1000,
                         gated_mlp=rng.random() < 0.5)
    gpus = []
    for n in rng.sample(BASE.names, rng.randint(1, 3)):
        g = BASE[n].to_dict()
        g.update(count=rng.randint(1, 4), memory_gb=round(rng.uniform(0.05, 0.3), 3),
                 memory_bytes=None, gpus_per_node=rng.choice([1, 2, 4]),
                 inter_node_gbs=rng.choice([50.0, 400.0]), bf16=True)
        gpus.append(es.GpuType(**g))
    catalog = es.Catalog(gpus=tuple(gpus))
    job = es.Job(model=model, seq_len=256, global_batch_size=batch, iterations=1000,
                 deadline_hours=1e6)
    fastest = es.search(job, catalog, objective="time", max_stages=max_stages,
                        **{**SMALL, "virtual_stages": (1, 2, 3)})  # type: ignore[arg-type]
    if fastest.plans:
        hours = fastest.plans[0].estimate.total_hours  # type: ignore[union-attr]
        job = replace(job, deadline_hours=hours * rng.choice([1 + 1e-9, 1.05, 1.2, 2.0, 100.0]))
    return job, catalog


@pytest.mark.parametrize(("seed", "max_stages"),
                         [(s, 3) for s in range(48)] + [(200 + s, 4) for s in range(6)])
def test_search_with_interleaving_equals_brute_force(seed: int, max_stages: int) -> None:
    """virtual_stages=(1, 2, 3): the search proves the cheapest plan over plain and
    interleaved pipelines (its bounds without 1F1B's fill and round-trip terms, the placer's
    groups timed and sized chunk by chunk), as a brute force over every order, split and
    chunking finds it. Interleaved plans are the optimum in 8 of these instances."""
    from _bruteforce import brute_force
    from test_search import COST, SMALL

    job, catalog = interleavable_instance(seed, max_stages)
    expected, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2),
                                    max_stages=max_stages, max_tp=2, cost_model=COST,
                                    virtual_stages=(1, 2, 3))
    r = es.search(job, catalog, max_stages=max_stages,
                  **{**SMALL, "virtual_stages": (1, 2, 3)})  # type: ignore[arg-type]
    assert r.stats.complete
    got = r.plans[0].estimate.total_usd if r.plans else math.inf  # type: ignore[union-attr]
    if math.isinf(expected):
        assert math.isinf(got)
        return
    assert got == pytest.approx(expected, rel=1e-9), plan
    best = r.plans[0]
    assert best.estimate == es.estimate(best, catalog)  # the plan as found is as estimated


@pytest.mark.parametrize("seed", range(12))
def test_fastest_plan_with_interleaving_equals_brute_force(seed: int) -> None:
    from _bruteforce import brute_force
    from test_search import COST, SMALL

    job, catalog = interleavable_instance(300 + seed, 3)
    fastest, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=3,
                                   max_tp=2, cost_model=COST, objective="time",
                                   virtual_stages=(1, 2, 3))
    r = es.search(job, catalog, objective="time", max_stages=3,
                  **{**SMALL, "virtual_stages": (1, 2, 3)})  # type: ignore[arg-type]
    assert r.stats.complete
    if math.isinf(fastest):
        assert not r.plans
        return
    assert r.plans[0].estimate.total_hours == pytest.approx(fastest, rel=1e-9), plan  # type: ignore[union-attr]


def test_place_interleaved_matches_every_split_of_the_groups() -> None:
    """espresso.place(..., virtual_stages=2): the fastest order and split of two groups
    interleaved, against every split tried by hand."""
    from espresso.interleave import split_layers

    job = replace(JOB, global_batch_size=16)
    p = es.place(job, [("A100-80GB", 1), ("H100-SXM", 1)], virtual_stages=2, micro_batch_size=1,
                 dp=1, catalog=CAT)
    assert p.virtual_stages == 2 and p.num_stages == 4
    ests = [es.estimate(es.Plan(job=job, num_microbatches=16, virtual_stages=2, stages=tuple(
        es.Stage(gpu=order[s % 2], layers=r)
        for s, r in enumerate(split_layers([n, MODEL.num_layers - n], 2)))), CAT)
        for order in (("A100-80GB", "H100-SXM"), ("H100-SXM", "A100-80GB"))
        for n in range(2, MODEL.num_layers - 1)]
    best = min(e.iteration_s for e in ests if e.feasible)
    assert p.estimate is not None and p.estimate.iteration_s == pytest.approx(best, rel=1e-12)
    with pytest.raises(es.SpecError, match="virtual_stages 2 needs"):
        es.place(job, [("A100-80GB", 1)], virtual_stages=2, catalog=CAT)


def test_a_deadline_only_interleaving_meets_is_pointed_out() -> None:
    """When no plain pipeline meets the deadline but the fastest one interleaved afterwards
    does, the error says so and how to search for the cheapest such plan."""
    from test_search import SMALL

    for seed in range(400, 460):
        job, catalog = interleavable_instance(seed, 3)
        kw = {**SMALL, "interleave_after": (2, 3)}
        plain = es.search(job, catalog, objective="time", max_stages=3,
                          **{**kw, "interleave_after": ()})  # type: ignore[arg-type]
        fast = es.search(job, catalog, objective="time", max_stages=3, **kw)  # type: ignore[arg-type]
        if not plain.plans or fast.plans[0].virtual_stages == 1:
            continue
        hours = [p.estimate.total_hours for p in (plain.plans[0], fast.plans[0])]  # type: ignore[union-attr]
        tight = replace(job, deadline_hours=(hours[0] + hours[1]) / 2)
        with pytest.raises(es.InfeasibleError) as info:
            es.plan(tight, catalog, max_stages=3, **kw)  # type: ignore[arg-type]
        v = fast.plans[0].virtual_stages
        assert "no plan without interleaving meets the deadline" in str(info.value)
        assert f"--virtual-stages 1,{v}" in str(info.value)
        # ... and that search finds a plan that meets it.
        found = es.plan(tight, catalog, max_stages=3, **{**kw, "virtual_stages": (1, v)})  # type: ignore[arg-type]
        assert found.estimate is not None and found.estimate.meets_deadline
        return
    pytest.fail("no instance where only interleaving meets the deadline")


def test_hosts_hold_each_gpu_group_once() -> None:
    """An interleaved plan needs its GPU groups' GPUs, not one set per stage: two A100 hosts
    of 4 hold pp 2 x tp 2 x dp 2 with three stages per group, and the ranks cover the world."""
    from espresso.runner.launch import Host, LaunchError, assign_hosts

    p = plan(2, 3, m=16, tp=2)  # dp 2, 8 GPUs in all
    nodes = assign_hosts(p, [Host(address="a", gpu="A100-80GB", gpus=4),
                             Host(address="b", gpu="A100-80GB", gpus=4)])
    assert sum(n.nproc for n in nodes) == p.num_gpus == 8
    with pytest.raises(LaunchError, match="missing 4 more A100-80GB"):
        assign_hosts(p, [Host(address="a", gpu="A100-80GB", gpus=4)])


@pytest.mark.parametrize("seed", range(300, 312))
def test_interleaved_search_with_nccl_buffers_equals_brute_force(seed: int) -> None:
    """With NCCL buffers per communicator, an interleaved group's usable memory is its
    stages' (TP, DP, pipeline): the search still proves the brute force's optimum."""
    from _bruteforce import assert_same_optimum, brute_force
    from test_search import SMALL

    cost = es.CostParams(reserved_gb=0.0, nccl_gb_per_group=0.02)
    job, catalog = interleavable_instance(seed, 3)
    expected, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=3,
                                    max_tp=2, cost_model=cost, virtual_stages=(1, 2, 3))
    r = es.search(job, catalog, max_stages=3,
                  **{**SMALL, "virtual_stages": (1, 2, 3), "cost_model": cost})  # type: ignore[arg-type]
    assert_same_optimum(r, expected, plan)
