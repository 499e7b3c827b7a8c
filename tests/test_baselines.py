"""espresso.baselines: each baseline plans what it says, on the same cost model, and Espresso's
proven optimum is never dearer than any of them."""

from __future__ import annotations

import math

import pytest
from test_search import SMALL, random_instance

import espresso as es
from espresso.baselines import BASELINES, compare, fastest_gpu

KW = {k: v for k, v in SMALL.items() if k != "interleave_after"} | {"interleave_after": ()}


def _usd(p: es.Plan | None) -> float:
    return math.inf if p is None or p.estimate is None else p.estimate.total_usd


@pytest.mark.parametrize("seed", range(25))
def test_espresso_is_never_dearer_than_a_baseline(seed: int) -> None:
    job, catalog = random_instance(seed, 2)
    plans = compare(job, catalog, max_stages=2, **KW)
    best = _usd(plans["espresso"])
    for name, plan in plans.items():
        if plan is None:
            continue
        est = plan.estimate
        assert est is not None and est.feasible and est.meets_deadline, name
        assert best <= est.total_usd * (1 + 1e-9), name
        if name == "homogeneous-cheapest":
            assert len(est.gpus) == 1
        if name == "no-recompute":
            assert plan.recompute == "none"
        if name == "fixed-microbatch":
            assert plan.micro_batch_size == 1


def test_the_baselines_differ_from_espresso_somewhere() -> None:
    """Not a vacuous comparison: on these instances some baseline is dearer or infeasible."""
    worse = 0
    for seed in range(25):
        job, catalog = random_instance(seed, 2)
        plans = compare(job, catalog, max_stages=2, **KW)
        if plans["espresso"] is None:
            continue
        best = _usd(plans["espresso"])
        worse += any(_usd(p) > best * (1 + 1e-9) for n, p in plans.items() if n != "espresso")
    assert worse >= 5


def test_fastest_gpu_rents_only_the_fastest_card() -> None:
    catalog = es.Catalog.builtin("gpus")
    job = es.Job(model=es.ModelSpec.preset("llama2-7b"), tokens=2 * 10**10, deadline_hours=720)
    plan = fastest_gpu(job, catalog, time_limit_s=30)
    assert plan is not None and plan.estimate is not None
    rates = {g.name: g.bf16_tflops * (g.efficiency or es.CostParams().efficiency)
             for g in catalog if g.count > 0}
    top = max(rates.values())
    fastest = {n for n, r in rates.items() if r == top}  # H100-SXM and H200 tie on compute
    assert len(plan.estimate.gpus) == 1 and set(plan.estimate.gpus) <= fastest


def test_unknown_baselines_are_refused() -> None:
    job, catalog = random_instance(0, 2)
    with pytest.raises(es.SpecError, match="unknown baseline 'greedy'"):
        compare(job, catalog, ("greedy",))
    assert set(BASELINES) == {"homogeneous-cheapest", "fastest-gpu", "no-recompute",
                              "fixed-microbatch"}
