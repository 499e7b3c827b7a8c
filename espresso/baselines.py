"""Baselines: what a user would plan without Espresso, on the same job, catalog and cost model,
so that a comparison with Espresso's optimum is fair and reproducible (issue "Benchmark
harness"; docs/baselines.md).

Each baseline is a function ``(job, catalog, **search options) -> Plan | None`` (``None``:
it finds no plan that meets the deadline) and is listed in :data:`BASELINES` with the
practice it stands for. Every plan is estimated by the same ``estimate()`` as Espresso's,
and Espresso's search space contains every baseline's, so Espresso's proven optimum is never
dearer (``tests/test_baselines.py`` checks it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog, GpuType
from .cost import CostParams
from .engines import engine_cost
from .errors import SpecError
from .job import Job
from .plan import Plan
from .progress import DEFAULT_TIME_LIMIT_S
from .search import DEFAULT_MAX_STAGES, InfeasibleError, _depth, place, search

Planner = Callable[..., "Plan | None"]


@dataclass(frozen=True, slots=True)
class Baseline:
    """One baseline: its name, the practice it stands for, and its planner."""

    name: str
    stands_for: str
    plan: Planner


def _cheaper(p: Plan | None, best: Plan | None, *, hourly: bool = False) -> bool:
    """``p`` beats ``best``: a lower job cost (``hourly``: a lower hourly rent, then job
    cost)."""
    if p is None or p.estimate is None:
        return False
    if best is None or best.estimate is None:
        return True
    a, b = p.estimate, best.estimate
    if hourly:
        return (a.hourly_usd, a.total_usd) < (b.hourly_usd, b.total_usd)
    return a.total_usd < b.total_usd


def _best(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    res = search(job, catalog, **kw)
    return res.plans[0] if res.plans else None


def homogeneous_cheapest(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    """The cheapest plan that uses one catalog row (one GPU type, or one offer): what most
    users do, choosing the best single type after trying each."""
    return _best(job, catalog, **{**kw, "max_gpu_types": 1})


def _rate(g: GpuType, params: CostParams) -> float:
    return g.bf16_tflops * (g.efficiency if g.efficiency is not None else params.efficiency)


def fastest_gpu(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    """Rent the fastest GPU (the highest sustained matmul rate per GPU in the catalog), then
    the cheapest plan with it alone: the common habit of picking the best card first. Cards
    that tie (H100 SXM and H200 share a compute peak) are all candidates."""
    params = engine_cost(kw.get("engine", "espresso"), kw.get("cost_model"))
    rows = [g for g in catalog.gpus if g.count > 0]
    if not rows:
        return None
    best = max(_rate(g, params) for g in rows)
    fastest = tuple(g for g in rows if _rate(g, params) == best)
    return _best(job, Catalog(gpus=fastest, notes=catalog.notes), **{**kw, "max_gpu_types": 1})


def no_recompute(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    """Espresso's search without activation recomputation (an ablation)."""
    return _best(job, catalog, **{**kw, "recompute": ("none",)})


def fixed_microbatch(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    """Espresso's search with micro-batches of one sequence only (an ablation: the micro-batch
    size most recipes fix)."""
    return _best(job, catalog, **{**kw, "micro_batch_sizes": (1,)})


def even_split(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    """A heterogeneous allocation with its layers split evenly over the stages and one
    tensor-parallel width for every stage: what planners without a placer do. The cheapest
    such plan over every width (the allocation and the stage order are still searched)."""
    top = int(kw.pop("max_tp", 8))
    limit = kw.pop("time_limit_s", DEFAULT_TIME_LIMIT_S)
    end = None if limit is None else time.monotonic() + float(limit)
    best: Plan | None = None
    w = 1
    while w <= top:  # the time limit holds for all widths together
        left = None if end is None else max(end - time.monotonic(), 0.01)
        p = _best(job, catalog, **{**kw, "min_tp": w, "max_tp": w, "even_split": True,
                                   "time_limit_s": left})
        if _cheaper(p, best):
            best = p
        w *= 2
    return best


PROTOTYPE_STEPS = 256
"""The prototype baseline adds at most this many GPUs (greedy steps)."""
PROTOTYPE_LOCATIONS = 3
"""It plans in each of this many locations (provider/region), those with the most sustained
compute on offer, and keeps the cheapest hourly rent."""


def _cm_ratio(g: GpuType, params: CostParams) -> float:
    """The compute-memory ratio: sustained TFLOPS per GB of memory."""
    return _rate(g, params) / g.memory_gb


def prototype(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    """The Espresso paper's prototype, reconstructed from its published description
    (docs/baselines.md says what is reproduced and what is not): the cheapest hourly rent that
    meets a per-iteration SLO, built greedily.

    * per-iteration SLO: the deadline divided by the job's iterations;
    * one GPU per pipeline stage (no tensor parallelism), micro-batches of one sequence, no
      recomputation, on-demand rows only, within Espresso's depth limits (``max_stages``);
    * greedy counts: first add GPUs, the most memory per USD/h first, until the stages hold
      the model; then, while the iteration misses the SLO, take the step with the most
      throughput per added USD/h: one more stage of some GPU type, or one more data-parallel
      replica of the whole pipeline;
    * stages in compute-memory order (memory-rich first, as the paper's placer orders them),
      the best layer split for that order from Espresso's placer (``fixed_order=True``);
    * with cloud offers, one location at a time (the :data:`PROTOTYPE_LOCATIONS` with the
      most sustained compute on offer), one offer per GPU model there (the most GPUs); the
      cheapest hourly rent over them.
    """
    params = engine_cost(kw.get("engine", "espresso"), kw.get("cost_model"))
    limit = kw.get("time_limit_s", DEFAULT_TIME_LIMIT_S)
    t_end = time.monotonic() + (1e9 if limit is None else float(limit))
    rows = [g for g in catalog.gpus if g.count > 0 and g.market != "spot"]
    places: dict[str, list[GpuType]] = {}
    for g in rows:
        places.setdefault(g.location, []).append(g)
    # the locations with the most sustained compute on offer first
    ranked = sorted(places.values(), key=lambda rs: (-sum(_rate(g, params) * g.count
                                                           for g in rs), rs[0].location))
    best: Plan | None = None
    for rs in ranked[:PROTOTYPE_LOCATIONS]:
        p = _greedy(job, catalog, rs, params, t_end, kw)
        if _cheaper(p, best, hourly=True):
            best = p
    return best


def _greedy(job: Job, catalog: Catalog, rows: list[GpuType], params: CostParams,
            t_end: float, kw: dict[str, Any]) -> Plan | None:
    """The prototype's greedy allocation over ``rows`` (one location)."""
    slo_s = job.deadline_hours * 3600.0 / job.num_iterations
    # one candidate row per GPU model: the offer with the most GPUs, then the cheapest
    by_model: dict[str, GpuType] = {}
    for g in rows:
        cur = by_model.get(g.model)
        if cur is None or (-g.count, g.price_per_hour, g.name) < (
                -cur.count, cur.price_per_hour, cur.name):
            by_model[g.model] = g
    order = sorted(by_model.values(),
                   key=lambda g: (_cm_ratio(g, params), g.price_per_hour, g.name))
    names = [g.name for g in order]
    by_memory = sorted(order, key=lambda g: (-g.memory_gb / g.price_per_hour,
                                              _cm_ratio(g, params), g.name))
    if not order:
        return None
    B = job.global_batch_size
    deepest, tiers = _depth(kw.get("max_stages", DEFAULT_MAX_STAGES))

    def deep_ok(stages: list[str]) -> bool:
        """Espresso's depth limits (``max_stages``), so that its space holds this plan."""
        kinds = len(set(stages))
        top = tiers[min(kinds, len(tiers)) - 1] if tiers else deepest
        return len(stages) <= min(top, job.model.num_layers)

    def try_place(stages: list[str], dp: int) -> Plan | None:
        if B % dp:
            return None
        left = max(t_end - time.monotonic(), 0.05)
        try:
            return place(job, [(n, 1) for n in stages], dp=dp, micro_batch_size=1,
                         recompute="none", catalog=catalog, cost_model=params,
                         time_limit_s=min(left, 1.0), fixed_order=True)
        except (InfeasibleError, SpecError):
            return None

    def spare(stages: list[str], dp: int, name: str) -> bool:
        return (stages.count(name) + 1) * dp <= catalog[name].count

    def hourly(plan: Plan) -> float:
        assert plan.estimate is not None
        return plan.estimate.hourly_usd

    stages: list[str] = []
    dp = 1
    current: Plan | None = None
    # memory phase: the most memory per USD/h first
    for _ in range(PROTOTYPE_STEPS):
        if current is not None or time.monotonic() > t_end:
            break
        nxt = next((g.name for g in by_memory
                    if spare(stages, dp, g.name) and deep_ok([*stages, g.name])), None)
        if nxt is None:
            return None
        stages.append(nxt)
        stages.sort(key=names.index)
        current = try_place(stages, dp)
    if current is None:
        return None
    # SLO phase: the step with the most throughput per added USD/h
    for _ in range(PROTOTYPE_STEPS):
        assert current.estimate is not None
        if current.estimate.iteration_s <= slo_s:
            return current
        if time.monotonic() > t_end:
            return None
        moves = [(sorted([*stages, g.name], key=names.index), dp)
                 for g in order if spare(stages, dp, g.name) and deep_ok([*stages, g.name])]
        if all(stages.count(n) * (dp + 1) <= catalog[n].count for n in set(stages)):
            moves.append((stages, dp + 1))
        best: tuple[float, Plan, list[str], int] | None = None
        for st, d in moves:
            p = try_place(st, d)
            if p is None or p.estimate is None:
                continue
            gain = 1.0 / p.estimate.iteration_s - 1.0 / current.estimate.iteration_s
            extra = max(hourly(p) - hourly(current), 1e-9)
            if gain > 0 and (best is None or gain / extra > best[0]):
                best = (gain / extra, p, st, d)
        if best is None:
            return None
        _, current, stages, dp = best
    return None


def prototype_source(job: Job, catalog: Catalog, **kw: Any) -> Plan | None:
    """The paper's prototype planner itself, run from its published source
    (:mod:`espresso.prototype_source`: ``$ESPRESSO_PROTOTYPE_SRC``, and
    ``$ESPRESSO_PROTOTYPE_PYTHON`` for the interpreter with its dependencies), its answer
    estimated by Espresso's cost model. Its own search runs within the time limit."""
    from .prototype_source import DEFAULT_TIMEOUT_S, run_prototype

    limit = kw.get("time_limit_s", DEFAULT_TIMEOUT_S)
    params = engine_cost(kw.get("engine", "espresso"), kw.get("cost_model"))
    return run_prototype(job, catalog, cost_model=params,
                         timeout_s=DEFAULT_TIMEOUT_S if limit is None else float(limit)).plan


BASELINES: dict[str, Baseline] = {b.name: b for b in (
    Baseline("homogeneous-cheapest", "the best plan on a single GPU type (what most users do)",
             homogeneous_cheapest),
    Baseline("fastest-gpu", "rent the fastest GPU, then the cheapest plan with it",
             fastest_gpu),
    Baseline("even-split", "layers split evenly over the stages, one TP width (no placer)",
             even_split),
    Baseline("prototype", "the paper's prototype: greedy counts in compute-memory order, "
             "cheapest hourly rent meeting a per-iteration SLO", prototype),
    Baseline("no-recompute", "ablation: Espresso without activation recomputation",
             no_recompute),
    Baseline("fixed-microbatch", "ablation: Espresso with micro-batches of one sequence",
             fixed_microbatch),
)}
"""Every baseline by name."""


def compare(job: Job, catalog: Catalog, names: tuple[str, ...] | None = None,
            **kw: Any) -> dict[str, Plan | None]:
    """Espresso's plan (``"espresso"``) and each baseline's (``None`` where it finds none),
    with the same search options ``kw``."""
    for n in names or ():
        if n not in BASELINES:
            msg = f"baselines: unknown baseline {n!r}; known: {', '.join(BASELINES)}"
            raise SpecError(msg)
    out: dict[str, Plan | None] = {"espresso": _best(job, catalog, **kw)}
    for name in names or tuple(BASELINES):
        out[name] = BASELINES[name].plan(job, catalog, **kw)
    return out

EXTERNAL_BASELINES: dict[str, Baseline] = {b.name: b for b in (
    Baseline("prototype-source", "the paper's prototype planner run from its source "
             "(GitHub Espresso111/Espresso), when present", prototype_source),
)}
"""Baselines that run code outside this package, when it is present: only by name in a suite
(``baselines: all`` is :data:`BASELINES`)."""


def baseline(name: str) -> Baseline:
    """A baseline of :data:`BASELINES` or :data:`EXTERNAL_BASELINES` by name."""
    return BASELINES.get(name) or EXTERNAL_BASELINES[name]
