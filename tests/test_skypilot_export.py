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
from espresso.train.metrics import read_metrics

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


TRAIN = {"data": "examples/data/espresso.txt", "workdir": str(ROOT)}
"""espresso train on the example text, the repository as the workdir."""


def test_tasks_name_the_rented_offers_and_every_rank_runs_once(tmp_path: Path) -> None:
    plan = tiny_on_offers()
    done = export(plan, tmp_path, **TRAIN)
    assert {f.name for f in done.files} == {"plan.json", "group0.yaml", "group1.yaml",
                                            "launch.sh", "recover.sh"}
    # Two groups without a bucket: no managed jobs, and the user is told why.
    assert len(done.notes) == 1 and "jobs.sh (SkyPilot managed jobs) is not written" in \
        done.notes[0]
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
        export(spot, tmp_path / "a", **TRAIN)
    done = export(spot, tmp_path / "b", checkpoint_bucket="s3://bucket/run", **TRAIN)
    assert done.notes == []
    spec = yaml.safe_load((tmp_path / "b" / "group1.yaml").read_text())
    assert spec["resources"]["use_spot"] is True
    assert spec["file_mounts"]["/checkpoints"] == {"source": "s3://bucket/run", "mode": "MOUNT"}
    assert "--checkpoint-dir /checkpoints/espresso" in spec["run"]
    # Both stages on one offer: one group, and a managed job SkyPilot recovers itself.
    one = replace(spot, stages=tuple(replace(s, gpu="L4", offer=L4 + ":spot")
                                     for s in spot.stages), estimate=None)
    one = replace(one, estimate=es.estimate(one, with_spot(es.Catalog.builtin())))
    export(one, tmp_path / "c", checkpoint_bucket="s3://bucket/run", **TRAIN)
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
        export(tiny, tmp_path / "d", **TRAIN)


def test_exported_run_steps_train_as_the_reference(tmp_path: Path) -> None:
    """Each node's run step, run here from the workdir with the variables SkyPilot sets (node
    rank, node IPs, MASTER_ADDR from launch.sh): `espresso train` under the exported torchrun
    commands, two 'nodes' of two processes each, on CPU with gloo; the losses equal the
    one-process reference's."""
    pytest.importorskip("torch")
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    plan = tiny_on_offers()
    export(plan, tmp_path, data="synthetic", workdir=str(ROOT),
           train_args=f"--steps 3 --lr 3e-3 --checkpoint-every 0 --metrics {tmp_path}/m.jsonl")
    # The plan file is mounted at /tmp/espresso/plan.json: point the commands at ours.
    procs = []
    for f in sorted(tmp_path.glob("group*.yaml")):
        run = yaml.safe_load(f.read_text())["run"].replace("/tmp/espresso/plan.json",
                                                           str(tmp_path / "plan.json"))
        env = {**os.environ, "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "127.0.0.1",
               "MASTER_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(["bash", "-c", run], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
    got = [s["loss"] for s in read_metrics(tmp_path / "m.jsonl").steps]
    ref = subprocess.run([sys.executable, "-m", "espresso.train", str(tmp_path / "plan.json"),
                          "--data", "synthetic", "--steps", "3", "--lr", "3e-3", "--reference",
                          "--metrics", str(tmp_path / "r.jsonl")], capture_output=True,
                         text=True, timeout=120, check=True)
    assert ref.returncode == 0
    want = [s["loss"] for s in read_metrics(tmp_path / "r.jsonl").steps]
    assert len(got) == len(want) == 3
    assert got == pytest.approx(want, rel=1e-4)


def test_nodes_install_espresso_and_run_what_exists(tmp_path: Path) -> None:
    """Setup installs this package with its torch and train extras from the synced workdir
    (or a mounted source tree or wheel), never a name the index lacks; the run line is
    `espresso train` or a script, each checked at export time."""
    plan = tiny_on_offers()
    export(plan, tmp_path / "a", **TRAIN)
    spec = yaml.safe_load((tmp_path / "a" / "group0.yaml").read_text())
    assert spec["setup"] == 'pip install ".[torch,train]"'
    assert spec["workdir"] == str(ROOT)
    assert "-m espresso.train /tmp/espresso/plan.json --data examples/data/espresso.txt" \
        in spec["run"]
    # A workdir elsewhere: the source tree is mounted and installed from there.
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "t.txt").write_text("hello")
    (work / "train.py").write_text("print('hi')\n")
    export(plan, tmp_path / "b", data="data/t.txt", workdir=str(work))
    spec = yaml.safe_load((tmp_path / "b" / "group0.yaml").read_text())
    assert spec["setup"] == 'pip install "/tmp/espresso/src[torch,train]"'
    assert spec["file_mounts"]["/tmp/espresso/src"] == str(ROOT)
    wheel = tmp_path / "espresso_planner-0.1.0-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"PK")
    export(plan, tmp_path / "c", script="train.py", script_args="--x 1", workdir=str(work),
           wheel=str(wheel))
    spec = yaml.safe_load((tmp_path / "c" / "group0.yaml").read_text())
    assert spec["setup"] == f'pip install "/tmp/espresso/dist/{wheel.name}[torch,train]"'
    assert spec["file_mounts"][f"/tmp/espresso/dist/{wheel.name}"] == str(wheel)
    assert " train.py --x 1" in spec["run"] and "espresso.train" not in spec["run"]
    for kw, match in [
        ({"script": "missing.py"}, "is not a file in the workdir"),
        ({"script": str(ROOT / "examples" / "train_gpt.py")}, "is not a file in the workdir"),
        ({}, "give --data"),
        ({"data": str(ROOT / "examples" / "data" / "espresso.txt")}, "is not in the workdir"),
        ({"data": "synthetic", "script_args": "--x"}, "--script-args go with --script"),
        ({"script": "train.py", "data": "synthetic"}, "--data and --train-args go with"),
        ({"data": "synthetic", "wheel": str(tmp_path / "nope.whl")}, "is not a wheel"),
    ]:
        with pytest.raises(es.PlanError, match=match):
            export(plan, tmp_path / "x", workdir=str(work), **kw)  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_the_fabric_the_plan_assumes_is_switched_on(tmp_path: Path) -> None:
    """Instances costed on EFA (p4d) or GPUDirect-TCPX (a3-highgpu-8g) between nodes get
    SkyPilot's best network tier; one instance alone, or plain networking, does not."""
    plan = es.Plan.from_json(TINY)
    p4d = "aws/us-east-1/p4d.24xlarge"
    cat = es.Catalog.builtin()
    a100 = cat.row("", p4d).model
    two = replace(plan, stages=tuple(replace(s, gpu=a100, offer=p4d) for s in plan.stages),
                  estimate=None)
    two = replace(two, estimate=es.estimate(two, cat))  # 4 GPUs: one p4d
    export(two, tmp_path / "one", **TRAIN)
    spec = yaml.safe_load((tmp_path / "one" / "group0.yaml").read_text())
    assert spec["num_nodes"] == 1 and "network_tier" not in spec["resources"]
    mixed = tiny_on_offers(second=p4d)
    export(mixed, tmp_path / "two", **TRAIN)
    g1 = yaml.safe_load((tmp_path / "two" / "group1.yaml").read_text())
    g0 = yaml.safe_load((tmp_path / "two" / "group0.yaml").read_text())
    assert g1["resources"]["network_tier"] == "best"      # p4d: EFA
    assert "network_tier" not in g0["resources"]          # g6.12xlarge: plain networking


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = tmp_path / "plan.json"
    tiny_on_offers().to_json(plan_file)
    assert main(["export", "skypilot", str(plan_file), "--out", str(tmp_path / "sky"),
                 "--data", "synthetic"]) == 0
    out = capsys.readouterr().out
    assert "launch.sh" in out and "Note: jobs.sh (SkyPilot managed jobs) is not written" in out
    assert main(["export", "skypilot", str(plan_file), "--out", str(tmp_path / "sky2"),
                 "--data", "synthetic", "--checkpoint-bucket", "s3://b/r"]) == 0
    assert "  jobs/group1.yaml" in capsys.readouterr().out  # named as written
    assert main(["export", "skypilot", str(TINY), "--out", str(tmp_path / "x")]) == 2
    assert "SkyPilot needs cloud offers" in capsys.readouterr().err


def test_skypilot_loads_every_exported_task(tmp_path: Path) -> None:
    """With SkyPilot installed, its own parser loads every file (skipped without it)."""
    sky = pytest.importorskip("sky")
    plan = tiny_on_offers()
    export(plan, tmp_path, checkpoint_bucket="s3://bucket/run", **TRAIN)
    # ... and a group on EFA (network_tier: best)
    export(tiny_on_offers(second="aws/us-east-1/p4d.24xlarge"), tmp_path / "efa", **TRAIN)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    tiers = []
    try:
        for f in sorted([*tmp_path.glob("*.yaml"), *tmp_path.glob("jobs/*.yaml"),
                         *tmp_path.glob("efa/*.yaml")]):
            task = sky.Task.from_yaml(str(f))
            assert task.num_nodes >= 1
            assert "[torch,train]" in task.setup and "espresso.train" in task.run
            tiers += [str(r.network_tier) for r in task.resources if r.network_tier]
    finally:
        os.chdir(cwd)
    assert tiers and all("best" in t.lower() for t in tiers)
    assert json.loads((tmp_path / "plan.json").read_text())["schema"] == "espresso.plan/1"


def test_gpus_attached_to_an_n1_host_export_as_machine_and_accelerators(tmp_path: Path) -> None:
    """An offer of GPUs attached to a GCP N1 host (``n1-highmem-4+T4``) exports as SkyPilot
    asks for it: the host machine as the instance type and the GPUs as accelerators."""
    from test_cloud import GCP_N1

    f = tmp_path / "gcp_vms.csv"
    f.write_text(GCP_N1)
    cat = es.Catalog.from_skypilot([f])
    model = es.ModelSpec(name="n1", num_layers=4, hidden_size=256, num_heads=8,
                         num_kv_heads=8, ffn_hidden_size=512, vocab_size=1000)
    job = es.Job(model=model, seq_len=256, global_batch_size=8, iterations=100,
                 deadline_hours=100, precision="fp16")
    plan = es.plan(job, cat, time_limit_s=10)
    export(plan, tmp_path / "out", **TRAIN)
    est = plan.estimate
    assert est is not None
    for i, r in enumerate(est.rent):
        res = yaml.safe_load((tmp_path / "out" / f"group{i}.yaml").read_text())["resources"]
        host, acc = str(r["instance_type"]).split("+")
        assert res["instance_type"] == host and host.startswith("n1-highmem-")
        assert res["accelerators"] == f"{acc}:{int(r['gpus']) // int(r['instances'])}"
