"""A running search's crew (the core's ``Crew``): threads that join it while it runs, and a
deadline the caller moves (docs/search.md, "Subproblems side by side")."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from _helpers import native_searches

import espresso as es
from espresso._native import core


@pytest.fixture(scope="module")
def hard_search() -> tuple[Any, ...]:
    """The arguments of a native search that takes about a second on one thread (llama2-13b,
    1e12 tokens in 60 days over the built-in GPU types: 45k nodes), captured from a plain
    ``espresso.search`` call, with the options it was run with."""
    job = es.Job(model=es.ModelSpec.preset("llama2-13b"), tokens=1e12, deadline_hours=60 * 24)
    with native_searches() as calls:
        es.search(job, es.Catalog.builtin("gpus"), threads=1, interleave_after=())
    args, res = max(calls, key=lambda c: c[1].stats.nodes_expanded)
    assert res.stats.nodes_expanded > 10_000  # hard enough that a helper joins it while it runs
    return args


def _run(args: tuple[Any, ...], crew: Any = None) -> Any:
    *head, opts = args
    opts.crew = crew
    opts.threads = 1
    opts.time_limit_s = 0.0
    try:
        return core.search(*head, opts)
    finally:
        opts.crew = None


def _key(res: Any) -> list[tuple[float, list[tuple[int, int]]]]:
    return [(p.objective, [(s.gpu, s.tp) for s in p.stages]) for p in res.plans]


def test_a_helper_joins_the_search_and_the_answer_is_the_same(hard_search: Any) -> None:
    plain = _run(hard_search)
    assert plain.stats.complete and plain.plans
    crew = core.Crew()
    helper = threading.Thread(target=crew.help)
    helper.start()  # waits for the search's engine to open
    helped = _run(hard_search, crew)
    helper.join(timeout=60)
    assert not helper.is_alive()  # help() returns once the search has ended
    assert crew.helpers >= 1  # it joined (the search runs about a second)
    assert helped.stats.threads >= 2
    assert helped.stats.complete and _key(helped) == _key(plain)
    # Helping a search that has ended returns at once.
    crew.help()


def test_the_crews_deadline_stops_the_search_and_can_be_moved(hard_search: Any) -> None:
    plain = _run(hard_search)
    crew = core.Crew()
    crew.stop_after(0.0)
    stopped = _run(hard_search, crew)
    assert not stopped.stats.complete and stopped.stats.timed_out
    assert stopped.stats.lower_bound <= plain.plans[0].objective  # still a true bound
    crew = core.Crew()
    crew.stop_after(0.0)
    crew.stop_after(math.inf)  # moved before it passed: the search runs to its end
    moved = _run(hard_search, crew)
    assert moved.stats.complete and _key(moved) == _key(plain)


def test_help_returns_when_the_search_fails_at_its_boundary(hard_search: Any) -> None:
    *head, _ = hard_search
    crew = core.Crew()
    helper = threading.Thread(target=crew.help)
    helper.start()
    bad = core.SearchOptions()
    bad.top_k = 0  # refused before any engine runs
    bad.crew = crew
    with pytest.raises(ValueError, match="top_k"):
        core.search(*head, bad)
    helper.join(timeout=10)
    assert not helper.is_alive()


def _run_shared(args: tuple[Any, ...], crew: Any, incumbent: float) -> Any:
    opts = args[-1]
    opts.shared = core.SharedIncumbent()
    opts.incumbent = incumbent
    try:
        return _run(args, crew)
    finally:
        opts.shared = None
        opts.incumbent = math.inf


def test_a_share_is_renewed_until_a_better_plan_is_found(hard_search: Any) -> None:
    """A share runs out only once a plan better than the one the search began under has been
    found (a restart would then prune more); before that it is renewed, since a restart would
    search the same nodes again."""
    best = _run(hard_search).plans[0].objective
    # Under the optimum as incumbent nothing better exists: the share is renewed to the end.
    crew = core.Crew()
    crew.share(1e-4)
    renewed = _run_shared(hard_search, crew, best)
    assert renewed.stats.complete and not renewed.stats.timed_out
    assert renewed.stats.nodes_expanded > 100  # it ran long past its first share
    # The same deadline set with stop_after is not renewed.
    crew = core.Crew()
    crew.stop_after(1e-4)
    cut = _run_shared(hard_search, crew, best)
    assert not cut.stats.complete and cut.stats.timed_out
    # Without an incumbent the search's own first plan lowers the shared one: the share ends.
    crew = core.Crew()
    crew.share(1e-4)
    ended = _run_shared(hard_search, crew, math.inf)
    assert ended.plans and not ended.stats.complete and ended.stats.timed_out
    assert ended.stats.lower_bound <= best
