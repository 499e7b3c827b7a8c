"""``espresso bench run SUITE --out DIR`` and ``espresso bench report DIR``: the
benchmarking harness (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import _io
from .. import _validate as v
from ..engines import ENGINES
from ..errors import SpecError
from . import _common as c


def _row_words(row: dict[str, Any]) -> str:
    what = "frontier" if row["planner"] == "frontier" else row["planner"]
    if row.get("error"):
        res = "error"
    elif row["planner"] == "frontier":
        res = "done"
    else:
        res = f"${row['usd']:,.0f}" if row["found"] else "no plan"
    return f"cell {row['cell']} {row['model']} {row['deadline_hours']:,.0f} h {what}: {res}"


def cmd_bench_run(args: argparse.Namespace) -> int:
    from ..bench import load_suite, report, run_suite

    _io.check_dir("--out", args.out, err=SpecError)
    suite = load_suite(args.suite)
    if args.engine is not None:
        suite.search["engine"] = args.engine
    if args.time_limit is not None:
        suite.search["time_limit_s"] = v.number("--time-limit", args.time_limit, positive=True,
                                                maximum=86_400)
    con = c.console()
    where = f"Ray ({args.ray})" if args.ray else f"{args.jobs or 'one per core'} processes"
    con.print(f"Suite [bold]{escape(suite.name)}[/]: {len(suite.cells)} cells x "
              f"{1 + len(suite.baselines)} planners"
              + (" + frontiers" if suite.frontier else "") + f", on {where}; rows go to "
              f"{escape(str(args.out))}/rows.jsonl as they finish")
    start = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=con,
                  transient=False) as bar:
        tid = bar.add_task("planning", total=None, last="")

        def progress(done: int, total: int, row: dict[str, Any]) -> None:
            bar.update(tid, completed=done, total=total, last=escape(_row_words(row)))
            if not con.is_terminal:  # a log file: one line per finished task
                con.print(f"[{done}/{total}] {escape(_row_words(row))}")

        rows = run_suite(suite, args.out, jobs=args.jobs, ray_address=args.ray,
                         resume=args.resume, progress=progress)
    path, plots, why = report(args.out, plots=not args.no_plots)
    _print_savings(con, rows)
    con.print(f"{len(rows)} rows in {time.monotonic() - start:,.1f} s: "
              f"{escape(str(args.out))}/rows.csv, rows.jsonl, {escape(path.name)}"
              + (f", {len(plots)} plots in plots/" if plots else ""))
    if why:
        con.print(f"[yellow]No plots:[/] {escape(why)}")
    errors = [r for r in rows if r.get("error")]
    if errors:
        con.print(f"[yellow]{len(errors)} tasks ended with an error[/] (listed in "
                  f"{escape(path.name)})")
    return c.EXIT_OK


def _print_savings(con: Any, rows: list[dict[str, Any]]) -> None:
    from ..bench import savings_table

    table = Table(title="Espresso's saving against each baseline (cells where both found a "
                        "plan)")
    for col in ("baseline", "cells", "median", "max", "both proven: cells", "median", "max",
                "baseline no plan", "baseline cheaper"):
        table.add_column(col, justify="left" if col == "baseline" else "right")
    for s in savings_table([r for r in rows if r["planner"] != "frontier"]):
        table.add_row(s["baseline"], str(s["both"]),
                      "—" if s["median"] is None else f"{100 * s['median']:.1f}%",
                      "—" if s["max"] is None else f"{100 * s['max']:.1f}%",
                      str(s["proven"]),
                      "—" if s["median_proven"] is None else f"{100 * s['median_proven']:.1f}%",
                      "—" if s["max_proven"] is None else f"{100 * s['max_proven']:.1f}%",
                      str(s["only_espresso"]), str(s["cheaper"]))
    con.print(table)


def cmd_bench_report(args: argparse.Namespace) -> int:
    from ..bench import report
    from ..bench.report import load_results

    if not _io.exists(Path(args.dir) / "rows.jsonl"):
        msg = (f"bench report: {_io.shown_path(args.dir)} has no rows.jsonl (run `espresso "
               "bench run` first)")
        raise SpecError(msg)
    path, plots, why = report(args.dir, plots=not args.no_plots)
    con = c.console()
    _print_savings(con, load_results(Path(args.dir))[1])
    con.print(f"Wrote {escape(str(path))}" + (f" and {len(plots)} plots" if plots else ""))
    if why:
        con.print(f"[yellow]No plots:[/] {escape(why)}")
    return c.EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmark Espresso against the baselines",
                       description="Run a suite of jobs through Espresso and every baseline "
                       "(docs/benchmarks.md).")
    cmds = p.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")
    r = cmds.add_parser(
        "run", help="run a suite into a results folder",
        description="Plan every cell of SUITE (models x catalogs x lengths x deadlines x "
        "quotas) with Espresso and each baseline; write rows.jsonl as each plan is known, "
        "then rows.csv, summary.md and plots/ (the plot extra).")
    r.add_argument("suite", help="suite YAML (bench/suites/paper.yaml is the default suite)")
    r.add_argument("--out", required=True, metavar="DIR", help="results folder")
    r.add_argument("--jobs", type=int, metavar="N",
                   help="parallel processes (default: one per core; 1: in this process)")
    r.add_argument("--ray", metavar="ADDRESS",
                   help="run the tasks on the Ray cluster at ADDRESS (auto, ray://HOST:PORT; "
                        "local: a one-machine Ray cluster started for this run); needs the ray "
                        "extra")
    r.add_argument("--time-limit", type=float, metavar="S",
                   help="search time limit per plan (default: the suite's, else 60 s)")
    r.add_argument("--engine", choices=tuple(ENGINES),
                   help="plan only what this engine runs (default: the suite's, else espresso)")
    r.add_argument("--resume", action="store_true",
                   help="keep the rows already in DIR and run only the missing tasks")
    r.add_argument("--no-plots", action="store_true", help="skip the plots")
    r.set_defaults(func=cmd_bench_run)
    q = cmds.add_parser("report", help="redraw summary.md and plots/ from a results folder",
                        description="Recompute the summary and plots from DIR/rows.jsonl.")
    q.add_argument("dir", help="results folder of `espresso bench run`")
    q.add_argument("--no-plots", action="store_true", help="skip the plots")
    q.set_defaults(func=cmd_bench_report)
