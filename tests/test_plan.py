"""Plan JSON contract: round trips, estimates identical on read-back, malformed plans."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _helpers import make_plan
from hypothesis import given, settings
from hypothesis import strategies as st

import espresso as es

EXAMPLE = Path(__file__).parents[1] / "examples" / "plans" / "llama2-7b-a100-l40s.json"


def example() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def test_example_plan_reads_and_estimates() -> None:
    plan = es.Plan.from_json(EXAMPLE)
    assert plan.gpus == {"A100-80GB": 4, "L40S": 2}
    assert plan.job.model == es.ModelSpec.preset("llama2-7b")
    est = es.estimate(plan)
    assert est.feasible
    assert len(est.stages) == 2


def test_json_round_trip_estimates_identically(tmp_path: Path) -> None:
    plan = es.Plan.from_json(EXAMPLE).with_estimate()
    path = tmp_path / "plan.json"
    plan.to_json(path)
    back = es.Plan.from_json(path)
    assert back == plan                      # job, stages, estimate: all equal
    assert es.estimate(back) == plan.estimate  # and estimating again gives identical numbers
    assert back.to_dict() == plan.to_dict()
    data = json.loads(path.read_text())
    assert data["schema"] == "espresso.plan/1"
    for key in ("iteration_s", "total_hours", "hourly_usd", "total_usd", "stage_time_s",
                "stage_memory_gb", "feasible", "meets_deadline"):
        assert key in data["estimate"]


def test_cost_model_travels_with_the_plan(tmp_path: Path) -> None:
    plan = es.Plan.from_json(EXAMPLE)
    plan = es.Plan.from_dict({**plan.to_dict(), "cost_model": {"efficiency": 0.3}})
    assert plan.cost_model.efficiency == 0.3
    back = es.Plan.from_json(plan.to_json())
    assert back.cost_model == plan.cost_model
    slow, fast = es.estimate(back), es.estimate(es.Plan.from_json(EXAMPLE))
    assert slow.iteration_s > fast.iteration_s


@settings(max_examples=60, deadline=None)
@given(dp=st.integers(1, 4), mbs=st.sampled_from([1, 2]), split=st.integers(1, 3),
       tp0=st.sampled_from([1, 2]), schedule=st.sampled_from(["1f1b", "gpipe"]),
       recompute=st.sampled_from(["none", "full"]))
def test_round_trip_property(dp: int, mbs: int, split: int, tp0: int, schedule: str,
                             recompute: str) -> None:
    model = es.ModelSpec(name="t", num_layers=4, hidden_size=64, num_heads=4, vocab_size=100)
    job = es.Job(model=model, seq_len=16, global_batch_size=dp * mbs * 4, tokens=10**6,
                 deadline_hours=2.5)
    plan = make_plan(job, [("A100-80GB", tp0, 0, split), ("L4", 1, split, 4)], dp=dp,
                     micro_batch_size=mbs, num_microbatches=4, schedule=schedule,
                     recompute=recompute).with_estimate()
    back = es.Plan.from_json(plan.to_json())
    assert back == plan
    assert es.estimate(back) == plan.estimate


def test_num_microbatches_derived_when_missing() -> None:
    d = example()
    del d["num_microbatches"]
    assert es.Plan.from_dict(d).num_microbatches == 512 // (2 * 1)
    d["micro_batch_size"] = 3
    with pytest.raises(es.PlanError, match="cannot be derived"):
        es.Plan.from_dict(d)


def _mutate(path: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(example())
    keys = path.split(".")
    node: Any = d
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return d


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        ("schema", "espresso.plan/2", "plan.schema"),
        ("dp", 0, "plan.dp"),
        ("dp", "2", "plan.dp"),
        ("micro_batch_size", -1, "plan.micro_batch_size"),
        ("num_microbatches", 0, "plan.num_microbatches"),
        ("num_microbatches", 1.5, "plan.num_microbatches"),
        ("schedule", "interleaved", "plan.schedule"),
        ("recompute", "partial", "plan.recompute"),
        ("stages", [], "plan.stages"),
        ("stages", {"gpu": "L4"}, "plan.stages"),
        ("stages.0.tp", 0, r"stages\[0\]\.tp"),
        ("stages.1.gpu", "", r"stages\[1\]\.gpu"),
        ("stages.1.layers", [20], r"stages\[1\]\.layers"),
        ("stages.1.layers", [20, -1], r"stages\[1\]\.layers\[1\]"),
        ("stages.1.layers", "20-32", r"stages\[1\]\.layers"),
        ("stages.0.layer", [0, 20], "did you mean 'layers'"),
        ("stages.0.gpu", KeyError, "missing required field 'gpu'"),
        ("gpus", {"A100-80GB": 2, "L40S": 2}, "plan.gpus"),
        ("job", KeyError, "missing required field 'job'"),
        ("job.seq_len", 0, "job.seq_len"),
        ("job.model", "llama2-7B", "did you mean 'llama2-7b'"),
        ("job.deadline_hours", "a week", "deadline"),
        ("microbatches", 4, "unknown field 'microbatches'"),
    ],
)
def test_malformed_plans(path: str, value: Any, match: str) -> None:
    with pytest.raises(es.PlanError, match=match):
        es.Plan.from_dict(_mutate(path, value))


def test_bad_plan_files(tmp_path: Path) -> None:
    with pytest.raises(es.PlanError, match="no such file"):
        es.Plan.from_json(tmp_path / "none.json")
    p = tmp_path / "p.json"
    p.write_text("{ not json")
    with pytest.raises(es.PlanError, match="not valid JSON"):
        es.Plan.from_json(p)
    p.write_text("[1, 2]")
    with pytest.raises(es.PlanError, match="mapping"):
        es.Plan.from_json(p)


def test_plans_from_before_the_fidelity_issue_still_load() -> None:
    """Plan files written before sharding existed: the legacy cost-model switch zero1 and
    an end-to-end efficiency keep loading; zero1 makes the plan at least ZeRO-1, so its
    optimizer states are split over the replicas as before."""
    old = {
        "schema": "espresso.plan/1",
        "job": {"model": "llama2-7b", "seq_len": 4096, "global_batch_size": 512,
                "tokens": 2e10, "deadline_hours": 720},
        "dp": 2, "micro_batch_size": 1, "num_microbatches": 256,
        "schedule": "1f1b", "recompute": "full",
        "stages": [{"gpu": "A100-80GB", "tp": 2, "layers": [0, 20]},
                   {"gpu": "L40S", "tp": 1, "layers": [20, 32]}],
        "cost_model": {"zero1": True, "efficiency": 0.45},
    }
    plan = es.Plan.from_dict(old)
    assert plan.sharding == "none" and plan.cost_model.zero1
    assert "sharding" not in plan.to_dict()  # written back as it was read
    est = es.estimate(plan, es.Catalog.builtin("gpus"))
    as_zero1 = es.estimate(replace(plan, sharding="zero1",
                                   cost_model=replace(plan.cost_model, zero1=False)),
                           es.Catalog.builtin("gpus"))
    assert est.stages[0].optimizer_gb == pytest.approx(as_zero1.stages[0].optimizer_gb)
    assert est.iteration_s == pytest.approx(as_zero1.iteration_s)
