"""Engines (`--engine`): which plans torchtitan and Megatron-LM can run, and a search limited
to an engine is exact over exactly those plans (brute force over the same space, filtered by
the engine's rules)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from _bruteforce import brute_force
from test_search import COST, SMALL, random_instance

import espresso as es
from espresso.engines import ENGINES, refusal, runnable
from espresso.errors import SpecError

KW = {k: v for k, v in SMALL.items() if k not in ("interleave_after", "sharding")}


def _plan(tps: list[int], layers: list[int], *, dp: int = 2, sharding: str = "zero1",
          schedule: str = "1f1b", v: int = 1) -> es.Plan:
    model = es.ModelSpec(name="m", num_layers=sum(layers), hidden_size=64, num_heads=8,
                         vocab_size=128)
    job = es.Job(model=model, seq_len=64, global_batch_size=8 * dp, iterations=1,
                 deadline_hours=1)
    stages, begin = [], 0
    for t, n in zip(tps, layers, strict=True):
        stages.append(es.Stage(gpu="L4", tp=t, layers=(begin, begin + n)))
        begin += n
    return es.Plan(job=job, dp=dp, micro_batch_size=1, num_microbatches=8,
                   sharding=sharding, schedule=schedule, virtual_stages=v,
                   stages=tuple(stages))


def test_what_each_engine_runs() -> None:
    hetero = _plan([1, 4, 2], [4, 18, 10])
    assert runnable(hetero) == {
        "espresso": None, "torchtitan": "stage TP widths differ (1/4/2)",
        "megatron": "stage TP widths differ (1/4/2)"}
    # Megatron: the first and last stages free, the middle ones equal.
    assert refusal(_plan([2, 2, 2, 2], [3, 5, 5, 2]), "megatron") is None
    assert refusal(_plan([2, 2, 2, 2], [3, 5, 4, 2]), "megatron") == \
        "middle stages of unequal layer counts (3/5/4/2)"
    assert refusal(_plan([2, 2, 2, 2], [3, 5, 4, 2], sharding="fsdp"), "torchtitan") is None
    # Sharding: Megatron's distributed optimizer is ZeRO-1; torchtitan shards with FSDP2.
    assert refusal(_plan([1, 1], [2, 2], sharding="fsdp"), "megatron") == "no fsdp sharding"
    assert refusal(_plan([1, 1], [2, 2], sharding="zero1"), "torchtitan") == \
        "no zero1 sharding"
    assert refusal(_plan([1], [4], sharding="none"), "torchtitan") is None  # DDP alone
    assert refusal(_plan([1, 1], [2, 2], sharding="none"), "torchtitan") == "no none sharding"
    assert refusal(_plan([1, 1], [2, 2], dp=1, sharding="none"), "torchtitan") is None
    assert refusal(_plan([1, 1], [2, 2], schedule="gpipe"), "megatron") == "no gpipe schedule"
    # Interleaving: Megatron's chunks are all equal.
    inter = _plan([1, 1, 1, 1], [1, 1, 2, 2], v=2, dp=1)
    assert refusal(inter, "megatron") == "interleaved chunks of unequal layer counts"
    assert refusal(inter, "torchtitan") is None
    with pytest.raises(SpecError, match="engine: expected one of espresso, torchtitan"):
        refusal(inter, "deepspeed")


@pytest.mark.parametrize(("seed", "engine"),
                         [(s, e) for s in range(10) for e in ("torchtitan", "megatron")])
def test_an_engine_search_is_exact_over_what_the_engine_runs(seed: int, engine: str) -> None:
    """Up to 3 stages of 2-4 GPU types with TP 1 or 2: the engine's search finds the
    brute-force optimum over the plans the engine runs, and its plan is one of them."""
    job, catalog = random_instance(seed, 3)
    eng = ENGINES[engine]
    expected, best, _ = brute_force(job, catalog, micro_batch_sizes=(1, 2), max_stages=3,
                                    max_tp=2, cost_model=COST, sharding=eng.shardings,
                                    accept=lambda p: refusal(p, eng) is None)
    r = es.search(job, catalog, max_stages=3, engine=engine, interleave_after=(),
                  sharding=("none", "zero1", "zero2", "fsdp"), **KW)  # type: ignore[arg-type]
    assert r.stats.complete
    if math.isinf(expected):
        assert not r.plans
        return
    assert r.plans, best
    got = r.plans[0]
    assert got.estimate is not None
    assert got.estimate.total_usd == pytest.approx(expected, rel=1e-9), best
    assert refusal(got, engine) is None
    assert r.stats.gap == 0


def test_engine_searches_refuse_what_the_engine_cannot_do(tiny_model: es.ModelSpec) -> None:
    job = es.Job(model=tiny_model, seq_len=64, global_batch_size=8, iterations=1,
                 deadline_hours=1)
    with pytest.raises(SpecError, match="engine megatron: runs sharding none, zero1, not fsdp"):
        es.search(job, engine="megatron", sharding=("fsdp",), time_limit_s=5)
    with pytest.raises(SpecError, match="engine megatron: runs the schedules 1f1b, not gpipe"):
        es.search(job, engine="megatron", schedule="gpipe", time_limit_s=5)


def test_a_megatron_plan_of_the_default_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-2-70B on 1e11 tokens in 30 days: the full space's plan has stages of TP 1, 2 and
    4, which neither engine runs; Megatron's plan has one width and equal middle stages, and
    costs at least as much."""
    job = es.Job.from_dict({"model": "llama2-70b", "tokens": 1e11, "deadline": "30d"})
    plan = es.plan(job, engine="megatron", time_limit_s=5)
    assert refusal(plan, "megatron") is None
    assert len({st.tp for st in plan.stages}) == 1
    assert plan.sharding in ("none", "zero1")
    counts = [st.num_layers for st in plan.stages]
    assert len(set(counts[1:-1])) <= 1
    assert replace(plan, estimate=None).with_estimate().estimate is not None


def test_recomputation_modes_per_engine(tiny_job: es.Job) -> None:
    """torchtitan runs its per-op selective checkpointing (selective-op), not espresso's
    attention-core-only selective; espresso's runner and Megatron-LM the reverse. A search for
    an engine keeps to its modes and names what it refused."""
    catalog = es.Catalog.builtin("gpus").with_counts(**{"A100-80GB": 8})
    for rc, ok in (("selective", {"espresso", "megatron"}), ("selective-op", {"torchtitan"})):
        plan = es.Plan(job=tiny_job, stages=(es.Stage(gpu="A100-80GB", layers=(0, 4)),),
                       dp=2, num_microbatches=8, micro_batch_size=1, recompute=rc,
                       sharding="fsdp" if "torchtitan" in ok else "zero1")
        for name in ENGINES:
            why = refusal(plan, name)
            assert (why is None) == (name in ok), (rc, name, why)
            if why is not None:
                assert why == f"no {rc} recomputation"
    with pytest.raises(SpecError, match=r"engine torchtitan: runs recomputation none, full, "
                                        r"selective-op, not selective"):
        es.search(tiny_job, catalog, engine="torchtitan", recompute=("selective",), max_tp=1)
    r = es.search(tiny_job, catalog, engine="torchtitan", recompute=("selective-op",), max_tp=1,
                  time_limit_s=30)
    assert r.plans and all(p.recompute == "selective-op" for p in r.plans)
