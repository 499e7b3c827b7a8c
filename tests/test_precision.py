"""Precision and the GPUs it runs on (issue 30, item 2): bf16 and fp8 jobs only on GPUs with
bf16 tensor cores, fp16 jobs (loss-scaled mixed precision) on any, costed as bf16."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_search import assert_search_equals_brute_force, random_instance, search_cost

import espresso as es
from espresso.cli import main
from espresso.gpu_type import runs_precision

GPUS = es.Catalog.builtin("gpus")


def row(model: str, price: float, **kw: object) -> es.GpuType:
    return replace(GPUS[model], price_per_hour=price, count=8, **kw)


JOB = es.Job(model=es.ModelSpec.preset("gpt3-1.3b"), tokens=2e9, deadline_hours=24 * 30)


def test_the_bf16_flag_comes_from_the_spec_table() -> None:
    assert not GPUS["T4"].bf16 and not GPUS["V100-32GB"].bf16 and GPUS["A100-80GB"].bf16
    own = es.GpuType(name="mine", memory_gb=16, bf16_tflops=50, mem_bandwidth_gbs=500,
                     price_per_hour=1, count=1, gpus_per_node=1, intra_node_gbs=16,
                     inter_node_gbs=1)
    assert own.bf16  # not in the table: assumed to have bf16
    assert "bf16" not in GPUS["T4"].to_dict()  # the table's flag is not written
    flagged = replace(own, bf16=False)
    assert flagged.to_dict()["bf16"] is False
    assert not es.GpuType.from_dict(flagged.to_dict()).bf16
    with pytest.raises(es.CatalogError, match="bf16"):
        replace(own, bf16="no")
    assert [runs_precision(GPUS["T4"], p) for p in ("bf16", "fp16", "fp8")] == [False, True,
                                                                                 False]
    assert [runs_precision(GPUS["H100-SXM"], p) for p in ("bf16", "fp16", "fp8")] == [True] * 3


def test_bf16_jobs_leave_gpus_without_bf16_out_and_fp16_jobs_use_them() -> None:
    # T4 far cheaper per FLOP than A100 here: an fp16 job takes it, a bf16 job cannot.
    cat = es.Catalog(gpus=(row("T4", 0.01), row("A100-80GB", 4.0)))
    bf16 = es.plan(JOB, cat, threads=1)
    fp16 = es.plan(replace(JOB, precision="fp16"), cat, threads=1)
    assert {s.gpu for s in bf16.stages} == {"A100-80GB"}
    assert "T4" in {s.gpu for s in fp16.stages}
    assert fp16.job.precision == "fp16" and fp16.to_dict()["job"]["precision"] == "fp16"
    assert fp16.estimate is not None and bf16.estimate is not None
    assert fp16.estimate.total_usd < bf16.estimate.total_usd
    # On GPUs with both, fp16 costs exactly what bf16 does.
    a100 = es.Catalog(gpus=(row("A100-80GB", 4.0),))
    p16 = es.plan(replace(JOB, precision="fp16"), a100, threads=1)
    p = es.plan(JOB, a100, threads=1)
    assert p16.estimate is not None and p.estimate is not None
    assert p16.estimate.total_usd == pytest.approx(p.estimate.total_usd, rel=1e-12)
    assert [(s.gpu, s.tp, s.layers) for s in p16.stages] == [(s.gpu, s.tp, s.layers)
                                                             for s in p.stages]


def test_no_gpu_for_the_precision_is_explained() -> None:
    old = es.Catalog(gpus=(row("T4", 0.5), row("V100-32GB", 3.0)))
    with pytest.raises(es.JobError, match=r"no GPU type of the catalog has bf16.*fp16"):
        es.plan(JOB, old)
    with pytest.raises(es.JobError, match=r"job.precision fp8: no GPU type .* bf16"):
        es.plan(replace(JOB, precision="fp8"), old)
    ampere = es.Catalog(gpus=(row("A100-80GB", 4.0),))
    with pytest.raises(es.JobError, match=r"fp8: no GPU type of the catalog has fp8"):
        es.plan(replace(JOB, precision="fp8"), ampere)


def test_a_bf16_plan_on_a_gpu_without_bf16_is_refused_by_the_estimate() -> None:
    cat = es.Catalog(gpus=(row("T4", 0.01),))
    plan = es.plan(replace(JOB, precision="fp16"), cat, threads=1)
    assert es.estimate(plan, cat).feasible
    with pytest.raises(es.PlanError, match=r"stage 0: job.precision is bf16 but T4 has no bf16"):
        es.estimate(replace(plan, job=replace(plan.job, precision="bf16")), cat)


def test_offers_of_gpus_without_bf16_carry_the_flag(tmp_path: Path) -> None:
    cat = es.Catalog.from_dict({"offers": [
        {"provider": "aws", "region": "us-east-1", "instance_type": "p3.16xlarge",
         "gpu": "V100-16GB", "gpus_per_instance": 8, "price_per_hour": 24.48, "instances": 2},
        {"provider": "aws", "region": "us-east-1", "instance_type": "p4d.24xlarge",
         "gpu": "A100-40GB", "gpus_per_instance": 8, "price_per_hour": 21.96, "instances": 2}]})
    v100, a100 = cat.gpus
    assert not v100.bf16 and a100.bf16
    path = tmp_path / "c.yaml"
    cat.save(path)
    assert [g.bf16 for g in es.Catalog.load(path)] == [False, True]


def test_cli_precision_fp16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cat = tmp_path / "old.yaml"
    es.Catalog(gpus=(row("T4", 0.5), row("V100-32GB", 3.0))).save(cat)
    rc = main(["plan", "--model", "gpt3-1.3b", "--tokens", "2e9", "--deadline", "30d",
               "--catalog", str(cat)])
    out = capsys.readouterr()
    assert rc == 2 and "--precision fp16" in out.out + out.err
    js = tmp_path / "p.json"
    rc = main(["plan", "--model", "gpt3-1.3b", "--tokens", "2e9", "--deadline", "30d",
               "--catalog", str(cat), "--precision", "fp16", "--json", str(js),
               "--threads", "1"])
    capsys.readouterr()
    assert rc == 0 and json.loads(js.read_text())["job"]["precision"] == "fp16"


def test_the_runner_trains_an_fp16_plan_with_loss_scaling() -> None:
    pytest.importorskip("torch")
    from espresso.train.loop import resolve_precision

    cat = es.Catalog(gpus=(row("A100-80GB", 4.0),))
    plan = es.plan(replace(JOB, precision="fp16"), cat, threads=1)
    cuda = SimpleNamespace(type="cuda")
    # An fp16 plan runs in fp16 (with loss scaling) even where bf16 is available.
    assert resolve_precision("auto", plan, cuda) == "fp16"
    assert resolve_precision("auto", plan, SimpleNamespace(type="cpu")) == "fp32"
    assert resolve_precision("bf16", plan, cuda) == "bf16"  # asked for: as asked


@pytest.mark.parametrize("seed", range(24))
def test_search_with_gpus_without_bf16_equals_brute_force(seed: int) -> None:
    """Random instances where some rows lack bf16 and the job is bf16 or fp16: the search's
    optimum is the brute force's over the rows the precision runs on."""
    rng = random.Random(1000 + seed)
    job, catalog = random_instance(seed, 2)
    rows = tuple(replace(g, bf16=rng.random() < 0.5) for g in catalog.gpus)
    catalog = es.Catalog(gpus=rows)
    job = replace(job, precision=rng.choice(["bf16", "fp16"]))
    if job.precision == "bf16" and not any(g.bf16 for g in rows):
        with pytest.raises(es.JobError, match="fp16"):
            search_cost(job, catalog, 2)
        return
    assert_search_equals_brute_force(job, catalog)
