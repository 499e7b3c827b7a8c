"""Depth by variety (``max_stages`` per number of GPU types): the search's two passes
(the shallow space first, then only the deeper allocations) are exact against the brute
force, merge their plans, and find the deep single-type pipelines large runs use."""

from __future__ import annotations

import math
import random

import pytest
from _bruteforce import brute_force
from test_search import BASE, COST, SMALL, random_instance

import espresso as es
from espresso.cli import main
from espresso.search import DEFAULT_MAX_STAGES, depth_words


def _best(res: es.SearchResult, objective: str = "cost") -> float:
    assert res.stats.complete
    if not res.plans:
        return math.inf
    est = res.plans[0].estimate
    assert est is not None
    return est.total_usd if objective == "cost" else est.total_hours


def deep_instance(seed: int, tiers: tuple[int, ...]) -> tuple[es.Job, es.Catalog]:
    """2-3 GPU types of 3-5 GPUs whose cards hold one to three blocks of a 4-6 block model,
    so single-type pipelines deeper than a mix may be are often the only or the cheapest
    plans, and a deadline relative to the fastest plan (below it, at it, above)."""
    rng = random.Random(seed)
    model = es.ModelSpec(name=f"d{seed}", num_layers=rng.randint(4, 6), hidden_size=256,
                         num_heads=8, num_kv_heads=rng.choice([8, 2]),
                         ffn_hidden_size=rng.choice([512, 1024]), vocab_size=1000,
                         gated_mlp=rng.random() < 0.5)
    gpus = []
    for n in rng.sample(BASE.names, rng.randint(2, 3)):
        g = BASE[n].to_dict()
        g.update(count=rng.randint(3, 5), memory_gb=round(rng.uniform(0.02, 0.035), 4),
                 memory_bytes=None, gpus_per_node=rng.choice([1, 2, 4]), bf16=True)
        gpus.append(es.GpuType(**g))
    catalog = es.Catalog(gpus=tuple(gpus))
    batch = rng.choice([4, 8])
    job = es.Job(model=model, seq_len=256, global_batch_size=batch, iterations=1000,
                 deadline_hours=1e6)
    fastest = es.search(job, catalog, objective="time", max_stages=tiers, **SMALL)  # type: ignore[arg-type]
    if fastest.plans:
        hours = fastest.plans[0].estimate.total_hours  # type: ignore[union-attr]
        job = es.Job(model=model, seq_len=256, global_batch_size=batch, iterations=1000,
                     deadline_hours=hours * rng.choice([0.9, 1 + 1e-9, 1.2, 2.0, 100.0]))
    return job, catalog


TIERED = [(seed, (4, 2)) for seed in range(40)] + [(100 + seed, (4, 3, 2)) for seed in range(10)]


@pytest.mark.parametrize(("seed", "tiers"), TIERED)
def test_tiered_search_equals_brute_force(seed: int, tiers: tuple[int, ...]) -> None:
    job, catalog = deep_instance(seed, tiers)
    expected, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=tiers,
                                    max_tp=2, cost_model=COST)
    got = _best(es.search(job, catalog, max_stages=tiers, **SMALL))  # type: ignore[arg-type]
    if math.isinf(expected):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(expected, rel=1e-9), plan


def test_tiered_instances_are_not_trivial() -> None:
    """The instances above often have a single-type optimum deeper than any mix may be."""
    deep = feasible = 0
    for seed, tiers in TIERED[:40]:
        job, catalog = deep_instance(seed, tiers)
        best, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=tiers,
                                    max_tp=2, cost_model=COST)
        feasible += math.isfinite(best)
        deep += plan is not None and len(plan.stages) > tiers[-1]
    assert feasible >= 20 and deep >= 5, (feasible, deep)


@pytest.mark.parametrize("seed", range(12))
def test_tiered_time_objective_equals_brute_force(seed: int) -> None:
    job, catalog = deep_instance(200 + seed, (4, 2))
    budget = 1e9 if seed % 2 else 0.5
    expected, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=(4, 2),
                                    max_tp=2, cost_model=COST, objective="time",
                                    budget_usd=budget)
    res = es.search(job, catalog, max_stages=(4, 2), objective="time", budget_usd=budget,
                    **SMALL)  # type: ignore[arg-type]
    got = _best(res, "time")
    if math.isinf(expected):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(expected, rel=1e-9), plan


def test_equal_tiers_are_one_depth() -> None:
    job, catalog = random_instance(7, 3)
    a = es.search(job, catalog, max_stages=3, **SMALL)  # type: ignore[arg-type]
    b = es.search(job, catalog, max_stages=(3, 3, 3), **SMALL)  # type: ignore[arg-type]
    assert [p.to_json() for p in a.plans] == [p.to_json() for p in b.plans]


def test_tiers_bound_the_depth_of_mixed_plans() -> None:
    """Every plan returned keeps its tier: a mix of two or more types at most the last
    entry's depth, one type at most the first's; top-k merges both passes in order."""
    for seed in range(12):
        job, catalog = deep_instance(300 + seed, (4, 2))
        res = es.search(job, catalog, max_stages=(4, 2), top_k=6,
                        **{**SMALL, "interleave_after": ()})  # type: ignore[arg-type]
        costs = [p.estimate.total_usd for p in res.plans]  # type: ignore[union-attr]
        assert costs == sorted(costs)
        assert len({p.to_json() for p in res.plans}) == len(res.plans)
        for p in res.plans:
            types = len({(s.gpu, s.offer) for s in p.stages})
            assert len(p.stages) <= (4 if types == 1 else 2)
        if res.plans:
            one = es.search(job, catalog, max_stages=(4, 2), **SMALL)  # type: ignore[arg-type]
            assert _best(one) == pytest.approx(costs[0], rel=1e-12)


def _deep_job() -> tuple[es.Job, es.Catalog]:
    """A 24-block model on one GPU type whose cards hold two blocks' model states (without
    sharding): no pipeline of 8 stages fits; every plan is at least 12 stages deep."""
    model = es.ModelSpec(name="deep", num_layers=24, hidden_size=512, num_heads=8,
                         ffn_hidden_size=2048, vocab_size=1000)
    job = es.Job(model=model, seq_len=256, global_batch_size=16, iterations=1000,
                 deadline_hours=1e6)
    g = es.Catalog.builtin("gpus")["A100-80GB"].to_dict()
    g.update(count=24, memory_gb=0.125, memory_bytes=None, gpus_per_node=8)
    return job, es.Catalog(gpus=(es.GpuType(**g),))


def test_default_depth_finds_deep_single_type_pipelines() -> None:
    job, catalog = _deep_job()
    kw = dict(micro_batch_sizes=(1,), max_tp=1, cost_model=COST, threads=1,
              interleave_after=(), sharding=("none",))
    with pytest.raises(es.InfeasibleError, match="at most 8 stages"):
        es.plan(job, catalog, max_stages=8, **kw)  # type: ignore[arg-type]
    res = es.search(job, catalog, **kw)  # type: ignore[arg-type]  # the default tiers
    assert res.stats.complete and res.plans
    deep = res.plans[0]
    assert len(deep.stages) >= 12
    # One pass over the same space (a plain depth) proves the same optimum.
    flat = es.search(job, catalog, max_stages=DEFAULT_MAX_STAGES[0], **kw)  # type: ignore[arg-type]
    assert _best(flat) == pytest.approx(_best(res), rel=1e-12)


@pytest.mark.parametrize(
    ("value", "match"),
    [((), r"max_stages: expected a depth or a non-empty list"),
     ((8, 64), r"max_stages\[1\]: expected at most max_stages\[0\] = 8"),
     ((64, 0), r"max_stages\[1\]"),
     ("8", "max_stages")],
)
def test_bad_depths_name_the_entry(value: object, match: str) -> None:
    job, catalog = random_instance(1, 2)
    with pytest.raises(es.SpecError, match=match):
        es.search(job, catalog, max_stages=value, **SMALL)  # type: ignore[arg-type]


def test_depth_in_words() -> None:
    assert depth_words(8) == "at most 8 stages"
    assert depth_words((64, 64, 8)) == "at most 64 stages (8 with 3+ GPU types)"
    assert depth_words((64, 8)) == "at most 64 stages (8 with 2+ GPU types)"
    assert depth_words((64, 16, 8)) == ("at most 64 stages (16 with 2 GPU types, "
                                        "8 with 3+ GPU types)")


def test_cli_takes_one_depth_or_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "llama2-7b", "--tokens", "1e9", "--deadline", "30d",
            "--catalog", "builtin:gpus", "--time-limit", "20"]
    assert main([*base, "--max-stages", "4,2"]) == 0
    assert "stage" in capsys.readouterr().out
    assert main([*base, "--max-stages", "2,4"]) != 0
    assert "max_stages[1]: expected at most max_stages[0] = 2" in capsys.readouterr().err
