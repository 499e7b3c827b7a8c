"""``espresso compare PLAN METRICS``: a training run against its plan. Torch-free.

Predicted (the plan's estimate) against measured (the run's ``metrics.jsonl``): iteration time
(the median over the timed steps), tokens/s, MFU, each GPU group's peak memory and its terms,
and the job's hours and dollars at the measured speed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..errors import TrainError
from ..plan import Plan
from .metrics import RunMetrics, read_metrics


@dataclass(frozen=True)
class Row:
    what: str
    predicted: float | None
    measured: float | None
    unit: str

    @property
    def ratio(self) -> float | None:
        """measured / predicted."""
        if self.predicted and self.measured is not None:
            return self.measured / self.predicted
        return None


@dataclass(frozen=True)
class Comparison:
    plan: Plan
    run: RunMetrics
    steps_timed: int
    speed: list[Row]
    memory: list[list[Row]]
    """Per GPU group: peak, then its terms."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def rows(rs: list[Row]) -> list[dict[str, Any]]:
            return [{"what": r.what, "predicted": r.predicted, "measured": r.measured,
                     "unit": r.unit, "ratio": r.ratio} for r in rs]

        return {"plan": self.run.header.get("plan"), "metrics": self.run.path,
                "steps_timed": self.steps_timed, "speed": rows(self.speed),
                "memory": [rows(m) for m in self.memory], "notes": self.notes}


def _same_layout(plan: Plan, header: dict[str, Any]) -> str | None:
    mine = [{"gpu": s.gpu, "tp": s.tp, "layers": list(s.layers)} for s in plan.stages]
    if header.get("stages") != mine or header.get("dp") != plan.dp:
        return (f"the metrics are of a run of another plan (stages {header.get('stages')}, "
                f"dp {header.get('dp')}); this plan has stages {mine}, dp {plan.dp}")
    return None


def compare(plan_path: str | Path, metrics_path: str | Path, *, skip: int = 2) -> Comparison:
    if skip < 0:
        msg = f"--skip: expected a number of steps >= 0, got {skip}"
        raise TrainError(msg)
    plan = Plan.from_json(plan_path)
    run = read_metrics(metrics_path)
    h = run.header
    if (why := _same_layout(plan, h)) is not None and not h.get("reference"):
        msg = f"compare: {why}"
        raise TrainError(msg)
    if plan.estimate is None:
        plan = plan.with_estimate()
    est = plan.estimate
    assert est is not None
    timed = run.timed(skip) or run.timed(0)
    if not timed:
        msg = f"compare: {metrics_path} has no completed step"
        raise TrainError(msg)
    notes = []
    if len(run.timed(skip)) == 0:
        notes.append(f"fewer steps than --skip {skip}: every step is timed, start-up included")
    step_s = statistics.median(s["step_s"] for s in timed)
    tokens = h.get("tokens_per_step") or plan.job.global_batch_size * plan.job.seq_len
    cpu_plan = all(st.gpu == "CPU" for st in plan.stages)
    on_gpus = not h.get("reference") and (
        h.get("device") == "cuda" or (h.get("device") == "cpu" and cpu_plan))
    flops = est.model_flops_per_iteration
    mfu = flops / (step_s * est.peak_flops) if on_gpus and flops and est.peak_flops else None
    hours = est.iterations * step_s / 3600
    extra_usd = est.transfer_usd
    speed = [
        Row("iteration time", est.iteration_s, step_s, "s"),
        Row("tokens/s", est.tokens_per_s, tokens / step_s, "tokens/s"),
        Row("MFU", est.mfu or None, mfu, "%"),
        Row("job hours", est.total_hours, hours if on_gpus else None, "h"),
        Row("job dollars", est.total_usd,
            hours * est.hourly_usd + extra_usd if on_gpus else None, "$"),
    ]
    if h.get("reference"):
        notes.append("a --reference run (one process, no plan parallelism): only its losses "
                     "compare with a run of the plan")
    elif not on_gpus:
        gpus = ", ".join(sorted({s.gpu for s in plan.stages}))
        notes.append(f"a rehearsal on {h.get('device_name', h.get('device'))}, not on the "
                     f"plan's GPUs ({gpus}): its times do not measure the plan; MFU, hours and "
                     "dollars are left out")
    if est.spot is not None:
        notes.append("the plan has spot instances: its hours and dollars include expected "
                     "interruptions; the measured ones are uninterrupted work")
    memory: list[list[Row]] = []
    for g in range(plan.pp):
        pst = est.stages[g]
        seen = [m for s in timed for m in s.get("memory", []) if m.get("stage") == g]
        if not seen:
            continue

        def most(key: str, seen: list[dict[str, Any]] = seen) -> float | None:
            vals = [m[key] for m in seen if isinstance(m.get(key), (int, float))]
            return max(vals) if vals else None

        memory.append([
            Row(f"group {g} ({pst.gpu} x{pst.tp}) peak", pst.memory_gb, most("peak_gb"), "GB"),
            Row("  parameters", pst.weights_gb, most("params_gb"), "GB"),
            Row("  gradients", pst.grads_gb, most("grads_gb"), "GB"),
            Row("  optimizer states", pst.optimizer_gb, most("optimizer_gb"), "GB"),
            Row("  saved activations", pst.activations_gb, most("activations_gb"), "GB"),
        ])
    if h.get("device") == "cpu" and not cpu_plan:
        notes.append("CPU memory is counted term by term (parameters, gradients, optimizer "
                     "states, saved activations); the estimate's peak adds transient buffers "
                     "and works in the plan's precision")
    # fp16 (loss-scaled) and bf16 mixed precision cost the same bytes and tensor-core time.
    if h.get("precision") not in ("bf16", "fp16") and not h.get("reference"):
        notes.append(f"the run used {h.get('precision')}; the plan is costed in "
                     f"{plan.job.precision} mixed precision")
    return Comparison(plan, run, len(timed), speed, memory, notes)


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "%":
        return f"{x:.1%}"
    if unit == "$":
        return f"${x:,.2f}"
    if unit == "GB":
        return f"{x:.4g} GB" if x < 1 else f"{x:,.2f} GB"
    if unit == "s":
        return f"{x:.4g} s"
    if unit == "h":
        return f"{x:,.2f} h"
    return f"{x:,.0f}"


def render(c: Comparison, console: Console | None = None) -> None:
    console = console or Console()
    h = c.run.header
    console.print(f"{h.get('model')}: run {c.run.path} ({len(c.run.steps)} steps, "
                  f"{c.steps_timed} timed; {h.get('world_size')} processes on "
                  f"{h.get('device_name')}, {h.get('precision')}) against plan "
                  f"{h.get('plan')}")
    t = Table(title=None)
    for col in ("", "predicted", "measured", "measured / predicted"):
        t.add_column(col, justify="left" if not col else "right")
    for r in c.speed:
        t.add_row(r.what, _fmt(r.predicted, r.unit), _fmt(r.measured, r.unit),
                  "-" if r.ratio is None else f"{r.ratio:.2f}x")
    for group in c.memory:
        t.add_section()
        for r in group:
            t.add_row(r.what, _fmt(r.predicted, r.unit), _fmt(r.measured, r.unit),
                      "-" if r.ratio is None else f"{r.ratio:.2f}x")
    console.print(t)
    losses = [s["loss"] for s in c.run.steps]
    if losses:
        console.print(f"Loss: {losses[0]:.4f} at step {c.run.steps[0]['step']} -> "
                      f"{losses[-1]:.4f} at step {c.run.steps[-1]['step']}")
    for n in c.notes:
        console.print(f"Note: {n}")
