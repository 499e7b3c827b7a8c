"""Interleaving a plan's pipeline (interleaved 1F1B, Narayanan et al. 2021, sec. 2.2).

By default the search proves a plan optimal among plans whose GPU groups each run one
contiguous stage (``search(virtual_stages=(1, 2, ...))`` proves interleaved plans too, more
slowly). :func:`interleave` then splits each group's blocks into ``v`` chunks (stage ``s`` on group
``s mod P``, as ``Plan.virtual_stages`` says) and keeps the ``v`` whose estimate is best, when
it beats the plan: the same GPUs, a bubble ``v`` times smaller, more transfers and more
activation memory (docs/cost-model.md, "Interleaved 1F1B"). It is a refinement of the proven
plan, not part of the proof: an interleaved plan of other GPUs could be cheaper still
(docs/search.md, "Interleaving").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .catalog import Catalog
from .errors import SpecError
from .estimate import estimate, rank_of
from .plan import Plan, Stage
from .table import Table

DEFAULT_VIRTUAL_STAGES = (2, 3, 4)
"""Chunks per GPU group the search tries on its plans (``search(virtual_stages=...)``)."""


def split_layers(counts: list[int], v: int) -> list[tuple[int, int]]:
    """Layer ranges of the ``len(counts) * v`` stages when GPU group ``d`` holds ``counts[d]``
    blocks in ``v`` chunks as equal as possible (the larger first): stage ``c * P + d`` is
    chunk ``c`` of group ``d``, in model order."""
    P = len(counts)
    sizes = [[n // v + (1 if c < n % v else 0) for c in range(v)] for n in counts]
    out, begin = [], 0
    for s in range(P * v):
        n = sizes[s % P][s // P]
        out.append((begin, begin + n))
        begin += n
    return out


def interleaved(plan: Plan, v: int) -> Plan | None:
    """``plan`` (one stage per GPU group) with each group's blocks in ``v`` chunks, or None
    where interleaved 1F1B cannot run it: other than 1F1B, fewer than 2 groups, micro-batches
    not a multiple of the groups, or a group with fewer than ``v`` blocks."""
    P = plan.num_stages
    if (plan.virtual_stages != 1 or v < 2 or plan.schedule != "1f1b" or P < 2
            or plan.num_microbatches % P):
        return None
    counts = [st.num_layers for st in plan.stages]
    if min(counts) < v:
        return None
    stages = tuple(Stage(gpu=plan.stages[s % P].gpu, tp=plan.stages[s % P].tp,
                         offer=plan.stages[s % P].offer, layers=r)
                   for s, r in enumerate(split_layers(counts, v)))
    return replace(plan, stages=stages, virtual_stages=v, estimate=None)


def rank_key(est: Any, objective: str) -> tuple[float, float]:
    """How estimates rank for the objective: cost by USD, then hours; time by hours, then
    USD (the search orders its plans the same way)."""
    if objective == "time":
        return (est.total_hours, est.total_usd)
    return (est.total_usd, est.total_hours)


def interleave(plan: Plan, catalog: Catalog | Table | None = None, *,
               virtual_stages: tuple[int, ...] = DEFAULT_VIRTUAL_STAGES,
               objective: str = "cost", budget_usd: float | None = None,
               enforce_deadline: bool = True,
               accept: Callable[[Plan], bool] | None = None) -> Plan:
    """The best of ``plan`` and its interleavings over ``virtual_stages`` chunks per group
    that fit in memory (and meet the deadline, or stay within ``budget_usd`` for
    ``objective="time"``); the plan itself when none is better. A returned interleaving
    carries the plan's search statistics plus ``stats["interleaving"]``: the chunks and what
    the plan without them cost. ``accept``: only interleavings it accepts (an engine's
    rules)."""
    if objective not in ("cost", "time"):
        msg = f"interleave: objective must be 'cost' or 'time', got {objective!r}"
        raise SpecError(msg)
    base = plan.estimate if plan.estimate is not None else estimate(plan, catalog)
    # Candidates are ranked by the core's figures alone (rank_of); only the one chosen
    # gets a whole estimate.
    best, best_rank = plan, rank_key(base, objective)
    for v in virtual_stages:
        cand = interleaved(plan, v)
        if cand is None or (accept is not None and not accept(cand)):
            continue
        got = rank_of(cand, catalog)
        if got is None:  # not feasible
            continue
        if objective == "cost" and enforce_deadline and not got.meets_deadline:
            continue
        if objective == "time" and budget_usd is not None and got.total_usd > budget_usd:
            continue
        if rank_key(got, objective) < best_rank:
            best, best_rank = cand, rank_key(got, objective)
    if best is plan:
        return plan if plan.estimate is not None else replace(plan, estimate=base)
    best_est = estimate(best, catalog)
    stats = dict(plan.stats or {})
    stats["interleaving"] = {"virtual_stages": best.virtual_stages,
                             "total_usd_without": base.total_usd,
                             "total_hours_without": base.total_hours,
                             "iteration_s_without": base.iteration_s}
    return replace(best, estimate=best_est, stats=stats)
