"""Helpers shared by the tests (imported as a plain module: tests/ has no __init__)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import espresso as es
from espresso._native import core


def make_plan(job: es.Job, stages: list[tuple[str, int, int, int]], **kw: object) -> es.Plan:
    """stages: (gpu, tp, begin, end)."""
    return es.Plan(job=job, stages=tuple(es.Stage(gpu=g, tp=t, layers=(a, b))
                                         for g, t, a, b in stages), **kw)  # type: ignore[arg-type]


@contextmanager
def native_searches() -> Iterator[list[tuple[tuple[Any, ...], Any]]]:
    """Every native search ``espresso.search`` runs inside the block: (its arguments, its
    result), in order."""
    calls: list[tuple[tuple[Any, ...], Any]] = []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(core, name)

        def search(self, *args: Any) -> Any:
            res = core.search(*args)
            calls.append((args, res))
            return res

    module = sys.modules["espresso.search"]
    module.core = Spy()  # type: ignore[attr-defined]
    try:
        yield calls
    finally:
        module.core = core  # type: ignore[attr-defined]


def spawn_ranks(fn: Any, args: tuple[Any, ...], nprocs: int) -> None:
    """``torch.multiprocessing.spawn`` through a fork server that has imported torch and
    espresso.torch once for the whole session: each rank is a fork of it, so a test's
    processes start in milliseconds instead of importing torch each (about 2.3 s a process
    on these machines, most of a multi-process test's time). The server is a fresh,
    single-threaded process, so forking it is safe where forking pytest (which has run
    torch's thread pools) would not be. `fn` must be a module-level function."""
    import multiprocessing

    import torch.multiprocessing as tmp

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "espresso.torch"])
    tmp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def deadline_near_fastest(job: es.Job, catalog: es.Catalog, factor: Callable[[], float],
                          **space: Any) -> es.Job:
    """``job`` with its deadline at ``factor()`` times the fastest plan's hours (the search
    with ``space``), so that the deadline binds; unchanged when no plan fits (``factor`` is
    then not called, which keeps a caller's random sequence as it was)."""
    fastest = es.search(job, catalog, objective="time", **space)
    if not fastest.plans:
        return job
    hours = fastest.plans[0].estimate.total_hours  # type: ignore[union-attr]
    return replace(job, deadline_hours=hours * factor())
