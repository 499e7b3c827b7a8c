"""espresso.frontier: every point is the cheapest plan for its deadlines, no breakpoint is
missed, and nothing is faster than the last point (against the brute force)."""

from __future__ import annotations

import importlib
import math
from dataclasses import replace
from pathlib import Path

import pytest
from _bruteforce import brute_force
from test_search import COST, SMALL, random_instance

import espresso as es
from espresso.frontier import deadline_hours, frontier

# The module (the package's attribute of that name is the function)
espresso_frontier = importlib.import_module("espresso.frontier")

KW = {**SMALL, "interleave_after": ()}


def _bf(job: es.Job, catalog: es.Catalog, deadline: float, depth: int = 2) -> float:
    cost, _, _ = brute_force(replace(job, deadline_hours=deadline), catalog,
                             micro_batch_sizes=(1, 2), max_stages=depth, max_tp=2,
                             cost_model=COST)
    return cost


CASES = [(seed, 2) for seed in range(30)] + [(1000 + seed, 3) for seed in range(12)]


@pytest.mark.parametrize("top_k", [1, 2, 8])
@pytest.mark.parametrize(("seed", "depth"), CASES)
def test_frontier_points_are_the_brute_force_optima(seed: int, depth: int, top_k: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With each search asked for top_k plans: 1, one search per point; 2, points taken
    from lists that often end before the next point (the next search starts there); 8 (the
    default), often the whole frontier from one or two searches, the last point known to be
    the fastest without a search of its own when a list ends short."""
    monkeypatch.setattr(espresso_frontier, "TOP_K", top_k)
    job, catalog = random_instance(seed, depth)
    f = frontier(job, catalog, max_stages=depth, time_limit_s=120, **KW)
    assert f.complete
    if not f.points:  # nothing fits at all, whatever the deadline
        assert math.isinf(_bf(job, catalog, 1e12, depth))
        return
    for i, p in enumerate(f.points):
        assert p.proven and p.hours == deadline_hours(p.plan)
        assert p.usd == pytest.approx(_bf(job, catalog, p.hours, depth), rel=1e-9)
        # Costs rise as hours fall; each point holds up to the previous one's hours.
        if i:
            prev = f.points[i - 1]
            assert p.hours < prev.hours and p.usd > prev.usd and p.up_to == prev.hours
            # Between two breakpoints the cheapest plan is still this one: none missed.
            mid = (p.hours + prev.hours) / 2
            assert _bf(job, catalog, mid, depth) == pytest.approx(p.usd, rel=1e-9)
    # Nothing meets a deadline below the fastest point; above the first, its plan holds.
    assert math.isinf(_bf(job, catalog, f.points[-1].hours * (1 - 1e-6), depth))
    assert _bf(job, catalog, f.points[0].hours * 10, depth) == pytest.approx(f.points[0].usd)


def test_frontiers_of_these_instances_have_steps() -> None:
    """Not vacuous: many of the instances above have two or more points."""
    steps = sum(len(frontier(*random_instance(s, d), max_stages=d, **KW).points) > 1
                for s, d in CASES)
    assert steps >= 8, steps


def test_frontier_answers_both_questions() -> None:
    job, catalog = random_instance(3, 2)
    f = frontier(job, catalog, max_stages=2, **KW)
    assert len(f.points) >= 2
    slow, fast = f.points[0], f.points[-1]
    assert f.cheapest_for(slow.hours * 2) == slow
    assert f.cheapest_for(fast.hours) == fast
    assert f.cheapest_for(fast.hours * 0.5) is None
    assert f.fastest_within(fast.usd) == fast
    assert f.fastest_within(slow.usd) == slow
    assert f.fastest_within(slow.usd * 0.5) is None


def test_one_short_list_gives_the_whole_frontier(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list shorter than asked holds every plan: its staircase is the whole frontier, from
    one search; cut by max_points, the frontier is not complete."""
    calls: list[float] = []
    real = espresso_frontier.search

    def counted(job: es.Job, *a: object, **kw: object) -> object:
        calls.append(job.deadline_hours)
        return real(job, *a, **kw)

    monkeypatch.setattr(espresso_frontier, "search", counted)
    monkeypatch.setattr(espresso_frontier, "TOP_K", 1000)
    job, catalog = random_instance(3, 2)
    full = frontier(job, catalog, max_stages=2, **KW)
    assert full.complete and len(full.points) >= 2 and len(calls) == 1
    monkeypatch.setattr(espresso_frontier, "TOP_K", 1)
    calls.clear()
    one_by_one = frontier(job, catalog, max_stages=2, **KW)
    assert len(calls) == len(full.points) + 1  # the last search finds nothing faster
    assert [(p.hours, p.usd) for p in one_by_one.points] == [(p.hours, p.usd)
                                                             for p in full.points]
    monkeypatch.setattr(espresso_frontier, "TOP_K", 1000)
    n = len(full.points)
    cut = frontier(job, catalog, max_points=n - 1, max_stages=2, **KW)
    assert not cut.complete and [p.usd for p in cut.points] == [p.usd for p in full.points][:-1]
    assert frontier(job, catalog, max_points=n, max_stages=2, **KW).complete


def test_frontier_limits() -> None:
    job, catalog = random_instance(3, 2)
    f = frontier(job, catalog, max_points=1, max_stages=2, **KW)
    assert len(f.points) == 1 and not f.complete
    with pytest.raises(es.SpecError, match="objective"):
        frontier(job, catalog, objective="time")
    with pytest.raises(es.SpecError, match="max_points"):
        frontier(job, catalog, max_points=0)


def test_cli_frontier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from espresso.cli import main

    out = tmp_path / "f.json"
    assert main(["frontier", "--model", "llama2-7b", "--tokens", "2e10", "--catalog",
                 "builtin:gpus", "--max-points", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "frontier of llama2-7b" in text and "incomplete" in text
    # Not a terminal: each point is a line as soon as it is found, before the table.
    lines = [line for line in text.splitlines() if line.startswith("point ")]
    assert [line.split(":")[0] for line in lines] == ["point 1", "point 2", "point 3"]
    assert text.index("point 3:") < text.index("frontier of llama2-7b")
    data = json.loads(out.read_text())
    assert data["schema"] == "espresso.frontier/1" and len(data["points"]) == 3
    assert data["points"][0]["up_to_hours"] is None
    hours = [p["hours"] for p in data["points"]]
    usd = [p["total_usd"] for p in data["points"]]
    assert hours == sorted(hours, reverse=True) and usd == sorted(usd)
    plan = es.Plan.from_dict(data["points"][1]["plan"])
    assert plan.estimate is not None and plan.estimate.total_usd == pytest.approx(usd[1])
