"""``espresso frontier``: the cost–deadline frontier of a job."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table

from ..frontier import FrontierPoint, frontier
from ..progress import DEFAULT_TIME_LIMIT_S, SearchProgress, TimeBudget
from ..units import format_hours as _hours
from . import _common as c
from .planning import (
    _cost_model,
    add_checkpoint_arg,
    add_headroom_arg,
    add_job_args,
    job_from_args,
)
from .report import _rented


def cmd_frontier(args: argparse.Namespace) -> int:
    c.check_output("--json", args.json)
    budget = TimeBudget(args.time_limit)  # the limit covers loading the catalog too
    catalog = c.load_available(args)
    args.deadline = args.deadline or "1e9"  # the frontier sets every deadline itself
    job = job_from_args(args)
    con = c.console(stderr=args.json == "-")  # `--json -`: the frontier alone on stdout
    progress = SearchProgress()
    count = [0]

    def found(p: FrontierPoint) -> None:
        count[0] += 1
        # Off a terminal (a log, a pipe) each point is a line as soon as it is proven; on
        # one the status line counts them (its phase is the point being searched).
        if not con.is_terminal:
            est = p.plan.estimate
            assert est is not None
            con.print(f"point {count[0]}: {_hours(p.hours)}, ${p.usd:,.2f} "
                      f"({escape(_rented(est))}){'' if p.proven else ' (not proven)'}")

    f = c.run_with_progress(
        con, "Searching the frontier (each step is one exact search)",
        lambda: frontier(job, catalog, max_points=args.max_points, time_limit_s=budget.share(),
                         threads=c.threads_arg(con, args.threads), cost_model=_cost_model(args),
                         progress=progress, engine=args.engine, on_point=found),
        progress, budget)
    if args.json:  # before anything else can fail
        c.write_json("--json", args.json, f.to_dict(timings=args.stats))
    if not f.points:
        if f.interrupted:
            con.print("Interrupted before the first point was found.")
            return c.EXIT_INTERRUPTED
        con.print("[red]No plan:[/] nothing fits this job in the catalog, whatever the "
                  "deadline.")
        return c.EXIT_INFEASIBLE
    table = Table(title=f"Cost–deadline frontier of {escape(job.model.name)}",
                  caption="each row: the cheapest plan for every deadline from its hours "
                          "up to the row above")
    for col in ("deadline from", "to", "total", "$/h", "rent", "proven"):
        table.add_column(col, justify="left" if col == "rent" else "right")
    for p in f.points:
        est = p.plan.estimate
        assert est is not None
        table.add_row(_hours(p.hours), "any" if p.up_to == float("inf") else _hours(p.up_to),
                      f"${p.usd:,.2f}", f"{est.hourly_usd:,.2f}", escape(_rented(est)),
                      "yes" if p.proven else "no")
    con.print(table)
    con.print(f"{len(f.points)} points in {f.seconds:.1f} s; "
              + ("complete: no plan is faster than the last" if f.complete else
                 "[yellow]interrupted[/] (Ctrl-C): the points found so far (faster plans may "
                 "remain)" if f.interrupted else
                 "[yellow]incomplete[/]: the time limit or --max-points stopped it "
                 "(faster plans may remain)"))
    if args.json and args.json != "-":
        con.print(f"Wrote the frontier to {escape(args.json)}")
    return c.EXIT_INTERRUPTED if f.interrupted else c.EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser(
        "frontier", help="the cheapest plan for every deadline (the cost-deadline frontier)",
        description="The exact cost-deadline frontier: every breakpoint where the cheapest "
        "plan changes, each a proven optimum, found by parametric search (docs/search.md, "
        "\"The frontier\").")
    add_job_args(p, deadline=False)
    p.add_argument("--job", metavar="FILE", help="job YAML/JSON (its deadline is ignored)")
    c.add_catalog_arg(p)
    c.add_availability_args(p)
    p.add_argument("--max-points", type=int, default=50, help="at most this many steps (50)")
    p.add_argument("--time-limit", type=float, metavar="S", default=5 * DEFAULT_TIME_LIMIT_S,
                   help=f"wall-clock limit of the whole command (default "
                        f"{5 * DEFAULT_TIME_LIMIT_S:g} s)")
    p.add_argument("--threads", type=int, help="search threads (default: all cores)")
    c.add_engine_arg(p)
    add_headroom_arg(p)
    p.add_argument("--json", metavar="OUT",
                   help="write the frontier (every plan) to OUT ('-': stdout)")
    p.add_argument("--stats", action="store_true",
                   help="with --json: also write the seconds taken (the file then differs from "
                        "run to run)")
    c.add_cost_model_arg(p, "instead of the defaults")
    add_checkpoint_arg(p)
    p.set_defaults(func=cmd_frontier, deadline=None)
