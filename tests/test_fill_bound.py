"""The allocator's 1F1B fill bound with the least block work of a split (``least_work`` in
csrc/espresso/search_bounds.cpp; docs/search.md, "The fill at the bottleneck") against the
brute force, on instances built so that it binds: three GPU types of different speeds, many
micro-batches, memory that rarely binds, and a deadline at or just above the fastest plan.

Mutation checks (run by hand, recorded here): taking the work as P x at bottleneck x (every
stage full, too strong for unbalanced pipelines) fails 3 of the 40 many-micro-batch
instances; evaluating the work only at the least bottleneck, without the walk over larger
ones, fails instance 151 of the few-micro-batch ones."""

from __future__ import annotations

import random

import pytest
from _bruteforce import assert_same_optimum, brute_force
from _helpers import deadline_near_fastest

import espresso as es

BASE = es.Catalog.builtin("gpus")
COST = es.CostParams(reserved_gb=0.0)
SMALL = dict(micro_batch_sizes=(1, 2), max_tp=2, cost_model=COST, threads=1,
             sharding=("none", "zero1", "zero2", "fsdp"), interleave_after=())


def fill_instance(seed: int, batches: tuple[int, ...],
                  scales: tuple[float, ...]) -> tuple[es.Job, es.Catalog]:
    """A 5-8 block model over three GPU types (1-3 GPUs each), a global batch from
    ``batches`` and a deadline of the fastest plan's hours times one of ``scales``."""
    rng = random.Random(seed)
    layers = rng.randint(5, 8)
    model = es.ModelSpec(name=f"f{seed}", num_layers=layers, hidden_size=256, num_heads=8,
                         num_kv_heads=8, ffn_hidden_size=1024, vocab_size=1000)
    gpus = []
    for name in rng.sample(BASE.names, 3):
        g = BASE[name].to_dict()
        # (synthetic GPUs, all with bf16 tensor cores: precision is not what these test)
        g.update(count=rng.randint(1, 3), memory_gb=round(rng.uniform(0.03, 0.2), 3),
                 memory_bytes=None, gpus_per_node=rng.choice([1, 2]), bf16=True,
                 inter_node_gbs=rng.choice([1.0, 10.0, 100.0]), intra_node_gbs=100.0)
        gpus.append(es.GpuType(**g))
    catalog = es.Catalog(gpus=tuple(gpus))
    batch = rng.choice(batches)
    job = es.Job(model=model, seq_len=256, global_batch_size=batch, iterations=1000,
                 deadline_hours=1e6)
    job = deadline_near_fastest(job, catalog, lambda: rng.choice(scales), max_stages=3,
                                **SMALL)  # type: ignore[arg-type]
    return job, catalog


def assert_exact(job: es.Job, catalog: es.Catalog) -> None:
    expected, plan, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=3,
                                    max_tp=2, cost_model=COST)
    assert_same_optimum(es.search(job, catalog, max_stages=3, **SMALL),  # type: ignore[arg-type]
                        expected, plan)


@pytest.mark.parametrize("seed", range(40))
def test_fill_bound_with_many_microbatches(seed: int) -> None:
    """4-32 micro-batches: the fill term's slope M - 1 - (P - 1)/q is large."""
    assert_exact(*fill_instance(seed, (8, 16, 32), (1.0 + 1e-9, 1.01, 1.03, 1.1)))


@pytest.mark.parametrize("seed", range(120, 180))
def test_fill_bound_with_few_microbatches(seed: int) -> None:
    """2-8 micro-batches: a small slope, so a larger bottleneck with less work can be the
    least (the walk over bottlenecks must find it)."""
    assert_exact(*fill_instance(seed, (4, 6, 8), (1.0 + 1e-9, 1.0 + 1e-9, 1.01, 1.03)))
