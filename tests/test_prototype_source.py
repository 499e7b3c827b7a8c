"""The paper's prototype planner run from its source (espresso.prototype_source): what it is
given, how its answer becomes a plan, and the process that runs it, against a stand-in
checkout with the prototype's interface; the real one runs when $ESPRESSO_PROTOTYPE_SRC
names a checkout (with $ESPRESSO_PROTOTYPE_PYTHON an interpreter holding its dependencies)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import espresso as es
from espresso.baselines import BASELINES, EXTERNAL_BASELINES, baseline
from espresso.bench.suite import suite_from_dict
from espresso.errors import EspressoError, SpecError
from espresso.prototype_source import (
    ENV_SOURCE,
    plan_from_result,
    prototype_input,
    run_prototype,
    source_dir,
    unavailable,
)

ROOT = Path(__file__).parents[1]
CATALOG = ROOT / "examples/catalogs/espresso-prototype.yaml"

# A stand-in for the prototype's planner with its interface (Espresso.GPUAllocator with
# gpu_allocator(model, beta), load_gpus_from_config, limit; Espresso.utils with GPU, Model):
# it plans two stages of the GPU with the most memory, as many replicas as `limit` allows
# (at most 4), and splits the layers evenly: enough to see that the runner hands it the
# job's GPUs, availability and model.
_UTILS = '''
class GPU:
    def __init__(self, name, cost, flops_efficiency, hbm_memory_efficiency,
                 mem_per_GPU_in_GB, peak_fp16_TFLOPS):
        self.name, self.cost, self.mem = name, cost, mem_per_GPU_in_GB

class Model:
    def __init__(self, **kw):
        self.__dict__.update(kw)
'''
_ALLOCATOR = '''
limit = None
def load_gpus_from_config():
    raise RuntimeError("the runner must replace the GPU list")
def gpu_allocator(model, beta=0.8, model_config=None):
    if test_overhead or testBP or testCP:
        raise RuntimeError("switches must be off")
    gpus = load_gpus_from_config()
    if MODE == "fail":
        raise ValueError("broken on purpose")
    if MODE == "none":
        return {"money_cost": 10000000000}
    i = max(range(len(gpus)), key=lambda k: gpus[k].mem)
    dp = 1
    while dp * 2 * 2 <= limit[i] and dp < 4:
        dp *= 2
    half = model.model_layer // 2
    return {"model_name": model.model_name, "gpus_permutation": [gpus[i].name] * 2,
            "tp_size": 1, "pp_size": 2, "dp_size": dp,
            "money_cost": 2 * dp * gpus[i].cost * model.slo / 3600, "time_cost": model.slo / 2,
            "layer_distribution": [half, model.model_layer - half], "success": True,
            "seen": {"limit": limit, "slo": model.slo, "gas": model.gradient_accumulation_steps,
                     "model_name": model.model_name}}
'''


def _fake_source(tmp: Path, mode: str = "plan") -> Path:
    src = tmp / "Espresso-src"
    pkg = src / "Espresso"
    (pkg / "llm-analysis" / "llm_analysis" / "model_configs").mkdir(parents=True)
    (pkg / "llm-analysis" / "llm_analysis" / "model_configs" / "open_llama_3b_v2.json"
     ).write_text("{}")
    (pkg / "utils.py").write_text(_UTILS)
    (pkg / "GPUAllocator.py").write_text(f"MODE = {mode!r}\n" + _ALLOCATOR)
    return src


def _paper_job(model: str = "open_llama_3b_v2") -> es.Job:
    return es.Job(model=es.ModelSpec.preset(model), seq_len=3000, global_batch_size=64,
                  iterations=1000, deadline_hours=100_000 / 3600)


def test_source_is_optional_and_a_wrong_one_is_named(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SOURCE, raising=False)
    assert source_dir() is None
    assert ENV_SOURCE in (unavailable() or "")
    with pytest.raises(SpecError, match=r"source: .* lacks Espresso/GPUAllocator.py"):
        source_dir(tmp_path)
    monkeypatch.setenv(ENV_SOURCE, str(tmp_path))
    assert "ESPRESSO_PROTOTYPE_SRC" in (unavailable() or "")
    with pytest.raises(SpecError, match=r"\$ESPRESSO_PROTOTYPE_SRC: .* is not a checkout"):
        run_prototype(_paper_job(), es.Catalog.load(CATALOG), source=None)
    monkeypatch.delenv(ENV_SOURCE)
    with pytest.raises(SpecError, match=r"source: set \$ESPRESSO_PROTOTYPE_SRC"):
        run_prototype(_paper_job(), es.Catalog.load(CATALOG))


def test_it_is_given_the_job_and_catalog(tmp_path: Path) -> None:
    src = _fake_source(tmp_path)
    given = prototype_input(_paper_job(), es.Catalog.load(CATALOG), src)
    names = [g["name"] for g in given.spec["gpus"]]
    assert names == ["a30-pcie-24gb", "a6000-pcie4-48gb", "a4000-pcie4-16gb", "3090-pcie4-24gb"]
    assert given.spec["limits"] == [16, 8, 16, 16]
    a30 = given.spec["gpus"][0]
    assert (a30["cost"], a30["flops_efficiency"], a30["mem_per_GPU_in_GB"],
            a30["peak_fp16_TFLOPS"]) == (4.0, 0.43, 24, 165)
    model = given.spec["model"]
    assert model["slo"] == pytest.approx(100.0)
    assert model["model_name"] == "open_llama_3b_v2"  # its own config of that name
    assert (model["global_batch_size"], model["seq_len"], model["model_layer"]) == (64, 3000, 26)
    # A model it has no config for is written out for its llm-analysis to read.
    other = prototype_input(_paper_job("llama2-7b"), es.Catalog.load(CATALOG), src,
                            work_dir=tmp_path)
    path = Path(other.spec["model"]["model_name"])
    cfg = json.loads(path.read_text())
    assert (cfg["num_layers"], cfg["hidden_dim"], cfg["ffn_embed_dim"]) == (32, 4096, 11008)
    with pytest.raises(SpecError, match="micro_batches: 5 does not divide"):
        prototype_input(_paper_job(), es.Catalog.load(CATALOG), src, micro_batches=5)


def test_gpus_it_does_not_know_are_left_out_and_said_so(tmp_path: Path) -> None:
    src = _fake_source(tmp_path)
    given = prototype_input(_paper_job(), es.Catalog.builtin("gpus"), src)
    known = {g["name"] for g in given.spec["gpus"]}
    assert "h100-sxm-80gb" in known and "a100-sxm-80gb" in known
    assert any(s.startswith("H200:") and "no config" in s for s in given.skipped)
    assert any(s.startswith("MI300X:") for s in given.skipped)


def test_its_answer_becomes_an_estimated_plan() -> None:
    catalog = es.Catalog.load(CATALOG)
    job = _paper_job()
    rows = {"a6000-pcie4-48gb": catalog["RTX-A6000"]}
    answer = {"gpus_permutation": ["a6000-pcie4-48gb"] * 3, "dp_size": 1, "pp_size": 3,
              "layer_distribution": [9, 9, 8], "success": True, "time_cost": 44.35}
    plan = plan_from_result(answer, job, catalog, rows)
    assert plan is not None and plan.estimate is not None
    assert [(s.gpu, s.layers) for s in plan.stages] == [
        ("RTX-A6000", (0, 9)), ("RTX-A6000", (9, 18)), ("RTX-A6000", (18, 26))]
    assert (plan.dp, plan.micro_batch_size, plan.num_microbatches) == (1, 16, 4)
    assert plan.recompute == "full" and plan.estimate.feasible
    # Whole instances: 3 of the node's 8 GPUs used, all 8 paid.
    assert plan.estimate.hourly_usd == pytest.approx(8 * 6.0)
    assert plan_from_result({**answer, "success": False}, job, catalog, rows) is None
    assert plan_from_result({"money_cost": 1e10}, job, catalog, rows) is None
    with pytest.raises(EspressoError, match="splits 25 layers"):
        plan_from_result({**answer, "layer_distribution": [9, 8, 8]}, job, catalog, rows)
    with pytest.raises(EspressoError, match="names 'x'"):
        plan_from_result({**answer, "gpus_permutation": ["x"] * 3}, job, catalog, rows)


def test_run_hands_its_planner_the_job_and_reads_its_answer(tmp_path: Path) -> None:
    src = _fake_source(tmp_path)
    catalog = es.Catalog.load(CATALOG)
    run = run_prototype(_paper_job(), catalog, source=src, timeout_s=120)
    seen = run.result["seen"]
    assert seen["limit"] == [16, 8, 16, 16, 0]  # its availability list, as its source has it
    assert seen["slo"] == pytest.approx(100.0) and seen["gas"] == 4
    # The stand-in picks the GPU with the most memory (the A6000s, 8 of them): 2 stages x
    # dp 4.
    assert run.plan is not None
    assert {s.gpu for s in run.plan.stages} == {"RTX-A6000"} and run.plan.dp == 4
    assert run.seconds >= 0


def test_its_failures_are_explained(tmp_path: Path) -> None:
    catalog = es.Catalog.load(CATALOG)
    with pytest.raises(EspressoError, match="its planner failed: ValueError: broken on purpose"):
        run_prototype(_paper_job(), catalog, source=_fake_source(tmp_path / "a", "fail"))
    none = run_prototype(_paper_job(), catalog, source=_fake_source(tmp_path / "b", "none"))
    assert none.plan is None
    with pytest.raises(EspressoError, match="cannot start"):
        run_prototype(_paper_job(), catalog, source=_fake_source(tmp_path / "c"),
                      python=str(tmp_path / "no-such-python"))


def test_it_is_a_baseline_by_name_only() -> None:
    assert "prototype-source" in EXTERNAL_BASELINES and "prototype-source" not in BASELINES
    assert baseline("prototype-source") is EXTERNAL_BASELINES["prototype-source"]
    assert baseline("prototype") is BASELINES["prototype"]
    suite = suite_from_dict({"models": ["gpt3-1.3b"], "tokens": 1e9, "deadlines": ["48h"],
                             "baselines": ["prototype", "prototype-source"]})
    assert suite.baselines == ("prototype", "prototype-source")
    assert "prototype-source" not in suite_from_dict(
        {"models": ["gpt3-1.3b"], "tokens": 1e9, "deadlines": ["48h"]}).baselines


@pytest.mark.skipif(not os.environ.get(ENV_SOURCE), reason=f"${ENV_SOURCE} not set")
def test_the_real_prototype_on_its_own_instance() -> None:
    """Its planner, from its source, on its example: a plan within the SLO by its own model,
    which Espresso's optimum does not cost more than (Espresso's space holds it)."""
    catalog = es.Catalog.load(CATALOG)
    job = _paper_job()
    run = run_prototype(job, catalog)
    assert run.result["success"] and run.result["time_cost"] < 100
    assert run.plan is not None and run.plan.estimate is not None
    best = es.plan(job, catalog)
    assert best.estimate is not None
    assert best.estimate.total_usd <= run.plan.estimate.total_usd
