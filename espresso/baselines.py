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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog, GpuType
from .cost import CostParams
from .errors import SpecError
from .job import Job
from .plan import Plan
from .search import search

Planner = Callable[..., "Plan | None"]


@dataclass(frozen=True, slots=True)
class Baseline:
    """One baseline: its name, the practice it stands for, and its planner."""

    name: str
    stands_for: str
    plan: Planner


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
    params = kw.get("cost_model") or CostParams()
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
    best: Plan | None = None
    w = 1
    while w <= top:
        p = _best(job, catalog, **{**kw, "min_tp": w, "max_tp": w, "even_split": True})
        if p is not None and p.estimate is not None and (
                best is None or best.estimate is None
                or p.estimate.total_usd < best.estimate.total_usd):
            best = p
        w *= 2
    return best


BASELINES: dict[str, Baseline] = {b.name: b for b in (
    Baseline("homogeneous-cheapest", "the best plan on a single GPU type (what most users do)",
             homogeneous_cheapest),
    Baseline("fastest-gpu", "rent the fastest GPU, then the cheapest plan with it",
             fastest_gpu),
    Baseline("even-split", "layers split evenly over the stages, one TP width (no placer)",
             even_split),
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
