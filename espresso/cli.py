"""The ``espresso`` command line: ``gpus``, ``models``, ``estimate``."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from ._optional import require
from ._validate import load_yaml
from .catalog import Catalog
from .cost import CostParams
from .errors import CatalogError, EspressoError, JobError, ProfileError, SpecError
from .estimate import Estimate, estimate
from .job import Job
from .launch import LaunchError, check_runnable, load_hosts, torchrun_commands
from .model import ModelSpec
from .plan import Plan
from .profile import Profile
from .search import InfeasibleError, search
from .search import plan as plan_search
from .units import format_count as _count
from .units import format_hours as _hours
from .units import format_seconds as _sec

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
        f"{est.iterations:,} iterations ({_count(job.num_tokens)} tokens), "
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
            _sec(s.fwd_s + s.bwd_s), _sec(s.time_s), f"{s.memory_gb:.1f} GB",
            f"{s.capacity_gb:.1f} GB", head, str(s.in_flight),
        )
    console.print(table)
    console.print(
        f"Iteration {_sec(est.iteration_s)} = pipeline {_sec(est.pipeline_s)} + dp all-reduce "
        f"{_sec(est.dp_allreduce_s)} + optimizer {_sec(est.optimizer_step_s)}; bubble "
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


def _profiles(items: list[str] | None) -> dict[str, Profile] | None:
    """``--profile GPU=FILE`` (repeatable) -> {gpu: Profile}."""
    if not items:
        return None
    out: dict[str, Profile] = {}
    for item in items:
        gpu, sep, path = item.partition("=")
        if not sep or not gpu or not path:
            msg = f"--profile: expected GPU=FILE (e.g. A100-80GB=prof.json), got {item!r}"
            raise ProfileError(msg)
        prof = Profile.load(path)
        if prof.gpu != gpu:
            msg = f"--profile {item}: the file is a profile of {prof.gpu}, not {gpu}"
            raise ProfileError(msg)
        out[gpu] = prof
    return out


def _cost_model(path: str | None) -> CostParams | None:
    """``--cost-model FILE``: CostParams from YAML/JSON (a mapping, or one under
    ``cost_model:``)."""
    if path is None:
        return None
    data = load_yaml("--cost-model", path, err=SpecError)
    if isinstance(data, dict) and set(data) == {"cost_model"}:
        data = data["cost_model"]
    if not isinstance(data, dict):
        msg = (f"--cost-model: {path!r} is not a mapping of cost-model constants "
               "(e.g. `bytes_per_weight: 4.0`); see docs/cost-model.md")
        raise SpecError(msg)
    return CostParams.from_dict(data)


def cmd_estimate(args: argparse.Namespace) -> int:
    catalog = _catalog(args.catalog)
    plan = Plan.from_json(args.plan)
    profiles = _profiles(args.profile)
    if profiles is not None:
        plan = replace(plan, profiles=profiles)
    cost = _cost_model(args.cost_model)
    if cost is not None:
        plan = replace(plan, cost_model=cost)
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



# ---------------------------------------------------------------------- plan
def _job_from_args(args: argparse.Namespace) -> Job:
    data: dict[str, Any] = {}
    if args.job:
        loaded = load_yaml("--job", args.job, err=JobError)
        if not isinstance(loaded, dict):
            msg = f"--job: {args.job!r} is not a readable YAML/JSON job file"
            raise JobError(msg)
        data.update(loaded)
    for key, val in (("model", args.model), ("seq_len", args.seq_len),
                     ("global_batch_size", args.global_batch), ("tokens", args.tokens),
                     ("iterations", args.iterations), ("deadline_hours", args.deadline),
                     ("optimizer", args.optimizer)):
        if val is not None:
            data[key] = val
    if args.tokens is not None:
        data.pop("iterations", None)
    if args.iterations is not None:
        data.pop("tokens", None)
    data.pop("deadline", None) if "deadline_hours" in data and "deadline" in data else None
    data.setdefault("seq_len", 4096)
    data.setdefault("global_batch_size", 512)
    for key, flag in (("model", "--model"), ("deadline_hours", "--deadline")):
        if key not in data and not (key == "deadline_hours" and "deadline" in data):
            msg = f"plan: {flag} is required (or give it in --job FILE)"
            raise JobError(msg)
    if "tokens" not in data and "iterations" not in data:
        msg = "plan: give --tokens (e.g. 2e10 or 20B) or --iterations"
        raise JobError(msg)
    return Job.from_dict(data)


def _run_with_progress(console: Console, label: str, fn: Any) -> Any:
    """Run fn() in a worker thread; after one second show a spinner with the elapsed time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        fut = pool.submit(fn)
        try:
            return fut.result(timeout=1.0)
        except concurrent.futures.TimeoutError:
            pass
        start = time.monotonic()
        with console.status(label) as status:
            while True:
                try:
                    return fut.result(timeout=0.2)
                except concurrent.futures.TimeoutError:
                    status.update(f"{label} ({time.monotonic() - start + 1:.0f} s)")


def print_plan(plan: Plan, console: Console, single: Plan | None) -> None:
    est = plan.estimate
    assert est is not None
    job = plan.job
    console.print(
        f"[bold]{escape(job.model.name)}[/] ({_count(job.model.num_params)} parameters): "
        f"seq {job.seq_len}, global batch {job.global_batch_size}, {est.iterations:,} "
        f"iterations ({_count(job.num_tokens)} tokens), deadline {_hours(job.deadline_hours)}"
    )
    parts = ", ".join(f"{c} x {escape(g)}" for g, c in est.gpus.items())
    console.print(f"Rent: [bold]{parts}[/] (${est.hourly_usd:,.2f}/h).  dp {plan.dp}, "
                  f"{plan.num_microbatches} micro-batches of {plan.micro_batch_size}, "
                  f"{plan.schedule}, recompute {plan.recompute}")
    table = Table(caption="f+b/mb: forward+backward of one micro-batch; *: bottleneck stage")
    for col in ("stage", "GPU", "TP", "layers", "memory / usable", "f+b/mb", "busy/iter"):
        table.add_column(col, justify="left" if col in ("GPU", "layers") else "right",
                         no_wrap=True)
    for st in est.stages:
        mark = " *" if st.index == est.bottleneck_stage else ""
        table.add_row(f"{st.index}{mark}", escape(st.gpu), str(st.tp),
                      f"[{st.layers[0]}, {st.layers[1]})",
                      f"{st.memory_gb:.1f} / {st.capacity_gb:.1f} GB",
                      _sec(st.fwd_s + st.bwd_s), _sec(st.time_s))
    console.print(table)
    console.print(
        f"Iteration {_sec(est.iteration_s)} (pipeline {_sec(est.pipeline_s)}, bubble "
        f"{est.bubble_fraction:.1%}; dp all-reduce {_sec(est.dp_allreduce_s)}; optimizer "
        f"{_sec(est.optimizer_step_s)}); MFU {est.mfu:.1%}"
    )
    console.print(f"Total: {_hours(est.total_hours)}, [bold]${est.total_usd:,.2f}[/] "
                  f"(deadline {_hours(job.deadline_hours)}: met)")
    if single is not None and single.estimate is not None:
        s_est = single.estimate
        s_parts = ", ".join(f"{c} x {g}" for g, c in s_est.gpus.items())
        if len(est.gpus) == 1:
            console.print("Single GPU type: the cheapest plan already uses one type.")
        else:
            saving = 1 - est.total_usd / s_est.total_usd
            console.print(
                f"Versus the cheapest single-type plan ({escape(s_parts)}, "
                f"${s_est.total_usd:,.2f}, {_hours(s_est.total_hours)}): saves "
                f"[bold]{saving:.1%}[/]")
    elif single is None and len(est.gpus) > 1:
        console.print("Versus single-type plans: no single GPU type meets the deadline.")
    stats = plan.stats or {}
    pruned = stats.get("pruned", {})
    proof = ("proven optimal within the cost model (gap 0)" if stats.get("gap") == 0.0
             else f"gap {stats.get('gap', float('nan')):.2%} (search stopped early)"
             if stats.get("gap") is not None else "no lower bound")
    console.print(
        f"Search: {stats.get('nodes_expanded', 0):,} nodes expanded, "
        f"{stats.get('leaves_placed', 0):,} allocations placed, pruned "
        + ", ".join(f"{k} {v:,}" for k, v in pruned.items())
        + f"; {stats.get('seconds', 0.0):.2f} s on {stats.get('threads', 1)} threads; {proof}"
    )


def _single_type_best(job: Job, catalog: Catalog, kwargs: dict[str, Any]) -> Plan | None:
    best: Plan | None = None
    for g in catalog:
        if g.count == 0:
            continue
        profs = {k: p for k, p in (kwargs.get("profiles") or {}).items() if k == g.name}
        res = search(job, Catalog(gpus=(g,)), **{**kwargs, "profiles": profs})
        if res.plans and res.plans[0].estimate is not None:
            cand = res.plans[0]
            assert cand.estimate is not None
            if best is None or cand.estimate.total_usd < best.estimate.total_usd:  # type: ignore[union-attr]
                best = cand
    return best


def cmd_plan(args: argparse.Namespace) -> int:
    catalog = _catalog(args.catalog)
    job = _job_from_args(args)
    console = _console()
    kwargs: dict[str, Any] = dict(threads=args.threads, time_limit_s=args.time_limit,
                                  max_stages=args.max_stages, max_tp=args.max_tp,
                                  profiles=_profiles(args.profile),
                                  cost_model=_cost_model(args.cost_model))
    objective = "time" if args.budget is not None else "cost"
    try:
        best = _run_with_progress(
            console, "Searching",
            lambda: plan_search(job, catalog, objective=objective, budget_usd=args.budget,
                                top_k=args.top_k, **kwargs))
    except InfeasibleError as exc:
        console.print(f"[red]No plan:[/] {escape(str(exc))}")
        if exc.fastest is not None and args.json:
            exc.fastest.to_json(args.json)
            console.print(f"Wrote the fastest plan to {args.json}")
        return EXIT_INFEASIBLE
    single = None
    assert best.estimate is not None
    if args.compare and len(best.estimate.gpus) > 1:
        single = _run_with_progress(
            console, "Comparing with single-type plans",
            lambda: _single_type_best(job, catalog, {**kwargs, "objective": objective,
                                                     "budget_usd": args.budget}))
    if args.json:
        best.to_json(args.json)
    print_plan(best, console, single)
    if args.json:
        console.print(f"Wrote the plan to {args.json}")
    return EXIT_OK



# ---------------------------------------------------------------------- profile
def cmd_profile(args: argparse.Namespace) -> int:
    from .profile import profile_model

    catalog = _catalog(args.catalog)
    gpu = catalog[args.gpu]
    model = ModelSpec.load(args.model)
    torch = require("torch")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             None: None}[args.dtype]
    if args.threads is not None:
        if not 1 <= args.threads <= 4096:
            msg = f"profile: --threads {args.threads} is out of range; expected 1 to 4096"
            raise EspressoError(msg)
        torch.set_num_threads(args.threads)
    cost = _cost_model(args.cost_model) or CostParams()
    console = _console(stderr=True)
    with console.status(f"Profiling {model.name} on {args.device or 'the default device'}") as st:
        prof = profile_model(model, gpu=gpu.name, micro_batch_size=args.micro_batch,
                             seq_len=args.seq_len, device=args.device, dtype=dtype,
                             warmup=args.warmup, repeats=args.repeats,
                             progress=lambda m: st.update(f"Profiling {model.name}: {m}"))
    prof.to_json(args.out)
    factors = prof.factors(model, gpu, cost)
    out = _console()
    out.print(f"[bold]{escape(model.name)}[/]: one block and the head, micro-batch "
              f"{prof.micro_batch_size} x seq {prof.seq_len}, {prof.dtype} on {prof.device} "
              f"({prof.meta.get('threads', '?')} threads), median of {prof.repeats}")
    table = Table("part", "measured", f"analytic ({gpu.name})", "measured / analytic")
    for part, key, analytic_key in (
            ("block forward", "block_fwd_s", "block_fwd_scale"),
            ("block backward", "block_bwd_s", "block_bwd_scale"),
            ("head forward", "head_fwd_s", "head_fwd_scale"),
            ("head backward", "head_bwd_s", "head_bwd_scale")):
        t = getattr(prof, key)
        f = factors[analytic_key]
        table.add_row(part, f"{t * 1e3:.3f} ms", f"{t / f * 1e3:.3f} ms", f"{f:.2f}x")
    act = prof.block_activation_bytes
    table.add_row("block activations", f"{act / 1e6:.1f} MB",
                  f"{act / factors['activation_scale'] / 1e6:.1f} MB",
                  f"{factors['activation_scale']:.2f}x")
    out.print(table)
    out.print(f"Wrote the profile to {args.out}; use it with "
              f"`espresso plan ... --profile {gpu.name}={args.out}`")
    return EXIT_OK


# ---------------------------------------------------------------------- bench-gpu
def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from . import gpu as gpu_bench

    console = _console(stderr=args.json == "-")
    info = gpu_bench.status(args.device)
    if not info.get("available"):
        console.print(f"No CUDA GPU to benchmark: {escape(str(info.get('error')))}. Nothing "
                      "measured.")
        if args.json:
            _write_json(args.json, {"device": info, "results": []})
        return EXIT_OK
    catalog = _catalog(args.catalog)
    gpu = catalog[args.gpu] if args.gpu else gpu_bench.match_catalog(info["name"], catalog)
    with _console(stderr=True).status(f"Benchmarking {info['name']}"):
        out = gpu_bench.run(args.device, quick=args.quick)
    out["catalog_gpu"] = gpu.name if gpu else None
    if args.json:
        _write_json(args.json, out)
        if args.json == "-":
            return EXIT_OK
    console.print(f"[bold]{escape(info['name'])}[/] (compute {info['compute_capability']}, "
                  f"{info['sms']} SMs, {info['memory_gb']:.0f} GB); catalog type: "
                  f"{gpu.name if gpu else 'none matched (give --gpu)'}")
    table = Table("kernel", "measured", "catalog peak", "efficiency", "verified", "size")
    for r in out["results"]:
        peak = None
        if gpu is not None and r["name"] in ("copy", "triad"):
            peak = gpu.mem_bandwidth_gbs
        elif gpu is not None and r["name"] == "gemm_bf16":
            peak = gpu.bf16_tflops
        table.add_row(r["name"], f"{r['rate']:,.1f} {r['unit']}",
                      f"{peak:,.0f} {r['unit']}" if peak else "-",
                      f"{r['rate'] / peak:.1%}" if peak else "-",
                      "yes" if r["verified"] else f"[red]NO[/] (error {r['max_error']:.3g})",
                      escape(r["detail"]))
    console.print(table)
    bad = [r["name"] for r in out["results"] if not r["verified"]]
    if bad:
        console.print(f"[red]Wrong results from {', '.join(bad)}: their rates mean nothing.[/]")
        return EXIT_INFEASIBLE
    return EXIT_OK


def _write_json(path: str, data: Any) -> None:
    text = json.dumps(data, indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text)


# ---------------------------------------------------------------------- calibrate
def cmd_calibrate(args: argparse.Namespace) -> int:
    from . import calibrate

    if sum(map(bool, (args.bench, args.profile, args.cpu))) != 1:
        msg = "calibrate: give exactly one of --bench FILE, --profile FILE or --cpu"
        raise EspressoError(msg)
    if args.cpu:
        return _calibrate_cpu(args)
    if args.cost_out or args.cores is not None:
        msg = "calibrate: --cost-out and --cores go with --cpu"
        raise EspressoError(msg)
    catalog = _catalog(args.catalog)
    if args.bench:
        data = load_yaml("--bench", args.bench, err=CatalogError)
        if not isinstance(data, dict) or "results" not in data:
            msg = f"--bench: {args.bench!r} is not an `espresso bench-gpu --json` result"
            raise CatalogError(msg)
        name = args.gpu or data.get("catalog_gpu")
        if not name:
            msg = "calibrate: the bench result names no catalog GPU type; give --gpu NAME"
            raise CatalogError(msg)
        new, changes = calibrate.from_bench(catalog, data, name)
    else:
        prof = Profile.load(args.profile)
        new, changes = calibrate.from_profile(catalog, prof)
    Path(args.out).write_text(yaml.safe_dump(new.to_dict(), sort_keys=False))
    console = _console()
    for c in changes:
        console.print(f"  {escape(c)}")
    console.print(f"Wrote the calibrated catalog to {args.out}")
    return EXIT_OK


def _calibrate_cpu(args: argparse.Namespace) -> int:
    from . import calibrate

    if args.catalog or args.gpu:
        msg = "calibrate --cpu measures this machine and writes a new catalog; drop --catalog/--gpu"
        raise EspressoError(msg)
    require("torch")
    cost_out = args.cost_out or str(Path(args.out).with_name(Path(args.out).stem + "-cost.yaml"))
    with _console(stderr=True).status("Measuring this machine's CPU (gloo link, AdamW, matmul)"):
        catalog, cost = calibrate.measure_cpu(args.cores)
    g = catalog[calibrate.CPU_NAME]
    Path(args.out).write_text(
        "# Written by `espresso calibrate --cpu`: each core of this machine as one GPU of type "
        "CPU,\n# for rehearsing plans with `espresso launch --local` (one process per core).\n"
        + yaml.safe_dump(catalog.to_dict(), sort_keys=False))
    Path(cost_out).write_text(
        "# Written by `espresso calibrate --cpu`: fp32 training in gloo processes.\n"
        + yaml.safe_dump(cost.to_dict(only_changed=True), sort_keys=False))
    console = _console()
    console.print(f"  {g.count} cores as GPU type {g.name}, {g.memory_gb:g} GB each, price 1 "
                  "per core-hour")
    console.print(f"  matmul (fp32, 1 thread): {g.bf16_tflops * 1e3:.1f} GFLOP/s")
    console.print(f"  gloo link: {cost.link_latency_s * 1e6:.0f} us latency, "
                  f"{g.intra_node_gbs:.2f} GB/s")
    console.print(f"  AdamW step as {g.mem_bandwidth_gbs:.1f} GB/s of memory bandwidth")
    console.print(f"Wrote the catalog to {args.out} and the cost model to {cost_out}. Next:\n"
                  f"  espresso profile --model MODEL --gpu CPU --catalog {args.out} --threads 1 "
                  "--seq-len S --out cpu-prof.json\n"
                  f"  espresso plan --model MODEL --catalog {args.out} --cost-model {cost_out} "
                  "--profile CPU=cpu-prof.json --seq-len S ... --json plan.json")
    return EXIT_OK


# ---------------------------------------------------------------------- launch
def cmd_launch(args: argparse.Namespace) -> int:
    plan = Plan.from_json(args.plan)
    check_runnable(plan)  # refuse here, once, what every rank would refuse
    if args.local:
        # A dry rehearsal on this machine: one CPU process per GPU of the plan, gloo.
        require("torch")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={plan.num_gpus}", args.script, *shlex.split(args.script_args)]
        env = {**os.environ, "ESPRESSO_PLAN": str(args.plan), "CUDA_VISIBLE_DEVICES": ""}
        # Each process stands for one GPU: one thread each (as a profile with --threads 1),
        # unless the caller says otherwise.
        env.setdefault("OMP_NUM_THREADS", "1")
        print(f"running (OMP_NUM_THREADS={env['OMP_NUM_THREADS']}): "
              + " ".join(shlex.quote(c) for c in cmd), flush=True)
        return subprocess.call(cmd, env=env)
    if not args.hosts:
        msg = "launch: give --hosts FILE (or --local to rehearse on this machine)"
        raise LaunchError(msg)
    hosts = load_hosts(args.hosts)
    cmds = torchrun_commands(str(args.plan), plan, hosts, args.script,
                             master_port=args.port, script_args=args.script_args or "")
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for i, c in enumerate(cmds):
            path = out / f"node{i}.sh"
            path.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + c + "\n")
            path.chmod(0o755)
        print(f"wrote {len(cmds)} scripts to {out}/node*.sh")
    else:
        print("\n\n".join(cmds))
    return EXIT_OK


# ---------------------------------------------------------------------- main
def _add_cost_model_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--cost-model", metavar="FILE",
                   help=f"cost-model constants (YAML/JSON, docs/cost-model.md) {what}")


def _add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="append", metavar="GPU=FILE",
                   help="measured profile (espresso profile) replacing the analytic block "
                        "costs of GPU; repeatable")


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
    _add_profile_arg(p)
    _add_cost_model_arg(p, "replacing the plan's cost_model")
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser(
        "plan",
        help="the cheapest plan that meets a deadline",
        description="Search the cheapest plan (GPUs to rent, stages, layer split, dp, "
        "micro-batches) that meets the deadline, exact within the cost model. Exit status: 0 "
        "a plan, 1 no plan (the reason is printed), 2 bad input.",
    )
    p.add_argument("--model", help="preset name (espresso models), HF config.json, or model YAML")
    p.add_argument("--tokens", help="training tokens, e.g. 2e10 or 20B")
    p.add_argument("--iterations", help="optimizer steps (instead of --tokens)")
    p.add_argument("--deadline", help="wall-clock limit, e.g. 7d, 36h, 90m (a number: hours)")
    p.add_argument("--seq-len", type=int, help="sequence length (default 4096)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default 512)")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), help="default adam")
    p.add_argument("--job", metavar="FILE", help="job YAML/JSON; flags override its fields")
    p.add_argument("--catalog", metavar="FILE", help="catalog YAML/JSON (default: built-in)")
    p.add_argument("--json", metavar="OUT", help="write the plan (espresso.plan/1) to OUT")
    p.add_argument("--threads", type=int, help="search threads (default: all cores)")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="stop after S seconds with the best plan so far and its gap")
    p.add_argument("--budget", type=float, metavar="USD",
                   help="instead: the fastest plan whose total cost is within USD")
    p.add_argument("--top-k", type=int, default=1, help="also report the next best plans")
    p.add_argument("--max-stages", type=int, default=8, help="pipeline depth at most (8)")
    p.add_argument("--max-tp", type=int, default=8,
                   help="tensor-parallel width at most (default 8)")
    p.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the comparison with single-type plans")
    _add_profile_arg(p)
    _add_cost_model_arg(p, "instead of the defaults")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "profile",
        help="measure one block and the head of a model on this machine's device",
        description="Build the model (a preset, HF config.json or model YAML) as PyTorch "
        "modules, time one block's forward and backward and the head's (median after "
        "warm-up; CUDA events on a GPU) and count the activations a block keeps, and write a "
        "profile for GPU type --gpu. Needs the torch extra.",
    )
    p.add_argument("--model", required=True, help="preset name, HF config.json or model YAML")
    p.add_argument("--gpu", required=True, help="catalog GPU type the profile describes")
    p.add_argument("--out", required=True, metavar="FILE", help="profile JSON to write")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (1)")
    p.add_argument("--seq-len", type=int, default=2048, help="sequence length (2048)")
    p.add_argument("--device", help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="default bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (3)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs (10)")
    p.add_argument("--threads", type=int,
                   help="CPU threads for torch (default: torch's; 1 to match one process per "
                        "core under `launch --local`)")
    _add_cost_model_arg(p, "for the analytic column (default: the defaults)")
    p.add_argument("--catalog", metavar="FILE", help="catalog YAML/JSON (default: built-in)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser(
        "bench-gpu",
        help="measure this machine's GPU: memory bandwidth, bf16 matmul, host copies",
        description="Run the CUDA micro-benchmarks (each verified against a CPU reference "
        "first) and show measured GB/s and TFLOP/s next to the catalog's peak. Without a GPU "
        "(or without the CUDA module) it says so and exits 0; exit 1 if a kernel's output was "
        "wrong.",
    )
    p.add_argument("--device", type=int, default=0, help="CUDA device index (0)")
    p.add_argument("--gpu", help="catalog GPU type (default: matched from the device name)")
    p.add_argument("--catalog", metavar="FILE", help="catalog YAML/JSON (default: built-in)")
    p.add_argument("--quick", action="store_true", help="small sizes: seconds, rougher numbers")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON ('-': stdout)")
    p.set_defaults(func=cmd_bench_gpu)

    p = sub.add_parser(
        "calibrate",
        help="write measured rates (bench-gpu, a profile, or this CPU) into a catalog file",
        description="Set a GPU type's efficiency (and, from bench-gpu, memory bandwidth) from "
        "measurements, and write the catalog to --out for later plans (--catalog OUT). With "
        "--cpu: measure this machine and write a catalog in which each core is one GPU of "
        "type CPU, and a cost model for fp32 gloo processes (--cost-out), to rehearse and "
        "check plans with `espresso launch --local`.",
    )
    p.add_argument("--cpu", action="store_true",
                   help="measure this machine's CPU cores, gloo link and optimizer step")
    p.add_argument("--cores", type=int, help="with --cpu: GPUs in the catalog (default: cores)")
    p.add_argument("--cost-out", metavar="FILE",
                   help="with --cpu: cost model YAML to write (default: OUT's stem + -cost.yaml)")
    p.add_argument("--catalog", metavar="FILE", help="catalog to start from (default: built-in)")
    p.add_argument("--bench", metavar="FILE", help="`espresso bench-gpu --json` output")
    p.add_argument("--profile", metavar="FILE", help="`espresso profile` output")
    p.add_argument("--gpu", help="catalog GPU type the bench result is of (default: its match)")
    p.add_argument("--out", required=True, metavar="FILE", help="calibrated catalog YAML")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser(
        "launch",
        help="the torchrun command for every node of a plan",
        description="Map the plan's ranks onto hosts (address, GPU type, GPU count) and print "
        "the torchrun command of each node, or write one script per node.",
    )
    p.add_argument("plan", help="plan JSON file")
    p.add_argument("--local", action="store_true",
                   help="rehearse here: one CPU process per GPU of the plan, gloo")
    p.add_argument("--hosts", metavar="FILE",
                   help="YAML: hosts: [{address: 10.0.0.1, gpu: A100-80GB, gpus: 8}, ...]")
    p.add_argument("--script", default="train.py", help="training script (default train.py)")
    p.add_argument("--script-args", default="", help="arguments for the script")
    p.add_argument("--port", type=int, default=29500, help="process-group port on the first host")
    p.add_argument("--out-dir", metavar="DIR", help="write node<i>.sh scripts instead")
    p.set_defaults(func=cmd_launch)
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
