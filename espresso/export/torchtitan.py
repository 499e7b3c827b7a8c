"""``espresso export torchtitan PLAN``: torchtitan's job config (TOML, read by
``torchtitan.train --job.config_file``; the schema of torchtitan 0.2: ``torchtitan/config/
job_config.py``) and, with hosts, each node's torchrun command.

What maps where: the stages' blocks become ``parallelism.module_fqns_per_model_part`` (one
list of module names per stage in model order: ``tok_embeddings`` with the first,
``norm`` and ``output`` with the last; interleaved plans list every chunk), ``pp`` GPU groups
``pipeline_parallel_degree``, the schedule ``pipeline_parallel_schedule`` (1F1B, GPipe,
Interleaved1F1B), the micro-batch ``pipeline_parallel_microbatch_size``, ``dp``
``data_parallel_shard_degree`` with ``fsdp_reshard_after_forward`` ``always`` (fsdp) or
``never`` (zero2), the one TP width ``tensor_parallel_degree``, recomputation
``activation_checkpoint.mode`` (selective: per op)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import _io
from ..errors import PlanError
from ..plan import Plan
from ..runner.launch import Host
from .common import check_engine, node_commands, toml, write

FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3.1-8b": "8B", "llama3.1-70b": "70B",
           "llama3.1-405b": "405B"}
"""Plan models that are torchtitan's own llama3 flavors (torchtitan/models/llama3)."""
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe"}


def model_parts(plan: Plan) -> list[list[str]]:
    """The modules of each stage, in model order (torchtitan's llama3 module names)."""
    parts = []
    last = plan.num_stages - 1
    for s, st in enumerate(plan.stages):
        names = ["tok_embeddings"] if s == 0 else []
        names += [f"layers.{i}" for i in range(*st.layers)]
        if s == last:
            names += ["norm", "output"]
        parts.append(names)
    return parts


def job_config(plan: Plan, *, dataset: str = "c4", tokenizer: str = "./assets/hf/Llama-3.1-8B",
               lr: float = 3e-4, warmup_steps: int | None = None,
               dump_folder: str = "./outputs") -> dict[str, dict[str, Any]]:
    check_engine(plan, "torchtitan")
    job, m = plan.job, plan.job.model
    tp = plan.stages[0].tp
    steps = job.num_iterations
    schedule = "Interleaved1F1B" if plan.virtual_stages > 1 else SCHEDULES[plan.schedule]
    flavor = FLAVORS.get(m.name, m.name)
    sharded = plan.dp > 1 and plan.sharding in ("zero2", "fsdp")
    interval = None
    if plan.estimate is not None and plan.estimate.spot is not None:
        interval = max(1, round(plan.estimate.spot.checkpoint_interval_hours * 3600
                                / plan.estimate.iteration_s))
    return {
        "job": {"dump_folder": dump_folder,
                "description": f"espresso plan: {m.name} on "
                               + ", ".join(f"{n} x {g}" for g, n in plan.gpus.items())},
        "model": {"name": "llama3", "flavor": flavor, "hf_assets_path": tokenizer,
                  # fp8 jobs: torchao's Float8 linear layers (torchtitan's float8 converter)
                  "converters": ["float8"] if job.precision == "fp8" else None},
        "optimizer": {"name": "AdamW", "lr": lr, "beta1": 0.9, "beta2": 0.95,
                      "weight_decay": 0.1},
        "lr_scheduler": {"warmup_steps": warmup_steps if warmup_steps is not None
                         else max(1, steps // 20), "decay_type": "cosine", "min_lr_factor": 0.1},
        "training": {"dataset": dataset,
                     "local_batch_size": plan.micro_batch_size * plan.num_microbatches,
                     "global_batch_size": job.global_batch_size, "seq_len": job.seq_len,
                     "max_norm": 1.0, "steps": steps, "mixed_precision_param": "bfloat16"},
        "parallelism": {
            "data_parallel_replicate_degree": 1 if sharded or plan.dp == 1 else plan.dp,
            "data_parallel_shard_degree": plan.dp if sharded else 1,
            "fsdp_reshard_after_forward": "never" if plan.sharding == "zero2" else "always",
            "tensor_parallel_degree": tp,
            "pipeline_parallel_degree": plan.pp,
            "module_fqns_per_model_part": model_parts(plan) if plan.num_stages > 1 else None,
            "pipeline_parallel_schedule": schedule,
            "pipeline_parallel_microbatch_size": plan.micro_batch_size},
        "activation_checkpoint": {"mode": "selective" if plan.recompute == "selective-op"
                                  else plan.recompute, "selective_ac_option": "op"},
        "checkpoint": {"enable": True, "folder": "checkpoint",
                       "interval": interval or max(1, steps // 10)},
    }


def export(plan: Plan, out: str | Path, *, hosts: list[Host] | None = None,
           master_port: int = 29500, **config: Any) -> tuple[list[Path], list[str]]:
    """Write ``torchtitan.toml`` (and ``node<i>.sh`` per host assignment when ``hosts`` are
    given) to ``out``; returns the files and notes."""
    cfg = job_config(plan, **config)
    notes = []
    m = plan.job.model
    header = (f"# torchtitan job config written by `espresso export torchtitan` from a plan of "
              f"{m.name}.\n# Run: torchrun ... -m torchtitan.train --job.config_file "
              "torchtitan.toml\n")
    if m.name not in FLAVORS:
        header += (f"# torchtitan has no llama3 flavor for {m.name!r}: add one to "
                   "torchtitan/models/llama3/__init__.py with\n"
                   f"#   dim={m.hidden_size}, n_layers={m.num_layers}, n_heads={m.num_heads}, "
                   f"n_kv_heads={m.kv_heads}, vocab_size={m.vocab_size},\n"
                   f"#   and an MLP of width {m.ffn} (ffn_dim_multiplier / multiple_of), and "
                   "name it as model.flavor below.\n")
        notes.append(f"torchtitan has no flavor for {m.name}: torchtitan.toml says which "
                     "model arguments to add")
    folder = _io.make_dir("--out", out, err=PlanError)
    files = [write(folder, "torchtitan.toml", toml(cfg, header))]
    if hosts:
        target = "-m torchtitan.train"
        for i, cmd in enumerate(node_commands(plan, hosts, target,
                                              "--job.config_file torchtitan.toml",
                                              master_port=master_port)):
            files.append(write(folder, f"node{i}.sh",
                               "#!/usr/bin/env bash\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n"
                               + cmd + "\n", mode=0o755))
    else:
        notes.append("no --hosts: node commands not written (torchrun -m torchtitan.train "
                     "--job.config_file torchtitan.toml on each node, node ranks in the "
                     "plan's stage order)")
    return files, notes
