"""The Espresso paper's public prototype planner (GitHub ``Espresso111/Espresso``), run from its
own source as an optional external baseline (docs/baselines.md, "The paper's prototype, from
its source").

The prototype is not a library: its allocator reads its GPUs from a JSON file beside it, its
availability from a list in its source, and models from its bundled, modified
``llm-analysis``; it needs ``fire`` and DeepSpeed's pipeline schedule. So it runs in a
process of its own (``espresso/_prototype_runner.py``), under the interpreter named by
``python`` or ``$ESPRESSO_PROTOTYPE_PYTHON`` (default: this one), from the checkout named by
``source`` or ``$ESPRESSO_PROTOTYPE_SRC``. Its answer (GPUs in pipeline order, layers per
stage, data-parallel degree) becomes an Espresso :class:`~espresso.plan.Plan`, estimated by
Espresso's cost model like every baseline's, with the prototype's own figures kept beside it.

What it is given, from the job and catalog: one GPU per GPU model (the prototype names GPUs by
its ``llm-analysis`` GPU configs: :data:`LLM_ANALYSIS_GPUS`; other models are left out, and
said so), the row's price per GPU-hour, memory, TFLOPS and efficiency, its count as the
availability; the per-iteration SLO ``deadline / iterations``; the model by the prototype's
own config of that name when it has one, else by Espresso's dimensions; the global batch and
sequence length; ``micro_batches`` gradient-accumulation steps (its example's 4), tensor
parallelism 1 (the prototype plans none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _validate as v
from .catalog import Catalog, GpuType
from .cost import CostParams
from .errors import EspressoError, SpecError
from .job import Job
from .plan import Plan, Stage

ENV_SOURCE = "ESPRESSO_PROTOTYPE_SRC"
"""Environment variable naming a checkout of GitHub Espresso111/Espresso."""
ENV_PYTHON = "ESPRESSO_PROTOTYPE_PYTHON"
"""Environment variable naming the interpreter that holds the prototype's dependencies."""

LLM_ANALYSIS_GPUS: dict[str, str] = {
    "H100-SXM": "h100-sxm-80gb", "H100-PCIe": "h100-pcie-80gb",
    "A100-80GB": "a100-sxm-80gb", "A100-40GB": "a100-sxm-40gb", "A10G": "a10g-pcie-24gb",
    "A10": "a10-pcie-28gb", "A30": "a30-pcie-24gb", "RTX-A6000": "a6000-pcie4-48gb",
    "RTX-A4000": "a4000-pcie4-16gb", "RTX-3090": "3090-pcie4-24gb", "RTX-4090": "4090-pcie-24gb",
    "L40": "l40-pcie4-48gb", "T4": "t4-pcie-16gb", "V100-32GB": "v100-sxm-32gb",
    "V100-16GB": "v100-sxm-16gb",
}
"""Espresso's GPU model names and the prototype's ``llm-analysis`` GPU configs for them (its
``gpu_configs/*.json``): the GPUs it can plan with."""

HBM_EFFICIENCY = 0.5
"""The HBM efficiency the prototype's own ``gpu_config.json`` gives every GPU."""
DEFAULT_MICRO_BATCHES = 4
"""Gradient-accumulation steps (micro-batches per replica) of the prototype's example."""
DEFAULT_TIMEOUT_S = 900.0

_PLANNER = Path("Espresso") / "GPUAllocator.py"
_MODEL_CONFIGS = Path("Espresso") / "llm-analysis" / "llm_analysis" / "model_configs"


def source_dir(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The prototype's checkout: ``path``, else ``$ESPRESSO_PROTOTYPE_SRC``; ``None`` when
    neither is given. A path without the planner is an error that names it."""
    raw = os.fspath(path) if path is not None else os.environ.get(ENV_SOURCE)
    if not raw:
        return None
    root = Path(raw).expanduser()
    missing = [str(p) for p in (_PLANNER, _MODEL_CONFIGS) if not (root / p).exists()]
    if missing:
        where = "source" if path is not None else f"${ENV_SOURCE}"
        msg = (f"{where}: {str(root)!r} is not a checkout of GitHub Espresso111/Espresso: it "
               f"lacks {', '.join(missing)}")
        raise SpecError(msg)
    return root


def unavailable() -> str | None:
    """Why the external baseline cannot run here (``None``: it can, as far as can be told
    without running it)."""
    try:
        root = source_dir()
    except SpecError as exc:
        return str(exc)
    if root is None:
        return (f"set ${ENV_SOURCE} to a checkout of GitHub Espresso111/Espresso (and "
                f"${ENV_PYTHON} to an interpreter with its dependencies: fire, deepspeed)")
    return None


@dataclass(frozen=True, slots=True)
class PrototypeInput:
    """What the prototype's planner is given (``spec``, the runner's input), the catalog row
    behind each of its GPU names, and the rows left out with the reason."""

    spec: dict[str, Any]
    rows: dict[str, GpuType]
    skipped: tuple[str, ...] = ()


def prototype_input(job: Job, catalog: Catalog, source: Path, *,
                    micro_batches: int = DEFAULT_MICRO_BATCHES,
                    cost_model: CostParams | None = None,
                    work_dir: Path | None = None) -> PrototypeInput:
    """The job and catalog as the prototype's planner takes them (module docstring).
    ``work_dir``: where the model's config is written when the prototype has none of that
    name (default: a file beside nothing, named in the spec only)."""
    micro_batches = v.integer("micro_batches", micro_batches, minimum=1, maximum=1 << 20)
    if job.global_batch_size % micro_batches:
        msg = (f"micro_batches: {micro_batches} does not divide the global batch "
               f"{job.global_batch_size}")
        raise SpecError(msg)
    cost = cost_model or CostParams()
    rows: dict[str, GpuType] = {}
    skipped: list[str] = []
    for g in catalog.gpus:
        if g.count <= 0 or g.market == "spot":
            continue
        theirs = LLM_ANALYSIS_GPUS.get(g.model)
        if theirs is None:
            skipped.append(f"{g.name}: the prototype's llm-analysis has no config for {g.model}")
            continue
        cur = rows.get(theirs)
        # one row per GPU model, as the prototype names GPUs by model: the most GPUs, then
        # the cheapest
        if cur is None or (-g.count, g.price_per_hour, g.name) < (
                -cur.count, cur.price_per_hour, cur.name):
            if cur is not None:
                skipped.append(f"{cur.name}: another offer of {cur.model} is used")
            rows[theirs] = g
        else:
            skipped.append(f"{g.name}: another offer of {g.model} is used")
    gpus = [{"name": theirs, "cost": g.price_per_hour,
             "flops_efficiency": g.efficiency if g.efficiency is not None else cost.efficiency,
             "hbm_memory_efficiency": HBM_EFFICIENCY, "mem_per_GPU_in_GB": g.memory_gb,
             "peak_fp16_TFLOPS": g.bf16_tflops} for theirs, g in rows.items()]
    m = job.model
    name = m.name
    max_seq_len = max(job.seq_len, m.position_embeddings or 0)
    if not (source / _MODEL_CONFIGS / f"{name}.json").exists():
        # llm-analysis reads a model config from a JSON file named in place of the model
        path = (work_dir or Path(tempfile.gettempdir())) / f"espresso-model-{name}.json"
        ffn = m.ffn_hidden_size or 4 * m.hidden_size
        path.write_text(json.dumps({
            "name": name, "num_layers": m.num_layers, "n_head": m.num_heads,
            "hidden_dim": m.hidden_size, "vocab_size": m.vocab_size,
            "max_seq_len": max_seq_len, "num_key_value_heads": m.num_kv_heads or m.num_heads,
            "ffn_embed_dim": ffn, "expansion_ratio": ffn / m.hidden_size}), encoding="utf-8")
        name = str(path)
    model = {"model_name": name, "gradient_accumulation_steps": micro_batches,
             "seq_len": job.seq_len, "slo": job.deadline_hours * 3600.0 / job.num_iterations,
             "model_layer": m.num_layers, "global_batch_size": job.global_batch_size,
             "dp_size": 1, "tp_size": 1, "num_layers": m.num_layers, "n_head": m.num_heads,
             "hidden_dim": m.hidden_size, "vocab_size": m.vocab_size,
             "max_seq_len": max_seq_len}
    spec = {"source": str(source), "gpus": gpus, "limits": [g.count for g in rows.values()],
            "model": model}
    return PrototypeInput(spec=spec, rows=rows, skipped=tuple(skipped))


def plan_from_result(result: dict[str, Any], job: Job, catalog: Catalog,
                     rows: dict[str, GpuType], *, micro_batches: int = DEFAULT_MICRO_BATCHES,
                     cost_model: CostParams | None = None) -> Plan | None:
    """The prototype's answer as an Espresso plan, estimated by Espresso's cost model
    (``None``: it found no plan). Its layer split, GPU order and data-parallel degree are
    kept; micro-batches of ``global batch / (dp x micro_batches)`` sequences, full
    recomputation (its memory model's), one GPU per stage."""
    perm = result.get("gpus_permutation")
    layers = result.get("layer_distribution")
    if not perm or not layers or not result.get("success"):
        return None
    if len(perm) != len(layers) or sum(layers) != job.model.num_layers:
        msg = (f"prototype: its answer splits {sum(layers)} layers over {len(perm)} GPUs "
               f"({len(layers)} stages), but {job.model.name} has {job.model.num_layers}")
        raise EspressoError(msg)
    dp = int(result.get("dp_size", 1))
    if job.global_batch_size % (dp * micro_batches):
        msg = (f"prototype: its data-parallel degree {dp} x {micro_batches} micro-batches does "
               f"not divide the global batch {job.global_batch_size}")
        raise EspressoError(msg)
    stages = []
    begin = 0
    for theirs, n in zip(perm, layers, strict=True):
        g = rows.get(theirs)
        if g is None:
            msg = f"prototype: its answer names {theirs!r}, which it was not given"
            raise EspressoError(msg)
        # a row whose name is not its GPU (an offer) is named by the stage's offer
        stages.append(Stage(gpu=g.model, tp=1, layers=(begin, begin + int(n)),
                            offer=g.name if g.provider or g.name != g.model else None))
        begin += int(n)
    plan = Plan(job=job, stages=tuple(stages), dp=dp,
                micro_batch_size=job.global_batch_size // (dp * micro_batches),
                num_microbatches=micro_batches, recompute="full",
                cost_model=cost_model or CostParams())
    return plan.with_estimate(catalog)


@dataclass(frozen=True, slots=True)
class PrototypeRun:
    """One run of the prototype's planner: its plan in Espresso's terms (``None``: none
    found), its own answer, its own time (seconds inside its planner), the rows left out."""

    plan: Plan | None
    result: dict[str, Any]
    seconds: float
    skipped: tuple[str, ...] = field(default=())


def run_prototype(job: Job, catalog: Catalog, *, source: str | os.PathLike[str] | None = None,
                  python: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  micro_batches: int = DEFAULT_MICRO_BATCHES,
                  cost_model: CostParams | None = None) -> PrototypeRun:
    """Run the prototype's planner on the job and catalog (module docstring) within
    ``timeout_s`` seconds and return its answer."""
    root = source_dir(source)
    if root is None:
        msg = f"source: {unavailable()}"
        raise SpecError(msg)
    timeout_s = v.number("timeout_s", timeout_s, positive=True)
    python = python or os.environ.get(ENV_PYTHON) or sys.executable
    with tempfile.TemporaryDirectory(prefix="espresso-prototype-") as tmp:
        work = Path(tmp)
        given = prototype_input(job, catalog, root, micro_batches=micro_batches,
                                cost_model=cost_model, work_dir=work)
        if not given.rows:
            return PrototypeRun(plan=None, result={"error": "no GPU the prototype knows"},
                                seconds=0.0, skipped=given.skipped)
        (work / "in.json").write_text(json.dumps(given.spec), encoding="utf-8")
        runner = Path(__file__).with_name("_prototype_runner.py")
        started = time.perf_counter()
        try:
            # it writes its analyses under ./testData: the temporary directory holds them
            done = subprocess.run([python, str(runner), "in.json", "out.json"], cwd=work,
                                  capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            msg = f"prototype: its planner did not finish within {timeout_s:g} s (timeout_s)"
            raise EspressoError(msg) from None
        except OSError as exc:
            msg = f"prototype: cannot start {python!r}: {exc}"
            raise EspressoError(msg) from None
        out_path = work / "out.json"
        if not out_path.exists():
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
            msg = (f"prototype: its runner exited with status {done.returncode} and no answer"
                   + (f": {' | '.join(tail)}" if tail else ""))
            raise EspressoError(msg)
        out = json.loads(out_path.read_text(encoding="utf-8"))
    if "error" in out:
        hint = ("" if "No module named" not in out["error"] else
                f" (run it under an interpreter with the prototype's dependencies: "
                f"${ENV_PYTHON}, or python=)")
        msg = f"prototype: its planner failed: {out['error']}{hint}"
        raise EspressoError(msg)
    result = out["result"]
    plan = plan_from_result(result, job, catalog, given.rows, micro_batches=micro_batches,
                            cost_model=cost_model)
    seconds = float(out.get("seconds", time.perf_counter() - started))
    return PrototypeRun(plan=plan, result=result, seconds=seconds, skipped=given.skipped)
