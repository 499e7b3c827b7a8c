"""espresso.baselines: each baseline plans what it says, on the same cost model, and Espresso's
proven optimum is never dearer than any of them."""

from __future__ import annotations

import math

import pytest
from _bruteforce import brute_force
from test_search import COST, SMALL, random_instance

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
        if name == "even-split":
            sizes = [st.num_layers for st in plan.stages]
            assert max(sizes) - min(sizes) <= 1 and len({st.tp for st in plan.stages}) == 1


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
    assert set(BASELINES) == {"homogeneous-cheapest", "fastest-gpu", "even-split",
                              "no-recompute", "fixed-microbatch"}


@pytest.mark.parametrize(("seed", "width"), [(s, w) for s in range(20) for w in (1, 2)])
def test_even_split_search_equals_brute_force(seed: int, width: int) -> None:
    """The search limited to the even split and one TP width is exact over that space."""
    job, catalog = random_instance(seed, 2)
    expected, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=2,
                                    max_tp=2, cost_model=COST, even_split=True,
                                    tp_widths=(width,))
    kw = {**KW, "max_tp": width}
    r = es.search(job, catalog, max_stages=2, min_tp=width, even_split=True,
                  **kw)  # type: ignore[arg-type]
    assert r.stats.complete
    got = _usd(r.plans[0] if r.plans else None)
    if math.isinf(expected):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(expected, rel=1e-9), plan
        p = r.plans[0]
        assert {st.tp for st in p.stages} == {width}
        sizes = [st.num_layers for st in p.stages]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
