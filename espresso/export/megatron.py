"""``espresso export megatron PLAN``: the arguments of Megatron-LM's ``pretrain_gpt.py``
(``megatron/training/arguments.py``) for a plan, and with hosts each node's torchrun command.

What maps where: the one TP width ``--tensor-model-parallel-size`` (with
``--sequence-parallel``), the ``pp`` GPU groups ``--pipeline-model-parallel-size``, unequal
end stages ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
(the middle stages split the rest evenly, as Megatron requires), interleaving
``--num-layers-per-virtual-pipeline-stage``, ZeRO-1 ``--use-distributed-optimizer``,
recomputation ``--recompute-granularity`` (full: ``--recompute-method uniform
--recompute-num-layers 1``), the model's shape, batch, sequence and iterations. Megatron's
rank order (tensor, then data, then pipeline parallelism, outermost) is the plan's."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from .. import _io
from ..errors import PlanError
from ..plan import Plan
from ..runner.launch import Host
from .common import check_engine, node_commands, write


def arguments(plan: Plan, *, data_path: str | None = None, tokenizer_model: str | None = None,
              lr: float = 3e-4, save: str = "checkpoints") -> list[str]:
    """``pretrain_gpt.py``'s arguments for the plan (mock data without ``data_path``)."""
    check_engine(plan, "megatron")
    job, m = plan.job, plan.job.model
    tp, P = plan.stages[0].tp, plan.pp
    steps = job.num_iterations
    a = ["--num-layers", m.num_layers, "--hidden-size", m.hidden_size,
         "--ffn-hidden-size", m.ffn, "--num-attention-heads", m.num_heads]
    if m.kv_heads != m.num_heads:
        a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    a += ["--seq-length", job.seq_len,
          "--max-position-embeddings", max(job.seq_len, m.position_embeddings)]
    if m.gated_mlp:
        a += ["--swiglu"]
    if m.norm == "rmsnorm":
        a += ["--normalization", "RMSNorm"]
    a += ["--position-embedding-type", "learned_absolute" if m.position_embeddings else "rope"]
    if not m.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if not m.linear_bias:
        a += ["--disable-bias-linear"]
    a += ["--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", P]
    if tp > 1 and plan.sequence_parallel:
        a += ["--sequence-parallel"]
    counts = [st.num_layers for st in plan.stages]
    if plan.virtual_stages > 1:
        a += ["--num-layers-per-virtual-pipeline-stage", counts[0]]
    elif P == 2 and counts[0] != counts[1]:
        a += ["--decoder-first-pipeline-num-layers", counts[0]]
    elif P > 2 and (counts[0] != counts[1] or counts[-1] != counts[1]):
        a += ["--decoder-first-pipeline-num-layers", counts[0],
              "--decoder-last-pipeline-num-layers", counts[-1]]
    if plan.dp > 1 and plan.sharding == "zero1":
        a += ["--use-distributed-optimizer", "--overlap-param-gather"]
    if plan.dp > 1:
        a += ["--overlap-grad-reduce"]
    a += ["--micro-batch-size", plan.micro_batch_size,
          "--global-batch-size", job.global_batch_size, "--train-iters", steps, "--bf16"]
    if job.precision == "fp8":  # Transformer Engine's delayed-scaling recipe
        a += ["--fp8-format", "hybrid", "--fp8-amax-history-len", 1024,
              "--fp8-amax-compute-algo", "max"]
    if plan.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", 1]
    elif plan.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
    a += ["--lr", lr, "--min-lr", lr / 10, "--lr-decay-style", "cosine",
          "--lr-warmup-iters", max(1, steps // 20), "--clip-grad", 1.0,
          "--weight-decay", 0.1, "--adam-beta1", 0.9, "--adam-beta2", 0.95]
    if data_path is None:
        a += ["--mock-data", "--tokenizer-type", "NullTokenizer",
              "--vocab-size", m.vocab_size]
    else:
        a += ["--data-path", data_path]
        if tokenizer_model is not None:
            a += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                  tokenizer_model]
    a += ["--save", save, "--load", save, "--save-interval", max(1, steps // 10),
          "--log-interval", 1]
    return [str(x) for x in a]


def export(plan: Plan, out: str | Path, *, hosts: list[Host] | None = None,
           master_port: int = 29500, **kw: Any) -> tuple[list[Path], list[str]]:
    """Write ``megatron_args.txt`` (one argument per line) and ``pretrain_gpt.sh`` (or
    ``node<i>.sh`` per host assignment with ``hosts``) to ``out``."""
    args = arguments(plan, **kw)
    notes = []
    if kw.get("data_path") is None:
        notes.append("no --data-path: the arguments train on Megatron's mock data")
    folder = _io.make_dir("--out", out, err=PlanError)
    joined = " \\\n    ".join(" ".join(shlex.quote(x) for x in pair)
                             for pair in _pairs(args))
    files = [write(folder, "megatron_args.txt", "\n".join(args) + "\n")]
    head = ("#!/usr/bin/env bash\n# Megatron-LM's pretrain_gpt.py for an espresso plan "
            "(espresso export megatron).\n# Run from Megatron-LM's checkout, or set "
            "MEGATRON to it.\nset -euo pipefail\ncd \"${MEGATRON:-.}\"\n")
    if hosts:
        for i, cmd in enumerate(node_commands(plan, hosts, "pretrain_gpt.py", "\\\n    "
                                              + joined, master_port=master_port)):
            files.append(write(folder, f"node{i}.sh", head + cmd + "\n", mode=0o755))
    else:
        files.append(write(folder, "pretrain_gpt.sh",
                           head + "# Each node: torchrun --nnodes N --node-rank I "
                           "--nproc-per-node G --master-addr A --master-port P, nodes in the "
                           "plan's stage order\ntorchrun \"$@\" pretrain_gpt.py \\\n    "
                           + joined + "\n", mode=0o755))
        notes.append("no --hosts: pretrain_gpt.sh takes torchrun's node arguments")
    return files, notes


def _pairs(args: list[str]) -> list[list[str]]:
    """Flags with their values, for one flag per line."""
    out: list[list[str]] = []
    for x in args:
        if x.startswith("--") or not out:
            out.append([x])
        else:
            out[-1].append(x)
    return out
