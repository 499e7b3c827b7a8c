"""`espresso export torchtitan|megatron`: the written configuration says what the plan says
(read back with torchtitan's own parser where torchtitan is installed; Megatron-LM's layer
rule applied to the arguments gives back the plan's split), node commands put every rank on
a host of its stage's GPU type, and plans the engine cannot run are refused."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import espresso as es
from espresso.cli import main
from espresso.export import megatron, torchtitan

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _plan(tps: list[int], layers: list[int], gpus: list[str], *, dp: int = 2,
          sharding: str = "zero1", recompute: str = "none", v: int = 1,
          model: str = "llama3-8b") -> es.Plan:
    spec = es.ModelSpec.preset(model)
    job = es.Job(model=spec, seq_len=4096, global_batch_size=16 * dp, iterations=1000,
                 deadline_hours=1000)
    stages, begin = [], 0
    for t, n, g in zip(tps, layers, gpus, strict=True):
        stages.append(es.Stage(gpu=g, tp=t, layers=(begin, begin + n)))
        begin += n
    plan = es.Plan(job=job, dp=dp, micro_batch_size=1, num_microbatches=16, stages=tuple(stages),
                   sharding=sharding, recompute=recompute, virtual_stages=v,
                   sequence_parallel=True)
    return plan.with_estimate()


def _torchtitan_parser() -> Any:
    """torchtitan's ConfigManager (its TOML and CLI parser), or skip. Importing the package
    runs its model code, which needs triton; the config package alone does not, so where
    that fails the package's __init__ is bypassed to reach the parser."""
    with warnings.catch_warnings():  # its dependencies' deprecations are not ours
        warnings.simplefilter("ignore")
        return _import_torchtitan_parser()


def _import_torchtitan_parser() -> Any:
    try:
        from torchtitan.config import ConfigManager
    except ImportError:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("torchtitan is not installed")
        saved = sys.modules.get("torchtitan")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = pkg
        try:
            from torchtitan.config import ConfigManager
        except ImportError as exc:
            pytest.skip(f"torchtitan's config cannot be imported here ({exc})")
        finally:
            if saved is not None:
                sys.modules["torchtitan"] = saved
    return ConfigManager


def test_torchtitan_config_says_what_the_plan_says(tmp_path: Path) -> None:
    plan = _plan([2, 2, 2], [9, 14, 9], ["H200", "H100-SXM", "H100-SXM"], sharding="fsdp",
                 recompute="selective-op")
    files, notes = torchtitan.export(plan, tmp_path)
    assert [f.name for f in files] == ["torchtitan.toml"] and notes
    cfg = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    par = cfg["parallelism"]
    assert (par["pipeline_parallel_degree"], par["tensor_parallel_degree"],
            par["data_parallel_shard_degree"]) == (3, 2, 2)
    assert par["fsdp_reshard_after_forward"] == "always"
    parts = par["module_fqns_per_model_part"]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    blocks = [int(n.split(".")[1]) for p in parts for n in p if n.startswith("layers.")]
    assert blocks == list(range(32))
    assert [sum(n.startswith("layers.") for n in p) for p in parts] == [9, 14, 9]
    assert cfg["training"]["local_batch_size"] * 2 == cfg["training"]["global_batch_size"]
    assert cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert cfg["model"]["flavor"] == "8B"
    # espresso's attention-core-only selective recomputation is not torchtitan's.
    with pytest.raises(es.PlanError, match=r"no selective recomputation"):
        torchtitan.export(replace(plan, recompute="selective"), tmp_path / "x")


def test_torchtitan_reads_the_config_with_its_own_parser(tmp_path: Path) -> None:
    """torchtitan's ConfigManager loads the file (skipped where torchtitan is not installed;
    checked with torchtitan 0.2.2)."""
    manager = _torchtitan_parser()
    plan = _plan([2, 2, 2], [9, 14, 9], ["H200", "H100-SXM", "H100-SXM"], sharding="fsdp",
                 recompute="selective-op")
    torchtitan.export(plan, tmp_path)
    parts = torchtitan.model_parts(plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = manager().parse_args(["--job.config_file", str(tmp_path / "torchtitan.toml")])
    assert parsed.parallelism.module_fqns_per_model_part == parts
    assert parsed.parallelism.pipeline_parallel_degree == 3
    assert parsed.training.steps == plan.job.num_iterations


def test_torchtitan_refuses_mixed_tp_and_names_missing_flavors(tmp_path: Path) -> None:
    with pytest.raises(es.PlanError, match=r"torchtitan cannot run this plan \(stage TP "
                                           r"widths differ \(1/2\)\); plan it with --engine"):
        torchtitan.export(_plan([1, 2], [16, 16], ["H200", "H100-SXM"], sharding="fsdp"),
                          tmp_path / "a")
    plan = _plan([1], [32], ["H200"], sharding="fsdp", model="llama2-7b")
    _, notes = torchtitan.export(plan, tmp_path / "b")
    text = (tmp_path / "b" / "torchtitan.toml").read_text()
    assert "no llama3 flavor for 'llama2-7b'" in text and "dim=4096, n_layers=32" in text
    assert any("no flavor" in n for n in notes)


def _megatron_counts(args: list[str], L: int) -> list[int]:
    """Megatron-LM's rule for the blocks of each pipeline stage, from its arguments."""
    def val(flag: str) -> int | None:
        return int(args[args.index(flag) + 1]) if flag in args else None
    P = val("--pipeline-model-parallel-size")
    assert P is not None
    first, last = val("--decoder-first-pipeline-num-layers"), \
        val("--decoder-last-pipeline-num-layers")
    if first is None and last is None:
        assert L % P == 0
        return [L // P] * P
    ends = (first or 0) + (last or 0)
    middle = P - (first is not None) - (last is not None)
    assert (L - ends) % middle == 0
    share = (L - ends) // middle
    return ([first] if first is not None else []) + [share] * middle + (
        [last] if last is not None else [])


@pytest.mark.parametrize("layers", [[8, 8, 8, 8], [6, 9, 9, 8], [10, 22], [5, 9, 9, 9]])
def test_megatron_arguments_give_back_the_split(layers: list[int], tmp_path: Path) -> None:
    gpus = ["H100-SXM"] * len(layers)
    plan = _plan([2] * len(layers), layers, gpus, recompute="full")
    args = megatron.arguments(plan)
    assert _megatron_counts(args, 32) == layers
    pairs = dict(zip(args, [*args[1:], ""], strict=True))
    assert pairs["--tensor-model-parallel-size"] == "2"
    assert pairs["--num-query-groups"] == "8" and "--swiglu" in args
    assert "--use-distributed-optimizer" in args and "--sequence-parallel" in args
    assert pairs["--recompute-granularity"] == "full"
    assert pairs["--global-batch-size"] == "32" and pairs["--micro-batch-size"] == "1"
    megatron.export(plan, tmp_path)
    assert (tmp_path / "megatron_args.txt").read_text().split() == args
    assert "pretrain_gpt.py" in (tmp_path / "pretrain_gpt.sh").read_text()
    try:
        from megatron.training.arguments import parse_args
    except ImportError:
        return  # Megatron-LM's training package is not on the package index
    sys_argv = sys.argv
    sys.argv = ["pretrain_gpt.py", *args]
    try:
        parsed = parse_args()
    finally:
        sys.argv = sys_argv
    assert parsed.pipeline_model_parallel_size == len(layers)


def test_megatron_refuses_unequal_middle_stages(tmp_path: Path) -> None:
    plan = _plan([2, 2, 2, 2], [6, 9, 8, 9], ["H100-SXM"] * 4)
    with pytest.raises(es.PlanError, match="middle stages of unequal layer counts"):
        megatron.arguments(plan)
    inter = _plan([2, 2, 2, 2], [8, 8, 8, 8], ["H100-SXM"] * 4, v=2)
    assert "--num-layers-per-virtual-pipeline-stage" in megatron.arguments(inter)


def test_node_commands_put_each_stage_on_its_gpus(tmp_path: Path) -> None:
    """An H200 stage then an H100 stage (tp 2, dp 2: 4 ranks each) on one host of each type:
    torchrun's node 0 is the H200 host (ranks 0-3), node 1 the H100 host (ranks 4-7)."""
    plan = _plan([2, 2], [12, 20], ["H200", "H100-SXM"], sharding="fsdp")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  - {address: 10.0.0.2, gpu: H100-SXM, gpus: 8}\n"
                     "  - {address: 10.0.0.1, gpu: H200, gpus: 8}\n")
    out = tmp_path / "tt"
    assert main(["export", "torchtitan", str(tmp_path / "p.json"), "--out", str(out)]) == 2
    plan.to_json(tmp_path / "p.json")
    assert main(["export", "torchtitan", str(tmp_path / "p.json"), "--out", str(out),
                 "--hosts", str(hosts)]) == 0
    n0, n1 = (out / "node0.sh").read_text(), (out / "node1.sh").read_text()
    assert "10.0.0.1 (H200): ranks 0..3" in n0 and "--node-rank=0" in n0
    assert "10.0.0.2 (H100-SXM): ranks 4..7" in n1 and "--node-rank=1" in n1
    assert all("--master-addr=10.0.0.1" in t and "-m torchtitan.train" in t for t in (n0, n1))
    assert re.search(r"CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun", n1)
    meg = tmp_path / "meg"
    plan1 = replace(plan, sharding="zero1", estimate=None).with_estimate()
    plan1.to_json(tmp_path / "p1.json")
    assert main(["export", "megatron", str(tmp_path / "p1.json"), "--out", str(meg),
                 "--hosts", str(hosts), "--data-path", "/data/tokens"]) == 0
    text = (meg / "node1.sh").read_text()
    assert "pretrain_gpt.py" in text and "--data-path /data/tokens" in text


def test_fp8_plans_export_fp8_and_espresso_refuses_them(tmp_path: Path) -> None:
    """An fp8 job: Megatron-LM gets Transformer Engine's fp8 recipe, torchtitan its float8
    converter, and espresso's own runner (no fp8 GEMMs) refuses the plan."""
    plan = _plan([2, 2], [16, 16], ["H100-SXM", "H100-SXM"], sharding="fsdp")
    plan8 = replace(plan, job=replace(plan.job, precision="fp8")).with_estimate()
    mplan = _plan([2, 2], [16, 16], ["H100-SXM", "H100-SXM"])
    mplan8 = replace(mplan, job=replace(mplan.job, precision="fp8")).with_estimate()
    args = [str(a) for a in megatron.arguments(mplan8)]
    i = args.index("--fp8-format")
    assert args[i + 1] == "hybrid" and "--fp8-amax-history-len" in args
    assert "--fp8-format" not in [str(a) for a in megatron.arguments(mplan)]
    torchtitan.export(plan8, tmp_path / "tt")
    cfg = tomllib.loads((tmp_path / "tt" / "torchtitan.toml").read_text())
    assert cfg["model"]["converters"] == ["float8"]
    torchtitan.export(plan, tmp_path / "bf16")
    assert "converters" not in tomllib.loads((tmp_path / "bf16" / "torchtitan.toml")
                                            .read_text())["model"]
    assert "fp8" in (es.engines.refusal(plan8, "espresso") or "")
    assert es.engines.refusal(plan, "espresso") is None
    # The fp8 plan is faster: its linear layers run at the fp8 peak.
    assert plan8.estimate.iteration_s < plan.estimate.iteration_s  # type: ignore[union-attr]


def test_fp8_plans_need_fp8_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    """An fp8 plan on a GPU without fp8 tensor cores is refused with the stage and the GPU;
    a search on a catalog without any is refused before it starts; the job field
    round-trips and is written only when it is not bf16."""
    plan = _plan([2, 2], [16, 16], ["A100-80GB", "A100-80GB"])
    with pytest.raises(es.PlanError, match=r"stage 0: job.precision is fp8 but A100-80GB has no "
                                           r"fp8 tensor cores"):
        es.estimate(replace(plan, job=replace(plan.job, precision="fp8")))
    job = replace(plan.job, precision="fp8")
    assert es.Job.from_dict(job.to_dict()).precision == "fp8"
    assert "precision" not in plan.job.to_dict()
    with pytest.raises(es.JobError, match=r"job\.precision"):
        replace(plan.job, precision="fp4")
    a100 = es.Catalog(gpus=(es.Catalog.builtin("gpus")["A100-80GB"],))
    with pytest.raises(es.JobError, match="no GPU type of the catalog has fp8 tensor cores"):
        es.search(job, a100, time_limit_s=5)
    assert main(["plan", "--model", "llama3-8b", "--tokens", "1e9", "--deadline", "30d",
                 "--precision", "fp8", "--catalog",
                 str(Path(__file__).parents[1] / "examples/catalogs/espresso-prototype.yaml")]) != 0
    assert "no GPU type of the catalog has fp8" in capsys.readouterr().err
