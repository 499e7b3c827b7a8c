"""Rank layout and torchrun commands (no torch needed)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from _helpers import make_plan

import espresso as es
from espresso.cli import main
from espresso.runner.launch import LaunchError, assign_hosts, hosts_from_dict, rank_layout

EXAMPLE = Path(__file__).parents[1] / "examples" / "plans" / "llama2-7b-a100-l40s.json"


def test_rank_layout_formula() -> None:
    plan = es.Plan.from_json(EXAMPLE)  # dp 2; stage 0 A100 tp 2, stage 1 L40S tp 1
    layout = rank_layout(plan)
    assert len(layout) == plan.num_gpus == 6
    got = [(r.stage, r.replica, r.tp_index, r.gpu) for r in layout]
    assert got == [(0, 0, 0, "A100-80GB"), (0, 0, 1, "A100-80GB"), (0, 1, 0, "A100-80GB"),
                   (0, 1, 1, "A100-80GB"), (1, 0, 0, "L40S"), (1, 1, 0, "L40S")]
    for r in layout:
        first = plan.dp * sum(s.tp for s in plan.stages[: r.stage])
        assert r.rank == first + r.replica * plan.stages[r.stage].tp + r.tp_index


def test_two_gpu_types_map_to_the_right_hosts() -> None:
    plan = es.Plan.from_json(EXAMPLE)
    hosts = hosts_from_dict({"hosts": [
        {"address": "10.0.0.2", "gpu": "L40S", "gpus": 4},
        {"address": "10.0.0.1", "gpu": "A100-80GB", "gpus": 2},
        {"address": "10.0.0.3", "gpu": "A100-80GB", "gpus": 8},
    ]})
    nodes = assign_hosts(plan, hosts)
    layout = rank_layout(plan)
    covered = []
    for n in nodes:
        for r in range(n.first_rank, n.first_rank + n.nproc):
            assert layout[r].gpu == n.host.gpu  # every rank on a node of its stage's type
            covered.append(r)
    assert sorted(covered) == list(range(plan.num_gpus))
    # Stage 0's two replicas (2 x tp 2) fit the 8-GPU host together: both go there, so their
    # DP all-reduce stays inside it; the 2-GPU host is left idle.
    assert [(n.host.address, n.first_rank, n.nproc) for n in nodes] == [
        ("10.0.0.3", 0, 4), ("10.0.0.2", 4, 2)]
    # Without a host that holds both, the TP groups are spread first-fit.
    split = hosts_from_dict({"hosts": [
        {"address": "10.0.0.2", "gpu": "L40S", "gpus": 4},
        {"address": "10.0.0.1", "gpu": "A100-80GB", "gpus": 2},
        {"address": "10.0.0.3", "gpu": "A100-80GB", "gpus": 2},
    ]})
    assert [(n.host.address, n.first_rank, n.nproc) for n in assign_hosts(plan, split)] == [
        ("10.0.0.1", 0, 2), ("10.0.0.3", 2, 2), ("10.0.0.2", 4, 2)]


def test_missing_gpus_are_named() -> None:
    plan = es.Plan.from_json(EXAMPLE)
    hosts = hosts_from_dict({"hosts": [{"address": "a", "gpu": "A100-80GB", "gpus": 3}]})
    with pytest.raises(LaunchError, match=r"missing 1 more A100-80GB \(plan needs 4, hosts "
                                          r"have 3\); 2 more L40S \(plan needs 2, hosts have 0\)"):
        assign_hosts(plan, hosts)


def test_tp_groups_never_straddle_hosts() -> None:
    plan = es.Plan.from_json(EXAMPLE)  # stage 0: dp 2 x tp 2 on A100-80GB
    hosts = hosts_from_dict({"hosts": [
        {"address": "a", "gpu": "A100-80GB", "gpus": 3},
        {"address": "b", "gpu": "A100-80GB", "gpus": 3},
        {"address": "c", "gpu": "L40S", "gpus": 2}]})
    nodes = assign_hosts(plan, hosts)
    host_of = {r: n.host.address for n in nodes for r in range(n.first_rank,
                                                                n.first_rank + n.nproc)}
    for info in rank_layout(plan):
        leader = info.rank - info.tp_index
        assert host_of[info.rank] == host_of[leader]  # the whole TP group on one host
    assert [(n.host.address, n.first_rank, n.nproc) for n in nodes] == [
        ("a", 0, 2), ("b", 2, 2), ("c", 4, 2)]
    # Enough A100s in total (3 + 1), but replica 1's TP pair fits on neither host.
    hosts = hosts_from_dict({"hosts": [
        {"address": "a", "gpu": "A100-80GB", "gpus": 3},
        {"address": "b", "gpu": "A100-80GB", "gpus": 1},
        {"address": "c", "gpu": "L40S", "gpus": 2}]})
    with pytest.raises(LaunchError, match=r"stage 0 \(replica 1\) needs 2 A100-80GB GPUs on "
                                          r"one host .* has left is 1"):
        assign_hosts(plan, hosts)


def test_non_adjacent_stages_on_one_host_get_device_offsets(tiny_job: es.Job) -> None:
    plan = make_plan(tiny_job, [("A100-80GB", 1, 0, 1), ("L4", 1, 1, 2), ("A100-80GB", 1, 2, 4)],
                     num_microbatches=16)
    hosts = hosts_from_dict({"hosts": [{"address": "a", "gpu": "A100-80GB", "gpus": 8},
                                       {"address": "b", "gpu": "L4", "gpus": 8}]})
    nodes = assign_hosts(plan, hosts)
    assert [(n.host.address, n.first_rank, n.device_offset) for n in nodes] == [
        ("a", 0, 0), ("b", 1, 0), ("a", 2, 1)]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"host": []}, "did you mean 'hosts'"),
        ({"hosts": []}, "non-empty list"),
        ({"hosts": [{"address": "a", "gpu": "L4"}]}, "missing required field 'gpus'"),
        ({"hosts": [{"address": "a", "gpu": "L4", "gpus": 0}]}, "host.gpus"),
        ({"hosts": [{"address": "", "gpu": "L4", "gpus": 1}]}, "host.address"),
    ],
)
def test_bad_hosts(data: object, match: str) -> None:
    with pytest.raises(LaunchError, match=match):
        hosts_from_dict(data)


def test_launch_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": [
        {"address": "10.0.0.1", "gpu": "A100-80GB", "gpus": 4},
        {"address": "10.0.0.2", "gpu": "L40S", "gpus": 2}]}))
    assert main(["launch", str(EXAMPLE), "--hosts", str(hosts), "--script", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "--nnodes=2 --node-rank=0 --nproc-per-node=4 --master-addr=10.0.0.1" in out
    assert "ESPRESSO_FIRST_RANK=4 ESPRESSO_WORLD_SIZE=6" in out
    assert main(["launch", str(EXAMPLE), "--hosts", str(hosts), "--out-dir",
                 str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "node1.sh").read_text().count("torchrun") == 1
    hosts.write_text(yaml.safe_dump({"hosts": [{"address": "x", "gpu": "L40S", "gpus": 2}]}))
    assert main(["launch", str(EXAMPLE), "--hosts", str(hosts)]) == 2
    assert "4 more A100-80GB" in capsys.readouterr().err


def test_launch_refuses_plans_the_runner_cannot_run(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Refused once, before any process starts, with the reason (not once per rank)."""
    plan = es.Plan.from_json(EXAMPLE)
    d = plan.to_dict()
    d["stages"][0]["tp"] = 3
    d["gpus"] = {"A100-80GB": 6, "L40S": 2}
    bad = tmp_path / "tp3.json"
    es.Plan.from_dict(d).to_json(bad)
    assert main(["launch", str(bad), "--local"]) == 2
    assert "stage 0 has tp 3, which does not divide the model's num_heads 32" in (
        capsys.readouterr().err)
    d = plan.to_dict()
    d["num_microbatches"] = 3
    es.Plan.from_dict(d).to_json(bad)
    assert main(["launch", str(bad), "--hosts", "unused.yaml"]) == 2
    assert "global batch is 512" in capsys.readouterr().err


def _offer_plan() -> es.Plan:
    """dp 2: stage 0 on p4d.24xlarge (A100-40GB, tp 4), stage 1 on p5.48xlarge (tp 8)."""
    job = es.Job(model=es.ModelSpec.preset("llama2-7b"), tokens=10**9, deadline_hours=1e4)
    return es.Plan(job=job, dp=2, micro_batch_size=1, num_microbatches=256, stages=(
        es.Stage(gpu="A100-40GB", tp=4, layers=(0, 16), offer="aws/us-east-1/p4d.24xlarge"),
        es.Stage(gpu="H100-SXM", tp=8, layers=(16, 32), offer="aws/us-east-1/p5.48xlarge")))


def test_hosts_by_instance_type_take_gpus_from_the_snapshot() -> None:
    plan = _offer_plan()
    hosts = hosts_from_dict({"hosts": [
        {"address": "h1", "instance_type": "p5.48xlarge"},
        {"address": "h0", "instance_type": "p4d.24xlarge"},
        {"address": "h2", "instance_type": "p5.48xlarge"},
    ]})
    assert (hosts[0].gpu, hosts[0].gpus) == ("H100-SXM", 8)
    nodes = assign_hosts(plan, hosts)
    assert [(n.host.address, n.first_rank, n.nproc) for n in nodes] == [
        ("h0", 0, 8), ("h1", 8, 8), ("h2", 16, 8)]


def test_hosts_of_another_instance_type_do_not_run_an_offer_stage() -> None:
    # Lambda's gpu_8x_a100 has the same GPU as p4d.24xlarge, but the plan rents p4d.
    plan = _offer_plan()
    hosts = hosts_from_dict({"hosts": [
        {"address": "l0", "instance_type": "gpu_8x_a100"},
        {"address": "h1", "instance_type": "p5.48xlarge"},
        {"address": "h2", "instance_type": "p5.48xlarge"},
    ]})
    with pytest.raises(LaunchError, match=r"missing 8 more p4d.24xlarge \(A100-40GB\) "
                                          r"\(plan needs 8, hosts have 0\)"):
        assign_hosts(plan, hosts)
    # Hosts described by GPU alone (machines you own) run any stage of that GPU.
    mixed = hosts_from_dict({"hosts": [
        {"address": "own", "gpu": "A100-40GB", "gpus": 8},
        {"address": "h1", "instance_type": "p5.48xlarge", "gpus": 16},
    ]})
    assert [n.host.address for n in assign_hosts(plan, mixed)] == ["own", "h1"]


@pytest.mark.parametrize(("host", "match"), [
    ({"address": "a", "instance_type": "x9.huge"}, "not in the built-in offer snapshot"),
    ({"address": "a", "instance_type": "p4d.24xlarge", "gpu": "H100-SXM"},
     "p4d.24xlarge has A100-40GB GPUs"),
    ({"address": "a", "gpus": 8}, "missing required field 'gpu'"),
])
def test_bad_instance_hosts(host: dict[str, object], match: str) -> None:
    with pytest.raises(LaunchError, match=match):
        hosts_from_dict({"hosts": [host]})
    # An unknown instance type is fine with its GPU given.
    h = hosts_from_dict({"hosts": [{"address": "a", "instance_type": "x9.huge", "gpu": "L4",
                                    "gpus": 4}]})[0]
    assert h.label == "x9.huge (L4)"


@pytest.mark.parametrize("seed", range(30))
def test_in_instance_links_match_the_launch_layout(seed: int) -> None:
    """The estimate's in-instance pipeline links are those of the hosts launch assigns: one
    host per rented instance, in order; a boundary is inside an instance exactly when every
    replica's two TP groups landed on the same host."""
    rng = random.Random(seed)
    cat = es.Catalog.builtin("cloud")
    offers = ["aws/us-east-1/p5.48xlarge", "aws/us-east-1/p4d.24xlarge",
              "aws/us-east-1/g6e.12xlarge"]
    dp = rng.choice([1, 2, 4])
    n = rng.randint(2, 5)
    per = 32 // n
    stages = []
    for i in range(n):
        offer = rng.choice(offers[:2] if rng.random() < 0.8 else offers)
        tp = rng.choice([w for w in (1, 2, 4, 8) if w <= cat[offer].gpus_per_node])
        stages.append(es.Stage(gpu=cat[offer].model, tp=tp, offer=offer,
                               layers=(i * per, 32 if i == n - 1 else (i + 1) * per)))
    job = es.Job(model=es.ModelSpec.preset("llama2-7b"), tokens=10**9, deadline_hours=1e4)
    plan = es.Plan(job=job, dp=dp, micro_batch_size=1, num_microbatches=512 // dp,
                   stages=tuple(stages))
    est = es.estimate(plan, cat)
    hosts = [{"address": f"{o.split('/')[-1]}#{k}", "instance_type": o.split("/")[-1]}
             for r in est.rent for o in [r["offer"]] for k in range(r["instances"])]
    nodes = assign_hosts(plan, hosts_from_dict({"hosts": hosts}))
    host_of = {}
    for nd in nodes:
        for rank in range(nd.first_rank, nd.first_rank + nd.nproc):
            host_of[rank] = nd.host.address
    layout = rank_layout(plan)
    group_host = {(r.stage, r.replica): host_of[r.rank] for r in layout if r.tp_index == 0}
    for s in range(n - 1):
        same = (stages[s].offer == stages[s + 1].offer and
                all(group_host[(s, r)] == group_host[(s + 1, r)] for r in range(dp)))
        assert est.stages[s].send_intra_node == same, (s, plan.stages, dp)
