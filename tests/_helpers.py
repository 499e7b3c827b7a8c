"""Helpers shared by the tests (imported as a plain module: tests/ has no __init__)."""

from __future__ import annotations

import espresso as es


def make_plan(job: es.Job, stages: list[tuple[str, int, int, int]], **kw: object) -> es.Plan:
    """stages: (gpu, tp, begin, end)."""
    return es.Plan(job=job, stages=tuple(es.Stage(gpu=g, tp=t, layers=(a, b))
                                         for g, t, a, b in stages), **kw)  # type: ignore[arg-type]
