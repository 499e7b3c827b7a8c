"""The ``espresso`` command line: ``gpus``, ``models``, ``estimate``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .catalog import Catalog
from .errors import EspressoError
from .estimate import Estimate, estimate
from .model import ModelSpec
from .plan import Plan
from .units import format_hours as _hours

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2


def _console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        # Piped or captured output: tables take their natural width instead of 80 columns.
        console = Console(stderr=stderr, highlight=False, width=240)
    return console


def _catalog(path: str | None) -> Catalog:
    return Catalog.builtin() if path is None else Catalog.load(path)


# ---------------------------------------------------------------------- gpus
def cmd_gpus(args: argparse.Namespace) -> int:
    catalog = _catalog(args.catalog)
    if args.json:
        print(json.dumps(catalog.to_dict(), indent=2))
        return EXIT_OK
    table = Table(title=f"GPU catalog ({'built-in' if args.catalog is None else args.catalog})")
    for col in ("GPU", "mem GB", "TFLOPS", "HBM GB/s", "intra", "inter", "/node", "$/h",
                "spot $/h", "count", "TFLOPS/$", "TFLOPS/GB"):
        table.add_column(col, justify="left" if col == "GPU" else "right", no_wrap=True)
    for g in catalog:
        table.add_row(
            g.name, f"{g.memory_gb:g}", f"{g.bf16_tflops:g}", f"{g.mem_bandwidth_gbs:g}",
            f"{g.intra_node_gbs:g}", f"{g.inter_node_gbs:g}", str(g.gpus_per_node),
            f"{g.price_per_hour:.3f}",
            "-" if g.spot_price_per_hour is None else f"{g.spot_price_per_hour:.3f}",
            str(g.count),
            f"{g.bf16_tflops / g.price_per_hour:.0f}" if g.price_per_hour > 0 else "inf",
            f"{g.bf16_tflops / g.memory_gb:.2f}",
        )
    _console().print(table)
    return EXIT_OK


# ---------------------------------------------------------------------- models
def cmd_models(args: argparse.Namespace) -> int:
    names = ModelSpec.preset_names()
    if args.json:
        out = {n: {**ModelSpec.preset(n).to_dict(), "num_params": ModelSpec.preset(n).num_params}
               for n in names}
        print(json.dumps(out, indent=2))
        return EXIT_OK
    table = Table(title="Model presets", caption="published: the size the preset's source states")
    for col in ("model", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "MLP",
                "embeddings", "params", "published"):
        table.add_column(col, justify="left" if col in ("model", "MLP", "embeddings") else "right",
                         no_wrap=True)
    for n in names:
        m = ModelSpec.preset(n)
        table.add_row(
            n, str(m.num_layers), str(m.hidden_size), str(m.num_heads), str(m.num_kv_heads),
            str(m.ffn_hidden_size), str(m.vocab_size), "gated" if m.gated_mlp else "plain",
            "tied" if m.tied_embeddings else "untied", f"{m.num_params / 1e9:.3f} B",
            f"{ModelSpec.published_params(n) / 1e9:.3f} B",
        )
    _console().print(table)
    return EXIT_OK


# ---------------------------------------------------------------------- estimate
def print_estimate(plan: Plan, est: Estimate, console: Console) -> None:
    job = plan.job
    rent = escape(", ".join(f"{c} x {g}" for g, c in est.gpus.items()))
    console.print(
        f"[bold]{escape(job.model.name)}[/]: seq {job.seq_len}, "
        f"global batch {job.global_batch_size}, "
        f"{est.iterations:,} iterations ({job.num_tokens / 1e9:,.2f}B tokens), "
        f"deadline {_hours(job.deadline_hours)}"
    )
    console.print(
        f"Rent: {rent} (${est.hourly_usd:,.2f}/h).  dp {plan.dp}, {plan.num_microbatches} "
        f"micro-batches of {plan.micro_batch_size}, {plan.schedule}, recompute {plan.recompute}"
    )
    table = Table(caption="f+b/mb: forward+backward of one micro-batch; *: bottleneck stage")
    for col in ("stage", "GPU", "TP", "layers", "f+b/mb", "busy/iter", "mem/GPU", "usable",
                "headroom", "in flight"):
        table.add_column(col, justify="left" if col in ("GPU", "layers") else "right",
                         no_wrap=True)
    for s in est.stages:
        head = f"{s.headroom_gb:.1f} GB"
        if s.headroom_gb < 0:
            head = f"[red]{head}[/]"
        mark = " *" if s.index == est.bottleneck_stage else ""
        table.add_row(
            f"{s.index}{mark}", escape(s.gpu), str(s.tp), f"[{s.layers[0]}, {s.layers[1]})",
            f"{s.fwd_s + s.bwd_s:.3f} s", f"{s.time_s:.2f} s", f"{s.memory_gb:.1f} GB",
            f"{s.capacity_gb:.1f} GB", head, str(s.in_flight),
        )
    console.print(table)
    console.print(
        f"Iteration {est.iteration_s:.3f} s = pipeline {est.pipeline_s:.3f} + dp all-reduce "
        f"{est.dp_allreduce_s:.3f} + optimizer {est.optimizer_step_s:.3f}; bubble "
        f"{est.bubble_fraction:.1%}; bottleneck stage {est.bottleneck_stage} (*); "
        f"MFU {est.mfu:.1%}; {est.tokens_per_s:,.0f} tokens/s"
    )
    console.print(f"Total: {_hours(est.total_hours)}, [bold]${est.total_usd:,.2f}[/]")
    if est.meets_deadline:
        console.print(f"Deadline: met with {_hours(job.deadline_hours - est.total_hours)} to spare")
    else:
        console.print(
            f"[yellow]Deadline: missed by {_hours(est.total_hours - job.deadline_hours)}[/] "
            f"(needs {_hours(est.total_hours)}, deadline {_hours(job.deadline_hours)})"
        )
    if est.feasible:
        console.print("Feasible: [green]yes[/]")
    else:
        console.print("Feasible: [red]no[/]")
        for r in est.reasons:
            console.print(f"  - {escape(r)}")


def cmd_estimate(args: argparse.Namespace) -> int:
    catalog = _catalog(args.catalog)
    plan = Plan.from_json(args.plan)
    est = estimate(plan, catalog)
    if args.json:
        text = replace(plan, estimate=est).to_json()
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text)
    if args.json != "-":
        print_estimate(plan, est, _console())
        if args.json:
            _console().print(f"Wrote the plan with its estimate to {args.json}")
    return EXIT_OK if est.feasible else EXIT_INFEASIBLE


# ---------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="espresso",
        description="Plan cost-efficient training of large transformers on heterogeneous "
        "cloud GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"espresso {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("gpus", help="list a GPU catalog")
    p.add_argument("--catalog", metavar="FILE", help="catalog YAML/JSON (default: built-in)")
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.set_defaults(func=cmd_gpus)

    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser(
        "estimate",
        help="time, memory and cost of a plan",
        description="Estimate a plan (JSON, schema espresso.plan/1). Exit status: 0 feasible, "
        "1 infeasible (the reasons are printed), 2 bad input.",
    )
    p.add_argument("plan", help="plan JSON file")
    p.add_argument("--catalog", metavar="FILE", help="catalog YAML/JSON (default: built-in)")
    p.add_argument("--json", metavar="OUT",
                   help="write the plan with its estimate as JSON to OUT ('-': stdout only)")
    p.set_defaults(func=cmd_estimate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except EspressoError as exc:
        _console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_USAGE
    except KeyboardInterrupt:  # pragma: no cover
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
