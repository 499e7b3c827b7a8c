"""This machine's CPU as a catalog (`espresso calibrate --cpu`), the fp32 cost model that goes
with it, and `--cost-model FILE` on plan, estimate and profile."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import espresso as es
from espresso import calibrate
from espresso.cli import main

ROOT = Path(__file__).parents[1]
SMALL = es.ModelSpec(name="small-gpt", num_layers=4, hidden_size=64, num_heads=4,
                     ffn_hidden_size=256, vocab_size=256, gated_mlp=False, norm="layernorm",
                     linear_bias=True, position_embeddings=32)


def _job(tmp_path: Path, deadline_hours: float = 24.0) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"model": SMALL.to_dict(), "seq_len": 32,
                                   "global_batch_size": 8, "iterations": 100,
                                   "deadline_hours": deadline_hours}))
    return job


def test_cpu_catalog_and_cost_model() -> None:
    cost = calibrate.cpu_cost_model(7e-5)
    assert (cost.bytes_per_weight, cost.bytes_per_grad, cost.bytes_per_activation) == (4, 4, 4)
    assert cost.link_latency_s == 7e-5 and cost.reserved_gb == 0 and cost.link_efficiency == 1
    cat = calibrate.cpu_catalog(cores=3, memory_gb=4.0, tflops=0.09, mem_gbs=6.0, link_gbs=3.5)
    g = cat["CPU"]
    assert (g.count, g.gpus_per_node, g.price_per_hour, g.efficiency) == (3, 3, 1.0, 1.0)
    # fp32 states: 4 + 4 + 12 bytes a parameter, against 2 + 2 + 12 by default.
    job = es.Job(model=SMALL, seq_len=32, global_batch_size=8, iterations=10, deadline_hours=1)
    plan = es.Plan(job=job, stages=(es.Stage(gpu="CPU", layers=(0, 4)),), num_microbatches=8)
    fp32 = es.estimate(es.Plan.from_dict({**plan.to_dict(), "cost_model": cost.to_dict()}), cat)
    bf16 = es.estimate(plan, cat)
    assert fp32.stages[0].memory_gb > bf16.stages[0].memory_gb


def test_cost_model_file_on_plan_and_estimate(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cost = tmp_path / "cost.yaml"
    cost.write_text("bytes_per_weight: 4.0\nbytes_per_grad: 4.0\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--job", str(_job(tmp_path)), "--cost-model", str(cost),
                 "--no-compare", "--json", str(out)]) == 0
    plan = es.Plan.from_json(out)
    assert plan.cost_model == es.CostParams(bytes_per_weight=4.0, bytes_per_grad=4.0)
    assert plan.estimate == es.estimate(plan)
    # estimate --cost-model replaces the plan's constants (here: back to the defaults, given
    # under a `cost_model:` key): less memory for the same stages.
    default = tmp_path / "default.yaml"
    default.write_text("cost_model: {}\n")
    again = tmp_path / "again.json"
    capsys.readouterr()
    assert main(["estimate", str(out), "--cost-model", str(default), "--json", str(again)]) == 0
    est = es.Plan.from_json(again)
    assert est.cost_model == es.CostParams()
    assert est.estimate.stages[0].memory_gb < plan.estimate.stages[0].memory_gb  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "message"), [
    ("- 1\n- 2\n", "is not a mapping of cost-model constants"),
    ("bytes_per_wieght: 4\n", "bytes_per_wieght"),
    ("link_efficiency: -1\n", "link_efficiency"),
])
def test_bad_cost_model_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          text: str, message: str) -> None:
    cost = tmp_path / "cost.yaml"
    cost.write_text(text)
    assert main(["plan", "--job", str(_job(tmp_path)), "--cost-model", str(cost)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert main(["plan", "--job", str(_job(tmp_path)), "--cost-model",
                 str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--cpu", "--bench", "b.json"],
     "exactly one of --bench FILE, --profile FILE, --cpu or --from-run METRICS"),
    ([], "exactly one of"),
    (["--bench", "b.json", "--cores", "2"], "--cost-out and --cores go with --cpu"),
    (["--cpu", "--gpu", "L4"], "drop --catalog/--gpu"),
])
def test_calibrate_refuses_mixed_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       argv: list[str], message: str) -> None:
    assert main(["calibrate", *argv, "--out", str(tmp_path / "c.yaml")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.torch
def test_cpu_calibrate_profile_plan_and_run(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The walk-through of docs/profiling.md ("Check a prediction yourself"): measure this
    CPU, profile the model on one thread, plan with both, run the plan with `launch --local`,
    and the example prints its median step time next to the plan's estimate."""
    pytest.importorskip("torch")
    cat, prof, plan_json = tmp_path / "cpu.yaml", tmp_path / "prof.json", tmp_path / "plan.json"
    assert main(["calibrate", "--cpu", "--cores", "2", "--out", str(cat)]) == 0
    assert "gloo link" in capsys.readouterr().out
    g = es.Catalog.load(cat)["CPU"]
    assert g.count == 2 and g.intra_node_gbs > 0 and g.mem_bandwidth_gbs > 0
    cost_file = tmp_path / "cpu-cost.yaml"
    cost = es.CostParams.from_dict(yaml.safe_load(cost_file.read_text()))
    assert cost.bytes_per_activation == 4.0 and 0 < cost.link_latency_s < 1
    model = tmp_path / "small.yaml"
    model.write_text(json.dumps(SMALL.to_dict()))
    assert main(["profile", "--model", str(model), "--gpu", "CPU", "--catalog", str(cat),
                 "--threads", "1", "--seq-len", "32", "--repeats", "3", "--warmup", "1",
                 "--cost-model", str(cost_file), "--out", str(prof)]) == 0
    assert es.Profile.load(prof).meta["threads"] == 1
    assert main(["plan", "--job", str(_job(tmp_path)), "--catalog", str(cat), "--cost-model",
                 str(cost_file), "--profile", f"CPU={prof}", "--max-tp", "1",
                 "--json", str(plan_json)]) == 0
    plan = es.Plan.from_json(plan_json)
    assert plan.cost_model == cost and plan.estimate is not None
    r = subprocess.run([sys.executable, "-m", "espresso.cli", "launch", str(plan_json),
                        "--local", "--script", str(ROOT / "examples" / "train_gpt.py"),
                        "--script-args", "--steps 5 --warmup 2"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OMP_NUM_THREADS=1" in r.stdout
    m = re.search(r"median step time (\S+) s over steps 2-4; the plan's estimate: (\S+) s",
                  r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) > 0 and m.group(2) == f"{plan.estimate.iteration_s:.3f}"


def test_profile_threads_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main(["profile", "--model", "llama2-7b", "--gpu", "L4", "--threads", "0",
                 "--out", str(tmp_path / "p.json")]) == 2
    assert "--threads 0 is out of range" in capsys.readouterr().err
