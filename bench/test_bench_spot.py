"""Spot plans over the cloud snapshot (issue "Spot capacity", deliverable 5): for llama2-7b and
llama2-70b, the best on-demand plan and the best plan with the spot market at deadline
confidence 0.5, 0.9 and 0.99, the saving, and the time each search takes.

    pytest bench/test_bench_spot.py --benchmark-columns=min
    python bench/test_bench_spot.py        # the table of bench/README.md
    python bench/test_bench_spot.py --rates 0.05,0.5   # at other interruption rates

At most two instances of each offer (`--max-instances 2`) and the providers' default
interruption rates (docs/cost-model.md, "Spot capacity"). Results: bench/README.md.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import espresso as es
from espresso.cloud.quota import max_instances
from espresso.cloud.spot import with_spot

JOBS = {
    "llama2-7b": dict(tokens=2 * 10**10, deadline_hours=14 * 24),
    "llama2-70b": dict(tokens=10**11, deadline_hours=20 * 24),
}
CONFIDENCE = (0.5, 0.9, 0.99)


def job(model: str, confidence: float = 0.9) -> es.Job:
    return es.Job(model=es.ModelSpec.preset(model), deadline_confidence=confidence,
                  **JOBS[model])  # type: ignore[arg-type]


def catalogs() -> tuple[es.Catalog, es.Catalog]:
    on_demand = max_instances(es.Catalog.builtin("cloud"), 2)
    return on_demand, with_spot(on_demand)


def check(res: es.SearchResult, catalog: es.Catalog) -> None:
    for p in res.plans:
        est = p.estimate
        assert est is not None and est.feasible and est.meets_deadline
        assert es.estimate(es.Plan.from_json(p.to_json()), catalog) == est
    if res.plans and res.stats.complete:
        assert res.stats.gap == 0.0


CASES = [(m, None) for m in JOBS] + [(m, c) for m in JOBS for c in CONFIDENCE]


@pytest.mark.benchmark(group="spot")
@pytest.mark.parametrize(("model", "confidence"), CASES)
def test_spot_search(benchmark: Any, model: str, confidence: float | None) -> None:
    on_demand, spot = catalogs()
    catalog = on_demand if confidence is None else spot
    res: es.SearchResult = benchmark.pedantic(
        es.search, args=(job(model, confidence or 0.9), catalog),
        kwargs=dict(time_limit_s=120), rounds=1, iterations=1)
    check(res, catalog)
    assert res.plans
    est = res.plans[0].estimate
    assert est is not None
    benchmark.extra_info.update(complete=res.stats.complete, gap=res.stats.gap,
                                usd=est.total_usd, hours=est.total_hours,
                                spot=est.spot is not None)


def rates(values: list[float]) -> None:
    """The best plan of each job with every spot row at each interruption rate."""
    on_demand, _ = catalogs()
    for model in JOBS:
        for rate in values:
            t = time.perf_counter()
            res = es.search(job(model), with_spot(on_demand, rate=rate), time_limit_s=120)
            took = time.perf_counter() - t
            est = res.plans[0].estimate
            assert est is not None
            rent = " + ".join(f"{r['instances']} x {r['instance_type']}"
                              f"{' (spot)' if r.get('market') == 'spot' else ''}"
                              for r in est.rent)
            at = est.spot.hours_at_confidence if est.spot else est.total_hours
            every = (f", checkpoint every {est.spot.checkpoint_interval_hours:.2f} h"
                     if est.spot else "")
            proof = "proven" if res.stats.gap == 0.0 else f"gap {res.stats.gap:.1%}"
            print(f"| {model} | {rate:g} | {rent} | {est.total_hours:,.1f} | {at:,.1f} | "
                  f"${est.total_usd:,.0f} | {took:.1f} s, {proof}{every} |")


def main() -> None:
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--rates":
        rates([float(x) for x in sys.argv[2].split(",")])
        return
    on_demand, spot = catalogs()
    print("| model | market | confidence | plan | expected hours | hours at confidence | "
          "expected USD | saving | search |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for model in JOBS:
        base = None
        for confidence in (None, *CONFIDENCE):
            catalog = on_demand if confidence is None else spot
            t = time.perf_counter()
            res = es.search(job(model, confidence or 0.9), catalog, time_limit_s=120)
            took = time.perf_counter() - t
            p = res.plans[0]
            est = p.estimate
            assert est is not None
            base = est.total_usd if confidence is None else base
            assert base is not None
            rent = " + ".join(f"{r['instances']} x {r['instance_type']}"
                              f"{' (spot)' if r.get('market') == 'spot' else ''}"
                              for r in est.rent)
            where = f"{p.domain.get('provider')}/{p.domain.get('region')}" if p.domain else ""
            at = est.spot.hours_at_confidence if est.spot else est.total_hours
            proof = "proven" if res.stats.gap == 0.0 else f"gap {res.stats.gap:.1%}"
            print(f"| {model} | {'on-demand' if confidence is None else 'spot allowed'} | "
                  f"{'-' if confidence is None else confidence} | {rent}, {where} | "
                  f"{est.total_hours:,.1f} | {at:,.1f} | ${est.total_usd:,.0f} | "
                  f"{1 - est.total_usd / base:.1%} | {took:.2f} s ({proof}) |")


if __name__ == "__main__":
    main()
