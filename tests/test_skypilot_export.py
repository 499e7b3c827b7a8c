"""`espresso export skypilot`: the tasks name what the plan rents, every rank runs exactly once
across the node groups, and the exported run steps, executed here as SkyPilot would on each
node (CPU, gloo), train the example to its single-process losses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import espresso as es
from espresso.cli import main
from espresso.cloud.skypilot_export import export
from espresso.cloud.spot import with_spot

ROOT = Path(__file__).parents[1]
TINY = ROOT / "examples" / "plans" / "tiny-gpt-2x2.json"
L4 = "aws/us-east-1/g6.12xlarge"      # 4 x L4
A10G = "aws/us-east-1/g5.12xlarge"    # 4 x A10G


def tiny_on_offers(second: str = A10G) -> es.Plan:
    """The 2 x 2 example (pp 2, dp 2) with stage 0 on one L4 instance and stage 1 on `second`."""
    plan = es.Plan.from_json(TINY)
    stages = (replace(plan.stages[0], gpu="L4", offer=L4),
              replace(plan.stages[1], gpu=es.Catalog.builtin().row("", second).model,
                      offer=second))
    plan = replace(plan, stages=stages, estimate=None)
    cat = with_spot(es.Catalog.builtin())
    return replace(plan, estimate=es.estimate(plan, cat))


def _commands(folder: Path) -> list[tuple[str, int, str]]:
    out = []
    for f in sorted(folder.glob("group*.yaml")):
        spec = yaml.safe_load(f.read_text())
        for line in spec["run"].splitlines():
            m = re.match(r"\s*(\d+)\) (.*) ;;$", line)
            if m:
                out.append((f.name, int(m.group(1)), m.group(2)))
    return out


def test_tasks_name_the_rented_offers_and_every_rank_runs_once(tmp_path: Path) -> None:
    plan = tiny_on_offers()
    files = export(plan, tmp_path, script="train.py")
    assert {f.name for f in files} == {"plan.json", "group0.yaml", "group1.yaml", "launch.sh",
                                       "recover.sh"}
    assert es.Plan.from_json(tmp_path / "plan.json") == plan
    est = plan.estimate
    assert est is not None
    for i, r in enumerate(est.rent):
        spec = yaml.safe_load((tmp_path / f"group{i}.yaml").read_text())
        res = spec["resources"]
        assert (res["cloud"], res["region"], res["instance_type"]) == (
            r["provider"], r["region"], r["instance_type"])
        assert spec["num_nodes"] == r["instances"] and res["use_spot"] is False
        mounted = spec["file_mounts"]["/tmp/espresso/plan.json"]
        assert mounted == str((tmp_path / "plan.json").resolve())
    ranks: list[int] = []
    node_ranks = []
    for _, _, cmd in _commands(tmp_path):
        first = int(re.search(r"ESPRESSO_FIRST_RANK=(\d+)", cmd).group(1))  # type: ignore[union-attr]
        n = int(re.search(r"--nproc-per-node=(\d+)", cmd).group(1))  # type: ignore[union-attr]
        ranks += range(first, first + n)
        node_ranks.append(int(re.search(r"--node-rank=(\d+)", cmd).group(1)))  # type: ignore[union-attr]
        assert "--nnodes=2" in cmd
    assert sorted(ranks) == list(range(plan.num_gpus))
    assert sorted(node_ranks) == [0, 1]
    # The group of rank 0 finds the master itself; the others take it from launch.sh.
    g0 = yaml.safe_load((tmp_path / "group0.yaml").read_text())
    g1 = yaml.safe_load((tmp_path / "group1.yaml").read_text())
    assert "SKYPILOT_NODE_IPS" in g0["run"] and "MASTER_ADDR" not in g0["envs"]
    assert g1["envs"]["MASTER_ADDR"] == ""
    for script in ("launch.sh", "recover.sh"):
        assert os.access(tmp_path / script, os.X_OK)
        subprocess.run(["bash", "-n", str(tmp_path / script)], check=True)
    text = (tmp_path / "launch.sh").read_text()
    assert text.count("sky launch") == 2 and text.count("sky exec") == 2


def test_spot_plans_need_a_checkpoint_bucket_and_one_offer_plans_are_managed_jobs(
        tmp_path: Path) -> None:
    plan = tiny_on_offers()
    spot = replace(plan, stages=tuple(replace(s, offer=s.offer + ":spot") for s in plan.stages),
                   estimate=None)
    spot = replace(spot, estimate=es.estimate(spot, with_spot(es.Catalog.builtin())))
    with pytest.raises(es.PlanError, match="--checkpoint-bucket"):
        export(spot, tmp_path / "a")
    export(spot, tmp_path / "b", checkpoint_bucket="s3://bucket/run")
    spec = yaml.safe_load((tmp_path / "b" / "group1.yaml").read_text())
    assert spec["resources"]["use_spot"] is True
    assert spec["file_mounts"]["/checkpoints"] == {"source": "s3://bucket/run", "mode": "MOUNT"}
    assert "--checkpoint-dir /checkpoints/espresso" in spec["run"]
    # Both stages on one offer: one group, and a managed job SkyPilot recovers itself.
    one = replace(spot, stages=tuple(replace(s, gpu="L4", offer=L4 + ":spot")
                                     for s in spot.stages), estimate=None)
    one = replace(one, estimate=es.estimate(one, with_spot(es.Catalog.builtin())))
    export(one, tmp_path / "c", checkpoint_bucket="s3://bucket/run")
    job = yaml.safe_load((tmp_path / "c" / "jobs" / "group0.yaml").read_text())
    assert job["resources"]["job_recovery"]["strategy"] == "FAILOVER"
    assert job["num_nodes"] == 1 and "MASTER_ADDR" not in job["envs"]
    # Several groups as managed jobs: rank 0's group publishes its address in the bucket.
    g0 = yaml.safe_load((tmp_path / "b" / "jobs" / "group0.yaml").read_text())
    g1 = yaml.safe_load((tmp_path / "b" / "jobs" / "group1.yaml").read_text())
    assert "> /checkpoints/espresso/master-addr" in g0["run"]
    assert "MASTER_ADDR=$(cat /checkpoints/espresso/master-addr)" in g1["run"]
    assert "MASTER_ADDR" not in g1["envs"]
    assert all(g["resources"]["job_recovery"]["max_restarts_on_errors"] > 0 for g in (g0, g1))
    assert (tmp_path / "b" / "jobs.sh").read_text().count("sky jobs launch") == 2
    subprocess.run(["bash", "-n", str(tmp_path / "b" / "jobs.sh")], check=True)
    for f in (tmp_path / "b" / "jobs").glob("*.yaml"):
        subprocess.run(["bash", "-n", "-c", yaml.safe_load(f.read_text())["run"]], check=True)
    # A plain GPU-type plan has no offers to rent.
    tiny = es.Plan.from_json(TINY)
    tiny = replace(tiny, estimate=es.estimate(tiny))
    with pytest.raises(es.PlanError, match="SkyPilot needs cloud offers"):
        export(tiny, tmp_path / "d")


def test_exported_run_steps_train_the_example_as_the_reference(tmp_path: Path) -> None:
    """Each node's run step, run here with the variables SkyPilot sets (node rank, node IPs,
    MASTER_ADDR from launch.sh), with the exported torchrun commands: two 'nodes' of two
    processes each, on CPU with gloo; the losses equal the single-process reference."""
    pytest.importorskip("torch")
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    plan = tiny_on_offers()
    script = ROOT / "examples" / "train_gpt.py"
    export(plan, tmp_path, script=str(script), script_args="--steps 3")
    # The plan file is mounted at /tmp/espresso/plan.json: point the commands at ours.
    procs = []
    for f in sorted(tmp_path.glob("group*.yaml")):
        run = yaml.safe_load(f.read_text())["run"].replace("/tmp/espresso/plan.json",
                                                           str(tmp_path / "plan.json"))
        env = {**os.environ, "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "127.0.0.1",
               "MASTER_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(["bash", "-c", run], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
    got = [float(x) for o in outs for x in re.findall(r"loss (\S+),", o[0])]
    ref = subprocess.run([sys.executable, str(script), "--plan", str(TINY), "--reference",
                          "--steps", "3"], capture_output=True, text=True, timeout=120,
                         check=True)
    want = [float(x) for x in re.findall(r"loss (\S+),", ref.stdout)]
    assert len(got) == len(want) == 3
    assert got == pytest.approx(want, abs=2e-4)


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = tmp_path / "plan.json"
    tiny_on_offers().to_json(plan_file)
    assert main(["export", "skypilot", str(plan_file), "--out", str(tmp_path / "sky")]) == 0
    assert "launch.sh" in capsys.readouterr().out
    assert main(["export", "skypilot", str(TINY), "--out", str(tmp_path / "x")]) == 2
    assert "SkyPilot needs cloud offers" in capsys.readouterr().err


def test_skypilot_loads_every_exported_task(tmp_path: Path) -> None:
    """With SkyPilot installed, its own parser loads every file (skipped without it)."""
    sky = pytest.importorskip("sky")
    plan = tiny_on_offers()
    export(plan, tmp_path, checkpoint_bucket="s3://bucket/run")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for f in sorted([*tmp_path.glob("*.yaml"), *tmp_path.glob("jobs/*.yaml")]):
            task = sky.Task.from_yaml(str(f))
            assert task.num_nodes >= 1
    finally:
        os.chdir(cwd)
    assert json.loads((tmp_path / "plan.json").read_text())["schema"] == "espresso.plan/1"
