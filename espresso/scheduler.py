"""Scheduling a search's subproblems: threads, one shared incumbent, time shares, stopping.

A catalog splits into (domain, vendor) subproblems (:mod:`espresso.cloud.domains`), each an
exact search of its own in the native core. :class:`Scheduler` runs them so that the whole
is exact too (docs/search.md, "Subproblems"):

* **order and cuts.** Subproblems are taken best bound first; one whose bound is above the
  ``top_k``-th best plan found so far is cut without a search (its bound is admissible, so
  none of its plans could enter the answer).
* **side by side.** With more subproblems than threads and ``top_k = 1``, one worker per
  thread takes subproblems from a queue and searches each on one thread; the workers share
  their best objective through the core's ``SharedIncumbent``, so a plan proven anywhere cuts
  every other search at once. Otherwise subproblems run one after another on every thread.
* **time shares.** Pass 1 gives each subproblem a fair share of the time left (the leading
  ones, one per worker, at least half of it), so one hard domain cannot starve the others;
  pass 2 returns to those a share did not finish, best bound first, with the incumbent of all.
  Side by side, a share is cut only when a better plan has been found since the search began
  (its restart then prunes more), it is lifted once no task waits, and a worker whose queue
  is empty joins the running search with the least bound (the core's ``Crew``).
* **stopping.** When the time is spent or the progress is cancelled, what is left keeps its
  bound; the result's lower bound is the least of the open bounds and the best plan.

The scheduler knows nothing of pipelines: a subproblem is a bound and a ``solve`` callback
that searches it under a time limit, a thread count and an incumbent.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._native import core
from .progress import TimeBudget

_EPS = 1e-9  # relative slack when a bound is compared with an objective

COUNTERS = ("nodes_expanded", "nodes_generated", "pruned_cost", "pruned_deadline",
            "pruned_memory", "pruned_availability", "pruned_dominance", "leaves_placed",
            "placer_nodes", "placer_leaves", "dives", "combos")
"""The core's work counters, summed over the subproblems searched."""


@dataclass(slots=True)
class Task:
    """One subproblem ready for the core: its admissible bound and what ``solve`` needs."""

    bound: float
    """No plan of this subproblem has a smaller objective (``inf``: none can be feasible)."""
    payload: Any
    """The caller's own description of the subproblem, handed back to ``solve``."""
    twin: int | None = None
    """An earlier task (index) onto whose plans every plan of this one maps at no more cost
    and no more time (the same offers, each priced no lower and counted no higher): once
    that one is searched to the end, this one cannot improve on it (docs/search.md)."""
    shadow: int | None = None
    """An earlier task onto whose plans every plan of this one maps in no more time, at any
    price (the same offers, each counted no higher): when that one is searched to the end
    with no plan while no plan is known anywhere, none meets the deadline, and this one
    holds none either (the cost objective, where prices do not decide feasibility)."""


@dataclass(slots=True)
class Solved:
    """What one search of a subproblem returned."""

    stats: Any
    """The core's ``SearchStats``."""
    plans: list[tuple[tuple[Any, ...], Any]]
    """``(key, plan)`` pairs: key = (objective, tie-break...), smaller is better."""


Solve = Callable[..., Solved]
"""``solve(task, time limit in s or None, threads, incumbent objective)``, and ``crew=`` (the
core's ``Crew`` of that search) when the scheduler has a ``crew`` factory, ``probed=True``
when the task's probe searched its space to the end."""


@dataclass(slots=True)
class Outcome:
    """The scheduled search: its best plans and what it proved."""

    found: list[tuple[tuple[Any, ...], Any, int]]
    """Best first, at most ``top_k``: (key with the task's index, plan, task index)."""
    counters: dict[str, int]
    frontier_peak: int
    searched: int
    """Subproblems whose search began."""
    threads: int
    """The most threads any search ran on (fewer than asked if some could not start)."""
    complete: bool
    lower_bound: float
    gap: float
    first_plan_s: float | None = None
    """Seconds from the start of :meth:`Scheduler.run` to the first plan of any search (None:
    none found)."""


@dataclass(slots=True)
class Scheduler:
    """Runs ``tasks`` (in order of preparation) through ``solve`` under ``budget``."""

    tasks: Sequence[Task]
    solve: Solve
    top_k: int
    threads: int
    budget: TimeBudget
    stopped: Callable[[], bool]
    """True once the time is spent or the search is cancelled."""
    shared: Any = None
    """The core's ``SharedIncumbent`` of side-by-side searches (``top_k = 1``), or None."""
    on_error: Callable[[], None] | None = None
    """Called in a worker that raised, to stop the other workers (the monitor's cancel)."""
    gap: float = 0.0
    """Relative gap: tasks whose bound is within it of the best plan are cut too, and what is
    proven is that much less than the best plan."""
    probe: Solve | None = None
    """A quick search of a restricted space of a task (single-type plans), run on every task
    before the first pass (``top_k = 1``) for an incumbent: its plans are plans of the task,
    so they are kept, but it settles nothing."""
    probe_share: float = 0.1
    """The most of the time budget the probes may take, all together."""
    probe_each_s: float = 0.2
    """The most one probe may take."""
    crew: Callable[[], Any] | None = None
    """Makes a crew for one search (the core's ``Crew``), handed to ``solve`` as ``crew=``: a
    search's share of the time is its crew's deadline, renewed while no better plan has been
    found since it began and lifted once no task waits, and a worker whose queue is empty
    joins a running search through it instead of idling. None: each search's time limit is
    its share."""
    _found: list[tuple[tuple[Any, ...], Any, int]] = field(default_factory=list)
    _counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    _peak: int = 0
    _searched: set[int] = field(default_factory=set)
    _threads_used: int = 0
    _retry: list[tuple[float, int]] = field(default_factory=list)
    _out_of_time: bool = False
    _pending: dict[int, float] = field(default_factory=dict)
    """Bounds of the tasks not settled yet (queued, running or to be retried)."""
    _unprepared: bool = False
    _floor: dict[int, float] = field(default_factory=dict)
    """Lower bounds of tasks whose twin was searched to the end (top_k = 1)."""
    _running: set[int] = field(default_factory=set)
    _twins: dict[int, list[int]] = field(default_factory=dict)
    _shadows: dict[int, list[int]] = field(default_factory=dict)
    _open: dict[int, float] = field(default_factory=dict)
    """Lower bounds of the tasks whose last search was cut short."""
    _crews: dict[int, Any] = field(default_factory=dict)
    """The crews of the searches running now."""
    _waiting: bool = True
    """Some task still waits for a worker (false once the first pass's queue is empty)."""
    _probed: set[int] = field(default_factory=set)
    """Tasks whose probe searched its restricted space to the end (``solve(probed=True)``:
    the full search may leave that space out where only it is costly)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _t0: float = 0.0
    """When run() began (time.monotonic())."""
    _first_plan: float = math.inf
    """Seconds from _t0 to the first plan any search found."""

    # ------------------------------------------------------------------ the whole
    def run(self, *, unprepared: bool = False) -> Outcome:
        """Pass 1, pass 2, and what they proved. ``unprepared``: the time ran out while the
        tasks were being prepared, so the rest of the catalog has no bound but 0."""
        self._t0 = time.monotonic()
        live = [n for n, t in enumerate(self.tasks) if math.isfinite(t.bound)]
        self._counters["pruned_deadline"] += len(self.tasks) - len(live)
        with self._lock:
            self._pending = {n: self.tasks[n].bound for n in live}
            self._unprepared = unprepared
            for n, t in enumerate(self.tasks):
                if t.twin is not None:
                    self._twins.setdefault(t.twin, []).append(n)
                if t.shadow is not None:
                    self._shadows.setdefault(t.shadow, []).append(n)
        self._probe_pass(live)
        self._first_pass(live)
        self._second_pass()
        open_bounds = ([max(lb, self._floor.get(n, lb)) for lb, n in self._retry
                        if lb <= self._target() * (1 + _EPS)
                        and not self._settled_by_twin(n)]
                       + [0.0] * unprepared)
        complete = not open_bounds
        best = self._found[0][0][0] if self._found else math.inf
        lower = best if complete else min(best, min(open_bounds, default=math.inf))
        if self.gap > 0 and self._found:
            lower = min(lower, best * (1 - self.gap))
            complete = complete or lower >= best * (1 - self.gap) * (1 - _EPS)
        gap = 0.0 if complete and self._found and lower >= best else (
            (best - lower) / best if self._found and best > 0 else math.inf)
        first = self._first_plan if math.isfinite(self._first_plan) else None
        return Outcome(found=self._found, counters=self._counters, frontier_peak=self._peak,
                       searched=len(self._searched), threads=self._threads_used or self.threads,
                       complete=complete, lower_bound=lower, gap=max(0.0, gap), first_plan_s=first)

    # ------------------------------------------------------------------ the passes
    def _probe_pass(self, live: list[int]) -> None:
        """Every task's single-type plans first, best bound first, for an incumbent that
        cuts the full searches from their start: the task with the best bound often holds
        only dearer mixes (a region of cheap, slow GPUs), and searched first without an
        incumbent it would prove its own optimum alone. Twins are left to their twin; the
        probes run on every thread, each at most ``probe_each_s``, all of them at most
        ``probe_share`` of the time."""
        if self.probe is None or self.top_k != 1:
            return
        start = time.monotonic()
        left = self.budget.share(1.0)
        allowance = None if left is None else self.probe_share * left
        queue = collections.deque(n for n in live if self.tasks[n].twin is None)
        qlock = threading.Lock()

        def work() -> None:
            while True:
                spent = time.monotonic() - start
                if self.stopped() or (allowance is not None and spent >= allowance):
                    return
                with qlock:
                    if not queue:
                        return
                    n = queue.popleft()
                with self._lock:
                    if self.tasks[n].bound > self._target() * (1 + _EPS):
                        continue  # (the first pass cuts it, and counts it)
                    incumbent = self._kth()
                limit = self.probe_each_s if allowance is None else max(
                    min(self.probe_each_s, allowance - spent), 1e-3)
                began = time.monotonic()
                solved = self.probe(self.tasks[n], limit, 1, incumbent)
                with self._lock:
                    self._saw(began, solved)
                    if solved.stats.complete:
                        self._probed.add(n)
                    for k in self._counters:
                        self._counters[k] += getattr(solved.stats, k)
                    for key, p in solved.plans:
                        self._found.append(((key[0], n, *key[1:]), p, n))
                    self._found.sort(key=lambda t: t[0])
                    del self._found[self.top_k:]

        self._spread(work, min(self.threads, len(queue)), "espresso-probe")

    def _spread(self, work: Callable[[], None], workers: int, name: str) -> int:
        """``work`` on ``workers`` threads, this one among them (a thread the system cannot
        start, a memory or process limit, is done without: the others take its share); the
        first error is re-raised here after the others were told to stop. Returns the
        number of threads that ran."""
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                work()
            except BaseException as exc:  # re-raised in the caller's thread below
                errors.append(exc)
                if self.on_error is not None:
                    self.on_error()  # stop the other searches too

        pool: list[threading.Thread] = []
        for i in range(max(0, workers - 1)):
            t = threading.Thread(target=worker, name=f"{name}-{i}")
            try:
                t.start()
            except RuntimeError:
                break
            pool.append(t)
        worker()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]
        return len(pool) + 1

    def _first_pass(self, live: list[int]) -> None:
        # Side by side when there are more subproblems than threads (a cloud snapshot): one
        # per thread, each searched single-threaded (no contention on one frontier; the
        # shared incumbent cuts every search as soon as any finds a plan). A few (the vendors
        # of a GPU-type catalog) are searched one after another with every thread.
        workers = self.threads if self.shared is not None and len(live) > self.threads else 1
        queue = collections.deque(live)
        qlock = threading.Lock()
        begun = [0]  # tasks taken from the queue

        def work(threads_each: int) -> None:
            while True:
                with qlock:
                    if not queue:
                        return
                    # A task whose twin's search is under way waits: that search will likely
                    # settle it. The first task not waiting is taken; when every task waits,
                    # this worker helps the search of the first one's twin, then looks again.
                    with self._lock:
                        waits = [self._settler(m) for m in queue]
                    free = next((i for i, w in enumerate(waits) if w is None), None)
                    helped = waits[0] if free is None else None
                    if helped is None:
                        n = queue[free or 0]
                        del queue[free or 0]
                        remaining = len(queue) + 1
                        lead = begun[0] < workers  # among the most promising: one per worker
                        begun[0] += 1
                if helped is not None:
                    helped.help()  # returns once that search has ended
                    continue
                if self._cut(n) or self._behind_twin(n):
                    continue
                if self.stopped():
                    with self._lock:
                        self._out_of_time = True
                        self._retry.append((self.tasks[n].bound, n))
                    continue
                self._run(n, self._share(workers, remaining, lead), threads_each)

        def work_then_help() -> None:
            work(1)
            self._help()

        if workers == 1:
            work(self.threads)
            return
        self._threads_used = self._spread(work_then_help, workers, "espresso-domain")

    def _help(self) -> None:
        """No task waits: the searches still running may use the whole budget, and this
        worker joins the one with the least bound (the one the proof waits for) until it
        ends, then the next."""
        if self.crew is None:
            return
        with self._lock:
            self._waiting = False
            for crew in self._crews.values():
                crew.stop_after(math.inf)
        helped: set[int] = set()
        while not self.stopped():
            with self._lock:
                running = sorted((self._pending.get(n, self.tasks[n].bound), n)
                                 for n, crew in self._crews.items() if id(crew) not in helped)
                if not running:
                    return
                crew = self._crews[running[0][1]]
            helped.add(id(crew))
            crew.help()  # returns once that search has ended

    def _second_pass(self) -> None:
        self._retry.sort()
        for lb, n in self._retry[:]:
            if (self._out_of_time or lb > self._target() * (1 + _EPS)
                    or self._settled_by_twin(n)):
                continue
            if self.stopped():
                self._out_of_time = True
                continue
            self._retry.remove((lb, n))
            self._run(n, self.budget.share(1.0), self.threads)

    def live(self) -> tuple[float, float]:
        """(best objective so far, lower bound of the whole): what the final outcome would
        say if the search stopped now, for the progress shown while it runs."""
        with self._lock:
            best = self._found[0][0][0] if self._found else math.inf
            if self.shared is not None:
                best = min(best, self.shared.value)
            lower = min(self._pending.values(), default=math.inf)
            if self._unprepared:
                lower = 0.0
        return best, min(best, lower)

    # ------------------------------------------------------------------ one task
    def _saw(self, began: float, solved: Solved) -> None:
        """A search that began at ``began`` returned: when its first plan came (its own
        ``first_plan_s``, or its end where the stats do not say), for the first plan of all.
        Called under the lock."""
        if not solved.plans:
            return
        first = getattr(solved.stats, "first_plan_s", None)
        at = (began + first if first is not None and first >= 0 else time.monotonic())
        self._first_plan = min(self._first_plan, at - self._t0)

    def _kth(self) -> float:
        """The objective a plan must beat to enter the answer (the shared one included)."""
        k = self._found[self.top_k - 1][0][0] if len(self._found) >= self.top_k else math.inf
        return min(k, self.shared.value) if self.shared is not None else k

    def _target(self) -> float:
        """What a task's bound must be below to be worth a search: the k-th best objective,
        less the gap."""
        return self._kth() * (1 - self.gap)

    def _settle(self, n: int, floor: float, *, none_meets: bool) -> None:
        """Task ``n`` holds no plan below ``floor``; with ``none_meets``, none that meets the
        deadline. So its twins hold none below ``floor`` either, its shadows none at all
        when none meets, and so on down their own twins and shadows. Called under the
        lock."""
        work = [(x, floor) for x in self._twins.get(n, ())]
        if none_meets:
            work += [(x, math.inf) for x in self._shadows.get(n, ())]
        while work:
            x, at = work.pop()
            if self._floor.get(x, -math.inf) >= at:
                continue
            self._floor[x] = at
            if x in self._pending:
                self._pending[x] = max(self._pending[x], at)
            work += [(y, at) for y in self._twins.get(x, ())]
            if math.isinf(at) and none_meets:
                work += [(y, at) for y in self._shadows.get(x, ())]

    def _settler(self, n: int) -> Any:
        """The crew of a running search that will likely settle task ``n`` (its twin's, or
        its shadow's while no plan is known), else None. Called under the lock."""
        t = self.tasks[n]
        if t.twin in self._running:
            return self._crews.get(t.twin)  # type: ignore[arg-type]
        if t.shadow in self._running and math.isinf(self._kth()):
            return self._crews.get(t.shadow)  # type: ignore[arg-type]
        return None

    def _settled_by_twin(self, n: int) -> bool:
        """Its twin was searched to the end: it holds no plan better than the k-th best
        (ties go to the twin, earlier in the order, as the plans' keys say anyway)."""
        return self._floor.get(n, -math.inf) >= self._target() * (1 - _EPS)

    def _behind_twin(self, n: int) -> bool:
        """Its twin's search was cut short: it waits for pass 2, behind its twin (its bound
        is at least the twin's), where the twin's search may settle it."""
        twin = self.tasks[n].twin
        with self._lock:
            if twin is None or twin not in self._open:
                return False
            lb = max(self.tasks[n].bound, self._open[twin])
            self._retry.append((lb, n))
            self._pending[n] = lb
        return True

    def _cut(self, n: int) -> bool:
        with self._lock:
            cut = (self.tasks[n].bound > self._target() * (1 + _EPS)
                   or self._settled_by_twin(n))
            if cut:
                self._counters["pruned_cost"] += 1
                self._pending.pop(n, None)
        return cut

    def _share(self, workers: int, remaining: int, lead: bool) -> float | None:
        """The time limit of the next task: its fair share of what is left. The leading
        tasks (the best bounds) get at least half of it: a short limit split evenly over a
        hundred regions lets none finish, while the first one's proven plan usually cuts all
        the others at once."""
        left = self.budget.share(1.0)
        if left is None:
            return None
        fair = left * workers / remaining
        return min(left, max(fair, 0.5 * left) if lead else fair)

    def _run(self, n: int, limit: float | None, threads: int) -> None:
        crew = self.crew() if self.crew is not None else None
        with self._lock:
            incumbent = self._kth()
            self._running.add(n)
            if crew is not None:
                # The share is the crew's deadline: renewed while no better plan has been found
                # since the search began (a restart would search the same nodes again), lifted
                # once no task waits; the search's own limit is what is left of the whole.
                if limit is not None and self._waiting:
                    crew.share(limit)
                limit = self.budget.share(1.0)
                self._crews[n] = crew
        extra: dict[str, Any] = {}
        if crew is not None:
            extra["crew"] = crew
        if n in self._probed:
            extra["probed"] = True
        try:
            began = time.monotonic()
            solved = self.solve(self.tasks[n], limit, threads, incumbent, **extra)
        finally:
            with self._lock:
                self._running.discard(n)
                self._crews.pop(n, None)
            if crew is not None:
                crew.finish()  # (the core did already, unless the search never began)
        st = solved.stats
        with self._lock:
            self._saw(began, solved)
            self._searched.add(n)
            if st.complete and self.top_k == 1:
                # Its optimum, or at least the incumbent it was searched under: a bound on
                # every twin of it.
                floor = min([incumbent, *(key[0] for key, _ in solved.plans)])
                self._settle(n, floor, none_meets=not solved.plans and math.isinf(self._kth()))
            for k in self._counters:
                self._counters[k] += getattr(st, k)
            self._peak = max(self._peak, st.frontier_peak)
            self._threads_used = max(self._threads_used, st.threads)
            for key, p in solved.plans:
                self._found.append(((key[0], n, *key[1:]), p, n))
            self._found.sort(key=lambda t: t[0])
            del self._found[self.top_k:]
            if not st.complete:
                # Both bound the subproblem: a search cut short before its own bounds rose
                # above the task's (or before it began) must not lower what is proven.
                lb = max(st.lower_bound, self.tasks[n].bound)
                self._retry.append((lb, n))
                self._pending[n] = lb
                self._open[n] = lb
            else:
                self._pending.pop(n, None)
                self._open.pop(n, None)


def shared_incumbent(top_k: int) -> Any:
    """The core's incumbent shared by side-by-side searches (``top_k = 1`` only)."""
    return core.SharedIncumbent() if top_k == 1 else None
