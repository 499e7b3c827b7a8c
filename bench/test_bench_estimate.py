"""How fast the cost model evaluates plans: the search will call it at every leaf.

Each benchmark asserts the result it timed is right before reporting the time.
"""

from __future__ import annotations

import pytest

import espresso as es
from espresso import _core
from espresso.estimate import _workload


def _llama70b_plan(stages: int, m: int) -> es.Plan:
    job = es.Job(model=es.ModelSpec.preset("llama2-70b"), seq_len=4096, global_batch_size=m * 4,
                 tokens=10**11, deadline_hours=24 * 30)
    per = 80 // stages
    types = ["H100-SXM", "A100-80GB"]
    return es.Plan(job=job, dp=4, num_microbatches=m, recompute="full",
                   stages=tuple(es.Stage(gpu=types[i % 2], tp=8,
                                         layers=(i * per, 80 if i == stages - 1 else (i + 1) * per))
                                for i in range(stages)))


@pytest.mark.benchmark(group="estimate")
@pytest.mark.parametrize(("stages", "m"), [(4, 16), (8, 64), (16, 256)])
def test_core_estimate(benchmark: object, stages: int, m: int) -> None:
    """The native estimate alone (what the search's leaves will call)."""
    plan = _llama70b_plan(stages, m)
    cat = es.Catalog.builtin("gpus").with_counts(**{"H100-SXM": 512, "A100-80GB": 512})
    names = list(dict.fromkeys(s.gpu for s in plan.stages))
    args = (plan.job.model._dims(), [cat[n]._spec() for n in names], plan.cost_model._core(),
            _workload(plan),
            [_core.StageSpec(names.index(s.gpu), s.tp, *s.layers) for s in plan.stages])
    res = benchmark(_core.estimate, *args)  # type: ignore[operator]
    assert res.feasible
    assert res.iteration_s == pytest.approx(es.estimate(plan, cat).iteration_s)
    # The pipeline can never beat the work of its bottleneck stage.
    assert res.pipeline_s >= m * max(s.fwd_s + s.bwd_s for s in res.stages) * (1 - 1e-12)


@pytest.mark.benchmark(group="estimate")
def test_python_estimate(benchmark: object) -> None:
    """The full Python estimate(): conversion, native call, words and dataclasses."""
    plan = _llama70b_plan(8, 64)
    cat = es.Catalog.builtin("gpus").with_counts(**{"H100-SXM": 512, "A100-80GB": 512})
    est = benchmark(es.estimate, plan, cat)  # type: ignore[operator]
    assert est.feasible and len(est.stages) == 8


@pytest.mark.benchmark(group="simulate")
@pytest.mark.parametrize(("p", "m"), [(4, 32), (16, 256), (64, 1024)])
def test_simulate_pipeline(benchmark: object, p: int, m: int) -> None:
    f, b = [1.0] * p, [2.0] * p
    c = [0.0] * (p - 1)
    r = benchmark(_core.simulate_pipeline, f, b, c, c, m,  # type: ignore[operator]
                  _core.Schedule.ONE_F_ONE_B)
    assert r.makespan_s == pytest.approx((m + p - 1) * 3.0)
