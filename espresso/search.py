"""plan(), search() and place(): the exact cost-tree search and the stage placer."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from . import _validate as v
from ._native import core
from .catalog import Catalog, GpuType
from .cloud.domains import SCOPES, Subproblem, locations_of, subproblems
from .cost import CostParams
from .engines import engine_cost, engine_named, refusal
from .errors import EspressoError, JobError, SpecError
from .estimate import RECOMPUTE_CORE, SHARDING_CORE, _workload, estimate
from .gpu_type import runs_precision
from .interleave import DEFAULT_VIRTUAL_STAGES, interleave, rank_key
from .job import Job
from .plan import RECOMPUTE, SCHEDULES, SHARDING, Plan, Stage
from .profile import as_profiles
from .progress import DEFAULT_TIME_LIMIT_S, MIN_SEARCH_S, SearchProgress, TimeBudget
from .scheduler import Outcome, Scheduler, Solved, Task, shared_incumbent
from .table import Table
from .units import format_hours as _hours

PRUNING_RULES = ("cost", "deadline", "memory", "dominance")
"""Pruning rules that can be switched off (availability is never violated: options beyond a
type's count are simply not generated)."""


class InfeasibleError(EspressoError):
    """No plan satisfies the job; the message says why. ``fastest`` is the fastest plan that
    ignores the deadline, when one exists; ``stats`` the search statistics."""

    def __init__(self, message: str, *, fastest: Plan | None = None,
                 stats: SearchStats | None = None) -> None:
        super().__init__(message)
        self.fastest = fastest
        self.stats = stats


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchStats:
    """What the search did and what it proved.

    The plan found is the same for any thread count (ties are broken by a total order), and
    so are ``lower_bound``, ``gap`` and ``complete`` of a search that completes. The work
    counters (nodes, pruning, placements, frontier peak, dives) are exact for one thread but
    vary with two or more: threads expand nodes in a timing-dependent order, and an
    incumbent found earlier prunes more. ``seconds`` varies with the machine."""

    nodes_expanded: int
    nodes_generated: int
    pruned: dict[str, int]
    """Nodes (or options) cut per rule: cost, deadline, memory, availability, dominance."""
    leaves_placed: int
    """Complete allocations handed to the placer."""
    placer_nodes: int
    placer_leaves: int
    """Placements the placer simulated exactly."""
    frontier_peak: int
    dives: int
    """Subtrees finished depth-first because the best-first frontier was full."""
    combos: int
    """(recomputation, micro-batch size, data-parallel degree) combinations."""
    seconds: float
    threads: int
    lower_bound: float
    """No plan has a smaller objective (USD, or hours for ``objective="time"``)."""
    gap: float
    """``(best - lower_bound) / best``: 0 means proven optimal within the cost model."""
    complete: bool
    """The whole space was searched (or pruned by admissible bounds)."""
    timed_out: bool
    objective: str
    subproblems: int = 1
    """(Domain, vendor) subproblems of the catalog (docs/catalog.md, "Scopes")."""
    subproblems_searched: int = 1
    """Those searched; the others were cut by a bound before their search began, or had the
    same offers as one searched (its plans are theirs)."""
    domain: str | None = None
    """The winning plan's domain and vendor."""
    interrupted: bool = False
    """:meth:`SearchProgress.cancel` (Ctrl-C in the CLI) stopped the search before it
    finished: its plans are the best found so far."""
    first_plan_s: float | None = None
    """Seconds from the call's start to the first plan any of its searches found (None: no
    plan): how soon an answer was there to stop at (docs/search.md, "Limits, progress,
    cancel")."""

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["pruned"] = dict(self.pruned)
        for k in ("lower_bound", "gap"):
            if not math.isfinite(out[k]):
                out[k] = None
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    plans: list[Plan] = field(default_factory=list)
    """Best first (at most ``top_k``), each with its estimate attached."""
    stats: SearchStats


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _threads(threads: int | None) -> int:
    if threads is None:
        return usable_cores()
    return v.integer("threads", threads, minimum=1, maximum=1024)


def for_precision(catalog: Catalog, precision: str) -> Catalog:
    """The rows a job of ``precision`` can run on (:func:`runs_precision`): the catalog itself
    when all can, else a copy without the others; an error naming what the catalog has and
    what would do when none can."""
    if all(runs_precision(g, precision) for g in catalog.gpus):
        return catalog
    rows = tuple(g for g in catalog.gpus if runs_precision(g, precision))
    if not rows:
        names = sorted({g.model for g in catalog.gpus})
        has = f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
        if precision == "fp8" and any(g.bf16 for g in catalog.gpus):
            msg = ("job.precision fp8: no GPU type of the catalog has fp8 tensor cores "
                   f"(fp8_tflops above its bf16 peak; the catalog has {has}); expected a "
                   "catalog with fp8 GPUs (H100, H200, B200, L40S, L4, MI300X) or "
                   "job.precision bf16")
        else:
            msg = (f"job.precision {precision}: no GPU type of the catalog has bf16 tensor "
                   f"cores (the catalog has {has}); expected job.precision fp16 (mixed "
                   "precision with loss scaling, --precision fp16) or a catalog with bf16 GPUs")
        raise JobError(msg)
    return Catalog(gpus=rows, notes=catalog.notes)


def _depth(max_stages: int | Sequence[int]) -> tuple[int, list[int]]:
    """``max_stages`` as (the deepest, per number of GPU types): an int is one depth for
    every plan; a sequence gives entry i to plans of i + 1 GPU types, the last entry to
    plans of more (docs/search.md, "Depth")."""
    if isinstance(max_stages, (list, tuple)):
        if not max_stages:
            msg = "max_stages: expected a depth or a non-empty list of depths, got []"
            raise SpecError(msg)
        tiers = [v.integer(f"max_stages[{i}]", x, minimum=1, maximum=1024)
                 for i, x in enumerate(max_stages)]
        for i in range(1, len(tiers)):
            if tiers[i] > tiers[i - 1]:
                msg = (f"max_stages[{i}]: expected at most max_stages[{i - 1}] = {tiers[i - 1]} "
                       f"(plans of more GPU types may not be deeper), got {tiers[i]}")
                raise SpecError(msg)
        return tiers[0], tiers
    return v.integer("max_stages", max_stages, minimum=1, maximum=1024), []


def _deep_is_single_type(tiers: Sequence[int]) -> bool:
    """Depth by variety where only plans of one GPU type go deeper than the rest (the default
    ``(64, 8)``): the deep tiers then lie inside the single-type plans."""
    return len(tiers) >= 2 and tiers[1] == tiers[-1]


def depth_words(max_stages: int | Sequence[int]) -> str:
    """``max_stages`` in words: "at most 8 stages", "at most 64 stages (8 with 3+ GPU types)"."""
    deepest, tiers = _depth(max_stages)
    if not tiers or len(set(tiers)) == 1:
        return f"at most {deepest} stages"
    parts, prev = [], deepest
    for i, x in enumerate(tiers[1:], start=2):
        if x < prev:
            more = "+" if i == len(tiers) else ""
            parts.append(f"{x} with {i}{more} GPU types")
            prev = x
    return f"at most {deepest} stages ({', '.join(parts)})"


def _options(*, objective: str, budget_usd: float | None, time_limit_s: float | None,
             threads: int | None, top_k: int, max_stages: int | Sequence[int], max_tp: int,
             micro_batch_sizes: Iterable[int], recompute: Iterable[str], schedule: str,
             enforce_deadline: bool, prune: dict[str, bool] | None,
             max_gpu_types: int | None = None, sharding: Iterable[str] = ("none",),
             virtual_stages: Iterable[int] = (1,), min_tp: int = 1,
             even_split: bool = False, middle_equal: bool = False, gap: float = 0.0) -> Any:
    o = core.SearchOptions()
    o.gap = v.number("gap", gap, minimum=0.0, maximum=0.99)
    objective = v.choice("objective", objective, ("cost", "time"))
    o.objective = core.Objective.COST if objective == "cost" else core.Objective.TIME
    if budget_usd is not None:
        o.budget_usd = v.number("budget_usd", budget_usd, positive=True)
    if time_limit_s is not None:
        o.time_limit_s = v.number("time_limit_s", time_limit_s, positive=True, maximum=1e7)
    o.threads = _threads(threads)
    o.top_k = v.integer("top_k", top_k, minimum=1, maximum=1000)
    o.max_stages, o.max_stages_by_types = _depth(max_stages)
    o.max_tp = v.integer("max_tp", max_tp, minimum=1, maximum=1024)
    o.min_tp = v.integer("min_tp", min_tp, minimum=1, maximum=o.max_tp)
    o.placer.even_split = v.boolean("even_split", even_split)
    o.placer.middle_equal = v.boolean("middle_equal", middle_equal)
    mbs = list(micro_batch_sizes)
    if not mbs:
        msg = "micro_batch_sizes: expected at least one micro-batch size, got none"
        raise SpecError(msg)
    o.micro_batch_sizes = [v.integer("micro_batch_sizes[]", b, minimum=1, maximum=1 << 24)
                           for b in mbs]
    rcs = [v.choice("recompute[]", r, RECOMPUTE) for r in recompute]
    if not rcs:
        msg = f"recompute: expected at least one of {', '.join(map(repr, RECOMPUTE))}, got none"
        raise SpecError(msg)
    o.recompute = [RECOMPUTE_CORE[r] for r in dict.fromkeys(rcs)]
    shs = [v.choice("sharding[]", x, SHARDING) for x in sharding]
    if not shs:
        msg = f"sharding: expected at least one of {', '.join(map(repr, SHARDING))}, got none"
        raise SpecError(msg)
    o.sharding = [SHARDING_CORE[x] for x in dict.fromkeys(shs)]
    if isinstance(virtual_stages, (str, bytes)) or not isinstance(virtual_stages, Iterable):
        msg = f"virtual_stages: expected a list of integers in [1, 64], got {virtual_stages!r}"
        raise SpecError(msg)
    vs = list(dict.fromkeys(v.integer("virtual_stages[]", x, minimum=1, maximum=64)
                            for x in virtual_stages))
    if not vs:
        msg = "virtual_stages: expected at least one value (1: plain pipelines), got none"
        raise SpecError(msg)
    o.virtual_stages = vs
    schedule = v.choice("schedule", schedule, SCHEDULES)
    o.schedule = core.Schedule.GPIPE if schedule == "gpipe" else core.Schedule.ONE_F_ONE_B
    o.enforce_deadline = enforce_deadline
    if max_gpu_types is not None:
        o.max_gpu_types = v.integer("max_gpu_types", max_gpu_types, minimum=1, maximum=1 << 20)
    for rule, on in (prune or {}).items():
        if rule not in PRUNING_RULES:
            msg = f"prune: unknown rule {rule!r}; rules: {', '.join(PRUNING_RULES)}"
            raise SpecError(msg)
        setattr(o, f"prune_{rule}", bool(on))
    return o


def _job_workload(job: Job, sp: Subproblem | None = None, *,
                  sequence_parallel: bool = False) -> Any:
    w = core.Workload()
    w.sequence_parallel = sequence_parallel
    w.fp8 = job.precision == "fp8"
    if sp is not None and sp.crossing is not None:
        w.transfer_usd_per_gb = sp.crossing.usd_per_gb
    w.seq_len = job.seq_len
    w.global_batch_size = job.global_batch_size
    w.optimizer_bytes_per_param = job.optimizer_state_bytes
    w.iterations = float(job.num_iterations)
    w.deadline_hours = job.deadline_hours
    w.deadline_confidence = job.deadline_confidence
    w.micro_batch_size = 1
    w.num_microbatches = 1
    w.dp = 1
    return w


DEFAULT_MAX_STAGES: tuple[int, ...] = (64, 8)
"""Pipeline depth by the number of GPU types in a plan (``max_stages``): up to 64 stages for
plans of one GPU type (the tens of stages large runs use, all of one type and width:
Megatron-LM's 35 and 64), 8 for mixes. ``(64, 64, 8)`` lets two-type mixes go as deep too,
at a few seconds more on large catalogs (docs/search.md, "Depth")."""

# Core enum value -> the plan's word (Recompute and Sharding values never compare equal).
DEFAULT_SHARDING = ("zero1", "zero2", "fsdp")
"""The sharding levels a search tries unless told otherwise. Not ``none``: with more than
one replica ZeRO-1 moves the same gradient bytes (reduce-scatter + all-gather), keeps 1/dp of
the optimizer states and steps 1/dp of the parameters; only its all-gather after the step can
be exposed. Leaving ``none`` out makes hard searches several times faster (bench/README.md);
``sharding=SHARDING`` searches it too. With ``dp = 1`` every level is ``none``."""

_NAMES: dict[Any, str] = {**{c: n for n, c in RECOMPUTE_CORE.items()},
                          **{c: n for n, c in SHARDING_CORE.items()}}


def _stage(row: GpuType, tp: int, layers: tuple[int, int]) -> Stage:
    # A row whose name is not its GPU (an offer, a spot row) is named by the stage's offer.
    return Stage(gpu=row.model, tp=tp, layers=layers,
                 offer=row.name if row.provider or row.name != row.model else None)


def _to_plan(sp: Any, job: Job, table: Table, rows: Sequence[GpuType],
             stats: dict[str, Any] | None, domain: dict[str, Any] | None) -> Plan:
    """A core plan as a Plan, with its estimate on the search's own table."""
    w = sp.work
    stages = tuple(_stage(rows[s.gpu], s.tp, (s.layer_begin, s.layer_end)) for s in sp.stages)
    plan = Plan(job=job, stages=stages, dp=w.dp, micro_batch_size=w.micro_batch_size,
                num_microbatches=w.num_microbatches, virtual_stages=w.virtual_stages,
                schedule="gpipe" if w.schedule == core.Schedule.GPIPE else "1f1b",
                recompute=_NAMES[w.recompute], sharding=_NAMES[w.sharding],
                # Only where it does something: a stage split over TP ranks.
                sequence_parallel=bool(w.sequence_parallel) and any(st.tp > 1 for st in stages),
                cost_model=table.cost, stats=stats, domain=domain,
                profiles={g: p for g, p in table.profiles.items()
                          if any(st.gpu == g for st in stages)})
    est = estimate(plan, table)
    # The search optimised exactly what estimate() reports.
    assert est.iteration_s == sp.estimate.iteration_s, (est.iteration_s, sp.estimate.iteration_s)
    return replace(plan, estimate=est)


def search(job: Job, catalog: Catalog | None = None, *, objective: str = "cost",
           budget_usd: float | None = None,
           time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
           threads: int | None = None, top_k: int = 1,
           max_stages: int | Sequence[int] = DEFAULT_MAX_STAGES, max_tp: int = 8,
           micro_batch_sizes: Sequence[int] = (1, 2, 4, 8),
           recompute: Sequence[str] = ("none", "full"), schedule: str = "1f1b",
           sharding: Sequence[str] = DEFAULT_SHARDING, sequence_parallel: bool | None = None,
           cost_model: CostParams | None = None, enforce_deadline: bool = True,
           prune: dict[str, bool] | None = None, profiles: Any = None,
           max_gpu_types: int | None = None, progress: SearchProgress | None = None,
           phase: str = "searching", scope: str = "region",
           virtual_stages: Sequence[int] = (1,),
           interleave_after: Sequence[int] = DEFAULT_VIRTUAL_STAGES, min_tp: int = 1,
           even_split: bool = False, engine: str = "espresso",
           gap: float = 0.0, stop_after_s: float | None = None) -> SearchResult:
    """Run the search and return up to ``top_k`` plans with the statistics.

    ``stop_after_s`` (default: none) stops the search after that many seconds while
    ``time_limit_s`` still sizes each subproblem's share of the time: a search that would
    finish early under the longer limit does, one that would not stops at ``stop_after_s``
    (a shorter ``time_limit_s`` would cut every subproblem sooner).

    ``time_limit_s`` is a wall-clock limit (default 60 s; ``None``: none): the search then
    returns the best plans found so far with ``stats.gap``. ``gap`` (default 0: exact) stops
    it once the best plan is proven within that relative gap, as MIP solvers' relative gap:
    whatever could improve on the plan by less is cut, and ``stats.gap`` reports it.
    ``max_gpu_types`` limits the distinct GPU types (catalog rows) of a plan (1: single-type
    plans). ``progress`` (a
    :class:`SearchProgress`) is updated while the search runs and can cancel it.

    The space: data-parallel degree (any divisor of the global batch), micro-batch size,
    recomputation (``recompute``: ``none``, ``full``, ``selective``, ``selective-op``), how
    model states are sharded over the replicas (``sharding``: ``none``, ``zero1``, ``zero2``,
    ``fsdp``; by default :data:`DEFAULT_SHARDING`, the last three), and pipelines of up to
    ``max_stages`` stages (default :data:`DEFAULT_MAX_STAGES`, depth by variety: 64 for
    single-type plans, 8 for mixes; an int is one depth for all), each a catalog row
    (GPU type or cloud offer) with a power-of-two tensor-parallel width inside one instance
    (at most ``max_tp``), in any order with any contiguous layer split, within every row's
    availability, paying whole instances. A plan uses one vendor's GPUs and one network
    domain: ``scope`` ``zone``, ``region`` (default) or ``provider`` (docs/catalog.md);
    each (domain, vendor) is a subproblem, searched cheapest bound first with the best plan
    so far as the incumbent. ``objective="cost"`` minimises total USD with total hours within
    the deadline; ``objective="time"`` minimises total hours within ``budget_usd`` (the
    deadline is then ignored).

    ``sequence_parallel``: TP stages run with sequence parallelism (``None``, the default:
    whenever every TP width the search may pick divides the sequence length; it never costs
    time or memory in the model).

    ``virtual_stages``: stages per GPU group the search tries, exactly: 1 is a plain
    pipeline, ``v >= 2`` interleaved 1F1B (``Plan.virtual_stages``, each group's blocks in
    near-equal chunks), and the proof covers every value given. ``interleave_after``: chunks
    with which each plan found is afterwards interleaved when that is better
    (:func:`espresso.interleave.interleave`), a refinement outside the proof; ``()`` turns it
    off (docs/search.md, "Interleaving").

    ``min_tp``: tensor-parallel widths below it are not tried (``min_tp = max_tp``: one
    width). ``even_split``: only the even layer split is placed (every stage ``L / P``
    blocks, the first ``L % P`` one more), the order still searched: planners without a
    placer (:mod:`espresso.baselines`).

    ``engine``: only plans that engine runs (:mod:`espresso.engines`): ``espresso`` (the
    default, every plan), ``torchtitan`` or ``megatron`` (one TP width, searched width by
    width; Megatron-LM's layer split and sharding).
    """
    if not isinstance(job, Job):
        msg = f"search: expected a Job, got {type(job).__name__}"
        raise SpecError(msg)
    started = time.perf_counter()  # wall clock: subproblems may run side by side
    eng = engine_named(engine)
    if eng.uniform_tp and min_tp < max_tp:
        return _search_widths(
            job, catalog, objective=objective, budget_usd=budget_usd,
            time_limit_s=time_limit_s, threads=threads, top_k=top_k, max_stages=max_stages,
            max_tp=max_tp, micro_batch_sizes=micro_batch_sizes, recompute=recompute,
            schedule=schedule, sharding=sharding, sequence_parallel=sequence_parallel,
            cost_model=cost_model, enforce_deadline=enforce_deadline, prune=prune,
            profiles=profiles, max_gpu_types=max_gpu_types, progress=progress, phase=phase,
            scope=scope, virtual_stages=virtual_stages, interleave_after=interleave_after,
            min_tp=min_tp, even_split=even_split, engine=engine, started=started, gap=gap,
            stop_after_s=stop_after_s)
    recompute = tuple(v.choice("recompute[]", r, RECOMPUTE) for r in recompute)
    space = eng.restrict(sharding=sharding, schedule=schedule, virtual_stages=virtual_stages,
                         recompute=recompute)
    sharding, virtual_stages = space["sharding"], space["virtual_stages"]
    recompute = space["recompute"]
    middle_equal = space["middle_equal"]
    catalog = Catalog.builtin() if catalog is None else catalog
    catalog = for_precision(catalog, job.precision)
    cost = engine_cost(engine, cost_model)  # the engine's profile unless one is given
    if objective == "time":
        enforce_deadline = False
    scope = v.choice("scope", scope, SCOPES)
    options = functools.partial(  # per subproblem: its own limit and threads
        _options, objective=objective, budget_usd=budget_usd, top_k=top_k,
        max_stages=max_stages, max_tp=max_tp, micro_batch_sizes=micro_batch_sizes,
        recompute=recompute, schedule=schedule, enforce_deadline=enforce_deadline,
        prune=prune, max_gpu_types=max_gpu_types, sharding=sharding,
        virtual_stages=virtual_stages, min_tp=min_tp, even_split=even_split,
        middle_equal=middle_equal, gap=gap)
    chunks = _interleave_chunks(interleave_after)
    opts = options(time_limit_s=time_limit_s, threads=threads)
    sequence_parallel = _sequence_parallel(sequence_parallel, job, opts.max_tp)
    if progress is not None:
        if not isinstance(progress, SearchProgress):
            msg = f"progress: expected a SearchProgress, got {type(progress).__name__}"
            raise SpecError(msg)
        opts.monitor = progress._start(phase, objective)
    table = Table(catalog, job.model, cost, as_profiles(profiles))
    budget = TimeBudget(time_limit_s, stop_after_s)

    def stopped() -> bool:
        # budget.share() never goes below MIN_SEARCH_S: ask whether the time is spent
        return budget.spent or (progress is not None and progress.cancelled)

    # 1. The subproblems, best bound first.
    tasks, total, unprepared = _tasks(job, table, scope, by_cost=objective == "cost",
                                      cut_deadline=enforce_deadline and opts.prune_deadline,
                                      stopped=stopped,
                                      # the fastest plan without a budget: prices play no part
                                      by_price=objective == "cost" or budget_usd is not None)

    # 2. Their searches, scheduled over the threads with one incumbent.
    shared = shared_incumbent(top_k)
    dims, core_cost = job.model._dims(), cost._core()

    def solve(task: Task, limit: float | None, threads_each: int, incumbent: float,
              single_type: bool = False, crew: Any = None, probed: bool = False) -> Solved:
        sp, rows, specs = task.payload.sp, task.payload.rows, task.payload.specs
        o = options(time_limit_s=None, threads=threads_each)
        if single_type:
            o.max_gpu_types = 1
        elif probed and _deep_is_single_type(o.max_stages_by_types):
            # The probe searched the task's single-type plans to the end, the deep tiers
            # among them: only the shallow space is left (the native deep pass is skipped).
            o.max_stages, o.max_stages_by_types = min(o.max_stages, o.max_stages_by_types[-1]), []
        o.monitor = opts.monitor
        o.pools = table.pools
        o.shared = shared
        o.crew = crew
        # A domain that spans locations also returns plans in one location, which are not
        # kept (their own subproblem prices them): its plans must not set the incumbent.
        o.share_plans = not sp.spans
        limit = budget.cap(limit)  # never past the stop time
        o.time_limit_s = 0.0 if limit is None else max(limit, 1e-3)
        o.incumbent = incumbent
        try:
            res = core.search(dims, specs, core_cost,
                              _job_workload(job, sp, sequence_parallel=sequence_parallel), o)
        except ValueError as exc:
            msg = f"search: {exc}"
            raise SpecError(msg) from None
        kept = [((p.objective, *_plan_key(p)), p) for p in res.plans
                # one location: its own subproblem prices it exactly
                if not (sp.spans and locations_of([rows[s.gpu] for s in p.stages],
                                                  sp.spans) == 1)]
        return Solved(stats=res.stats, plans=kept)

    def probe(task: Task, limit: float | None, threads_each: int, incumbent: float) -> Solved:
        # The task's single-type plans (a plain search of that smaller space): an incumbent.
        return solve(task, limit, threads_each, incumbent, single_type=True)

    scheduler = Scheduler(tasks=tasks, solve=solve, top_k=top_k, threads=opts.threads,
                          budget=budget, stopped=stopped, shared=shared, gap=opts.gap,
                          probe=probe if shared is not None and opts.max_gpu_types > 1
                          and len(tasks) > 1 else None,
                          crew=core.Crew if shared is not None else None,
                          on_error=opts.monitor.cancel if opts.monitor is not None else None)
    if progress is not None:  # the live gap is the whole search's, as the final one
        progress._attach(scheduler.live)
    scheduled = time.perf_counter() - started
    try:
        outcome = scheduler.run(unprepared=unprepared)
    finally:
        if progress is not None:
            progress._attach(None)

    # 3. What the search proved, and its best plans as Plans.
    stats = _search_stats(outcome, objective=objective, subproblems=total,
                          seconds=time.perf_counter() - started,
                          interrupted=progress is not None and progress.cancelled,
                          domain=tasks[outcome.found[0][2]].payload.sp.label
                          if outcome.found else None,
                          first_plan_s=None if outcome.first_plan_s is None
                          else scheduled + outcome.first_plan_s)
    show_domain = catalog.has_offers or len(tasks) > 1
    plans = []
    for i, (_, p, n) in enumerate(outcome.found):
        sub = tasks[n].payload
        plans.append(_to_plan(p, job, table, sub.rows, {**stats.to_dict(), "rank": i + 1},
                              sub.sp.domain(scope) if show_domain or sub.sp.spans else None))

    # 4. Interleaved where that is better: a refinement outside the proof.
    if chunks:
        plans = [interleave(p, table, virtual_stages=chunks, budget_usd=budget_usd,
                            objective=objective, enforce_deadline=enforce_deadline,
                            accept=lambda q: refusal(q, eng) is None)
                 for p in plans]
        plans.sort(key=lambda p: rank_key(p.estimate, objective))
        if plans and stats.gap > 0 and math.isfinite(stats.lower_bound):
            # The gap of the plan returned: interleaving may have made it cheaper.
            est = plans[0].estimate
            assert est is not None
            best = est.total_usd if objective == "cost" else est.total_hours
            if best > 0:
                stats = replace(stats, gap=max(0.0, (best - stats.lower_bound) / best))
        plans = [replace(p, stats={**(p.stats or {}), "gap": stats.gap, "rank": i + 1})
                 for i, p in enumerate(plans)]
    return SearchResult(plans=plans, stats=stats)


def _search_widths(job: Job, catalog: Catalog | None, *, max_tp: int, min_tp: int,
                   time_limit_s: float | None, top_k: int, objective: str,
                   progress: SearchProgress | None, started: float,
                   stop_after_s: float | None = None, **kw: Any) -> SearchResult:
    """An engine with one TP width for all stages: one search per width (each proven), the
    best plans over all, and what was proven over all (the smallest lower bound)."""
    budget = TimeBudget(time_limit_s, stop_after_s)
    widths = []
    w = 1
    while w <= max_tp:
        if w >= min_tp:
            widths.append(w)
        w *= 2
    results: list[SearchResult] = []
    offsets: list[float] = []  # when each width's search began (from `started`)
    for i, w in enumerate(widths):
        if results and (budget.spent or (progress is not None and progress.cancelled)):
            break
        share = budget.share(1.0 / (len(widths) - i))
        stop = budget.until_stop() / (len(widths) - i)
        offsets.append(time.perf_counter() - started)
        results.append(search(job, catalog, min_tp=w, max_tp=w, time_limit_s=share,
                              top_k=top_k, objective=objective, progress=progress,
                              stop_after_s=None if math.isinf(stop) else max(stop, MIN_SEARCH_S),
                              **kw))
    plans = sorted((p for r in results for p in r.plans),
                   key=lambda p: rank_key(p.estimate, objective))[:top_k]
    stats = [r.stats for r in results]
    skipped = len(widths) - len(results)
    complete = all(s.complete for s in stats) and not skipped
    # A width never searched bounds nothing: then no lower bound but 0.
    lower = 0.0 if skipped else min(s.lower_bound for s in stats)
    if plans:
        est = plans[0].estimate
        assert est is not None
        best = est.total_usd if objective == "cost" else est.total_hours
        gap = max(0.0, (best - lower) / best) if best > 0 and math.isfinite(lower) else 0.0
    else:
        gap = 0.0 if complete else 1.0
    merged = SearchStats(
        nodes_expanded=sum(s.nodes_expanded for s in stats),
        nodes_generated=sum(s.nodes_generated for s in stats),
        pruned={k: sum(s.pruned.get(k, 0) for s in stats) for k in stats[0].pruned},
        leaves_placed=sum(s.leaves_placed for s in stats),
        placer_nodes=sum(s.placer_nodes for s in stats),
        placer_leaves=sum(s.placer_leaves for s in stats),
        frontier_peak=max(s.frontier_peak for s in stats), dives=sum(s.dives for s in stats),
        combos=sum(s.combos for s in stats), seconds=time.perf_counter() - started,
        threads=stats[0].threads, lower_bound=lower, gap=gap, complete=complete,
        timed_out=not complete, objective=objective,
        subproblems=sum(s.subproblems for s in stats),
        subproblems_searched=sum(s.subproblems_searched for s in stats),
        domain=(plans[0].stats or {}).get("domain") if plans else None,
        interrupted=any(s.interrupted for s in stats),
        first_plan_s=min((at + s.first_plan_s for at, s in zip(offsets, stats, strict=True)
                          if s.first_plan_s is not None), default=None))
    plans = [replace(p, stats={**merged.to_dict(), "rank": i + 1}) for i, p in enumerate(plans)]
    return SearchResult(plans=plans, stats=merged)


def _interleave_chunks(interleave_after: Sequence[int]) -> tuple[int, ...]:
    if isinstance(interleave_after, (str, bytes)) or not isinstance(interleave_after, Sequence):
        msg = f"interleave_after: expected a list of integers >= 2, got {interleave_after!r}"
        raise SpecError(msg)
    return tuple(v.integer("interleave_after[]", x, minimum=2, maximum=64)
                 for x in interleave_after)


def _sequence_parallel(sequence_parallel: bool | None, job: Job, max_tp: int) -> bool:
    if sequence_parallel is None:
        # Sequence parallelism only removes work and memory in the cost model (the same
        # traffic as the all-reduces it replaces), so it is on wherever the runner can run
        # it: every TP width the search may pick (powers of two up to max_tp) divides seq_len.
        widest = 1 << (max_tp.bit_length() - 1)
        sequence_parallel = job.seq_len % widest == 0
    return v.boolean("sequence_parallel", sequence_parallel)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A subproblem ready for the core: its domain, its catalog rows, their native specs."""

    sp: Subproblem
    rows: list[GpuType]
    specs: list[Any]


def _tasks(job: Job, table: Table, scope: str, *, by_cost: bool, cut_deadline: bool,
           stopped: Callable[[], bool], by_price: bool = True) -> tuple[list[Task], int, bool]:
    """The catalog's (domain, vendor) subproblems as tasks, best bound first, those with the
    same content as an earlier one left out; also how many there were, and whether the time
    ran out while they were being prepared (the rest then has no bound but 0)."""
    cost = table.cost
    dims = job.model._dims()
    # FLOPs of the whole job at the least work per sequence (no recomputation; flash
    # attention's causal half skipped): a bound on every plan's compute, for the bounds that
    # order and cut subproblems.
    per_seq = 3.0 * (job.model.num_layers * core.block_bound_flops(dims, cost._core(),
                                                                    job.seq_len, 1)
                     + core.head_fwd_flops(dims, job.seq_len, 1))
    job_flops = float(job.num_iterations) * job.global_batch_size * per_seq
    prepared: list[tuple[float, int, Task]] = []
    unprepared = False
    for sp in subproblems(table.catalog, scope):
        if stopped():
            unprepared = True
            break
        rows = [table.catalog.gpus[i] for i in sp.rows]
        specs = table.specs(sp.rows, sp.crossing.link_gbps if sp.crossing else None)
        rates = [s.tflops * 1e12 * (s.efficiency or cost.efficiency) * cost.sustained_fraction
                 / min(s.block_fwd_scale, s.block_bwd_scale, s.head_fwd_scale,
                       s.head_bwd_scale) for s in specs]
        total_rate = sum(g.count * r for g, r in zip(rows, rates, strict=True))
        hours = job_flops / (3600.0 * total_rate) if total_rate > 0 else math.inf
        if cut_deadline and hours > job.deadline_hours * (1 + 1e-9):
            bound = math.inf  # even every GPU of the domain at full rate misses the deadline
        elif by_cost:
            bound = min((job_flops / 3600.0 * g.price_per_hour / r
                         for g, r in zip(rows, rates, strict=True) if g.count > 0 and r > 0),
                        default=math.inf)
        else:
            bound = hours
        prepared.append((bound, len(prepared),
                         Task(bound=bound, payload=_Prepared(sp=sp, rows=rows, specs=specs))))
    prepared.sort(key=lambda t: (t[0], t[1]))
    # Subproblems with the same content (same prices, GPUs, links, counts: e.g. a provider
    # that prices every region alike) have the same best plans: only the first is searched.
    seen: set[tuple[Any, ...]] = set()
    tasks = []
    for _, _, task in prepared:
        sp, rows, specs = task.payload.sp, task.payload.rows, task.payload.specs
        content = (sp.crossing, tuple(
            (g.model, g.instance_type, g.gpus_per_node, g.price_per_hour, g.count,
             g.intra_node_gbs, g.inter_node_gbs, g.efficiency) for g in rows),
            tuple((s.block_fwd_scale, s.block_bwd_scale, s.head_fwd_scale,
                   s.head_bwd_scale, s.activation_scale) for s in specs))
        if content not in seen:
            seen.add(content)
            tasks.append(task)
    for task, twin in zip(tasks, _find_twins(tasks, by_price=by_price), strict=True):
        task.twin = twin
    if by_cost:
        # Which plans meet the deadline does not depend on prices: a task whose rows map
        # into an earlier one's at any price has no plan when that one has none.
        for task, shadow in zip(tasks, _find_twins(tasks, by_price=False), strict=True):
            if task.twin is None:
                task.shadow = shadow
    return tasks, len(prepared), unprepared


# What the native search sees of a row, but for its price and count (GpuSpec's fields).
_SHAPE = ("memory_gb", "memory_bytes", "tflops", "mem_bandwidth_gbs", "intra_node_gbs",
          "inter_node_gbs", "efficiency", "gpus_per_node", "interruptions_per_hour",
          "recovery_hours", "block_fwd_scale", "block_bwd_scale", "head_fwd_scale",
          "head_bwd_scale", "activation_scale")


# A subproblem's rows by shape: (price, count) of each.
_Rows = dict[tuple[Any, ...], list[tuple[float, int]]]


def _find_twins(tasks: list[Task], *, by_price: bool = True) -> list[int | None]:
    """For each task, an earlier task into whose rows its rows map one to one, rows of the
    same shape (every figure the search uses but price and count), each onto one priced no
    lower and counted no lower (None: there is none): every plan of it is a plan of the
    earlier one at no more cost and the same time, so once that one is searched to the end
    it is settled (Task.twin). The
    earlier task may hold more rows (a region that offers a subset of another's). The
    synthetic and real catalogs that repeat a region's offers at higher prices, or a part
    of them, are the case. ``by_price=False`` (the fastest plan without a budget, where
    prices play no part): prices are not compared. A subproblem that spans locations is
    searched with every link capped at its crossing's and every boundary paying its transfer
    price, wherever its rows are, so it pairs only with another of the same crossing (the
    key's first part) and its zones play no part. The bound it takes from its twin leaves
    out the twin's plans in one location (dropped: their own subproblem prices them); a plan
    of it that maps onto one of those costs at least that plan, which that location's
    subproblem holds at no more cost, so the bound of the whole stays true."""
    rows_of: dict[int, _Rows] = {}
    # earlier tasks by (crossing, shape) that they offer, in order: the candidates of a task
    # are those offering its rarest shape
    having: dict[tuple[Any, ...], list[int]] = {}
    twins: list[int | None] = [None] * len(tasks)
    for i, task in enumerate(tasks):
        sp, specs = task.payload.sp, task.payload.specs
        if any(s.pool >= 0 for s in specs):
            continue  # (shared limits: a row's count alone does not say what it can have)
        rows: _Rows = {}
        for s in specs:
            rows.setdefault(tuple(getattr(s, f) for f in _SHAPE), []).append(
                (s.price_per_hour if by_price else 0.0, s.count))
        keys = [(sp.crossing, shape) for shape in rows]
        if keys:
            rarest = min(keys, key=lambda k: len(having.get(k, ())))
            for j in having.get(rarest, ()):
                other = rows_of[j]
                if all(shape in other and _maps_into(mine, other[shape])
                       for shape, mine in rows.items()):
                    twins[i] = j
                    break
        rows_of[i] = rows
        for k in keys:
            having.setdefault(k, []).append(i)
    return twins


def _maps_into(mine: list[tuple[float, int]], theirs: list[tuple[float, int]]) -> bool:
    """Whether each (price, count) of ``mine`` pairs with its own one of ``theirs`` priced no
    higher and counted no lower (a sufficient test: greedy, dearest first, each taking the
    dearest fitting row left, then the one with fewest GPUs)."""
    if len(mine) > len(theirs):
        return False
    left = list(theirs)
    for price, count in sorted(mine, reverse=True):
        fit = [k for k, (q, c) in enumerate(left) if q <= price and c >= count]
        if not fit:
            return False
        best = max(fit, key=lambda k: (left[k][0], -left[k][1]))
        left.pop(best)
    return True


def _search_stats(outcome: Outcome, *, objective: str, subproblems: int, seconds: float,
                  interrupted: bool, domain: str | None,
                  first_plan_s: float | None = None) -> SearchStats:
    c = outcome.counters
    return SearchStats(
        nodes_expanded=c["nodes_expanded"], nodes_generated=c["nodes_generated"],
        pruned={"cost": c["pruned_cost"], "deadline": c["pruned_deadline"],
                "memory": c["pruned_memory"], "availability": c["pruned_availability"],
                "dominance": c["pruned_dominance"]},
        leaves_placed=c["leaves_placed"], placer_nodes=c["placer_nodes"],
        placer_leaves=c["placer_leaves"], frontier_peak=outcome.frontier_peak,
        dives=c["dives"], combos=c["combos"], seconds=seconds, threads=outcome.threads,
        lower_bound=(outcome.lower_bound if outcome.found or not outcome.complete
                     else math.inf),
        gap=outcome.gap, complete=outcome.complete, timed_out=not outcome.complete,
        objective=objective, subproblems=subproblems, subproblems_searched=outcome.searched,
        domain=domain, interrupted=not outcome.complete and interrupted,
        first_plan_s=first_plan_s)


def _plan_key(p: Any) -> tuple[Any, ...]:
    groups = len(p.stages) // max(1, p.work.virtual_stages)
    gpus = sum(s.tp for s in p.stages[:groups]) * p.work.dp
    return (gpus, p.estimate.iteration_s, p.work.dp, p.work.micro_batch_size,
            int(p.work.recompute), p.work.virtual_stages,
            tuple((s.gpu, s.tp, s.layer_begin, s.layer_end) for s in p.stages))


def _rent(plan: Plan) -> str:
    return " + ".join(f"{c} x {g}" for g, c in plan.gpus.items())


def _gap_words(stats: SearchStats) -> str:
    return (f"gap {stats.gap:.1%}" if math.isfinite(stats.gap) else "no lower bound")


EXPLAIN_SHARE = 1 / 30
"""Of a call's time limit, what the fastest-plan search that explains an unmet deadline gets
(at least :data:`EXPLAIN_MIN_S`; 2 s of the default 60-s limit): the answer, no plan, is
proven before it starts. On the snapshot's 70B "no plan" questions (14 and 60 days, with and
without the quota file of bench/first_questions.py), 2 s finds the same fastest plan as 3 s,
and 3 s the same as 6 s (docs/search.md, "Limits, progress, cancel")."""
EXPLAIN_MIN_S = 2.0


def explain_infeasible(job: Job, catalog: Catalog, result: SearchResult,
                       budget: TimeBudget | float | None = None,
                       progress: SearchProgress | None = None, *, objective: str = "cost",
                       budget_usd: float | None = None, **kwargs: Any) -> InfeasibleError:
    """Why the search found nothing: the deadline (with the fastest plan, searched within
    what is left of ``budget``), the budget (``objective="time"``), memory, availability,
    or the time limit."""
    stats = result.stats
    budget = TimeBudget.of(budget)
    if not stats.complete:
        return InfeasibleError(
            f"no plan found within the time limit ({stats.seconds:.1f} s, "
            f"{stats.nodes_expanded:,} nodes expanded); allow more time with time_limit_s "
            "(--time-limit)", stats=stats)
    if objective == "time" and budget_usd is not None:
        return InfeasibleError(f"no plan fits within the budget of ${budget_usd:,.2f}",
                               stats=stats)
    kw = {k: val for k, val in kwargs.items() if k not in ("top_k", "time_limit_s")}
    # The answer, "no plan meets the deadline", is proven (the search was complete); the
    # fastest plan only explains by how much, so it gets a share of the limit
    # (EXPLAIN_SHARE of it, at least EXPLAIN_MIN_S), never more than what is left.
    # It stops at its share but keeps the whole limit to size its subproblems' slices, so a
    # search that would finish early still does (a shorter limit cuts every slice sooner).
    left = budget.share(1.0)
    share = left
    if left is not None and budget.limit_s is not None:
        share = min(left, max(EXPLAIN_MIN_S, EXPLAIN_SHARE * budget.limit_s))
    # A complete time-objective search that found nothing already says it: nothing fits.
    fast = result if objective == "time" else search(
        job, catalog, objective="time", time_limit_s=left, stop_after_s=share,
        progress=progress, phase="the fastest plan", **kw)
    if fast.plans:
        f = fast.plans[0]
        assert f.estimate is not None
        what = ("the fastest plan needs" if fast.stats.complete else
                f"the fastest plan found so far (not proven: {_gap_words(fast.stats)}; its "
                f"search stopped after {fast.stats.seconds:.0f} s, its share of the time "
                "limit) needs")
        shape = f"{f.pp} stage{'s' if f.pp > 1 else ''}"
        if f.virtual_stages > 1:
            shape = f"{f.pp} GPU groups of {f.virtual_stages} interleaved stages each"
            if "interleaving" in (f.stats or {}):
                what = what.replace("the fastest plan", "the fastest plan, interleaved after "
                                                        "the search,", 1)
        text = (f"no plan meets the deadline of {_hours(job.deadline_hours)}; {what} "
                f"{_hours(f.estimate.total_hours)} on {_rent(f)} ({shape}, dp {f.dp}) and "
                f"costs ${f.estimate.total_usd:,.2f}")
        if f.virtual_stages > 1 and f.estimate.meets_deadline:
            text = (f"no plan without interleaving meets the deadline of "
                    f"{_hours(job.deadline_hours)}; interleaved ({f.virtual_stages} stages per "
                    f"GPU group), the fastest plan needs {_hours(f.estimate.total_hours)} on "
                    f"{_rent(f)} (dp {f.dp}, ${f.estimate.total_usd:,.2f}) and meets it: "
                    f"search with virtual_stages=(1, {f.virtual_stages}) (--virtual-stages "
                    f"1,{f.virtual_stages}) for the cheapest such plan")
        return InfeasibleError(text, fastest=f, stats=stats)
    if not fast.stats.complete:
        return InfeasibleError(
            f"no plan meets the deadline of {_hours(job.deadline_hours)}; the search for the "
            "fastest plan found none before the time limit; allow more time with "
            "time_limit_s (--time-limit)", stats=stats)
    # Nothing runs at all: memory or availability.
    model = job.model
    cost = kwargs.get("cost_model") or CostParams()
    states = model.num_params * (cost.bytes_per_weight + cost.bytes_per_grad
                                 + job.optimizer_state_bytes)
    usable = sum(max(0.0, g.memory_gb * (1 - cost.memory_reserve_fraction) - cost.reserved_gb)
                 * g.count for g in catalog)
    gpus = sum(g.count for g in catalog)
    if gpus == 0:
        return InfeasibleError("no plan: every GPU type in the catalog has count 0", stats=stats)
    if states / 1e9 > usable:
        return InfeasibleError(
            f"{model.name} does not fit: its model states alone need {states / 1e9:,.1f} GB "
            f"({model.num_params / 1e9:.2f}B parameters x "
            f"{cost.bytes_per_weight + cost.bytes_per_grad + job.optimizer_state_bytes:g} bytes) "
            f"but all {gpus} GPUs of the catalog together offer {usable:,.1f} GB usable",
            stats=stats)
    return InfeasibleError(
        f"no arrangement of the catalog's GPUs fits {model.name} in memory within the search "
        f"space ({depth_words(kwargs.get('max_stages', DEFAULT_MAX_STAGES))}, "
        f"tensor parallelism up to "
        f"{kwargs.get('max_tp', 8)} inside a node, micro-batch sizes "
        f"{list(kwargs.get('micro_batch_sizes', (1, 2, 4, 8)))}): try a shorter sequence, more "
        "stages, or recomputation", stats=stats)


def plan(job: Job, catalog: Catalog | None = None, *,
         time_limit_s: float | TimeBudget | None = DEFAULT_TIME_LIMIT_S,
         threads: int | None = None, top_k: int = 1, objective: str = "cost",
         budget_usd: float | None = None, progress: SearchProgress | None = None,
         **space: Any) -> Plan:
    """The cheapest plan that meets the job's deadline (``objective="cost"``), or the fastest
    within ``budget_usd`` (``objective="time"``), with ``plan.estimate`` and ``plan.stats``
    (nodes, pruning per rule, seconds, lower bound and gap: 0 is proven optimal).

    ``time_limit_s`` bounds the whole call (default 60 s; ``None``: no limit), the search
    for the fastest plan that explains an unmeetable deadline included. ``progress`` (a
    :class:`SearchProgress`) shows the running search and can cancel it. Other keywords of
    :func:`search` (``max_stages``, ``max_tp``, ``micro_batch_sizes``, ``recompute``,
    ``schedule``, ``cost_model``, ``profiles``, ``max_gpu_types``) shape the space.

    Raises
    ------
    InfeasibleError
        Nothing meets the job; the message explains why (e.g. the fastest plan's hours).
    """
    catalog = Catalog.builtin() if catalog is None else catalog
    budget = TimeBudget.of(time_limit_s)
    kwargs = dict(threads=threads, **space)
    result = search(job, catalog, objective=objective, budget_usd=budget_usd, top_k=top_k,
                    time_limit_s=budget.share(1.0), progress=progress, **kwargs)
    if result.plans:
        best = result.plans[0]
        if len(result.plans) > 1:
            assert best.stats is not None
            alts = [{"total_usd": p.estimate.total_usd if p.estimate else None,
                     "total_hours": p.estimate.total_hours if p.estimate else None,
                     "gpus": p.gpus} for p in result.plans[1:]]
            best = replace(best, stats={**best.stats, "alternatives": alts})
        return best
    raise explain_infeasible(job, catalog, result, budget, progress, objective=objective,
                             budget_usd=budget_usd, **kwargs)


def place(job: Job, groups: Sequence[tuple[str, int]], *, dp: int = 1,
          micro_batch_size: int = 1, recompute: str = "none", schedule: str = "1f1b",
          catalog: Catalog | None = None, cost_model: CostParams | None = None,
          profiles: Any = None, virtual_stages: int = 1,
          time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
          fixed_order: bool = False) -> Plan:
    """Arrange GPUs you already have: the stage order and layer split with the smallest
    iteration time for the given stage groups ``[(gpu type, tp), ...]`` (one per stage, or
    with ``virtual_stages`` = v > 1 one per GPU group running v interleaved stages).
    ``time_limit_s`` (default 60 s; ``None``: none) stops it with the best arrangement so far
    (``plan.stats["exhaustive"]`` is then false). ``fixed_order``: the stages keep the
    compute-memory order (memory-rich first) and only the layer split is searched, as the
    paper's placer does.

    Raises InfeasibleError when no split fits in memory."""
    if catalog is None:  # offer keys name the cloud snapshot; GPU names the GPU-type one
        offers = any(isinstance(g, (tuple, list)) and "/" in str(g[0]) for g in groups)
        catalog = Catalog.builtin("cloud" if offers else "gpus")
    cost = CostParams() if cost_model is None else cost_model
    groups = list(groups)
    if not groups:
        msg = "place: expected at least one (gpu, tp) stage group"
        raise SpecError(msg)
    names: list[str] = []
    core_groups = []
    for i, gr in enumerate(groups):
        if not isinstance(gr, (tuple, list)) or len(gr) != 2:
            msg = f"place: groups[{i}]: expected (gpu type, tp), got {gr!r}"
            raise SpecError(msg)
        name, tp = gr
        catalog.index(name)
        tp = v.integer(f"place: groups[{i}].tp", tp, minimum=1,
                       maximum=catalog[name].gpus_per_node)
        if name not in names:
            names.append(name)
        core_groups.append(core.StageGroup(names.index(name), tp))
    use: dict[str, int] = {}
    for name, tp in groups:
        use[name] = use.get(name, 0) + int(tp) * int(dp)
    for name, n in use.items():
        if n > catalog[name].count:
            msg = (f"place: the groups use {n} x {name} (dp {dp} x tp summed over its stages) but "
                   f"the catalog has {catalog[name].count}; raise its count if you own more")
            raise SpecError(msg)
    if len(groups) > job.model.num_layers:
        msg = (f"place: {len(groups)} stages but the model has only {job.model.num_layers} "
               "blocks (each stage needs at least one)")
        raise SpecError(msg)
    B = job.global_batch_size
    dp = v.integer("dp", dp, minimum=1)
    micro_batch_size = v.integer("micro_batch_size", micro_batch_size, minimum=1)
    if B % (dp * micro_batch_size):
        msg = (f"place: the global batch {B} is not a multiple of dp {dp} x micro_batch_size "
               f"{micro_batch_size}")
        raise SpecError(msg)
    virtual_stages = v.integer("virtual_stages", virtual_stages, minimum=1, maximum=64)
    if virtual_stages > 1:
        M = B // (dp * micro_batch_size)
        if (len(groups) < 2 or M % len(groups) or schedule != "1f1b"
                or len(groups) * virtual_stages > job.model.num_layers):
            msg = (f"place: virtual_stages {virtual_stages} needs the 1f1b schedule, at least 2 "
                   f"groups, micro-batches ({M}) a multiple of the groups ({len(groups)}) and "
                   f"{virtual_stages} blocks per group ({job.model.num_layers} in all)")
            raise SpecError(msg)
    probe = Plan(job=job, stages=tuple(Stage(gpu=n, tp=t, layers=(0, 1)) for n, t in groups),
                 dp=dp, micro_batch_size=micro_batch_size,
                 num_microbatches=B // (dp * micro_batch_size), recompute=recompute,
                 schedule=schedule, cost_model=cost)
    profs = {g: p for g, p in as_profiles(profiles).items() if g in names}
    specs = Table(catalog, job.model, cost, profs).specs([catalog.index(n) for n in names])
    opts = core.PlaceOptions()
    opts.fixed_order = v.boolean("fixed_order", fixed_order)
    if time_limit_s is not None:
        opts.time_limit_s = v.number("time_limit_s", time_limit_s, positive=True, maximum=1e7)
    work = _workload(probe)
    work.virtual_stages = virtual_stages
    res = core.place(job.model._dims(), specs, cost._core(), work, core_groups, opts)
    if not res.found and not res.exhaustive:
        why = (f"the time limit ({time_limit_s} s; allow more with time_limit_s)"
               if res.timed_out else "the placer's node limit")
        msg = f"place: no arrangement found before {why} stopped the search"
        raise InfeasibleError(msg)
    if not res.found:
        msg = (f"place: no stage order and layer split of {[tuple(g) for g in groups]} fits "
               f"{job.model.name} in memory with dp {dp}, micro-batch {micro_batch_size}, "
               f"recompute {recompute}")
        raise InfeasibleError(msg)
    stages = tuple(_stage(catalog[names[s.gpu]], s.tp, (s.layer_begin, s.layer_end))
                   for s in res.stages)
    out = Plan(job=job, stages=stages, dp=dp, micro_batch_size=micro_batch_size,
               num_microbatches=probe.num_microbatches, recompute=probe.recompute,
               schedule=probe.schedule, virtual_stages=virtual_stages, cost_model=cost,
               profiles=profs,
               stats={"placer_nodes": res.nodes, "placer_leaves": res.leaves,
                      "exhaustive": res.exhaustive, "timed_out": res.timed_out,
                      "lower_bound_s": res.lower_bound_s})
    return out.with_estimate(catalog)
