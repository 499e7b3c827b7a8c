"""The instances where the search was slow or unbounded (issue "Hardening"), each timed once
and checked: the plan is valid and, where the search completes, proven (gap 0).

    pytest bench/test_bench_hard.py --benchmark-columns=min,median

Targets: the prototype's instance with 32-300 GB/s intra-node links <= 20 ms and every case
proven, on 2 cores. The llama2-70b case's old target (<= 1 s, issue "Hardening") predates
whole instances, sharding and sequence parallelism in the search, which made it a larger
instance; it now takes about 2 s. Results and history: bench/README.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import espresso as es

ROOT = Path(__file__).parents[1]

PROTOTYPE_LINKS = {  # intra-node GB/s of A30, RTX-A6000, RTX-A4000, RTX-3090
    "all-32": (32, 32, 32, 32),
    "all-64": (64, 64, 64, 64),
    "all-300": (300, 300, 300, 300),
    "300-150-64-32": (300, 150, 64, 32),
    "32-300-32-300": (32, 300, 32, 300),
}


def _prototype(links: tuple[int, ...]) -> tuple[es.Job, es.Catalog]:
    cat = es.Catalog.load(ROOT / "examples/catalogs/espresso-prototype.yaml")
    gpus = []
    for g, intra in zip(cat.gpus, links, strict=True):
        d = g.to_dict()
        d["intra_node_gbs"] = intra
        gpus.append(d)
    job = es.Job(model=es.ModelSpec.preset("open_llama_3b_v2"), seq_len=3000,
                 global_batch_size=64, iterations=1000, deadline_hours=100_000 / 3600)
    return job, es.Catalog.from_dict({"gpus": gpus})


def _run(benchmark: Any, job: es.Job, catalog: es.Catalog | None, **kw: Any) -> es.SearchResult:
    # None: the GPU-type catalog these instances were defined on (the default catalog is
    # the cloud snapshot now; bench/test_bench_cloud.py times that one).
    cat = catalog or es.Catalog.builtin("gpus")
    res: es.SearchResult = benchmark.pedantic(es.search, args=(job, cat), kwargs=kw,
                                              rounds=1, iterations=1)
    for p in res.plans:
        est = p.estimate
        assert est is not None and est.feasible
        assert kw.get("objective") == "time" or est.meets_deadline
        assert es.estimate(es.Plan.from_json(p.to_json()), cat) == est
    if res.plans and res.stats.complete:
        assert res.stats.gap == 0.0
    benchmark.extra_info.update(complete=res.stats.complete, gap=res.stats.gap,
                                nodes=res.stats.nodes_expanded,
                                best=res.plans[0].estimate.total_usd if res.plans else None)  # type: ignore[union-attr]
    return res


@pytest.mark.benchmark(group="hard: prototype with fast links")
@pytest.mark.parametrize("links", list(PROTOTYPE_LINKS))
def test_prototype_fast_links(benchmark: Any, links: str) -> None:
    job, cat = _prototype(PROTOTYPE_LINKS[links])
    res = _run(benchmark, job, cat, threads=2)
    assert res.stats.complete and res.plans


@pytest.mark.benchmark(group="hard: built-in catalog")
def test_llama2_70b_30_days(benchmark: Any) -> None:
    job = es.Job(model=es.ModelSpec.preset("llama2-70b"), tokens=10**11, deadline_hours=720)
    res = _run(benchmark, job, None, threads=2)
    # Proven either way. Under the roofline model (issue 13) a one-token sequence re-reads
    # every weight per micro-batch, and no plan meets 7 days any more.
    assert res.stats.complete


@pytest.mark.benchmark(group="hard: built-in catalog")
def test_tiny_sequences(benchmark: Any) -> None:
    job = es.Job(model=es.ModelSpec.preset("llama2-7b"), tokens=2 * 10**10, deadline_hours=168,
                 seq_len=1)
    res = _run(benchmark, job, None, threads=2)
    # Proven either way. Under the roofline model (issue 13) a one-token sequence re-reads
    # every weight per micro-batch, and no plan meets 7 days any more.
    assert res.stats.complete


@pytest.mark.benchmark(group="hard: unmeetable deadlines")
def test_infeasibility_proof(benchmark: Any) -> None:
    """The cost search proving that nothing meets 2 days for llama2-7b on 2e11 tokens."""
    job = es.Job(model=es.ModelSpec.preset("llama2-7b"), tokens=2 * 10**11, deadline_hours=48)
    res = _run(benchmark, job, None, threads=2, time_limit_s=60)
    assert res.stats.complete and not res.plans


FASTEST = {
    "llama2-7b 2e11": ("llama2-7b", 2e11),
    "llama2-70b 2e12": ("llama2-70b", 2e12),
    "llama3-70b 15e12": ("llama3-70b", 15e12),
    "llama3-70b 1e11": ("llama3-70b", 1e11),
}


@pytest.mark.benchmark(group="hard: the fastest plan")
@pytest.mark.parametrize("case", list(FASTEST))
def test_fastest_plan(benchmark: Any, case: str) -> None:
    """The question behind "no plan meets the deadline; the fastest needs ..."; stopped at
    60 s when not proven (the gap is then reported in extra_info)."""
    model, tokens = FASTEST[case]
    job = es.Job(model=es.ModelSpec.preset(model), tokens=int(tokens), deadline_hours=1.0)
    res = _run(benchmark, job, None, objective="time", threads=2, time_limit_s=60)
    assert res.plans
