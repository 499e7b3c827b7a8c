"""Run a suite: every cell through Espresso and each baseline, in parallel processes (or as
Ray tasks), one row per plan written as soon as it is known.

The results folder (docs/benchmarks.md):

* ``suite.json``: what ran (written first);
* ``rows.jsonl``: one JSON line per (cell, planner), appended and flushed as each finishes, so
  an interrupted run keeps every finished row (``--resume`` skips them on the next run);
* ``rows.csv``: the same rows in cell and planner order (written at the end, and on an
  interrupt);
* ``plans/cell-NNNN-PLANNER.json``: every plan found (``espresso show`` reads them);
* ``frontiers/GROUP.json``: Espresso's exact cost-deadline frontier per curve, when the
  suite asks for it;
* ``summary.md`` and ``plots/`` (:mod:`espresso.bench.report`).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import math
import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from .. import _io
from .. import _validate as v
from ..baselines import _best, baseline
from ..catalog import Catalog
from ..errors import EspressoError, SpecError
from ..plan import Plan
from .suite import CatalogSpec, Cell, Suite

ROW_FIELDS = ("suite", "cell", "model", "catalog", "quota", "tokens", "iterations",
              "seq_len", "global_batch_size", "deadline_hours", "planner", "found", "usd",
              "hours", "hourly_usd", "iteration_s", "gpus", "instances", "idle_gpus", "stages",
              "dp", "tp", "micro_batch_size", "recompute", "sharding", "rent", "gap", "proven",
              "search_s", "error", "plan_file")
"""The columns of ``rows.csv`` (and the keys of each ``rows.jsonl`` line)."""


@dataclass(frozen=True, slots=True)
class Task:
    """One planner on one cell (``planner`` ``espresso`` or a baseline's name), or one
    frontier (``planner`` ``frontier``) over the cell's group."""

    suite: str
    cell: Cell
    planner: str
    catalog: CatalogSpec
    quota: str | None
    search: tuple[tuple[str, Any], ...]
    frontier: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> tuple[int, str]:
        return (self.cell.index, self.planner)


@functools.lru_cache(maxsize=16)
def _catalog(spec: CatalogSpec, quota: str | None) -> Catalog:
    return spec.load(quota)


def slug(*parts: Any) -> str:
    """A file-name-safe name from parts."""
    text = "-".join(str(p) for p in parts if p is not None)
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text).strip("_")


def curve_slug(row: dict[str, Any]) -> str:
    """The file name of a curve (cells that differ only in the deadline), from a row's or a
    cell's fields: the same for its frontier file and its plot."""
    tokens, iterations = row.get("tokens"), row.get("iterations")
    n = (f"{float(tokens):.3g}".replace("e+0", "e").replace("e+", "e") + "tok"
         if tokens is not None else f"{iterations}it")
    return slug(row["model"], row["catalog"], row["quota"], n, row["seq_len"],
                row["global_batch_size"])


def _search_kw(task: Task) -> dict[str, Any]:
    kw = dict(task.search)
    for k in ("max_stages", "micro_batch_sizes", "recompute", "sharding"):
        if isinstance(kw.get(k), list):
            kw[k] = tuple(kw[k])
    kw["threads"] = 1  # one process per task: the pool is the parallelism
    # The proven search alone unless the suite asks for the interleaving refinement, so that
    # every Espresso row is the optimum of its space and lies on the frontier.
    kw["interleave_after"] = tuple(kw.get("interleave_after") or ())
    return kw


def run_task(task: Task) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Plan one task; returns its row and the plan (or frontier) as JSON data. Errors of the
    package become the row's ``error``; nothing else is caught."""
    cell = task.cell
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS, None)
    row.update(suite=task.suite, cell=cell.index, model=cell.model_name, catalog=cell.catalog,
               quota=cell.quota, tokens=cell.tokens, iterations=cell.iterations,
               seq_len=cell.seq_len, global_batch_size=cell.global_batch_size,
               deadline_hours=cell.deadline_hours, planner=task.planner, found=False,
               error="")
    t0 = time.perf_counter()
    data: dict[str, Any] | None = None
    try:
        job = cell.job()
        catalog = _catalog(task.catalog, task.quota)
        kw = _search_kw(task)
        if task.planner == "frontier":
            from ..frontier import frontier

            f = frontier(job, catalog, **dict(task.frontier), **kw)
            data = f.to_dict()
            row["found"] = bool(f.points)
        else:
            plan = (_best(job, catalog, **kw) if task.planner == "espresso"
                    else baseline(task.planner).plan(job, catalog, **kw))
            if plan is not None:
                row.update(_plan_columns(plan))
                data = plan.to_dict()
    except EspressoError as exc:
        row["error"] = str(exc)
    row["search_s"] = time.perf_counter() - t0
    return row, data


def _plan_columns(plan: Plan) -> dict[str, Any]:
    est = plan.estimate
    assert est is not None
    gap = plan.stats.get("gap") if plan.stats else None
    return {
        "found": bool(est.feasible and est.meets_deadline),
        "usd": est.total_usd, "hours": est.total_hours, "hourly_usd": est.hourly_usd,
        "iteration_s": est.iteration_s, "gpus": sum(est.gpus.values()),
        "instances": sum(est.instances.values()), "idle_gpus": est.idle_gpus,
        "stages": len(plan.stages), "dp": plan.dp,
        "tp": "/".join(str(s.tp) for s in plan.stages),
        "micro_batch_size": plan.micro_batch_size, "recompute": plan.recompute,
        "sharding": plan.sharding,
        "rent": " + ".join(f"{r['instances']} x {r['instance_type']}"
                           + (f" ({r['provider']} {r['region']})" if r.get("provider") else "")
                           for r in est.rent),
        "gap": gap, "proven": None if gap is None else gap <= 0.0,
    }


def tasks_of(suite: Suite) -> list[Task]:
    """Every task of the suite: per cell, Espresso then each baseline; then one frontier per
    curve (cells that differ only in the deadline) when the suite asks for it."""
    search = tuple(sorted(suite.search.items()))
    out: list[Task] = []
    seen: set[Any] = set()
    for cell in suite.cells:
        spec = suite.catalogs[cell.catalog]
        quota = suite.quotas[cell.quota]
        for planner in ("espresso", *suite.baselines):
            out.append(Task(suite.name, cell, planner, spec, quota, search))
    if suite.frontier is not None:
        fkw = {"max_points": suite.frontier["max_points"],
               "time_limit_s": suite.frontier["time_limit_s"]}
        search_f = tuple((k, x) for k, x in search if k != "time_limit_s")
        for cell in suite.cells:
            if cell.group in seen:
                continue
            seen.add(cell.group)
            out.append(Task(suite.name, cell, "frontier", suite.catalogs[cell.catalog],
                            suite.quotas[cell.quota], search_f, tuple(sorted(fkw.items()))))
    return out


def _order(planners: Iterable[str]) -> dict[str, int]:
    return {p: i for i, p in enumerate(("espresso", *planners, "frontier"))}


ROW_TYPES = {"suite": "str?", "cell": "int", "model": "str", "catalog": "str", "quota": "str?",
             "tokens": "float?", "iterations": "float?", "seq_len": "int?",
             "global_batch_size": "int?", "deadline_hours": "float", "planner": "str",
             "found": "bool", "usd": "float?", "hours": "float?", "gap": "float?",
             "proven": "bool?", "search_s": "float?", "error": "str?", "plan_file": "str?"}
"""The row fields the report reads, and their JSON types (``?``: may be null)."""
MAX_ROWS_BYTES = 1 << 30
"""``rows.jsonl`` larger than this is refused (10,000 cells of six planners are ~30 MB)."""
_ROW_WORDS = {"str": "a string", "bool": "true or false", "int": "an integer",
              "float": "a number"}


def _check_row(where: str, row: Any) -> dict[str, Any]:
    try:
        if not isinstance(row, dict):
            msg = f"{where}: expected a row (a JSON object), got {str(row)[:80]}"
            raise SpecError(msg)
        for key, kind in ROW_TYPES.items():
            if key not in row and not kind.endswith("?"):
                msg = f"{where}: field {key!r}: expected {_ROW_WORDS[kind]}, got missing"
                raise SpecError(msg)
            v.typed(f"{where}: field {key!r}", row.get(key), kind)
        if row["found"] and row.get("usd") is None and row.get("planner") != "frontier":
            # (a frontier row's figures are in its frontier file)
            msg = f"{where}: a row with found: true has no usd"
            raise SpecError(msg)
    except SpecError as exc:
        msg = f"{exc}; is this the results folder of `espresso bench run`?"
        raise SpecError(msg) from None
    plan_file = row.get("plan_file")
    if plan_file is not None and (Path(plan_file).is_absolute() or ".." in Path(plan_file).parts):
        msg = f"{where}: plan_file {plan_file[:80]!r} is not a file inside the results folder"
        raise SpecError(msg)
    return dict(row)


def read_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of ``rows.jsonl`` in a results folder (a cut-short last line is skipped);
    a line that is not a row of ours is an error naming it."""
    path = out / "rows.jsonl"
    rows: list[dict[str, Any]] = []
    if not _io.exists(path):
        return rows
    text = _io.read_text("bench", path, err=SpecError, max_bytes=MAX_ROWS_BYTES)
    lines = text.splitlines()
    for n, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            if n == len(lines):
                continue  # cut short by an interrupt: the task runs again on --resume
            msg = (f"{path}: line {n}: not JSON; is this the results folder of "
                   "`espresso bench run`?")
            raise SpecError(msg) from None
        rows.append(_check_row(f"{path}: line {n}", row))
    return rows


def write_csv(out: Path, rows: list[dict[str, Any]], planners: Iterable[str]) -> Path:
    order = _order(planners)
    rows = sorted(rows, key=lambda r: (r["cell"], order.get(r["planner"], 99)))
    path = out / "rows.csv"
    with _io.atomic_output("bench", path, err=SpecError) as tmp, \
            tmp.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=ROW_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in ROW_FIELDS})
    return path


Progress = Callable[[int, int, dict[str, Any]], None]


def run_suite(suite: Suite, out: str | Path, *, jobs: int | None = None,
              ray_address: str | None = None, resume: bool = False,
              progress: Progress | None = None) -> list[dict[str, Any]]:
    """Run ``suite`` into the folder ``out`` (created; refused when it holds another run's
    rows unless ``resume``). ``jobs`` processes (default: one per core), or Ray tasks on the
    cluster at ``ray_address`` (``local``: a one-machine Ray cluster started for the run
    and stopped after it). Returns the
    rows (plans and frontiers), in cell and planner order;
    ``progress(done, total, row)`` is called after each task."""
    out = Path(out)
    for cat, quota in {(c.catalog, c.quota) for c in suite.cells}:
        _catalog(suite.catalogs[cat], suite.quotas[quota])  # a bad file fails here, at once
    jobs = ((os.cpu_count() or 1) if jobs is None
            else v.integer("jobs", jobs, minimum=1, maximum=1024))
    _io.make_dir("--out", out, err=SpecError)
    rows_path = out / "rows.jsonl"
    done_rows = read_rows(out) if resume else []
    if rows_path.exists() and not resume and rows_path.stat().st_size > 0:
        msg = (f"bench run: {out} already holds the rows of a run; pass --resume to finish it, "
               "or choose another --out")
        raise SpecError(msg)
    if done_rows or (resume and rows_path.exists()):
        # keep only whole rows: a line cut short by an interrupt would swallow the next one
        _io.write_text("bench", rows_path,
                       "".join(json.dumps(_clean(r)) + "\n" for r in done_rows), err=SpecError)
    _io.write_text("bench", out / "suite.json", json.dumps(suite.to_dict(), indent=2) + "\n",
                   err=SpecError)
    _io.make_dir("bench", out / "plans", err=SpecError)
    tasks = tasks_of(suite)
    have = {(r["cell"], r["planner"]) for r in done_rows}
    todo = [t for t in tasks if t.key not in have]
    rows = list(done_rows)
    total = len(tasks)
    with rows_path.open("a", encoding="utf-8") as fh:

        def record(task: Task, row: dict[str, Any], data: dict[str, Any] | None) -> None:
            if data is not None:
                if task.planner == "frontier":
                    _io.make_dir("bench", out / "frontiers", err=SpecError)
                    name = f"frontiers/{curve_slug(row)}.json"
                else:
                    name = f"plans/cell-{task.cell.index:04d}-{task.planner}.json"
                _io.write_text("bench", out / name, json.dumps(data, indent=1) + "\n",
                               err=SpecError)
                row["plan_file"] = name
            fh.write(json.dumps(_clean(row)) + "\n")
            fh.flush()
            rows.append(row)
            if progress is not None:
                progress(len(rows), total, row)

        try:
            if ray_address is not None:
                _run_ray(todo, ray_address, record)
            elif jobs == 1:
                for t in todo:
                    record(t, *run_task(t))
            else:
                _run_pool(todo, jobs, record)
        finally:
            write_csv(out, rows, suite.baselines)
    order = _order(suite.baselines)
    return sorted(rows, key=lambda r: (r["cell"], order.get(r["planner"], 99)))


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: a non-finite number becomes null."""
    return {k: (None if isinstance(x, float) and not math.isfinite(x) else x)
            for k, x in row.items()}


def _quiet_worker() -> None:
    """A worker process leaves Ctrl-C to the parent, which stops it: its own
    KeyboardInterrupt would only print a traceback from inside the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT blocked in this thread while the pool may start a process: the child starts
    with it blocked (a mask survives fork and exec) until ``_quiet_worker`` ignores it, so a
    Ctrl-C while it boots cannot interrupt it either. A Ctrl-C meanwhile waits, not lost."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _ctrl_c_polled() -> Iterator[threading.Event]:
    """Ctrl-C sets the event instead of raising inside whatever runs (an exception thrown
    into the pool's locks surfaces as "release unlocked lock"); the loop polls it and stops
    at a safe point. Outside the main thread, signals are not ours to handle: a plain
    event."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, old)


def _record_done(finished: Iterable[Future[Any]], pending: dict[Future[Any], Task],
                 it: Iterator[Task], record: Callable[..., None],
                 submit: Callable[[Task], None]) -> None:
    for f in finished:
        t = pending.pop(f)
        record(t, *f.result())
        nxt = next(it, None)
        if nxt is not None:
            submit(nxt)


def _worker_pool(workers: int) -> ProcessPoolExecutor:
    """Processes that leave Ctrl-C to this one (spawned: the native search's threads make
    fork unsafe)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                               initializer=_quiet_worker)


def _run_pool(todo: list[Task], jobs: int,
              record: Callable[[Task, dict[str, Any], dict[str, Any] | None], None]) -> None:
    pool = _worker_pool(min(jobs, max(1, len(todo))))
    pending: dict[Future[Any], Task] = {}

    def submit(t: Task) -> None:
        with _sigint_held():
            pending[pool.submit(run_task, t)] = t

    try:
        with _ctrl_c_polled() as stop:
            it = iter(todo)
            for t in it:  # keep 2 tasks per worker queued, not the whole suite
                submit(t)
                if len(pending) >= 2 * jobs:
                    break
            while pending:
                finished, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                if stop.is_set():
                    raise KeyboardInterrupt
                _record_done(finished, pending, it, record, submit)
    except BaseException:
        # Ctrl-C or a failure: stop now (the rows written so far stay), not after the
        # running searches end.
        workers = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for w in workers:
            w.terminate()
        # Wait for the pool's manager thread to close its wake-up pipe: otherwise the
        # interpreter's exit hook may write to that pipe while the thread closes it
        # ("Bad file descriptor" printed after the run's own summary).
        manager = getattr(pool, "_executor_manager_thread", None)
        if manager is not None and manager is not threading.current_thread():
            manager.join(timeout=10)
        raise
    pool.shutdown(wait=True)


def _run_ray(todo: list[Task], address: str,
             record: Callable[[Task, dict[str, Any], dict[str, Any] | None], None]) -> None:
    from .._optional import require

    ray = require("ray")
    started = False
    if not ray.is_initialized():
        with warnings.catch_warnings():  # Ray's own deprecations are not the user's to fix
            warnings.simplefilter("ignore")
            try:
                if address == "local":  # a one-machine cluster started here, ended after
                    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False,
                             log_to_driver=False)
                else:
                    ray.init(address=address, log_to_driver=False)
            except Exception as exc:  # Ray raises many kinds; say which address failed
                msg = f"--ray {address}: Ray could not start or connect ({exc})"
                raise SpecError(msg) from exc
        started = True
    try:
        remote = ray.remote(num_cpus=1)(run_task)
        refs = {remote.remote(t): t for t in todo}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                t = refs.pop(ref)
                record(t, *ray.get(ref))
    finally:
        if started:
            ray.shutdown()
