"""The subproblem scheduler on made-up subproblems: what it proves when searches are cut
short, twins, and the gap it shows while running against the one it returns."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace
from typing import Any

from espresso.progress import TimeBudget
from espresso.scheduler import Scheduler, Solved, Task


def _stats(*, complete: bool, lower: float) -> Any:
    return SimpleNamespace(complete=complete, lower_bound=lower, frontier_peak=0, threads=1,
                           nodes_expanded=1, nodes_generated=1, pruned_cost=0,
                           pruned_deadline=0, pruned_memory=0, pruned_availability=0,
                           pruned_dominance=0, leaves_placed=0, placer_nodes=0,
                           placer_leaves=0, dives=0, combos=1)


def _run(tasks: list[Task], results: dict[str, Any],
         **kw: Any) -> tuple[Any, list[str], list[tuple[float, float]]]:
    """results: name -> (complete, the search's lower bound, its best objective or None)."""
    searched: list[str] = []
    live: list[tuple[float, float]] = []
    sched: Scheduler

    def solve(task: Task, limit: float | None, threads: int, incumbent: float) -> Solved:
        searched.append(task.payload)
        r = results[task.payload]
        # A list: one result per search of it, in turn (the last one repeats).
        complete, lower, best = r.pop(0) if isinstance(r, list) and len(r) > 1 else (
            r[0] if isinstance(r, list) else r)
        plans = [] if best is None or best > incumbent else [((best,), task.payload)]
        live.append(sched.live())
        return Solved(stats=_stats(complete=complete, lower=lower), plans=plans)

    sched = Scheduler(tasks=tasks, solve=solve, top_k=1, threads=1, budget=TimeBudget(None),
                      stopped=lambda: False, **kw)
    out = sched.run()
    live.append(sched.live())
    return out, searched, live


def test_a_search_cut_short_keeps_its_task_bound() -> None:
    """A subproblem whose search stopped before its own bounds rose (lower bound 0) still
    bounds the whole by its task bound, not by 0 ('gap 100%')."""
    tasks = [Task(bound=10.0, payload="a"), Task(bound=50.0, payload="b")]
    out, _, live = _run(tasks, {"a": (True, 100.0, 100.0), "b": (False, 0.0, None)})
    assert not out.complete
    assert out.lower_bound == 50.0
    assert out.gap == (100.0 - 50.0) / 100.0
    assert live[-1] == (100.0, 50.0)  # the live figures say what the outcome says


def test_twin_is_settled_once_its_twin_is_searched_to_the_end() -> None:
    tasks = [Task(bound=10.0, payload="a"), Task(bound=20.0, payload="b", twin=0),
             Task(bound=30.0, payload="c")]
    res = {"a": (True, 200.0, 200.0), "b": (True, 190.0, 190.0), "c": (True, 150.0, 150.0)}
    out, searched, _ = _run(tasks, res)
    # b is never searched (its twin a was searched to the end; b's plans cost no less),
    # c is: it is no twin.
    assert searched == ["a", "c"] and out.complete
    assert out.found[0][1] == "c" and out.lower_bound == 150.0
    # Not settled when the twin's search is cut short every time.
    res["a"] = (False, 120.0, 200.0)
    out, searched, _ = _run(tasks, res)
    assert "b" in searched
    # Cut short in pass 1, b waits behind it for pass 2, where a's second search settles it.
    res["a"] = [(False, 120.0, 200.0), (True, 200.0, 200.0)]
    out, searched, _ = _run(tasks, res)
    assert searched == ["a", "c", "a"] and out.complete and out.found[0][1] == "c"


def test_gap_cuts_within_it_and_says_so() -> None:
    tasks = [Task(bound=10.0, payload="a"), Task(bound=97.0, payload="b")]
    res = {"a": (True, 100.0, 100.0), "b": (True, 96.0, 96.0)}
    out, searched, _ = _run(tasks, res, gap=0.05)
    assert searched == ["a"] and out.complete
    assert math.isclose(out.lower_bound, 95.0) and math.isclose(out.gap, 0.05)
    out, searched, _ = _run(tasks, res)  # exact: b is searched and wins
    assert searched == ["a", "b"] and out.found[0][1] == "b" and out.gap == 0.0


def test_probes_give_the_first_full_search_an_incumbent_and_settle_nothing() -> None:
    """The task of the best bound holds only a dear plan (a region of cheap, slow GPUs);
    another's single-type probe finds a cheaper one, which the first full search starts
    under. Probes settle nothing: every task is still searched, the answer is the same as
    without them, and a probe's plan is kept when no full search beats it."""
    tasks = [Task(bound=10.0, payload="a"), Task(bound=20.0, payload="b"),
             Task(bound=30.0, payload="c", twin=1)]
    res = {"a": (True, 120.0, 120.0), "b": (True, 100.0, 100.0), "c": (True, 150.0, None)}
    probed: list[tuple[str, float]] = []
    seen: list[tuple[str, float]] = []

    def probe(task: Task, limit: float | None, threads: int, incumbent: float) -> Solved:
        probed.append((task.payload, incumbent))
        best = {"a": None, "b": 100.0, "c": None}[task.payload]
        plans = [] if best is None or best > incumbent else [((best,), task.payload + "*")]
        return Solved(stats=_stats(complete=False, lower=0.0), plans=plans)

    def solve(task: Task, limit: float | None, threads: int, incumbent: float) -> Solved:
        seen.append((task.payload, incumbent))
        complete, lower, best = res[task.payload]
        plans = [] if best is None or best > incumbent else [((best,), task.payload)]
        return Solved(stats=_stats(complete=complete, lower=lower), plans=plans)

    out = Scheduler(tasks=tasks, solve=solve, top_k=1, threads=1, budget=TimeBudget(None),
                    stopped=lambda: False, probe=probe).run()
    assert probed == [("a", math.inf), ("b", math.inf)]  # the twin is left to its twin
    assert seen[0] == ("a", 100.0)  # the first full search under the probe's plan
    assert out.complete and out.lower_bound == 100.0
    assert out.found[0][0][0] == 100.0
    baseline, _, _ = _run(tasks, res)
    assert baseline.found[0][0][0] == out.found[0][0][0] and baseline.complete


class _Crew:
    """A stand-in for the core's Crew: records its deadlines and who helps, lets its
    search end once helped, and (as the core's) keeps a helper until the search ends."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.helped = threading.Event()
        self.done = threading.Event()

    def share(self, seconds: float) -> None:
        self.log.append((self, "share", seconds))

    def stop_after(self, seconds: float) -> None:
        self.log.append((self, "stop_after", seconds))

    def help(self) -> None:
        self.log.append((self, "help"))
        self.helped.set()
        assert self.done.wait(10)

    def finish(self) -> None:
        self.log.append((self, "finish"))
        self.done.set()


def test_an_idle_worker_lifts_the_shares_and_joins_the_running_search() -> None:
    """Two workers side by side: 'a' (the best bound) runs long; the other worker searches
    'b' and 'c'. While 'c' waits, 'a' and 'b' run under a share of the time (their crews'
    deadlines); once no task waits, the shares of the searches still running are lifted and
    the idle worker joins a's search instead of idling."""
    tasks = [Task(bound=10.0, payload="a"), Task(bound=20.0, payload="b"),
             Task(bound=30.0, payload="c")]
    log: list[tuple[Any, ...]] = []
    crews: dict[str, _Crew] = {}

    def solve(task: Task, limit: float | None, threads: int, incumbent: float,
              crew: Any = None) -> Solved:
        crews[task.payload] = crew
        log.append((crew, "limit", limit))
        if task.payload == "a":
            assert crew.helped.wait(10)  # the other worker came to help
        best = {"a": 100.0, "b": 120.0, "c": 130.0}[task.payload]
        return Solved(stats=_stats(complete=True, lower=best), plans=[((best,), task.payload)])

    sched = Scheduler(tasks=tasks, solve=solve, top_k=1, threads=2, budget=TimeBudget(100.0),
                      stopped=lambda: False, shared=SimpleNamespace(value=math.inf),
                      crew=lambda: _Crew(log))
    out = sched.run()
    assert out.complete and out.found[0][1] == "a"

    def events(name: str, kind: str) -> list[float]:
        return [e[2] for e in log if e[0] is crews[name] and e[1] == kind]

    for name in "abc":
        # The search's own limit is what is left of the budget; the share is the crew's.
        assert len(events(name, "limit")) == 1 and events(name, "limit")[0] > 99.0
    # 'a' and 'b' started while 'c' waited: each got a share (a's, of three tasks on two
    # workers, is two thirds of the budget; b's, of the two left, all that is left).
    assert len(events("a", "share")) == 1 and 60.0 < events("a", "share")[0] < 70.0
    assert len(events("b", "share")) == 1 and events("b", "share")[0] > 0
    assert all(s > 99.0 for s in events("c", "share"))  # the last task: all that is left
    # Once the queue was empty, a's share was lifted before the idle worker joined it.
    lifted = log.index((crews["a"], "stop_after", math.inf))
    assert lifted < log.index((crews["a"], "help"))
    assert [e[0] for e in log if e[1] == "help"] == [crews["a"]]
    assert sched._crews == {}


def test_a_shadow_is_settled_only_when_no_plan_meets_the_deadline() -> None:
    """'c' is a shadow of 'b' (b's offers at other prices, Task.shadow), and 'd' a twin of
    'c' (c's offers at prices no lower). When b's search ends with no plan while no plan is
    known anywhere, no plan meets the deadline there, so neither in c nor in d: neither is
    searched. When b ends with no plan only because 'a' found one first (its plans cost
    more), c may still hold a cheaper plan and is searched."""
    tasks = [Task(bound=10.0, payload="b"), Task(bound=20.0, payload="c", shadow=0),
             Task(bound=30.0, payload="d", twin=1)]
    out, searched, _ = _run(tasks, {"b": (True, math.inf, None), "c": (True, 40.0, 40.0),
                                    "d": (True, 45.0, 45.0)})
    assert searched == ["b"] and out.complete and not out.found
    # A plan first: b's empty search proves nothing about c's cheaper offers.
    tasks = [Task(bound=5.0, payload="a"), Task(bound=10.0, payload="b"),
             Task(bound=20.0, payload="c", shadow=1)]
    out, searched, _ = _run(tasks, {"a": (True, 100.0, 100.0), "b": (True, 100.0, None),
                                    "c": (True, 40.0, 40.0)})
    assert searched == ["a", "b", "c"] and out.complete and out.found[0][0][0] == 40.0


def test_a_twin_waits_while_its_twin_runs_and_the_worker_helps_that_search() -> None:
    """Two workers; 'b' is a twin of 'a' and 'c' is not. The worker that finds 'b' next in
    the queue while a's search runs takes 'c' first, then, with only 'b' left, joins a's
    search instead of searching 'b' beside it; a's search, ended with no plan (an
    infeasibility proof), settles 'b', which is never searched."""
    tasks = [Task(bound=10.0, payload="a"), Task(bound=20.0, payload="b", twin=0),
             Task(bound=30.0, payload="c")]
    log: list[tuple[Any, ...]] = []
    searched: list[str] = []
    crews: dict[str, _Crew] = {}
    c_done = threading.Event()

    def solve(task: Task, limit: float | None, threads: int, incumbent: float,
              crew: Any = None) -> Solved:
        searched.append(task.payload)
        crews[task.payload] = crew
        if task.payload == "a":
            assert crew.helped.wait(10)  # the other worker came to help
            assert c_done.is_set()  # ... after searching c
        else:
            c_done.set()
        return Solved(stats=_stats(complete=True, lower=math.inf), plans=[])

    sched = Scheduler(tasks=tasks, solve=solve, top_k=1, threads=2, budget=TimeBudget(100.0),
                      stopped=lambda: False, shared=SimpleNamespace(value=math.inf),
                      crew=lambda: _Crew(log))
    out = sched.run()
    assert sorted(searched) == ["a", "c"]
    assert out.complete and not out.found and out.lower_bound == math.inf
    assert [e[0] for e in log if e[1] == "help"] == [crews["a"]]
    assert (crews["a"], "finish") in log  # helpers can never wait on it


def test_the_first_plan_is_timed_from_the_start_of_the_run() -> None:
    """Outcome.first_plan_s: when the earliest search that found a plan began, plus its own
    first_plan_s (its end where its stats do not say); None without a plan."""
    tasks = [Task(bound=10.0, payload="a"), Task(bound=20.0, payload="b")]

    def run(finds: str, first: float | None) -> Any:
        def solve(task: Task, limit: float | None, threads: int, incumbent: float) -> Solved:
            stats = _stats(complete=True, lower=100.0)
            if task.payload != finds:
                return Solved(stats=stats, plans=[])
            if first is not None:
                stats.first_plan_s = first  # as the core reports it
            return Solved(stats=stats, plans=[((100.0,), task.payload)])

        return Scheduler(tasks=tasks, solve=solve, top_k=1, threads=1,
                         budget=TimeBudget(None), stopped=lambda: False).run()

    t = time.monotonic()
    out = run("b", 0.25)
    assert out.first_plan_s is not None
    assert 0.25 <= out.first_plan_s <= 0.25 + (time.monotonic() - t)
    t = time.monotonic()
    out = run("a", None)  # stats that do not say: the search's end
    assert out.first_plan_s is not None and 0.0 <= out.first_plan_s <= time.monotonic() - t
    assert run("nobody", 0.25).first_plan_s is None
