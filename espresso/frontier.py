"""The cost–deadline frontier: for every deadline, the cheapest plan that meets it.

The answer is a step function. The cheapest plan of all (no deadline) holds for every deadline
from its own hours up; just below them a faster plan takes over, and so on, down to the
fastest plan. :func:`frontier` finds the steps by parametric search rather than a grid: each
search is Espresso's exact one with the deadline set just below the hours of the plan found
last, so every point is a proven optimum and no breakpoint between two points is missed
(docs/search.md, "The frontier"). The points are exactly the Pareto-optimal (cost, hours)
plans, so the same list answers the dual question, the fastest plan within a budget
(:meth:`Frontier.fastest_within`).

"Hours" are what a deadline is held against: a plan's total hours, or with spot instances
its hours at the job's deadline confidence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from . import _validate as v
from .catalog import Catalog
from .errors import SpecError
from .job import Job
from .plan import Plan
from .progress import SearchProgress
from .search import search

SHRINK = 1e-9
"""Each next deadline is the last plan's hours times (1 - SHRINK): plans whose hours differ
by less are one point."""


TOP_K = 8
"""Plans asked of each search: the cheapest that meet its deadline. Every later one that is
faster than the one before it is a point too (see :func:`frontier`), so one search may
give several points."""


def deadline_hours(plan: Plan) -> float:
    """The hours a deadline is held against (at confidence for spot plans)."""
    est = plan.estimate
    assert est is not None
    return est.spot.hours_at_confidence if est.spot is not None else est.total_hours


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    """The cheapest plan for every deadline in ``[hours, up_to)``."""

    plan: Plan
    hours: float
    usd: float
    up_to: float
    """The next point's hours (``inf`` for the cheapest plan of all)."""
    proven: bool
    """The search that found it proved it optimal (gap 0)."""


@dataclass(frozen=True, slots=True)
class Frontier:
    points: list[FrontierPoint] = field(default_factory=list)
    """From the cheapest (slowest) plan to the fastest."""
    complete: bool = True
    """Every step was searched to the end (the last search proved that nothing is faster)
    within ``max_points`` and the time limit."""
    seconds: float = 0.0
    interrupted: bool = False
    """:meth:`SearchProgress.cancel` (Ctrl-C) stopped it: the points so far."""

    def to_dict(self, *, timings: bool = False) -> dict[str, Any]:
        """JSON data (schema ``espresso.frontier/1``, docs/search.md). ``seconds`` only with
        ``timings=True``, so the same frontier always serialises to the same bytes."""
        out: dict[str, Any] = {"schema": "espresso.frontier/1", "complete": self.complete}
        if self.interrupted:
            out["interrupted"] = True
        if timings:
            out["seconds"] = self.seconds
        return {**out, "points": [{"hours": p.hours,
                            "up_to_hours": None if p.up_to == math.inf else p.up_to,
                            "total_usd": p.usd, "proven": p.proven, "plan": p.plan.to_dict()}
                           for p in self.points]}

    def cheapest_for(self, deadline: float) -> FrontierPoint | None:
        """The cheapest plan that meets ``deadline`` hours, or None."""
        for p in self.points:
            if p.hours <= deadline:
                return p
        return None

    def fastest_within(self, budget_usd: float) -> FrontierPoint | None:
        """The fastest plan whose cost is within ``budget_usd``, or None."""
        best = None
        for p in self.points:  # costs rise as the hours fall
            if p.usd <= budget_usd:
                best = p
        return best


def frontier(job: Job, catalog: Catalog | None = None, *, max_points: int = 50,
             time_limit_s: float | None = 300.0, progress: SearchProgress | None = None,
             on_point: Callable[[FrontierPoint], None] | None = None,
             **space: Any) -> Frontier:
    """The cost–deadline frontier of ``job`` (its deadline is ignored) over ``catalog``.

    ``max_points`` caps the number of steps; ``time_limit_s`` bounds the whole call (each
    search gets what is left); ``progress`` shows each search and can cancel the call, which
    then returns the points found so far (``interrupted``); ``on_point`` is called with
    each point as soon as it is found (from the calling thread); other keywords are
    :func:`espresso.search`'s (the default refinement that interleaves plans after the
    search is off: every point is proven).
    """
    max_points = v.integer("max_points", max_points, minimum=1, maximum=10_000)
    if "objective" in space or "budget_usd" in space or "top_k" in space:
        msg = "frontier: objective, budget_usd and top_k are set by the frontier itself"
        raise SpecError(msg)
    space.setdefault("interleave_after", ())
    # Several points from one search need its list of plans exact: no gap, and no
    # interleaving refinement (it re-ranks the plans after the search).
    exact = not space.get("gap") and not space.get("interleave_after")
    start = time.monotonic()
    end = None if time_limit_s is None else start + v.number(
        "time_limit_s", time_limit_s, positive=True, maximum=1e7)
    deadline = 1e12  # no deadline
    points: list[FrontierPoint] = []
    complete = True
    while len(points) < max_points:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            complete = False
            break
        if progress is not None and progress.cancelled:
            complete = False
            break
        res = search(replace(job, deadline_hours=deadline), catalog, time_limit_s=left,
                     progress=progress, phase=f"frontier point {len(points) + 1}",
                     top_k=TOP_K if exact else 1, **space)
        if not res.plans:
            complete = complete and res.stats.complete
            break
        # The search's plans are the TOP_K cheapest that meet `deadline`, cheapest first.
        # The first is this point. When the search is complete and exact, so is every later
        # one that meets the next deadline before the list ends: any cheaper plan that meets
        # the next (tighter) deadline meets this one too, so it would stand before it in the
        # list. A list cut at TOP_K says nothing past its end: the next search starts there.
        taken = [(res.plans[0], deadline_hours(res.plans[0]))]
        if exact and res.stats.complete:
            for p in res.plans[1:]:
                hours = deadline_hours(p)
                if hours <= taken[-1][1] * (1 - SHRINK):
                    taken.append((p, hours))
        cut = len(taken) > max_points - len(points)  # the rest would pass max_points
        for plan, hours in taken[:max_points - len(points)]:
            est = plan.estimate
            assert est is not None
            points.append(FrontierPoint(plan=plan, hours=hours, usd=est.total_usd,
                                        up_to=points[-1].hours if points else math.inf,
                                        proven=res.stats.complete))
            if on_point is not None:
                on_point(points[-1])
        complete = complete and res.stats.complete
        deadline = points[-1].hours * (1 - SHRINK)
        if exact and res.stats.complete and len(res.plans) < TOP_K and not cut:
            # A list shorter than asked holds every plan that meets the deadline (each one
            # the search left out is no faster than one it kept), and the walk took every
            # plan faster than the one before: the last point is the fastest plan there is,
            # and no search is needed to say so.
            break
    else:
        complete = False  # max_points reached: faster plans may remain
    return Frontier(points=points, complete=complete, seconds=time.monotonic() - start,
                    interrupted=progress is not None and progress.cancelled)
