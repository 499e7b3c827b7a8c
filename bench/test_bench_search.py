"""The search on the prototype's own instance and at catalog scale.

Each benchmark asserts the plan it times is valid (feasible, meets the deadline, estimates
to the same numbers from its JSON) and reports whether it was proven optimal (gap 0).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import espresso as es

ROOT = Path(__file__).parents[1]


def prototype_job() -> es.Job:
    # open_llama_3b_v2, sequence 3000, global batch 64, 1,000 iterations, 100,000 s.
    return es.Job(model=es.ModelSpec.preset("open_llama_3b_v2"), seq_len=3000,
                  global_batch_size=64, iterations=1000, deadline_hours=100_000 / 3600)


def catalog_64(seed: int = 0) -> es.Catalog:
    """64 types derived from the built-in 13 as regions and spot markets vary price and
    availability."""
    rng = random.Random(seed)
    base = es.Catalog.builtin("gpus")
    gpus = []
    for i in range(64):
        g = base.gpus[i % len(base)].to_dict()
        g.update(name=f"{g['name']}-{i // len(base)}",
                 price_per_hour=round(g["price_per_hour"] * rng.uniform(0.35, 1.3), 4),
                 count=rng.choice([0, 8, 16, 32, 64]))
        g.pop("spot_price_per_hour", None)
        gpus.append(g)
    return es.Catalog.from_dict({"gpus": gpus})


def check(plan: es.Plan, catalog: es.Catalog) -> None:
    est = plan.estimate
    assert est is not None and est.feasible and est.meets_deadline
    assert es.estimate(es.Plan.from_json(plan.to_json()), catalog) == est


@pytest.mark.benchmark(group="search")
@pytest.mark.parametrize("threads", [1, 2])
def test_prototype_instance(benchmark: object, threads: int) -> None:
    catalog = es.Catalog.load(ROOT / "examples/catalogs/espresso-prototype.yaml")
    job = prototype_job()
    plan = benchmark.pedantic(es.plan, args=(job, catalog),  # type: ignore[attr-defined]
                              kwargs={"threads": threads}, rounds=1, iterations=1)
    check(plan, catalog)
    assert plan.stats is not None and plan.stats["gap"] == 0.0  # proven optimal


@pytest.mark.benchmark(group="search")
def test_catalog_scale(benchmark: object) -> None:
    """64 types, llama2-70b, 1e11 tokens, a 30-day deadline; stopped at 60 s if not done."""
    catalog = catalog_64()
    job = es.Job(model=es.ModelSpec.preset("llama2-70b"), seq_len=4096, global_batch_size=1024,
                 tokens=10**11, deadline_hours=24 * 30)
    res = benchmark.pedantic(es.search, args=(job, catalog),  # type: ignore[attr-defined]
                             kwargs={"threads": 2, "time_limit_s": 60}, rounds=1, iterations=1)
    assert res.plans, "no plan found"
    check(res.plans[0], catalog)
    assert res.stats.lower_bound <= res.plans[0].estimate.total_usd * (1 + 1e-9)  # type: ignore[union-attr]
