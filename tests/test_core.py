"""The compiled core's surface: the stub matches it, and its boundary refuses bad input
with ValueError instead of crashing."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

import espresso as es
from espresso import _core


def test_stub_names_match_the_module() -> None:
    stub = Path(es.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {n for n in dir(_core) if not n.startswith("_")}
    assert names == public


def _dims() -> _core.ModelDims:
    return es.ModelSpec(name="m", num_layers=2, hidden_size=64, num_heads=4,
                        vocab_size=10)._dims()


def _work(**kw: object) -> _core.Workload:
    w = _core.Workload()
    w.seq_len, w.micro_batch_size, w.num_microbatches, w.dp = 8, 1, 2, 1
    w.global_batch_size, w.iterations, w.deadline_hours = 2, 1.0, 1.0
    for k, v in kw.items():
        setattr(w, k, v)
    return w


def _gpu(**kw: object) -> _core.GpuSpec:
    g = es.Catalog.builtin("gpus")["L4"]._spec()
    for k, v in kw.items():
        setattr(g, k, v)
    return g


@pytest.mark.parametrize(
    ("gpu", "work", "stages", "match"),
    [
        ({"memory_gb": -1.0}, {}, [(0, 1, 0, 2)], r"gpus\[0\]\.memory_gb"),
        ({"tflops": math.nan}, {}, [(0, 1, 0, 2)], r"gpus\[0\]\.bf16_tflops"),
        ({"inter_node_gbs": math.inf}, {}, [(0, 1, 0, 2)], "inter_node_gbs"),
        ({"efficiency": 2.0}, {}, [(0, 1, 0, 2)], "efficiency"),
        ({"gpus_per_node": 0}, {}, [(0, 1, 0, 2)], "gpus_per_node"),
        ({}, {"seq_len": 0}, [(0, 1, 0, 2)], "seq_len"),
        ({}, {"num_microbatches": 0}, [(0, 1, 0, 2)], "num_microbatches"),
        ({}, {"dp": -3}, [(0, 1, 0, 2)], "dp"),
        ({}, {"iterations": -1.0}, [(0, 1, 0, 2)], "iterations"),
        ({}, {}, [], "number of stages"),
        ({}, {}, [(1, 1, 0, 2)], r"stages\[0\]\.gpu"),
        ({}, {}, [(-1, 1, 0, 2)], r"stages\[0\]\.gpu"),
        ({}, {}, [(0, 0, 0, 2)], r"stages\[0\]\.tp"),
        ({}, {}, [(0, 1, -5, 2)], r"stages\[0\]\.layers"),
        ({}, {}, [(0, 1, 0, 10**9)], r"stages\[0\]\.layers"),
        ({}, {"num_microbatches": 1 << 20}, [(0, 1, 0, 1)] * 8, "stages \\* num_microbatches"),
    ],
)
def test_core_estimate_refuses_bad_input(gpu: dict[str, object], work: dict[str, object],
                                         stages: list[tuple[int, int, int, int]],
                                         match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _core.estimate(_dims(), [_gpu(**gpu)], es.CostParams()._core(), _work(**work),
                       [_core.StageSpec(*s) for s in stages])


def test_core_refuses_bad_model() -> None:
    d = _dims()
    d.num_heads = 3
    with pytest.raises(ValueError, match=r"model\.hidden_size"):
        _core.estimate(d, [_gpu()], es.CostParams()._core(), _work(),
                       [_core.StageSpec(0, 1, 0, 2)])
    d = _dims()
    d.vocab_size = 0
    with pytest.raises(ValueError, match=r"model\.vocab_size"):
        _core.validate_model(d)


def test_core_refuses_bad_cost_params() -> None:
    p = _core.CostParams()
    p.link_efficiency = 0.0
    with pytest.raises(ValueError, match=r"cost_model\.link_efficiency"):
        _core.validate_cost_params(p)
    with pytest.raises(es.SpecError, match=r"cost_model\.memory_reserve_fraction"):
        es.CostParams(memory_reserve_fraction=1.0)
    with pytest.raises(es.SpecError, match=r"cost_model\.zero1"):
        es.CostParams(zero1="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("efficiency", 0.0), ("efficiency", 1.5), ("bytes_per_weight", 0.0),
     ("bytes_per_grad", -2.0), ("bytes_per_activation", float("nan")),
     ("bytes_per_logit", -1.0), ("reserved_gb", -1.0), ("memory_reserve_fraction", -0.1),
     ("link_efficiency", 2.0), ("link_latency_s", -1e-5),
     ("optimizer_step_bytes_per_param", float("inf")), ("memory_bandwidth_efficiency", 0.0),
     ("flash_attention", 1), ("dropout_masks", "no")],
)
def test_every_cost_param_is_checked(field: str, value: object) -> None:
    with pytest.raises(es.SpecError, match=rf"cost_model\.{field}"):
        es.CostParams(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(es.SpecError, match=rf"cost_model\.{field}"):
        es.CostParams.from_dict({field: value})
