"""Estimate and StageEstimate: what the cost model says of a plan (data only, so that the
plan module can hold an estimate without importing the estimator)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from . import _validate as v
from .errors import PlanError

GB = 1e9

MAY_BE_NEGATIVE = ("headroom_gb", "interruptions_at_confidence")
"""Estimate fields that may be below 0 (a stage that does not fit; -1: no bound)."""
RENT_KEYS = {"offer": "str", "provider": "str?", "region": "str?", "instance_type": "str",
             "gpu": "str", "instances": "int", "gpus": "int", "idle_gpus": "int",
             "hourly_usd": "float", "market": "str", "interruptions_per_hour": "float",
             "recovery_hours": "float", "network_assumption": "str", "price_note": "str",
             "available": "int", "availability": "str"}
"""The fields of one entry of ``Estimate.rent`` and their types (``?``: may be null)."""
RENT_REQUIRED = ("offer", "provider", "region", "instance_type", "gpu", "instances", "gpus",
                 "hourly_usd")


def _checked(where: str, cls: Any, data: Any, optional: tuple[str, ...] = (),
             special: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of dataclass ``cls`` from ``data``, each checked against its type (those in
    ``special`` are left to the caller)."""
    data = dict(v.mapping(where, data, err=PlanError))
    names = [f.name for f in fields(cls)]
    v.known_keys(where, data, names, [n for n in names if n not in optional], err=PlanError)
    types = {f.name: str(f.type) for f in fields(cls)}
    out = {k: x if k in special else v.typed(f"{where}.{k}", x, types[k], err=PlanError)
           for k, x in data.items()}
    for k, x in out.items():
        bad = [y for y in (x if isinstance(x, tuple) else (x,))
               if isinstance(y, (int, float)) and not isinstance(y, bool)
               and y < -1e-9]  # (a rounding below 0, as a bubble of -1e-17, is 0)
        if bad and k not in MAY_BE_NEGATIVE:
            msg = f"{where}.{k}: expected a number >= 0, got {x!r}"
            raise PlanError(msg)
    return out


def _rent_entry(where: str, value: Any) -> dict[str, Any]:
    data = v.mapping(where, value, err=PlanError)
    v.known_keys(where, data, tuple(RENT_KEYS), RENT_REQUIRED, err=PlanError)
    out = {k: v.typed(f"{where}.{k}", x, RENT_KEYS[k], err=PlanError) for k, x in data.items()}
    if "market" in out:
        v.choice(f"{where}.market", out["market"], ("on-demand", "spot"), err=PlanError)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class StageEstimate:
    """Time and per-GPU memory of one stage."""

    index: int
    gpu: str
    tp: int
    layers: tuple[int, int]
    fwd_s: float
    """Forward time of one micro-batch."""
    bwd_s: float
    """Backward time of one micro-batch (recomputation included)."""
    time_s: float
    """Compute seconds per iteration: ``num_microbatches * (fwd_s + bwd_s)``."""
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    """Activations stashed for the micro-batches in flight."""
    transient_gb: float
    """Working memory: one block's activations under recomputation, the last stage's logits."""
    memory_gb: float
    """Peak memory per GPU: the sum of the five above."""
    capacity_gb: float
    """Usable memory per GPU after the head-room."""
    headroom_gb: float
    """``capacity_gb - memory_gb``; negative when the stage does not fit."""
    in_flight: int
    """Micro-batches whose activations the stage holds at its peak."""
    send_s: float
    """Activation transfer to the next stage (0 for the last)."""
    send_intra_node: bool
    dp_allreduce_s: float
    optimizer_step_s: float

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layers"] = list(self.layers)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> StageEstimate:
        return cls(**_checked("estimate.stages[]", cls, data))


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotEstimate:
    """What interruptions do to a plan with spot instances (docs/cost-model.md, "Spot
    capacity"). ``Estimate.total_hours`` and ``total_usd`` are the expected figures."""

    interruptions_per_hour: float
    """The plan's interruption rate: the sum over its spot instances."""
    checkpoint_interval_hours: float
    """Hours of work between checkpoints (the interval that minimises the expected time;
    Young's sqrt(2 C / rate) to first order)."""
    checkpoint_hours: float
    """Hours to write one checkpoint (model and optimizer states at
    ``cost_model.checkpoint_gbs``)."""
    restart_hours: float
    """Hours from an interruption until work resumes: new capacity, restart, the read."""
    work_hours: float
    """Hours of training alone, as an on-demand plan would take."""
    expected_hours: float
    hours_at_confidence: float
    """Hours that hold with probability ``confidence``: the quantile of the interruption
    process's own distribution, from above (``inf``: none holds)."""
    confidence: float
    interruptions_expected: float
    interruptions_at_confidence: int
    """The same quantile of the number of interruptions (-1: none bounds it)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Any) -> SpotEstimate:
        return cls(**_checked("estimate.spot", cls, data))


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """What a plan costs and whether it works. ``reasons`` explains infeasibility."""

    iteration_s: float
    """Seconds per optimizer step: pipeline + DP all-reduce + optimizer step."""
    total_hours: float
    hourly_usd: float
    total_usd: float
    stage_time_s: tuple[float, ...]
    """Compute seconds each stage spends per iteration."""
    stage_memory_gb: tuple[float, ...]
    """Peak memory per GPU of each stage."""
    feasible: bool
    """Every stage fits in memory, availability holds, the layers are covered exactly."""
    meets_deadline: bool
    iterations: int
    deadline_hours: float
    pipeline_s: float
    """Makespan of the schedule's event simulation."""
    dp_allreduce_s: float
    optimizer_step_s: float
    closed_form_s: float
    """``sum(f+b) + (M-1) max(f+b)``, the classic pipeline formula, for comparison."""
    bubble_fraction: float
    """Idle share of the pipeline: ``1 - sum(busy) / (P * pipeline_s)``."""
    bottleneck_stage: int
    """The stage with the largest per-micro-batch ``fwd + bwd``."""
    mfu: float
    """Model FLOPs per second over the peak of all rented GPUs."""
    tokens_per_s: float
    gpus: dict[str, int]
    stages: tuple[StageEstimate, ...]
    reasons: tuple[str, ...]
    """Why the plan is infeasible, in words (empty when feasible)."""
    instances: dict[str, int] = field(default_factory=dict)
    """Whole instances rented per catalog row (offer key, or GPU type)."""
    idle_gpus: int = 0
    """GPUs in the rented instances that no stage uses (paid for all the same)."""
    transfer_gb: float = 0.0
    """GB per iteration sent between stages in different locations (charged)."""
    transfer_usd: float = 0.0
    """Data-transfer charges over the job (included in ``total_usd``)."""
    rent: tuple[dict[str, Any], ...] = ()
    """What to rent: per catalog row, ``{offer, provider, region, instance_type, gpu,
    instances, gpus, idle_gpus, hourly_usd}``, and ``market: spot`` for spot rows."""
    spot: SpotEstimate | None = None
    """Interruptions, checkpoints and the deadline at confidence, for a plan with spot
    instances (``None`` without)."""
    model_flops_per_iteration: float = 0.0
    """The model's FLOPs per iteration (forward and backward, no recomputation), the count
    :attr:`mfu` divides by; 0 in plans written before it was recorded."""
    peak_flops: float = 0.0
    """Peak dense bf16 FLOP/s of the GPUs the stages use, the denominator of :attr:`mfu`; 0 in
    plans written before it was recorded."""

    @property
    def bottleneck(self) -> StageEstimate:
        return self.stages[self.bottleneck_stage]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            val = getattr(self, f.name)
            if f.name == "stages":
                val = [s.to_dict() for s in val]
            elif f.name == "rent":
                val = [dict(r) for r in val]
            elif f.name == "spot":
                if val is None:
                    continue
                val = val.to_dict()
            elif isinstance(val, tuple):
                val = list(val)
            elif isinstance(val, dict):
                val = dict(val)
            out[f.name] = val
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Estimate:
        optional = ("instances", "idle_gpus", "transfer_gb", "transfer_usd", "rent", "spot",
                    "model_flops_per_iteration", "peak_flops")
        data = _checked("estimate", cls, data, optional, special=("stages", "rent", "spot"))
        for key in ("stages", "rent"):
            if not isinstance(data.get(key, []), list):
                msg = f"estimate.{key}: expected a list, got {data[key]!r}"
                raise PlanError(msg)
        data["stages"] = tuple(StageEstimate.from_dict(s) for s in data["stages"])
        data["rent"] = tuple(_rent_entry(f"estimate.rent[{i}]", r)
                             for i, r in enumerate(data.get("rent", [])))
        if data.get("spot") is not None:
            data["spot"] = SpotEstimate.from_dict(data["spot"])
        est = cls(**data)
        if not 0 <= est.bottleneck_stage < max(1, len(est.stages)):
            msg = (f"estimate.bottleneck_stage: expected a stage index below "
                   f"{len(est.stages)}, got {est.bottleneck_stage}")
            raise PlanError(msg)
        return est
