"""The resolved table: a catalog's rows resolved once for the core, shared by a search, the
estimates of its plans and their interleavings (espresso.table)."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from test_profile import COST, profile_with

import espresso as es
from espresso.cloud.domains import subproblems
from espresso.cloud.quota import max_instances
from espresso.gpu_type import GpuType
from espresso.profile import Profile
from espresso.table import Table


def test_specs_are_copies_with_the_crossing_cap(tiny_catalog: es.Catalog,
                                                tiny_model: es.ModelSpec) -> None:
    table = Table(tiny_catalog, tiny_model, COST)
    rows = [0, 1]
    a = table.specs(rows)
    a[0].inter_node_gbs = -1.0  # a caller changing its copy changes nothing shared
    b = table.specs(rows)
    assert b[0].inter_node_gbs == tiny_catalog.gpus[0].inter_node_gbs
    capped = table.specs(rows, link_gbps=8.0)  # 8 Gbit/s per instance = 1 GB/s per instance
    for s, g in zip(capped, [tiny_catalog.gpus[i] for i in rows], strict=True):
        assert s.inter_node_gbs == pytest.approx(min(g.inter_node_gbs, 1.0 / g.gpus_per_node))


def test_profiles_are_applied_once_and_exactly(tiny_catalog: es.Catalog,
                                               tiny_model: es.ModelSpec) -> None:
    g = tiny_catalog["Y"]
    prof = profile_with(tiny_model, g, fwd=2.0, bwd=3.0, act=0.5)
    table = Table(tiny_catalog, tiny_model, COST, {"Y": prof})
    spec = table.spec(tiny_catalog.index("Y"))
    for k, val in prof.factors(tiny_model, g, COST).items():
        assert getattr(spec, k) == val
    assert spec.block_fwd_scale == pytest.approx(2.0)
    other = table.spec(tiny_catalog.index(tiny_catalog.gpus[0].name))
    assert other.block_fwd_scale == 1.0 or tiny_catalog.gpus[0].name == "Y"


def test_a_profile_of_an_unknown_gpu_is_refused(tiny_catalog: es.Catalog,
                                                tiny_model: es.ModelSpec) -> None:
    prof = profile_with(tiny_model, tiny_catalog["Y"])
    stray = Profile.from_dict({**prof.to_dict(), "gpu": "NoSuchGPU"})
    with pytest.raises(es.CatalogError, match="NoSuchGPU"):
        Table(tiny_catalog, tiny_model, COST, {"NoSuchGPU": stray})


def test_a_table_for_another_model_or_cost_is_not_used(tiny_job: es.Job,
                                                       tiny_catalog: es.Catalog) -> None:
    plan = es.plan(tiny_job, tiny_catalog, threads=1)
    fresh = es.estimate(plan, tiny_catalog)
    other_cost = Table(tiny_catalog, tiny_job.model, es.CostParams(efficiency=0.2))
    assert es.estimate(plan, other_cost) == fresh
    bigger = es.ModelSpec.from_dict({**tiny_job.model.to_dict(), "name": "wider",
                                     "hidden_size": 2 * tiny_job.model.hidden_size})
    assert es.estimate(plan, Table(tiny_catalog, bigger, plan.cost_model)) == fresh
    same = Table(tiny_catalog, tiny_job.model, plan.cost_model)
    assert es.estimate(plan, same) == fresh


def _count(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[str], Counter[str]]:
    """Counters of the rows' native specs and profile factors derived (a profile's factors
    derive the analytic spec inside: not counted)."""
    specs: Counter[str] = Counter()
    factors: Counter[str] = Counter()
    spec_fn, factors_fn = GpuType._spec, Profile.factors
    inside = [0]

    def spec(self: GpuType) -> Any:
        if not inside[0]:
            specs[self.name] += 1
        return spec_fn(self)

    def fac(self: Profile, model: Any, gpu: Any, cost: es.CostParams) -> dict[str, float]:
        factors[gpu.name] += 1
        inside[0] += 1
        try:
            return factors_fn(self, model, gpu, cost)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(GpuType, "_spec", spec)
    monkeypatch.setattr(Profile, "factors", fac)
    return specs, factors


def test_a_search_resolves_each_row_once(monkeypatch: pytest.MonkeyPatch,
                                         tiny_job: es.Job, tiny_catalog: es.Catalog) -> None:
    """Subproblems, the estimates of the plans found and their interleavings all read one
    table: no row's spec or profile is derived twice."""
    prof = profile_with(tiny_job.model, tiny_catalog["Y"], fwd=1.5)
    specs, factors = _count(monkeypatch)
    res = es.search(tiny_job, tiny_catalog, threads=1, top_k=3, profiles={"Y": prof},
                    interleave_after=(2, 3))
    assert res.plans
    assert specs and max(specs.values()) == 1, specs
    assert factors == Counter({"Y": 1})
    # The plans estimate the same on a fresh resolution.
    monkeypatch.undo()
    for p in res.plans:
        assert es.estimate(p, tiny_catalog) == p.estimate


def test_a_cloud_search_resolves_each_row_once(monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = max_instances(es.Catalog.builtin(), 2)
    model = es.ModelSpec.preset("gpt3-1.3b")
    job = es.Job(model=model, seq_len=2048, global_batch_size=512,
                 tokens=20 * model.num_params, deadline_hours=14 * 24)
    specs, _ = _count(monkeypatch)
    res = es.search(job, catalog, threads=1)
    assert res.plans
    # Rows shared by several subproblems (a region and its zones) are resolved once.
    shared = Counter(i for sp in subproblems(catalog) for i in sp.rows)
    assert max(shared.values()) > 1
    assert max(specs.values()) == 1


def test_table_specs_match_the_rows(tiny_catalog: es.Catalog, tiny_model: es.ModelSpec) -> None:
    table = Table(tiny_catalog, tiny_model, COST)
    for i, g in enumerate(tiny_catalog.gpus):
        got, want = table.specs([i])[0], g._spec()
        for k in ("memory_gb", "tflops", "mem_bandwidth_gbs", "intra_node_gbs",
                  "inter_node_gbs", "price_per_hour", "count", "gpus_per_node"):
            assert getattr(got, k) == getattr(want, k)
    assert copy.copy(table.spec(0)) is not table.spec(0)
