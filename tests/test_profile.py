"""Profiles: the JSON contract, their exact effect on the estimate, the search with profiles
against the brute force, and mismatches refused."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from _bruteforce import brute_force
from test_search import SMALL

import espresso as es
from espresso.profile import as_profiles, shape_workload

COST = es.CostParams(reserved_gb=0.0)


def profile_with(model: es.ModelSpec, gpu: es.GpuType, *, fwd: float = 1.0, bwd: float = 1.0,
                 head_fwd: float = 1.0, head_bwd: float = 1.0, act: float = 1.0,
                 seq_len: int = 64, micro_batch_size: int = 1,
                 cost: es.CostParams = COST) -> es.Profile:
    """A profile whose factors over the analytic model are the given ones."""
    from espresso._native import core

    dims, s, b = model._dims(), seq_len, micro_batch_size
    w = shape_workload(s, b)
    blk = core.block_times(dims, gpu._spec(), cost._core(), w, 1)
    head = core.head_times(dims, gpu._spec(), cost._core(), w, 1)
    act_bytes = core.block_activation_bytes(dims, cost._core(), s, b, 1)
    return es.Profile(gpu=gpu.name, model=model.to_dict(), seq_len=s, micro_batch_size=b,
                      block_fwd_s=fwd * blk.fwd, block_bwd_s=bwd * blk.bwd,
                      head_fwd_s=head_fwd * head.fwd, head_bwd_s=head_bwd * head.bwd,
                      block_activation_bytes=act * act_bytes, block_param_bytes=1.0)


@pytest.fixture
def plan4(tiny_job: es.Job) -> es.Plan:
    return es.Plan(job=tiny_job, stages=(es.Stage(gpu="L4", layers=(0, 2)),
                                         es.Stage(gpu="L4", layers=(2, 4))),
                   num_microbatches=16, cost_model=COST)


def test_json_round_trip(tmp_path: Path, tiny_job: es.Job) -> None:
    p = profile_with(tiny_job.model, es.Catalog.builtin("gpus")["L4"], fwd=2.0)
    p = replace(p, samples={"block_fwd": [0.1, 0.2]}, meta={"torch": "x"}, device="cpu")
    assert es.Profile.from_dict(p.to_dict()) == p
    p.to_json(tmp_path / "p.json")
    assert es.Profile.load(tmp_path / "p.json") == p


def test_measured_times_replace_the_analytic_ones_exactly(plan4: es.Plan) -> None:
    """At the profiled shape a stage's forward is L x the measured block forward (plus the
    head's on the last stage); doubling the measured block time doubles that part."""
    model = plan4.job.model
    prof = es.Profile(gpu="L4", model=model.to_dict(), seq_len=plan4.job.seq_len,
                      micro_batch_size=1, block_fwd_s=1.0e-4, block_bwd_s=2.5e-4,
                      head_fwd_s=4e-5, head_bwd_s=6e-5, block_activation_bytes=3e6,
                      block_param_bytes=1e5)
    est = es.estimate(plan4, profiles={"L4": prof})
    first, last = est.stages
    assert first.fwd_s == pytest.approx(2 * 1.0e-4, rel=1e-12)
    assert first.bwd_s == pytest.approx(2 * 2.5e-4, rel=1e-12)
    assert last.fwd_s == pytest.approx(2 * 1.0e-4 + 4e-5, rel=1e-12)
    assert last.bwd_s == pytest.approx(2 * 2.5e-4 + 6e-5, rel=1e-12)
    # 1F1B: stage 0 of 2 holds 2 micro-batches of 2 blocks (and their token ids, int64).
    ids = plan4.job.seq_len * 1 * 8
    assert first.activations_gb == pytest.approx((2 * 2 * 3e6 + 2 * ids) / 1e9, rel=1e-12)
    slow = es.estimate(plan4, profiles={"L4": replace(prof, block_fwd_s=2.0e-4)})
    assert slow.stages[0].fwd_s == pytest.approx(2 * first.fwd_s, rel=1e-12)
    assert slow.stages[0].bwd_s == first.bwd_s
    assert slow.iteration_s > est.iteration_s
    # A different micro-batch size scales with the analytic block time.
    from espresso._native import core

    def analytic(b: int) -> float:
        w = shape_workload(8, b)
        return float(core.block_times(model._dims(), es.Catalog.builtin("gpus")["L4"]._spec(),
                                      COST._core(), w, 1).fwd)

    b2 = replace(plan4, micro_batch_size=2, num_microbatches=8)
    assert es.estimate(b2, profiles=[prof]).stages[0].fwd_s == pytest.approx(
        first.fwd_s * analytic(2) / analytic(1), rel=1e-9)


def test_profiles_travel_with_the_plan(plan4: es.Plan) -> None:
    prof = profile_with(plan4.job.model, es.Catalog.builtin("gpus")["L4"], fwd=3.0, act=0.5)
    plan = replace(plan4, profiles={"L4": prof}).with_estimate()
    back = es.Plan.from_json(plan.to_json())
    assert back.profiles == {"L4": prof}
    assert es.estimate(back).iteration_s == plan.estimate.iteration_s  # type: ignore[union-attr]
    assert es.estimate(plan4).iteration_s != plan.estimate.iteration_s  # type: ignore[union-attr]


def test_mismatches_are_refused(plan4: es.Plan, tiny_job: es.Job) -> None:
    cat = es.Catalog.builtin("gpus")
    other = es.ModelSpec(name="wide", num_layers=4, hidden_size=128, num_heads=4, vocab_size=100)
    with pytest.raises(es.ProfileError, match=r"another model .* hidden_size: profiled 128"):
        es.estimate(plan4, profiles=[profile_with(other, cat["L4"])])
    with pytest.raises(es.ProfileError, match=r"profiles\['L4'\]: the profile is of T4"):
        es.estimate(plan4, profiles={"L4": profile_with(tiny_job.model, cat["T4"])})
    with pytest.raises(es.CatalogError, match="NOPE"):
        es.search(tiny_job, profiles=[replace(profile_with(tiny_job.model, cat["L4"]),
                                              gpu="NOPE")])
    with pytest.raises(es.ProfileError, match="block_fwd_s: expected a positive number"):
        es.Profile.from_dict({**profile_with(tiny_job.model, cat["L4"]).to_dict(),
                              "block_fwd_s": 0})
    with pytest.raises(es.ProfileError, match="did you mean 'block_fwd_s'"):
        es.Profile.from_dict({**profile_with(tiny_job.model, cat["L4"]).to_dict(),
                              "block_fwd": 1})
    with pytest.raises(es.ProfileError,
                       match=r"block_fwd_scale of [0-9.]+e\+\d+ .* expected within"):
        es.estimate(plan4, profiles=[replace(profile_with(tiny_job.model, cat["L4"]),
                                             block_fwd_s=1e6)])
    with pytest.raises(es.ProfileError, match="two profiles of L4"):
        as_profiles([profile_with(tiny_job.model, cat["L4"])] * 2)


def profiled_instance(seed: int) -> tuple[es.Job, es.Catalog, dict[str, es.Profile]]:
    """Compute-bound instances (h 2048, seq 2048), so the bounds built on the profiles' rates
    decide what is pruned: 3 GPU types of 1-3 GPUs, most profiled with random factors (a
    backward sometimes cheaper than a forward), a deadline near the fastest plan."""
    rng = random.Random(seed)
    base = es.Catalog.builtin("gpus")
    model = es.ModelSpec(name=f"p{seed}", num_layers=rng.randint(4, 8), hidden_size=2048,
                         num_heads=16, vocab_size=32000, gated_mlp=rng.random() < 0.5)
    gpus = [es.GpuType(**{**base[n].to_dict(), "count": rng.randint(1, 3),
                          "gpus_per_node": rng.choice([1, 2]), "bf16": True})
            for n in rng.sample(base.names, 3)]
    catalog = es.Catalog(gpus=tuple(gpus))
    profiles = {g.name: profile_with(model, g, fwd=rng.uniform(0.1, 2), bwd=rng.uniform(0.1, 2),
                                     head_fwd=rng.uniform(0.1, 2), head_bwd=rng.uniform(0.1, 2),
                                     act=rng.uniform(0.1, 2), seq_len=2048)
                for g in catalog if rng.random() < 0.7}
    job = es.Job(model=model, seq_len=2048, global_batch_size=4, iterations=1e5,
                 deadline_hours=1e6)
    fast = es.search(job, catalog, objective="time", max_stages=2, profiles=profiles, **SMALL)
    if fast.plans:
        hours = fast.plans[0].estimate.total_hours  # type: ignore[union-attr]
        job = replace(job, deadline_hours=hours * rng.choice([1.0001, 1.1, 1.5, 3.0]))
    return job, catalog, profiles


@pytest.mark.parametrize("seed", range(120))
def test_search_with_profiles_equals_brute_force(seed: int) -> None:
    """The search with profiles finds the brute force's optimum (a search that ignores the
    profiles' faster parts in its bounds fails 4 of the first 30 seeds)."""
    job, catalog, profiles = profiled_instance(seed)
    expected, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=2,
                                    max_tp=2, cost_model=COST, profiles=profiles)
    r = es.search(job, catalog, max_stages=2, profiles=profiles, **SMALL)  # type: ignore[arg-type]
    assert r.stats.complete
    got = r.plans[0].estimate.total_usd if r.plans else math.inf  # type: ignore[union-attr]
    if math.isinf(expected):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(expected, rel=1e-9), plan


def test_profiles_change_the_optimum_in_many_instances() -> None:
    changed = 0
    for seed in range(40):
        job, catalog, profiles = profiled_instance(seed)
        with_p = es.search(job, catalog, max_stages=2, profiles=profiles, **SMALL)  # type: ignore[arg-type]
        without = es.search(job, catalog, max_stages=2, **SMALL)  # type: ignore[arg-type]
        a = with_p.plans[0].gpus if with_p.plans else None
        b = without.plans[0].gpus if without.plans else None
        changed += a != b
    assert changed >= 8
