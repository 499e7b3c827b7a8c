"""Time budgets shared by the searches of one call, and live progress of a running search.

``plan()`` may run up to three searches (the plan, the fastest plan when the deadline
cannot be met, the cheapest single-type plan for comparison); one :class:`TimeBudget`
bounds them together, so the call returns within its limit plus a small constant.
:class:`SearchProgress` is read from another thread while a search runs (the CLI's
progress line) and can cancel it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _validate as v
from ._native import core

DEFAULT_TIME_LIMIT_S = 60.0
"""Wall-clock limit of one ``plan()`` call (or CLI command) when none is given."""

MIN_SEARCH_S = 0.05
"""A search is given at least this long, so a nearly spent budget still answers."""


class TimeBudget:
    """Seconds left of a wall-clock limit (``None``: unlimited). ``stop_s``: the budget is
    spent at that time already, while the limit still sizes :meth:`share` (a search that
    would finish early under the longer limit does; one that would not stops there)."""

    def __init__(self, limit_s: float | None, stop_s: float | None = None) -> None:
        self.limit_s = None if limit_s is None else v.number(
            "time_limit_s", limit_s, positive=True, maximum=1e7)
        self.stop_s = None if stop_s is None else v.number(
            "stop_after_s", stop_s, positive=True, maximum=1e7)
        self._start = time.monotonic()

    @classmethod
    def of(cls, value: TimeBudget | float | None) -> TimeBudget:
        return value if isinstance(value, TimeBudget) else cls(value)

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def remaining(self) -> float:
        if self.limit_s is None:
            return math.inf
        return max(0.0, self.limit_s - self.elapsed())

    def share(self, fraction: float = 1.0) -> float | None:
        """Seconds for the next search: ``fraction`` of what is left (``None``: no limit)."""
        if self.limit_s is None:
            return None
        return max(MIN_SEARCH_S, self.remaining() * fraction)

    def until_stop(self) -> float:
        """Seconds left until ``stop_s`` (infinite without one)."""
        if self.stop_s is None:
            return math.inf
        return max(0.0, self.stop_s - self.elapsed())

    def cap(self, limit: float | None) -> float | None:
        """``limit`` (``None``: none) cut to the time left until ``stop_s``."""
        left = self.until_stop()
        if math.isinf(left):
            return limit
        return left if limit is None else min(limit, left)

    @property
    def spent(self) -> bool:
        return ((self.limit_s is not None and self.remaining() <= 0.0)
                or (self.stop_s is not None and self.until_stop() <= 0.0))


class SearchProgress:
    """Live figures of the search a call is running; safe to read from another thread.

    Pass one to :func:`espresso.plan` or :func:`espresso.search` (``progress=``) and poll
    :meth:`snapshot`; :meth:`cancel` stops the search as if its time were up (the call then
    returns the best plan found so far, with its gap).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._monitor: Any = None
        self._phase = ""
        self._objective = "cost"
        self._cancelled = False
        self._whole: Callable[[], tuple[float, float]] | None = None

    def _attach(self, whole: Callable[[], tuple[float, float]] | None) -> None:
        """The running search's (best, lower bound) over all its subproblems (the
        scheduler's), shown instead of the one subproblem's monitor; None detaches it."""
        with self._lock:
            self._whole = whole

    def _start(self, phase: str, objective: str) -> Any:
        """A fresh native monitor for the next search (called by the search)."""
        mon = core.SearchMonitor()
        with self._lock:
            self._monitor = mon
            self._phase = phase
            self._objective = objective
            if self._cancelled:
                mon.cancel()
        return mon

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._monitor is not None:
                self._monitor.cancel()

    def snapshot(self) -> dict[str, Any]:
        """``phase``, ``objective``, ``best`` (USD or hours; ``None`` before the first plan),
        ``lower_bound``, ``gap`` (``None`` without a plan) and ``nodes``."""
        with self._lock:
            mon, phase, objective = self._monitor, self._phase, self._objective
            whole = self._whole
        if mon is None:
            return {"phase": phase, "objective": objective, "best": None, "lower_bound": None,
                    "gap": None, "nodes": 0}
        best, lb = whole() if whole is not None else (mon.best, mon.lower_bound)
        has_best = math.isfinite(best)
        gap = (max(0.0, (best - lb) / best) if has_best and best > 0 else None)
        return {"phase": phase, "objective": objective, "best": best if has_best else None,
                "lower_bound": lb, "gap": gap, "nodes": mon.nodes_expanded}
