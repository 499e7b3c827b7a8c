"""estimate() on infeasible plans: every reason in words."""

from __future__ import annotations

import pytest
from _helpers import make_plan

import espresso as es


def llama(deadline: float = 1e6, batch: int = 512) -> es.Job:
    return es.Job(model=es.ModelSpec.preset("llama2-7b"), seq_len=4096,
                  global_batch_size=batch, tokens=2 * 10**10, deadline_hours=deadline)


def test_out_of_memory_names_stage_and_amount() -> None:
    plan = make_plan(llama(), [("L4", 1, 0, 16), ("L4", 1, 16, 32)], dp=4,
                     num_microbatches=128)
    est = es.estimate(plan)
    assert not est.feasible
    oom = [r for r in est.reasons if "GB over" in r]
    assert len(oom) == 2
    s0 = est.stages[0]
    assert f"stage 0 (L4, tp 1, layers [0, 16)) needs {s0.memory_gb:.1f} GB per GPU" in oom[0]
    assert f"{s0.memory_gb - s0.capacity_gb:.1f} GB over" in oom[0]
    assert s0.headroom_gb < 0


def test_availability_exceeded() -> None:
    cat = es.Catalog.builtin("gpus").with_counts(**{"A100-80GB": 3})
    plan = make_plan(llama(), [("A100-80GB", 2, 0, 32)], dp=2, num_microbatches=256)
    est = es.estimate(plan, cat)
    assert any("rents 4 x A100-80GB" in r and "catalog has 3" in r for r in est.reasons)


@pytest.mark.parametrize(
    ("stages", "fragment"),
    [
        ([(0, 16), (16, 30)], "layers [30, 32) are held by no stage"),
        ([(0, 16), (18, 32)], "layers [16, 18) are held by no stage: stage 1"),
        ([(0, 18), (16, 32)], "layers [16, 18) are held twice"),
        ([(0, 16), (16, 40)], "reach layer 40 but the model has only 32 blocks"),
        ([(2, 16), (16, 32)], "layers [0, 2) are held by no stage: stage 0"),
        ([(0, 32), (32, 32)], "stage 1 (A100-80GB, tp 1, layers [32, 32)) holds no"),
    ],
)
def test_layer_coverage(stages: list[tuple[int, int]], fragment: str) -> None:
    plan = make_plan(llama(), [("A100-80GB", 1, a, b) for a, b in stages], num_microbatches=512)
    est = es.estimate(plan)
    assert not est.feasible
    assert any(fragment in r for r in est.reasons), est.reasons


def test_tp_beyond_a_node_and_not_dividing() -> None:
    plan = make_plan(llama(), [("RTX-A6000", 8, 0, 32)], num_microbatches=512)
    assert any("exceeds the 4 GPUs of a RTX-A6000 node" in r for r in es.estimate(plan).reasons)
    plan = make_plan(llama(), [("A100-80GB", 3, 0, 32)], num_microbatches=512)
    reasons = es.estimate(plan).reasons
    assert any("tp 3 does not divide the model's num_heads (32)" in r for r in reasons)


def test_batch_mismatch() -> None:
    plan = make_plan(llama(), [("A100-80GB", 1, 0, 32)], dp=2, num_microbatches=100)
    reasons = es.estimate(plan).reasons
    assert any("= 200 sequences per step, but the job's global batch is 512" in r
               for r in reasons)


def test_unknown_gpu_is_an_error() -> None:
    plan = make_plan(llama(), [("A100_80GB", 1, 0, 32)], num_microbatches=512)
    with pytest.raises(es.CatalogError, match="did you mean 'A100-80GB'"):
        es.estimate(plan)


def test_feasible_but_late() -> None:
    plan = make_plan(llama(deadline=24), [("A100-80GB", 2, 0, 32)], num_microbatches=512,
                     recompute="full")
    est = es.estimate(plan)
    assert est.feasible and not est.meets_deadline and est.reasons == ()
    assert est.total_hours > 24


def test_faster_gpus_cost_less_time() -> None:
    a = es.estimate(make_plan(llama(), [("A100-80GB", 1, 0, 32)], num_microbatches=512,
                              recompute="full"))
    h = es.estimate(make_plan(llama(), [("H100-SXM", 1, 0, 32)], num_microbatches=512,
                              recompute="full"))
    assert h.iteration_s < a.iteration_s


@pytest.mark.parametrize(("stages", "dp", "groups"), [
    ([("A100-80GB", 1, 0, 32)], 1, 0),        # alone: no communicator
    ([("A100-80GB", 1, 0, 32)], 2, 1),        # DP
    ([("A100-80GB", 2, 0, 32)], 1, 1),        # TP
    ([("A100-80GB", 2, 0, 16), ("A100-80GB", 2, 16, 32)], 2, 3),  # TP, DP and the pipeline
])
def test_each_stage_gives_its_communicators_nccl_buffers(stages: list, dp: int,
                                                         groups: int) -> None:
    """nccl_gb_per_group: a stage's usable memory is the GPU's less the NCCL buffers of each
    communicator its GPUs run collectives in (TP group, DP group, pipeline); memory is
    judged against it, and the plan output shows it."""
    cost = es.CostParams(reserved_gb=0.5, nccl_gb_per_group=0.62)
    plan = make_plan(llama(batch=64 * dp), stages, dp=dp, num_microbatches=64)
    est = es.estimate(es.Plan.from_dict({**plan.to_dict(), "cost_model": cost.to_dict()}))
    spec = es.Catalog.builtin("gpus")["A100-80GB"]
    card = (spec.memory_bytes or spec.memory_gb * 1e9) / 1e9
    usable = card * 0.95 - 0.5
    for st in est.stages:
        assert st.capacity_gb == pytest.approx(usable - 0.62 * groups, rel=1e-12)
    # Enough buffers and every stage that has a communicator runs out of memory.
    heavy = es.CostParams(reserved_gb=0.5, nccl_gb_per_group=40.0)
    over = es.estimate(es.Plan.from_dict({**plan.to_dict(), "cost_model": heavy.to_dict()}))
    oom = [r for r in over.reasons if "GB over" in r]
    assert len(oom) == (len(stages) if groups else len(
        [r for r in est.reasons if "GB over" in r]))
    with pytest.raises(es.SpecError, match="nccl_gb_per_group"):
        es.CostParams(nccl_gb_per_group=-0.1)
