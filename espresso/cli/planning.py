"""``espresso plan`` and ``espresso estimate``."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

from rich.markup import escape

from .._optional import require
from .._validate import load_yaml
from ..catalog import NETWORK_NOTE, Catalog
from ..cost import CostParams
from ..engines import engine_cost
from ..errors import JobError
from ..estimate import estimate
from ..interleave import DEFAULT_VIRTUAL_STAGES
from ..job import DEFAULT_GLOBAL_BATCH_SIZE, DEFAULT_SEQ_LEN, Job
from ..plan import RECOMPUTE, SHARDING, Plan
from ..progress import DEFAULT_TIME_LIMIT_S, SearchProgress, TimeBudget
from ..search import (
    DEFAULT_MAX_STAGES,
    DEFAULT_SHARDING,
    InfeasibleError,
    SearchResult,
    explain_infeasible,
    search,
)
from . import _common as c
from .report import NO_DEADLINE_HOURS, Comparison, print_estimate, print_plan, print_top

MAIN_SHARE = 0.8
"""Share of the command's time limit the main search may use when a comparison with
single-type plans follows (which gets the rest)."""


# ---------------------------------------------------------------------- estimate
def cmd_estimate(args: argparse.Namespace) -> int:
    c.check_output("--json", args.json)
    plan = Plan.from_json(args.plan)
    # Without --catalog: the snapshot for plans that name offers, else the GPU-type catalog.
    spot = (args.spot or args.spot_only or args.spot_rate is not None
            or args.spot_recovery is not None)
    catalog = (c.load_available(args)
               if args.catalog or args.quota or args.max_instances is not None or spot
               else None)
    profiles = c.load_profiles(args.profile)
    if profiles is not None:
        plan = replace(plan, profiles=profiles)
    cost = c.load_cost_model(args.cost_model)
    if cost is not None:
        plan = replace(plan, cost_model=cost)
    if args.checkpoint_gbs is not None:
        plan = replace(plan, cost_model=replace(plan.cost_model,
                                                checkpoint_gbs=args.checkpoint_gbs))
    est = estimate(plan, catalog)
    if args.json:
        c.write_output("--json", args.json, replace(plan, estimate=est).to_json())
    if args.json != "-":
        print_estimate(plan, est, c.console())
        if args.json:
            c.console().print(f"Wrote the plan with its estimate to {escape(args.json)}")
    return c.EXIT_OK if est.feasible and est.meets_deadline else c.EXIT_INFEASIBLE


# ---------------------------------------------------------------------- plan
def job_from_args(args: argparse.Namespace) -> Job:
    data: dict[str, Any] = {}
    if args.tokens is not None and args.iterations is not None:
        msg = (f"give --tokens or --iterations, not both (got --tokens {args.tokens} and "
               f"--iterations {args.iterations})")
        raise JobError(msg)
    if args.job:
        loaded = load_yaml("--job", args.job, err=JobError)
        if not isinstance(loaded, dict):
            msg = f"--job: {args.job}: expected a YAML/JSON mapping of job fields"
            raise JobError(msg)
        data.update(loaded)
    for key, val in (("model", args.model), ("seq_len", args.seq_len),
                     ("global_batch_size", args.global_batch), ("tokens", args.tokens),
                     ("iterations", args.iterations), ("deadline_hours", args.deadline),
                     ("optimizer", args.optimizer), ("precision", args.precision),
                     ("deadline_confidence", args.deadline_confidence)):
        if val is not None:
            data[key] = val
    if args.tokens is not None:
        data.pop("iterations", None)
    if args.iterations is not None:
        data.pop("tokens", None)
    if "deadline_hours" in data:
        data.pop("deadline", None)
    if (getattr(args, "budget", None) is not None and "deadline_hours" not in data
            and "deadline" not in data):
        # The fastest plan within a budget needs no deadline: none binds.
        data["deadline_hours"] = NO_DEADLINE_HOURS  # over a century: none binds
    for key, flag in (("model", "--model"), ("deadline_hours", "--deadline")):
        if key not in data and not (key == "deadline_hours" and "deadline" in data):
            msg = (f"plan: {flag} is required (or give it in --job FILE"
                   + (", or ask for the fastest plan within --budget USD)"
                      if key == "deadline_hours" else ")"))
            raise JobError(msg)
    if "tokens" not in data and "iterations" not in data:
        msg = "plan: give --tokens (e.g. 2e10 or 20B) or --iterations (one of them)"
        raise JobError(msg)
    return Job.from_dict(data)


def _compare(job: Job, catalog: Any, best: Plan, budget: TimeBudget,
             progress: SearchProgress, kwargs: dict[str, Any]) -> Comparison | None:
    est = best.estimate
    assert est is not None
    if len(est.gpus) == 1:
        return Comparison(plan=best)
    if budget.spent:
        return Comparison(plan=None, skipped="not compared: the main search used the whole "
                          "time limit (--time-limit)")
    res = search(job, catalog, max_gpu_types=1, time_limit_s=budget.share(1.0),
                 progress=progress, phase="single-type plans", **kwargs)
    return Comparison(plan=res.plans[0] if res.plans else None, stats=res.stats)


def _compare_on_demand(job: Job, catalog: Any, best: Plan, budget: TimeBudget, share: float,
                       progress: SearchProgress, kwargs: dict[str, Any]) -> Comparison:
    """The best plan without spot instances, for the saving the spot market brings."""
    est = best.estimate
    assert est is not None
    if est.spot is None:
        return Comparison(plan=best, kind="on-demand")
    rows = tuple(g for g in catalog.gpus if not g.is_spot)
    if not rows:
        return Comparison(plan=None, kind="on-demand",
                          skipped="not compared: the catalog has spot rows only (--spot-only)")
    if budget.spent:
        return Comparison(plan=None, kind="on-demand", skipped="not compared: the main search "
                          "used the whole time limit (--time-limit)")
    res = search(job, Catalog(gpus=rows, notes=catalog.notes), time_limit_s=budget.share(share),
                 progress=progress, phase="on-demand plans", **kwargs)
    return Comparison(plan=res.plans[0] if res.plans else None, stats=res.stats,
                      kind="on-demand")


def _cost_model(args: argparse.Namespace) -> CostParams | None:
    """--cost-model with --checkpoint-gbs applied."""
    cost = c.load_cost_model(args.cost_model)
    over: dict[str, Any] = {}
    if getattr(args, "checkpoint_gbs", None) is not None:
        over["checkpoint_gbs"] = args.checkpoint_gbs
    if getattr(args, "memory_headroom", None) is not None:
        over["memory_reserve_fraction"] = args.memory_headroom
    if over:  # over the engine's profile, unless a cost model is given
        cost = replace(engine_cost(getattr(args, "engine", "espresso"), cost), **over)
    return cost


def _depth_arg(tiers: tuple[int, ...]) -> int | tuple[int, ...]:
    """--max-stages: one number is one depth for every plan."""
    return tiers[0] if len(tiers) == 1 else tiers


def _word_list(name: str, allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        words = tuple(w.strip() for w in text.split(","))
        bad = [w for w in words if w not in allowed]
        if not words or bad:
            msg = (f"--{name}: expected a comma-separated list of {', '.join(allowed)}, "
                   f"got {text!r}")
            raise argparse.ArgumentTypeError(msg)
        return words
    return parse


def _int_list(name: str, lo: int, hi: int, *, allow_none: bool = True) -> Any:
    def parse(text: str) -> tuple[int, ...]:
        if allow_none and text.strip() == "none":
            return ()
        try:  # every item a number: "1,,2" and "4," are refused, not read as (1, 2), (4,)
            out = tuple(int(w) for w in text.split(","))
        except ValueError:
            out = ()
        if not out or any(not lo <= x <= hi for x in out):
            none = "'none' or " if allow_none else ""
            msg = (f"--{name}: expected {none}a comma-separated list of integers in "
                   f"[{lo}, {hi}], got {text!r}")
            raise argparse.ArgumentTypeError(msg)
        return out
    return parse


def _check_plot(path: str | None) -> None:
    if path is None:
        return
    c.check_output("--plot", path)
    if not path.lower().endswith((".png", ".svg", ".pdf")):
        msg = f"--plot: expected a .png, .svg or .pdf file, got {path!r}"
        raise JobError(msg)
    require("matplotlib")  # the plot extra, before the search spends its time


def _write_plot(con: Any, plan: Plan, path: str | None) -> None:
    if path is None:
        return
    from ..plot import plot_plan

    plot_plan(plan, path)
    con.print(f"Drew the plan's timeline and memory per stage in {escape(path)}")


def cmd_plan(args: argparse.Namespace) -> int:
    c.check_output("--json", args.json)
    _check_plot(args.plot)
    budget = TimeBudget(args.time_limit)
    catalog = c.load_available(args)
    job = job_from_args(args)
    con = c.console(stderr=args.json == "-")  # `--json -`: the plan alone on stdout
    objective = "time" if args.budget is not None else "cost"
    space: dict[str, Any] = dict(threads=c.threads_arg(con, args.threads),
                                 max_stages=_depth_arg(args.max_stages), max_tp=args.max_tp,
                                 profiles=c.load_profiles(args.profile),
                                 cost_model=_cost_model(args),
                                 scope=args.scope, sharding=args.sharding,
                                 recompute=args.recompute, virtual_stages=args.virtual_stages,
                                 interleave_after=args.interleave_after,
                                 sequence_parallel=None if args.sequence_parallel else False,
                                 engine=args.engine, gap=args.gap)
    kwargs = {**space, "objective": objective, "budget_usd": args.budget}
    progress = SearchProgress()
    spot = any(g.is_spot for g in catalog.gpus)
    # The main search, then (spot) the best on-demand plan, then single-type plans.
    share = (MAIN_SHARE * (0.75 if spot else 1.0)) if args.compare else 1.0

    def main_search() -> SearchResult:
        return search(job, catalog, top_k=args.top_k, time_limit_s=budget.share(share),
                      progress=progress, phase="searching", **kwargs)

    result = c.run_with_progress(con, "Searching", main_search, progress, budget)
    c.note_threads(con, space["threads"], result.stats)
    if not result.plans:
        if progress.cancelled:
            con.print("Interrupted before any plan was found.")
            return c.EXIT_INTERRUPTED
        exc: InfeasibleError = c.run_with_progress(
            con, "Explaining", lambda: explain_infeasible(
                job, catalog, result, budget, progress, **kwargs), progress, budget)
        con.print(f"[red]No plan:[/] {escape(str(exc))}")
        if exc.fastest is not None and args.json:
            _write_plan(exc.fastest, args)
            if args.json != "-":
                con.print(f"Wrote the fastest plan to {escape(args.json)}")
        return c.EXIT_INTERRUPTED if progress.cancelled else c.EXIT_INFEASIBLE
    best = result.plans[0]
    if args.json:  # before anything else can fail or take time
        _write_plan(best, args)
    comparison = on_demand = None
    if args.compare and spot and not progress.cancelled:
        on_demand = c.run_with_progress(
            con, "Comparing with on-demand plans",
            lambda: _compare_on_demand(job, catalog, best, budget, 0.5, progress, kwargs),
            progress, budget)
    if args.compare and not progress.cancelled:
        comparison = c.run_with_progress(
            con, "Comparing with single-type plans",
            lambda: _compare(job, catalog, best, budget, progress, kwargs), progress, budget)
    if progress.cancelled:  # a comparison cut short compares with nothing proven
        comparison = on_demand = None
    print_plan(best, con, comparison, *([on_demand] if on_demand is not None else []))
    for note in catalog.notes:
        if not note.startswith(NETWORK_NOTE):  # the plan says what it assumes of its own
            con.print(f"[dim]Catalog: {escape(note)}[/]")
    if len(result.plans) > 1 or args.top_k > 1:
        print_top(result.plans, con)
        if len(result.plans) < args.top_k:
            con.print(f"Only {len(result.plans)} plan{'s' if len(result.plans) > 1 else ''} "
                      f"meet{'s' if len(result.plans) == 1 else ''} the job "
                      f"(--top-k {args.top_k}).")
    if args.json and args.json != "-":
        con.print(f"Wrote the plan to {escape(args.json)}"
                  + (" (with search statistics)" if args.stats else ""))
    _write_plot(con, best, args.plot)
    if progress.cancelled:
        con.print("[yellow]Interrupted[/] after the search "
                  + ("had proven this plan optimal." if result.stats.complete else
                     "found this plan: the best so far, not proven optimal"
                     + (" (so marked in the JSON)." if args.json else ".")))
        return c.EXIT_INTERRUPTED
    return c.EXIT_OK


def _write_plan(plan: Plan, args: argparse.Namespace) -> None:
    """``--json OUT`` (``-``: standard output)."""
    c.write_output("--json", args.json, plan.to_json(stats=args.stats))


def register(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="time, memory and cost of a plan",
        description="Estimate a plan (JSON, schema espresso.plan/1). Exit status: 0 the plan "
        "fits and meets its deadline, 1 it does not (the reasons are printed), 2 bad input.",
    )
    p.add_argument("plan", help="plan JSON file")
    c.add_catalog_arg(p)
    c.add_availability_args(p)
    p.add_argument("--json", metavar="OUT",
                   help="write the plan with its estimate as JSON to OUT ('-': stdout only)")
    c.add_profile_arg(p)
    c.add_cost_model_arg(p, "replacing the plan's cost_model")
    add_checkpoint_arg(p)
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser(
        "plan",
        help="the cheapest plan that meets a deadline",
        description="Search the cheapest plan (GPUs to rent, stages, layer split, dp, "
        "micro-batches) that meets the deadline, exact within the cost model. Exit status: 0 "
        "a plan, 1 no plan (the reason is printed), 2 bad input, 130 interrupted.",
    )
    add_job_args(p, deadline=True)
    p.add_argument("--job", metavar="FILE", help="job YAML/JSON; flags override its fields")
    c.add_catalog_arg(p)
    c.add_availability_args(p)
    p.add_argument("--scope", choices=("zone", "region", "provider"), default="region",
                   help="how far one plan's instances may spread: one zone, one region "
                        "(default; cross-zone links and transfer are charged) or one "
                        "provider (cross-region)")
    p.add_argument("--json", metavar="OUT", help="write the plan (espresso.plan/1) to OUT")
    p.add_argument("--plot", metavar="FILE",
                   help="draw the plan's pipeline timeline and memory per stage into FILE "
                        "(.png, .svg or .pdf; needs the plot extra)")
    p.add_argument("--stats", action="store_true",
                   help="with --json: also write the search statistics (they hold timings, "
                        "so the file then differs from run to run)")
    p.add_argument("--threads", type=int, help="search threads (default: all cores)")
    p.add_argument("--time-limit", type=float, metavar="S", default=DEFAULT_TIME_LIMIT_S,
                   help="wall-clock limit of the whole command, every search included "
                        f"(default {DEFAULT_TIME_LIMIT_S:g} s); when it stops a search, the best "
                        "plan so far is shown with its gap")
    p.add_argument("--budget", type=float, metavar="USD",
                   help="instead: the fastest plan whose total cost is within USD "
                        "(--deadline then optional)")
    p.add_argument("--gap", type=_gap_fraction, default=0.0, metavar="P",
                   help="stop once the plan is proven within a relative gap P of the "
                        "optimum, e.g. 0.01 (as MIP solvers'; default 0: exact)")
    p.add_argument("--top-k", type=int, default=1,
                   help="also list the next best plans (a table of k plans)")
    p.add_argument("--max-stages", type=_int_list("max-stages", 1, 1024, allow_none=False),
                   default=",".join(map(str, DEFAULT_MAX_STAGES)), metavar="N[,N...]",
                   help="pipeline depth at most: one number for every plan, or one per number "
                        "of GPU types in a plan, the last for more (default "
                        f"{','.join(map(str, DEFAULT_MAX_STAGES))}: 64 stages with one GPU type, "
                        "8 for mixes; 64,64,8 lets two-type mixes go as deep)")
    p.add_argument("--max-tp", type=int, default=8,
                   help="tensor-parallel width at most (default 8)")
    c.add_engine_arg(p)
    add_headroom_arg(p)
    p.add_argument("--sharding", type=_word_list("sharding", SHARDING),
                   default=",".join(DEFAULT_SHARDING), metavar="LIST",
                   help="sharding levels of the model states over data-parallel replicas to "
                        f"search, comma-separated from {', '.join(SHARDING)} (default "
                        f"{','.join(DEFAULT_SHARDING)})")
    p.add_argument("--recompute", type=_word_list("recompute", RECOMPUTE), default="none,full",
                   metavar="LIST",
                   help=f"recomputation modes to search, from {', '.join(RECOMPUTE)} "
                        "(default none,full)")
    p.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false",
                   help="plan TP stages without sequence parallelism (by default they use it "
                        "whenever the TP widths divide the sequence length)")
    p.add_argument("--virtual-stages", type=_int_list("virtual-stages", 1, 64, allow_none=False),
                   default="1", metavar="LIST",
                   help="stages per GPU group to search, exactly: 1 plain pipelines, 2 and "
                        "more interleaved 1F1B (e.g. 1,2,4; default 1: interleaving is slower "
                        "to prove and then only tried by --interleave-after)")
    p.add_argument("--interleave-after", type=_int_list("interleave-after", 2, 64),
                   default=",".join(map(str, DEFAULT_VIRTUAL_STAGES)), metavar="LIST",
                   help="chunks per GPU group with which the plan found is then interleaved, "
                        "keeping the best that beats it (outside the proof); 'none' turns it "
                        f"off (default {','.join(map(str, DEFAULT_VIRTUAL_STAGES))})")
    p.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the comparison with single-type plans")
    c.add_profile_arg(p)
    c.add_cost_model_arg(p, "instead of the defaults")
    add_checkpoint_arg(p)
    p.set_defaults(func=cmd_plan)


def add_job_args(p: argparse.ArgumentParser, *, deadline: bool) -> None:
    """The job's flags (`plan`, and `frontier` without --deadline)."""
    p.add_argument("--model", help="preset name (espresso models), HF config.json, or model YAML")
    p.add_argument("--tokens", help="training tokens, e.g. 2e10 or 20B")
    p.add_argument("--iterations", help="optimizer steps (instead of --tokens)")
    if deadline:
        p.add_argument("--deadline",
                       help="wall-clock limit, e.g. 7d, 36h, 90m (a number: hours)")
    p.add_argument("--seq-len", type=int, help=f"sequence length (default {DEFAULT_SEQ_LEN})")
    p.add_argument("--global-batch", type=int,
                   help=f"sequences per step (default {DEFAULT_GLOBAL_BATCH_SIZE})")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd", "adam-bf16"),
                   help="default adam; adam-bf16: Adam states kept in bf16 (6 bytes per "
                        "parameter, not 12)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp8"),
                   help="default bf16 (GPUs with bf16 tensor cores); fp16: mixed precision "
                        "with loss scaling, on any GPU (V100, T4 and P100 too); fp8: the "
                        "linear layers' GEMMs in fp8 (Transformer Engine), on GPUs with fp8 "
                        "tensor cores only")
    p.add_argument("--deadline-confidence", type=float, metavar="P",
                   help="with spot instances: the probability with which the deadline must "
                        "hold, over the number of interruptions (default 0.9)")


def _gap_fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not 0.0 <= x < 1.0:
        msg = f"expected a relative gap in [0, 1), e.g. 0.01 for 1%, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return x


def _fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0 <= x < 1:
        msg = f"expected a fraction in [0, 1), got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return x


def add_headroom_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-headroom", type=_fraction, metavar="FRACTION",
                   help="share of each GPU's memory kept free for what the model cannot count "
                        "(allocator cache, fragmentation), besides cost_model.reserved_gb "
                        "(default 0.05: cost_model.memory_reserve_fraction)")


def add_checkpoint_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint-gbs", type=float, metavar="GB/s",
                   help="with spot instances: aggregate GB/s at which checkpoints are written "
                        "and read back (default 2; 0: free), replacing cost_model.checkpoint_gbs")
