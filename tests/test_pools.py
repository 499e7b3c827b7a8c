"""Limits shared by several offers (issue 30, item 4): AWS's vCPU quotas per instance family,
GCP's GPU quotas per model and region, pooled instance counts; the search keeps to them
exactly, and plans and estimates say how much of each they use."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from test_search import assert_search_equals_brute_force, random_instance, search_cost

import espresso as es
from espresso.cloud.quota import apply_quota, vcpus_of

JOB = es.Job(model=es.ModelSpec.preset("llama2-13b"), tokens=2e11, deadline_hours=24 * 14)


def pooled_instance(seed: int) -> tuple[es.Job, es.Catalog, es.Catalog]:
    """test_search's random instance, and the same with a random limit over 2+ of its rows."""
    rng = random.Random(500 + seed)
    job, catalog = random_instance(seed, 2)
    rows = list(catalog.gpus)
    members = rng.sample(range(len(rows)), rng.randint(2, len(rows)))
    units = {i: rng.choice([1.0, 2.0, 3.0]) for i in members}
    limit = float(rng.randint(1, 6))
    for i in members:
        rows[i] = replace(rows[i], pool="p", pool_units=units[i], pool_limit=limit)
    return job, catalog, es.Catalog(gpus=tuple(rows))


@pytest.mark.parametrize("seed", range(40))
def test_search_with_shared_limits_equals_brute_force(seed: int) -> None:
    job, catalog, pooled = pooled_instance(seed)
    got = assert_search_equals_brute_force(job, pooled)
    # A limit only takes plans away.
    assert got >= search_cost(job, catalog, 2) * (1 - 1e-9)


def test_shared_limits_bind_where_per_offer_counts_would_not() -> None:
    """Two offers of one family, each allowed 4 instances alone; a shared 6-instance limit
    (in vCPUs) forbids the 8-instance plan the offers would allow apart."""
    offers = [{"provider": "aws", "region": "us-east-1", "instance_type": it,
               "gpu": "H100-SXM", "gpus_per_instance": 8, "price_per_hour": price,
               "instances": 4} for it, price in (("p5.48xlarge", 55.04), ("p5e.48xlarge", 56.0))]
    cat = es.Catalog.from_dict({"offers": offers})
    job = es.Job(model=es.ModelSpec.preset("llama2-13b"), tokens=1e11, deadline_hours=100)
    free = es.plan(job, cat, time_limit_s=60)
    assert free.estimate is not None and sum(free.estimate.instances.values()) > 6
    limited = apply_quota(cat, {"limits": [{"provider": "aws", "family": "P",
                                            "vcpus": 6 * 192}]})
    assert {g.pool for g in limited} == {"limits[0] aws/us-east-1"}
    with pytest.raises(es.InfeasibleError):
        es.plan(job, limited, time_limit_s=60)
    # The free plan, estimated against the limit, is infeasible and says why.
    est = es.estimate(free, limited)
    assert not est.feasible
    assert any("shared limit 'limits[0] aws/us-east-1'" in r and "allows 1152" in r
               for r in est.reasons)
    # A longer deadline fits in six instances; the rent list states the use.
    ok = es.plan(replace(job, deadline_hours=400), limited, time_limit_s=60)
    assert ok.estimate is not None and sum(ok.estimate.instances.values()) <= 6
    words = ok.estimate.rent[0]["availability"]
    assert "quota file limit 1 (provider aws, family P: 1152 vcpus in us-east-1, shared)" in words
    assert "the plan uses" in words and "of 1152" in words


def test_limits_are_per_region_and_market_and_replace_the_assumption() -> None:
    cat = es.Catalog.builtin()
    lim = apply_quota(cat, {"limits": [{"provider": "aws", "family": "P", "vcpus": 384}]})
    p = [g for g in lim if g.provider == "aws" and g.instance_type.startswith("p")]
    assert p and all(g.pool == f"limits[0] aws/{g.region}" for g in p)
    assert len({g.pool for g in p}) == len({g.region for g in p})  # one pool per region
    big = [g for g in p if g.instance_type == "p5.48xlarge"]
    assert all(g.instances == 2 for g in big)  # 384 vCPUs = 2 x 192, not the assumed 4
    assert all(g.pool is None for g in lim if not (g.instance_type or "").startswith("p")
               or g.provider != "aws")
    assert [vcpus_of(g) for g in big[:1]] == [192]
    spot = apply_quota(es.cloud.spot.with_spot(cat) if hasattr(es, "cloud") else cat,
                       {"limits": [{"provider": "aws", "family": "G", "market": "spot",
                                    "gpus": 8}]})
    g_spot = [g for g in spot if g.pool is not None]
    assert g_spot and all(g.market == "spot" and g.instance_type.startswith("g")
                          for g in g_spot)


def test_bad_limits_are_refused_with_their_field(tmp_path: Path) -> None:
    cat = es.Catalog.builtin()
    for bad, words in (
            ({"provider": "aws", "vcpus": 8, "gpus": 8}, "exactly one of vcpus, gpus, instances"),
            ({"provider": "aws", "family": "Q", "vcpus": 8}, "family"),
            ({"provider": "aws", "vcpus": -1}, r"limits\[0\]\.vcpus"),
            ({"provider": "nowhere", "gpus": 8}, "matches no offer"),
            ({"provider": "gcp", "vcpus": 8}, "vCPUs of .* are not known")):
        with pytest.raises(es.CatalogError, match=words):
            apply_quota(cat, {"limits": [bad]})
    row = cat.gpus[0]
    with pytest.raises(es.CatalogError, match="pool, pool_units and pool_limit go together"):
        replace(row, pool="x")


def test_the_random_limits_bind_often_enough_to_test_something() -> None:
    binding = 0
    for seed in range(40):
        job, catalog, pooled = pooled_instance(seed)
        binding += search_cost(job, pooled, 2) > search_cost(job, catalog, 2) * (1 + 1e-9)
    assert binding >= 5, binding


def test_a_saved_catalog_keeps_its_limits_and_rules(tmp_path: Path) -> None:
    cat = apply_quota(es.Catalog.builtin(), {
        "quotas": [{"provider": "aws", "region": "us-east-1", "instance_type": "p5.48xlarge",
                    "instances": 3}],
        "limits": [{"provider": "aws", "region": "us-east-1", "family": "P", "vcpus": 384}]})
    path = tmp_path / "c.yaml"
    cat.save(path)
    again = es.Catalog.load(path)
    for a, b in zip(cat, again, strict=True):
        assert (a.pool, a.pool_units, a.pool_limit, a.availability, a.count) == (
            b.pool, b.pool_units, b.pool_limit, b.availability, b.count)
    p5 = again["aws/us-east-1/p5.48xlarge"]
    assert p5.instances == 3 and p5.pool_limit == 384 and "quota file entry 1" in str(
        p5.availability)


def test_vcpu_limits_read_the_catalogs_own_vcpus(tmp_path: Path) -> None:
    """Azure and the GPU clouds count vCPUs too: a SkyPilot file's vCPUs column gives each
    instance's (Nebius's 8 x H100 instance has 128), kept when the catalog is saved."""
    from test_providers import NEBIUS

    path = tmp_path / "nebius_vms.csv"
    path.write_text(NEBIUS)
    cat = es.Catalog.from_skypilot([path])
    h100 = cat["nebius/eu-north1/gpu-h100-sxm_8gpu-128vcpu-1600gb"]
    assert h100.vcpus == 128 and vcpus_of(h100) == 128
    lim = apply_quota(cat, {"limits": [{"provider": "nebius", "vcpus": 256}]})
    assert lim["nebius/eu-north1/gpu-h100-sxm_8gpu-128vcpu-1600gb"].instances == 2
    assert lim["nebius/eu-north1/gpu-l40s-d_4gpu-128vcpu-768gb"].pool_units == 128
    saved = tmp_path / "c.yaml"
    lim.save(saved)
    assert es.Catalog.load(saved)["nebius/eu-north1/gpu-h100-sxm_8gpu-128vcpu-1600gb"].vcpus == 128
    bare = replace(h100, vcpus=None)
    with pytest.raises(es.CatalogError, match=r"vCPUs of .* are not known"):
        vcpus_of(bare)
