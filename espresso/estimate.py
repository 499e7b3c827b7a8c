"""estimate(): time, memory and cost of any plan under the analytic cost model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Protocol

from ._native import core
from .catalog import Catalog
from .cloud.prices import price_notes
from .cloud.spot import with_spot
from .cost import CostParams
from .errors import PlanError, SpecError
from .estimate_result import GB, Estimate, SpotEstimate, StageEstimate
from .gpu_type import runs_fp8
from .job import Job
from .profile import Profile, as_profiles
from .table import Table

__all__ = ["Estimate", "PlanLike", "StageEstimate", "estimate"]


class StageLike(Protocol):
    """What the estimate reads of a stage (:class:`espresso.plan.Stage`)."""

    @property
    def gpu(self) -> str: ...
    @property
    def offer(self) -> str | None: ...
    @property
    def market(self) -> str: ...
    @property
    def tp(self) -> int: ...
    @property
    def layers(self) -> tuple[int, int]: ...


class PlanLike(Protocol):
    """What the estimate reads of a plan: the fields of :class:`espresso.plan.Plan`. The
    cost model sits below the plan class (``Plan.with_estimate`` calls it), so it knows plans
    by their shape, never by importing them (docs/development.md, "Layers")."""

    @property
    def job(self) -> Job: ...
    @property
    def stages(self) -> Sequence[StageLike]: ...
    @property
    def dp(self) -> int: ...
    @property
    def micro_batch_size(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...
    @property
    def num_stages(self) -> int: ...
    def device_stages(self, group: int) -> tuple[int, ...]: ...
    @property
    def virtual_stages(self) -> int: ...
    @property
    def schedule(self) -> str: ...
    @property
    def recompute(self) -> str: ...
    @property
    def sharding(self) -> str: ...
    @property
    def sequence_parallel(self) -> bool: ...
    @property
    def cost_model(self) -> CostParams: ...
    @property
    def profiles(self) -> Mapping[str, Profile]: ...
    @property
    def domain(self) -> Mapping[str, Any] | None: ...
    @property
    def estimate(self) -> Estimate | None: ...

RECOMPUTE_CORE = {"none": core.Recompute.NONE, "full": core.Recompute.FULL,
                  "selective": core.Recompute.SELECTIVE,
                  "selective-op": core.Recompute.SELECTIVE_OP}
SHARDING_CORE = {"none": core.Sharding.NONE, "zero1": core.Sharding.ZERO1,
                 "zero2": core.Sharding.ZERO2, "fsdp": core.Sharding.FULL}

def _workload(plan: PlanLike) -> Any:
    job = plan.job
    w = core.Workload()
    w.seq_len = job.seq_len
    w.micro_batch_size = plan.micro_batch_size
    w.num_microbatches = plan.num_microbatches
    w.dp = plan.dp
    w.global_batch_size = job.global_batch_size
    w.schedule = core.Schedule.GPIPE if plan.schedule == "gpipe" else core.Schedule.ONE_F_ONE_B
    w.recompute = RECOMPUTE_CORE[plan.recompute]
    w.sharding = SHARDING_CORE[plan.sharding]
    w.sequence_parallel = plan.sequence_parallel
    w.fp8 = job.precision == "fp8"
    w.virtual_stages = plan.virtual_stages
    w.optimizer_bytes_per_param = job.optimizer_state_bytes
    w.iterations = float(job.num_iterations)
    w.deadline_hours = job.deadline_hours
    w.deadline_confidence = job.deadline_confidence
    dom = plan.domain or {}
    if dom.get("spans"):
        w.transfer_usd_per_gb = float(dom.get("transfer_usd_per_gb", 0.0))
    return w


def _with_recorded_terms(catalog: Catalog, plan: PlanLike) -> Catalog:
    """Spot rows with the interruption rate and recovery the plan's estimate recorded."""
    terms = {r["offer"]: r for r in (plan.estimate.rent if plan.estimate is not None else ())
             if r.get("market") == "spot" and "interruptions_per_hour" in r}
    if not terms:
        return catalog
    rows = tuple(replace(g, interruptions_per_hour=float(terms[g.name]["interruptions_per_hour"]),
                         recovery_hours=float(terms[g.name].get("recovery_hours", g.recovery)))
                 if g.name in terms else g for g in catalog.gpus)
    return Catalog(gpus=rows, notes=catalog.notes)


def _spot(res: Any, job: Job) -> SpotEstimate | None:
    """The spot terms of a core estimate (``None`` without spot instances)."""
    if res.interruptions_per_hour <= 0:
        return None
    return SpotEstimate(
        interruptions_per_hour=res.interruptions_per_hour,
        checkpoint_interval_hours=res.checkpoint_interval_hours,
        checkpoint_hours=res.checkpoint_hours, restart_hours=res.restart_hours,
        work_hours=res.work_hours, expected_hours=res.total_hours,
        hours_at_confidence=res.hours_at_confidence, confidence=job.deadline_confidence,
        interruptions_expected=res.interruptions_expected,
        interruptions_at_confidence=int(res.interruptions_at_confidence))


def pool_use(rows: Sequence[Any], instances: Sequence[int]) -> dict[str, float]:
    """Units of each shared limit (``GpuType.pool``) the rented instances use."""
    used: dict[str, float] = {}
    for g, inst in zip(rows, instances, strict=True):
        if g.pool is not None and inst > 0:
            used[g.pool] = used.get(g.pool, 0.0) + int(inst) * float(g.pool_units or 0.0)
    return used


def pools_exceeded(rows: Sequence[Any], instances: Sequence[int]) -> list[str]:
    """Why the rented instances break a shared limit (none: they do not)."""
    limits = {g.pool: float(g.pool_limit or 0.0) for g in rows if g.pool is not None}
    return [f"the plan's instances use {used:g} units of the shared limit {pool!r}, which "
            f"allows {limits[pool]:g} (its offers: "
            + ", ".join(g.name for g in rows if g.pool == pool) + ")"
            for pool, used in pool_use(rows, instances).items()
            if used > limits[pool] * (1 + 1e-9)]


def rent_list(rows: list[Any], gpus_used: list[int], instances: list[int],
              notes: dict[str, str] | None = None) -> tuple[dict[str, Any], ...]:
    """What to rent, per catalog row used. A row whose network between instances is an
    assumption says so (``network_assumption``) when the plan spans more than one instance
    (within one, that network carries nothing); one priced far below its GPU's other offers
    says why (``price_note``, :func:`espresso.cloud.prices.price_notes`)."""
    notes = notes or {}
    pooled = pool_use([g for g, used in zip(rows, gpus_used, strict=True) if used > 0],
                      [int(i) for i, used in zip(instances, gpus_used, strict=True) if used > 0])
    out = []
    spans = sum(int(inst) for used, inst in zip(gpus_used, instances, strict=True)
                if used > 0) > 1
    for g, used, inst in zip(rows, gpus_used, instances, strict=True):
        if used <= 0:
            continue
        gpus = int(inst) * g.gpus_per_node
        out.append({"offer": g.name, "provider": g.provider, "region": g.region,
                    "instance_type": g.instance_label, "gpu": g.model, "instances": int(inst),
                    "gpus": gpus, "idle_gpus": gpus - int(used),
                    "hourly_usd": int(inst) * g.instance_price_per_hour,
                    "available": g.instances,
                    **({"availability": g.availability + (
                        f"; the plan uses {pooled.get(g.pool, 0.0):g} of {g.pool_limit:g}"
                        if g.pool is not None else "")} if g.availability else {}),
                    **({"network_assumption": g.network_source}
                       if spans and g.network_assumed else {}),
                    **({"price_note": notes[g.name]} if g.name in notes else {}),
                    **({"market": "spot", "interruptions_per_hour": g.interruption_rate,
                        "recovery_hours": g.recovery} if g.is_spot else {})})
    return tuple(out)


def _range(layers: tuple[int, int]) -> str:
    return f"[{layers[0]}, {layers[1]})"


def _reason(issue: Any, plan: PlanLike, names: list[str], res: Any, catalog: Catalog) -> str:
    kind = core.IssueKind
    k = issue.kind
    if issue.stage >= 0:
        st = plan.stages[issue.stage]
        where = f"stage {issue.stage} ({st.gpu}, tp {st.tp}, layers {_range(st.layers)})"
    else:
        where = "the plan"
    L = plan.job.model.num_layers
    if k == kind.OUT_OF_MEMORY:
        g = catalog[names[issue.gpu]]
        if plan.virtual_stages > 1:
            st = plan.stages[issue.stage]
            group = ", ".join(str(i) for i in plan.device_stages(issue.stage))
            where = f"GPU group {issue.stage} ({st.gpu}, tp {st.tp}, stages {group})"
        over = (issue.value - issue.limit) / GB
        return (
            f"{where} needs {issue.value / GB:.1f} GB per GPU but {issue.limit / GB:.1f} GB is "
            f"usable on a {g.memory_gb:g} GB {g.name} after head-room: {over:.1f} GB over"
        )
    if k == kind.AVAILABILITY:
        name = names[issue.gpu]
        return (
            f"the plan rents {issue.value:.0f} x {name} (dp {plan.dp} x tp summed over its "
            f"stages) but the catalog has {issue.limit:.0f}"
        )
    if k == kind.LAYERS_NOT_COVERED:
        if issue.stage == plan.num_stages - 1 and issue.limit == L and issue.value != L:
            if issue.value < L:
                return (
                    f"layers [{issue.value:.0f}, {L}) are held by no stage "
                    f"(the model has {L} blocks)"
                )
            return (
                f"the stages reach layer {issue.value:.0f} but the model has only {L} blocks"
            )
        return (
            f"layers [{issue.value:.0f}, {issue.limit:.0f}) are held by no stage: {where} "
            f"starts at {issue.limit:.0f}"
        )
    if k == kind.LAYERS_OVERLAP:
        return (
            f"{where} starts at layer {issue.value:.0f} but earlier stages already hold layers "
            f"up to {issue.limit:.0f}: layers [{issue.value:.0f}, {issue.limit:.0f}) are held twice"
        )
    if k == kind.EMPTY_STAGE:
        return f"{where} holds no transformer block"
    if k == kind.TP_EXCEEDS_NODE:
        g = catalog[names[issue.gpu]]
        return (
            f"{where}: tp {issue.value:.0f} exceeds the {issue.limit:.0f} GPUs of a {g.name} "
            "node; a tensor-parallel group must live inside one node"
        )
    if k == kind.TP_NOT_DIVISOR:
        return (
            f"{where}: tp {issue.value:.0f} does not divide the model's {issue.what} "
            f"({issue.limit:.0f})"
        )
    if k == kind.BATCH_MISMATCH:
        return (
            f"dp {plan.dp} x micro_batch_size {plan.micro_batch_size} x num_microbatches "
            f"{plan.num_microbatches} = {issue.value:.0f} sequences per step, but the job's "
            f"global batch is {issue.limit:.0f}"
        )
    return f"{where}: {k.name}"  # pragma: no cover - every kind is handled above


@cache
def _builtin_with_spot(name: str) -> Catalog:
    """A built-in catalog with its spot rows, made once."""
    return with_spot(Catalog.builtin(name))


def _catalog_of(plan: PlanLike, catalog: Catalog | Table | None) -> Catalog:
    """The catalog given, else the built-in one the plan was made with."""
    if isinstance(catalog, Catalog):
        return catalog
    if catalog is not None:
        msg = f"catalog: expected a Catalog or a Table, got {type(catalog).__name__}"
        raise SpecError(msg)
    # Plans that name offers come from the cloud snapshot; older plans (GPU types only)
    # from the GPU-type reference catalog they were made with.
    name = "cloud" if any(st.offer and "/" in st.offer for st in plan.stages) else "gpus"
    catalog = Catalog.builtin(name)
    if any(st.market == "spot" for st in plan.stages):
        # The interruption terms the plan was made with (its rent list), else the
        # providers' defaults.
        catalog = _with_recorded_terms(_builtin_with_spot(name), plan)
    return catalog


@dataclass(frozen=True, slots=True)
class _Native:
    """The core's estimate of a plan, before it becomes an :class:`Estimate`."""

    res: Any
    names: list[str]
    """The catalog rows the stages rent, in the core's order."""
    rows: list[Any]
    catalog: Catalog


def _native_result(plan: PlanLike, catalog: Catalog | Table | None,
                   cost_model: CostParams | None, profiles: Any) -> _Native:
    # Checked by shape: the plan module imports this one, not the other way round.
    if not (isinstance(getattr(plan, "job", None), Job)
            and isinstance(getattr(plan, "stages", None), tuple)
            and hasattr(plan, "num_microbatches")):
        msg = f"estimate: expected a Plan, got {type(plan).__name__}"
        raise PlanError(msg)
    table = catalog if isinstance(catalog, Table) else None
    catalog = _catalog_of(plan, table.catalog if table is not None else catalog)
    params = plan.cost_model if cost_model is None else cost_model

    # Only the catalog rows the plan uses travel to the core.
    names: list[str] = []
    keys: list[str] = []
    for i, st in enumerate(plan.stages):
        row = catalog.row(st.gpu, st.offer)
        if st.gpu not in (row.model, row.name):
            msg = (f"stage {i}: offer {row.name} rents {row.model}, "
                   f"not {st.gpu}")
            raise PlanError(msg)
        if plan.job.precision == "fp8" and not runs_fp8(row):
            msg = (f"stage {i}: job.precision is fp8 but {row.model} has no fp8 tensor cores "
                   f"(fp8_tflops {row.fp8_tflops or 0:g}, bf16 {row.bf16_tflops:g}); expected "
                   "a GPU with an fp8 peak above its bf16 one, or job.precision bf16")
            raise PlanError(msg)
        if plan.job.precision in ("bf16", "fp8") and not row.bf16:
            msg = (f"stage {i}: job.precision is {plan.job.precision} but {row.model} has no "
                   "bf16 tensor cores; expected job.precision fp16 (mixed precision with loss "
                   "scaling) or a GPU with bf16")
            raise PlanError(msg)
        keys.append(row.name)
        if row.name not in names:
            names.append(row.name)
    where = [catalog.index(n) for n in names]
    rows = [catalog.gpus[i] for i in where]
    profs = plan.profiles if profiles is None else as_profiles(profiles)
    if table is None or not table.serves(plan.job.model, params, profs,
                                         [g.model for g in rows]):
        table = Table(catalog, plan.job.model, params, profs)
    # A plan spanning zones or regions: links between instances at most the domain's
    # cross-location figure (docs/catalog.md, "Scopes").
    dom = plan.domain or {}
    specs = table.specs(where,
                        float(dom["cross_link_gbps"])
                        if dom.get("spans") and dom.get("cross_link_gbps") else None)
    core_stages = [
        core.StageSpec(names.index(k), st.tp, st.layers[0], st.layers[1])
        for k, st in zip(keys, plan.stages, strict=True)
    ]
    try:
        res = core.estimate(plan.job.model._dims(), specs, params._core(), _workload(plan),
                            core_stages)
    except ValueError as exc:  # the core's own boundary checks
        msg = f"estimate: {exc}"
        raise SpecError(msg) from None
    return _Native(res=res, names=names, rows=rows, catalog=catalog)


def rank_of(plan: PlanLike, catalog: Catalog | Table | None = None) -> Any | None:
    """What ranks ``plan`` among candidates, without building its :class:`Estimate` (most of
    an estimate's time): an object with ``total_usd``, ``total_hours`` and
    ``meets_deadline`` as :func:`estimate` would give them, or None when the plan is not
    feasible."""
    native = _native_result(plan, catalog, None, None)
    if not native.res.feasible or pools_exceeded(native.rows, list(native.res.instances)):
        return None
    return native.res


def estimate(plan: PlanLike, catalog: Catalog | Table | None = None, *,
             cost_model: CostParams | None = None, profiles: Any = None) -> Estimate:
    """Estimate time, memory and cost of ``plan`` on ``catalog`` (the built-in one by default).

    Parameters
    ----------
    plan
        Any plan, e.g. ``Plan.from_json(path)``; it need not be feasible.
    catalog
        Rows the stages name; when omitted, the built-in cloud snapshot for a plan whose
        stages name offers, else the built-in GPU-type catalog (``Catalog.builtin("gpus")``).
        A :class:`~espresso.table.Table` already resolved for the plan's model, cost model
        and profiles (the search's) is read as it is; one resolved otherwise is not used.
    cost_model
        Constants of the cost model; the plan's own (``plan.cost_model``) when omitted.
    profiles
        Measured profiles, ``{gpu: Profile | path}``: they replace the analytic block and head
        times and block activations of those GPU types; the plan's own when omitted.

    Returns
    -------
    Estimate
        Per-stage time and memory, iteration seconds, total hours and USD, ``feasible``,
        ``meets_deadline`` and, for an infeasible plan, every reason in words.

    Raises
    ------
    CatalogError
        A stage names a GPU type the catalog does not have.
    """
    native = _native_result(plan, catalog, cost_model, profiles)
    res, names, rows, catalog = native.res, native.names, native.rows, native.catalog
    stages = []
    M = plan.num_microbatches
    for i, (st, se) in enumerate(zip(plan.stages, res.stages, strict=True)):
        stages.append(StageEstimate(
            index=i, gpu=st.gpu, tp=st.tp, layers=st.layers,
            fwd_s=se.fwd_s, bwd_s=se.bwd_s, time_s=M * (se.fwd_s + se.bwd_s),
            weights_gb=se.weights_bytes / GB, grads_gb=se.grads_bytes / GB,
            optimizer_gb=se.optimizer_bytes / GB, activations_gb=se.activation_bytes / GB,
            transient_gb=se.transient_bytes / GB, memory_gb=se.memory_bytes / GB,
            capacity_gb=se.capacity_bytes / GB,
            headroom_gb=(se.capacity_bytes - se.memory_bytes) / GB,
            in_flight=se.in_flight, send_s=se.send_s, send_intra_node=se.send_intra_node,
            dp_allreduce_s=se.dp_allreduce_s, optimizer_step_s=se.optimizer_step_s,
        ))
    peak = sum(catalog[n].bf16_tflops * 1e12 * c for n, c in zip(names, res.gpus_used, strict=True))
    reasons = tuple(_reason(i, plan, names, res, catalog) for i in res.issues)
    over = pools_exceeded(rows, list(res.instances))
    reasons += tuple(over)
    job = plan.job
    return Estimate(
        iteration_s=res.iteration_s,
        total_hours=res.total_hours,
        hourly_usd=res.hourly_usd,
        total_usd=res.total_usd,
        stage_time_s=tuple(s.time_s for s in stages),
        stage_memory_gb=tuple(s.memory_gb for s in stages),
        feasible=res.feasible and not over,
        meets_deadline=res.meets_deadline,
        iterations=job.num_iterations,
        deadline_hours=job.deadline_hours,
        pipeline_s=res.pipeline_s,
        dp_allreduce_s=res.dp_allreduce_s,
        optimizer_step_s=res.optimizer_step_s,
        closed_form_s=res.closed_form_s,
        bubble_fraction=res.bubble_fraction,
        bottleneck_stage=res.bottleneck_stage,
        mfu=res.model_flops_per_iteration / (res.iteration_s * peak) if peak > 0 else 0.0,
        tokens_per_s=job.global_batch_size * job.seq_len / res.iteration_s,
        gpus=dict(zip(names, res.gpus_used, strict=True)),
        stages=tuple(stages),
        reasons=reasons,
        instances=dict(zip(names, res.instances, strict=True)),
        idle_gpus=res.idle_gpus,
        transfer_gb=res.transfer_gb,
        transfer_usd=res.transfer_usd,
        rent=rent_list(rows, list(res.gpus_used), list(res.instances), price_notes(catalog)),
        spot=_spot(res, job),
        model_flops_per_iteration=res.model_flops_per_iteration,
        peak_flops=peak,
    )
