"""Plan and Stage: a pipeline-parallel arrangement of GPUs, and its JSON contract."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import _io
from . import _validate as v
from .cost import CostParams
from .errors import PlanError, SpecError
from .estimate import estimate as _estimate
from .estimate_result import Estimate
from .job import Job
from .profile import as_profiles

SCHEMA = "espresso.plan/1"
SCHEDULES = ("1f1b", "gpipe")
RECOMPUTE = ("none", "full", "selective", "selective-op")
SHARDING = ("none", "zero1", "zero2", "fsdp")
MAX_STAGES = 1024
MAX_MICROBATCHES = 1 << 20

_PLAN_KEYS = ("schema", "job", "dp", "micro_batch_size", "num_microbatches", "schedule",
              "recompute", "sharding", "sequence_parallel", "virtual_stages", "stages", "gpus",
              "estimate",
              "cost_model", "profiles", "stats", "domain", "proof")
_OFFER_KEYS = ("provider", "region", "instance_type")


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One pipeline stage: a GPU type, its tensor-parallel width and its blocks."""

    gpu: str
    """GPU type name in the catalog (the GPU model when ``offer`` is given)."""
    tp: int = 1
    """Tensor-parallel width (GPUs of the stage in one replica, inside one node)."""
    layers: tuple[int, int]
    """Half-open range ``[begin, end)`` of transformer blocks. Stage 0 also holds the
    embedding; the last stage the final norm, LM head and loss."""

    offer: str | None = None
    """The catalog offer the stage rents (``provider/region/instance_type``, with ``:spot``
    on the spot market), or ``<gpu>:spot`` for a plain GPU type bought on the spot market;
    ``None`` for a plain GPU-type row."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "gpu", v.string("stage.gpu", self.gpu, err=PlanError))
        if self.offer is not None:
            offer = v.string("stage.offer", self.offer, err=PlanError)
            parts = offer.removesuffix(":spot").split("/")
            plain_spot = offer == f"{self.gpu}:spot"
            if not plain_spot and (len(parts) != 3 or not all(parts)):
                msg = (f"stage.offer: expected provider/region/instance_type (`:spot` on the "
                       f"spot market) or {self.gpu}:spot, got {offer!r}")
                raise PlanError(msg)
            set_(self, "offer", offer)
        set_(self, "tp", v.integer("stage.tp", self.tp, minimum=1, maximum=1024, err=PlanError))
        layers = self.layers
        if not isinstance(layers, (list, tuple)) or len(layers) != 2:
            msg = f"stage.layers: expected [begin, end], got {layers!r}"
            raise PlanError(msg)
        begin = v.integer("stage.layers[0]", layers[0], minimum=0, maximum=100_000, err=PlanError)
        end = v.integer("stage.layers[1]", layers[1], minimum=0, maximum=100_000, err=PlanError)
        set_(self, "layers", (begin, end))

    @property
    def num_layers(self) -> int:
        return max(0, self.layers[1] - self.layers[0])

    @classmethod
    def from_dict(cls, data: Any, index: int = 0) -> Stage:
        data = v.mapping(f"stages[{index}]", data, err=PlanError)
        v.known_keys(f"stages[{index}]", data, ("gpu", "tp", "layers", "offer"),
                     ("gpu", "layers"), err=PlanError)
        data = dict(data)
        if isinstance(data.get("offer"), dict):
            off = data["offer"]
            where = f"stages[{index}].offer"
            v.known_keys(where, off, (*_OFFER_KEYS, "market"), (), err=PlanError)
            market = v.choice(f"{where}.market", off.get("market", "on-demand"),
                              ("on-demand", "spot"), err=PlanError)
            suffix = ":spot" if market == "spot" else ""
            if market == "spot" and not any(k in off for k in _OFFER_KEYS):
                data["offer"] = f"{data.get('gpu')}{suffix}"  # a plain GPU type, spot
            else:
                v.known_keys(where, off, (*_OFFER_KEYS, "market"), _OFFER_KEYS, err=PlanError)
                data["offer"] = "/".join(str(off[k]) for k in _OFFER_KEYS) + suffix
        try:
            return cls(**data)
        except PlanError as exc:
            msg = str(exc).replace("stage.", f"stages[{index}].", 1)
            raise PlanError(msg) from None

    @property
    def instance_type(self) -> str | None:
        """The instance type of the offer (``p4d.24xlarge``), ``None`` without one."""
        if self.offer is None or "/" not in self.offer:
            return None
        return self.offer.removesuffix(":spot").split("/")[-1]

    @property
    def market(self) -> str:
        """``spot`` when the stage's instances are bought on the spot market."""
        return "spot" if self.offer is not None and self.offer.endswith(":spot") else "on-demand"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu": self.gpu, "tp": self.tp, "layers": list(self.layers)}
        if self.offer is not None:
            key = self.offer.removesuffix(":spot")
            off: dict[str, Any] = (dict(zip(_OFFER_KEYS, key.split("/"), strict=True))
                                   if "/" in key else {})
            if self.market == "spot":
                off["market"] = "spot"
            out["offer"] = off
        return out


def _proof_stats(proof: Any) -> dict[str, Any] | None:
    """The ``proof`` block of an unproven plan as the statistics it came from."""
    if proof is None:
        return None
    proof = v.mapping("plan.proof", proof, err=PlanError)
    v.known_keys("plan.proof", proof, ("proven", "gap", "stopped_by"), ("proven",),
                 err=PlanError)
    if v.boolean("plan.proof.proven", proof["proven"], err=PlanError):
        return None
    gap = proof.get("gap")
    gap = None if gap is None else v.number("plan.proof.gap", gap, minimum=0.0, err=PlanError)
    stopped = v.choice("plan.proof.stopped_by", proof.get("stopped_by", "time limit"),
                       ("time limit", "interrupt"), err=PlanError)
    return {"complete": False, "gap": gap, "interrupted": stopped == "interrupt"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A training plan: the job, the stages and how batches flow through them."""

    job: Job
    """The job the plan runs."""
    stages: tuple[Stage, ...]
    """Pipeline stages in order."""
    dp: int = 1
    """Data-parallel replicas of the whole pipeline."""
    micro_batch_size: int = 1
    """Sequences per micro-batch."""
    num_microbatches: int
    """Micro-batches per replica per step; ``dp * micro_batch_size * num_microbatches``
    must equal the job's global batch."""
    schedule: str = "1f1b"
    """``1f1b`` (PipeDream-flush) or ``gpipe``."""
    recompute: str = "none"
    """Activation recomputation: ``none``, ``full`` (every block's forward again) or
    ``selective`` (the attention core only, Korthikanti et al. 2022)."""
    sharding: str = "none"
    """How each stage's model states are sharded over its ``dp`` replicas: ``none``,
    ``zero1`` (optimizer states), ``zero2`` (and gradients) or ``fsdp`` (and the weights,
    gathered block by block: FSDP2 / ZeRO-3)."""
    sequence_parallel: bool = False
    """Tensor-parallel stages split the norms and dropouts along the sequence (Korthikanti
    et al. 2022): the same communication, less activation memory and work."""
    virtual_stages: int = 1
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2): with ``v > 1`` the ``stages`` are
    the model's ``P * v`` pipeline stages in order, run by ``P = num_stages / v`` groups of
    GPUs (``pp``), stage ``s`` on group ``s % P`` (each group holds ``v`` chunks: stages
    ``d, d + P, ...``, which must name the same GPU type, tp and offer). It cuts the
    pipeline bubble ``v``-fold for more transfers and activation memory; needs the
    ``1f1b`` schedule and ``num_microbatches`` a multiple of ``P``."""
    cost_model: CostParams = field(default_factory=CostParams)
    """Constants of the cost model the plan is estimated with."""
    estimate: Estimate | None = None
    """The cost model's estimate, when attached (``plan.with_estimate()``)."""
    stats: dict[str, Any] | None = None
    """Search statistics, for plans the search produced. Not part of the plan's JSON unless
    asked for (``to_dict(stats=True)``): they hold timings, so two runs differ."""
    profiles: dict[str, Any] = field(default_factory=dict)
    """Measured profiles (``{gpu: espresso.Profile}``) that replace the analytic block costs
    of those GPU types in the estimate; part of the plan so it estimates the same when read
    back."""
    domain: dict[str, Any] | None = None
    """Where the plan runs (``scope``, ``provider``, ``region``, ``zone``, ``vendor``; and
    ``spans``, ``transfer_usd_per_gb``, ``cross_link_gbps`` when its instances span zones or
    regions, which the estimate then charges). ``None``: one location, nothing charged."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.domain is not None:
            dom = dict(v.mapping("plan.domain", self.domain, err=PlanError))
            v.known_keys("plan.domain", dom, ("scope", "provider", "region", "zone", "vendor",
                                             "spans", "transfer_usd_per_gb",
                                             "cross_link_gbps"), (), err=PlanError)
            for k in ("transfer_usd_per_gb", "cross_link_gbps"):
                if k in dom:
                    dom[k] = v.number(f"plan.domain.{k}", dom[k], minimum=0, maximum=1e6,
                                      err=PlanError)
            if "cross_link_gbps" in dom and dom["cross_link_gbps"] <= 0:
                msg = f"plan.domain.cross_link_gbps: expected > 0, got {dom['cross_link_gbps']}"
                raise PlanError(msg)
            set_(self, "domain", dom)
        if not isinstance(self.job, Job):
            msg = f"plan.job: expected a Job, got {type(self.job).__name__}"
            raise PlanError(msg)
        stages = tuple(self.stages) if isinstance(self.stages, (list, tuple)) else None
        if not stages:
            msg = f"plan.stages: expected a non-empty list of stages, got {self.stages!r}"
            raise PlanError(msg)
        if len(stages) > MAX_STAGES:
            msg = f"plan.stages: at most {MAX_STAGES} stages are supported, got {len(stages)}"
            raise PlanError(msg)
        for i, st in enumerate(stages):
            if not isinstance(st, Stage):
                msg = f"plan.stages[{i}]: expected a Stage, got {type(st).__name__}"
                raise PlanError(msg)
        set_(self, "stages", stages)
        set_(self, "dp", v.integer("plan.dp", self.dp, minimum=1, maximum=1 << 20, err=PlanError))
        set_(self, "micro_batch_size",
             v.integer("plan.micro_batch_size", self.micro_batch_size, minimum=1,
                       maximum=1 << 24, err=PlanError))
        set_(self, "num_microbatches",
             v.integer("plan.num_microbatches", self.num_microbatches, minimum=1,
                       maximum=MAX_MICROBATCHES, err=PlanError))
        if len(stages) * self.num_microbatches > 1 << 22:
            msg = (
                f"plan: {len(stages)} stages x {self.num_microbatches} micro-batches is beyond "
                f"what the pipeline simulation supports (at most {1 << 22})"
            )
            raise PlanError(msg)
        set_(self, "schedule", v.choice("plan.schedule", self.schedule, SCHEDULES, err=PlanError))
        set_(self, "recompute",
             v.choice("plan.recompute", self.recompute, RECOMPUTE, err=PlanError))
        set_(self, "sharding", v.choice("plan.sharding", self.sharding, SHARDING, err=PlanError))
        set_(self, "sequence_parallel",
             v.boolean("plan.sequence_parallel", self.sequence_parallel, err=PlanError))
        set_(self, "virtual_stages",
             v.integer("plan.virtual_stages", self.virtual_stages, minimum=1,
                       maximum=MAX_STAGES, err=PlanError))
        if self.virtual_stages > 1:
            self._check_interleaving()
        set_(self, "profiles", as_profiles(self.profiles))
        if not isinstance(self.cost_model, CostParams):
            msg = f"plan.cost_model: expected CostParams, got {type(self.cost_model).__name__}"
            raise PlanError(msg)

    def _check_interleaving(self) -> None:
        n, vs = len(self.stages), self.virtual_stages
        if n % vs or n // vs < 2:
            msg = (f"plan.virtual_stages: {vs} chunks per GPU group need a multiple of {vs} "
                   f"stages over at least 2 groups, got {n} stages")
            raise PlanError(msg)
        if self.schedule != "1f1b":
            msg = (f"plan.virtual_stages: {vs} needs the 1f1b schedule (interleaved 1F1B), "
                   f"got {self.schedule!r}")
            raise PlanError(msg)
        pp = n // vs
        if self.num_microbatches % pp:
            msg = (f"plan.num_microbatches: interleaved 1F1B over {pp} GPU groups needs a "
                   f"multiple of {pp}, got {self.num_microbatches}")
            raise PlanError(msg)
        for i in range(pp, n):
            a, b = self.stages[i % pp], self.stages[i]
            if (a.gpu, a.tp, a.offer) != (b.gpu, b.tp, b.offer):
                msg = (f"plan.stages[{i}]: runs on the GPUs of stage {i % pp} (virtual_stages "
                       f"{vs} over {pp} groups), so needs its gpu, tp and offer "
                       f"({a.gpu}, tp {a.tp}, {a.offer}); got ({b.gpu}, tp {b.tp}, {b.offer})")
                raise PlanError(msg)

    # ------------------------------------------------------------------ derived
    @property
    def num_stages(self) -> int:
        """Pipeline stages (``pp * virtual_stages``)."""
        return len(self.stages)

    @property
    def pp(self) -> int:
        """Groups of GPUs along the pipeline (one per stage unless interleaved)."""
        return len(self.stages) // self.virtual_stages

    def device_stages(self, group: int) -> tuple[int, ...]:
        """The stages GPU group ``group`` runs: ``group, group + pp, ...``."""
        return tuple(range(group, self.num_stages, self.pp))

    @property
    def gpus(self) -> dict[str, int]:
        """GPUs used per GPU type: ``dp * sum(tp)`` over the GPU groups of that type."""
        out: dict[str, int] = {}
        for st in self.stages[:self.pp]:
            out[st.gpu] = out.get(st.gpu, 0) + st.tp * self.dp
        return out

    @property
    def num_gpus(self) -> int:
        return sum(self.gpus.values())

    def with_estimate(self, catalog: Any = None) -> Plan:
        """A copy with ``estimate`` filled in by :func:`espresso.estimate`."""
        return replace(self, estimate=_estimate(self, catalog))

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Read the plan contract (``"schema": "espresso.plan/1"``)."""
        data = v.mapping("plan", data, err=PlanError)
        v.known_keys("plan", data, _PLAN_KEYS, ("job", "stages"), err=PlanError)
        schema = data.get("schema", SCHEMA)
        if schema != SCHEMA:
            msg = f"plan.schema: expected {SCHEMA!r}, got {schema!r}"
            raise PlanError(msg)
        try:
            job = Job.from_dict(data["job"])
        except SpecError as exc:
            msg = f"plan.job: {exc}"
            raise PlanError(msg) from None
        raw_stages = data["stages"]
        if not isinstance(raw_stages, list) or not raw_stages:
            msg = f"plan.stages: expected a non-empty list of stages, got {raw_stages!r}"
            raise PlanError(msg)
        stages = tuple(Stage.from_dict(s, i) for i, s in enumerate(raw_stages))
        dp = data.get("dp", 1)
        mbs = data.get("micro_batch_size", 1)
        m = data.get("num_microbatches")
        if m is None:
            dp_i = v.integer("plan.dp", dp, minimum=1, err=PlanError)
            mbs_i = v.integer("plan.micro_batch_size", mbs, minimum=1, err=PlanError)
            if job.global_batch_size % (dp_i * mbs_i):
                msg = (
                    "plan.num_microbatches: missing, and cannot be derived: global batch "
                    f"{job.global_batch_size} is not a multiple of dp {dp_i} x micro_batch_size "
                    f"{mbs_i}"
                )
                raise PlanError(msg)
            m = job.global_batch_size // (dp_i * mbs_i)
        cost = CostParams.from_dict(data["cost_model"]) if "cost_model" in data else CostParams()
        est = Estimate.from_dict(data["estimate"]) if data.get("estimate") is not None else None
        stats = (dict(v.mapping("plan.stats", data["stats"], err=PlanError))
                 if data.get("stats") is not None else _proof_stats(data.get("proof")))
        plan = cls(job=job, stages=stages, dp=dp, micro_batch_size=mbs, num_microbatches=m,
                   schedule=data.get("schedule", "1f1b"), recompute=data.get("recompute", "none"),
                   sharding=data.get("sharding", "none"),
                   sequence_parallel=data.get("sequence_parallel", False),
                   virtual_stages=data.get("virtual_stages", 1), cost_model=cost,
                   estimate=est, stats=stats,
                   profiles=data.get("profiles") or {}, domain=data.get("domain"))
        if "gpus" in data:
            given = v.mapping("plan.gpus", data["gpus"], err=PlanError)
            if dict(given) != plan.gpus:
                msg = (
                    f"plan.gpus: says {dict(given)} but the stages with dp {plan.dp} use "
                    f"{plan.gpus} (gpus is derived: dp x tp summed per type; fix or drop it)"
                )
                raise PlanError(msg)
        return plan

    def to_dict(self, *, stats: bool = False) -> dict[str, Any]:
        """The plan contract. Search statistics (timings, node counts) only with
        ``stats=True``, so the same plan always serialises to the same bytes."""
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "job": self.job.to_dict(),
            "dp": self.dp,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "schedule": self.schedule,
            "recompute": self.recompute,
            "stages": [s.to_dict() for s in self.stages],
            "gpus": self.gpus,
        }
        # Written only when used, so plans without them read as before by older readers.
        if self.sharding != "none":
            out["sharding"] = self.sharding
        if self.sequence_parallel:
            out["sequence_parallel"] = True
        if self.virtual_stages > 1:
            out["virtual_stages"] = self.virtual_stages
        changed = self.cost_model.to_dict(only_changed=True)
        if changed:
            out["cost_model"] = changed
        if self.profiles:
            out["profiles"] = {g: p.to_dict() for g, p in self.profiles.items()}
        if self.domain is not None:
            out["domain"] = dict(self.domain)
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_dict()
        if stats and self.stats is not None:
            out["stats"] = self.stats
        elif self.stats is not None and self.stats.get("complete") is False:
            # An unproven plan says so even without its statistics (docs/plan-format.md).
            gap = self.stats.get("gap")
            out["proof"] = {"proven": False,
                            "gap": gap if isinstance(gap, float) and math.isfinite(gap)
                            else None,
                            "stopped_by": "interrupt" if self.stats.get("interrupted")
                            else "time limit"}
        return out

    def to_json(self, path: str | Path | None = None, *, indent: int = 2,
                stats: bool = False) -> str:
        """The plan as JSON text; also written to ``path`` (atomically) when given."""
        text = json.dumps(self.to_dict(stats=stats), indent=indent) + "\n"
        if path is not None:
            _io.write_text("plan", path, text, err=PlanError)
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> Plan:
        """Read a plan from a JSON file path (or JSON text starting with ``{``)."""
        text = str(source)
        where = "plan"
        if not text.lstrip().startswith("{"):
            text = _io.read_text("plan", source, err=PlanError)
            where = f"plan: {_io.shown_path(source)}"
        try:
            data = _io.loads_json(text)
        except (ValueError, RecursionError) as exc:
            msg = f"{where}: not valid JSON ({exc})"
            raise PlanError(msg) from None
        return cls.from_dict(data)
