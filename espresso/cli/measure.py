"""``espresso profile``, ``espresso bench-gpu`` and ``espresso calibrate``: measurements."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.table import Table

from .. import _io
from .._optional import require
from .._validate import load_yaml
from ..cost import CostParams
from ..errors import CatalogError, EspressoError
from ..model import ModelSpec
from ..profile import Profile
from . import _common as c


def cmd_profile(args: argparse.Namespace) -> int:
    from ..profile import profile_model

    c.check_output("--out", args.out)
    catalog = c.load_catalog(args.catalog, getattr(args, "network_gbs", None))
    gpu = catalog.model_row(args.gpu)
    model = ModelSpec.load(args.model)
    from ..profile import LIMITS, resolve_device

    for flag, name, val in (("--micro-batch", "micro_batch_size", args.micro_batch),
                            ("--seq-len", "seq_len", args.seq_len),
                            ("--warmup", "warmup", args.warmup),
                            ("--repeats", "repeats", args.repeats)):
        lo, hi = LIMITS[name]
        if not lo <= val <= hi:
            msg = f"profile: {flag} {val} is out of range; expected {lo} to {hi:,}"
            raise EspressoError(msg)
    torch = require("torch")
    resolve_device(torch, args.device)  # a device this machine lacks, refused before the work
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             None: None}[args.dtype]
    if args.threads is not None:
        if not 1 <= args.threads <= 4096:
            msg = f"profile: --threads {args.threads} is out of range; expected 1 to 4096"
            raise EspressoError(msg)
        torch.set_num_threads(args.threads)
    cost = c.load_cost_model(args.cost_model) or CostParams()
    console = c.console(stderr=True)
    with console.status(f"Profiling {model.name} on {args.device or 'the default device'}") as st:
        prof = profile_model(model, gpu=gpu.model, micro_batch_size=args.micro_batch,
                             seq_len=args.seq_len, device=args.device, dtype=dtype,
                             warmup=args.warmup, repeats=args.repeats,
                             progress=lambda m: st.update(f"Profiling {model.name}: {m}"))
    prof.to_json(args.out)
    factors = prof.factors(model, gpu, cost)
    out = c.console()
    out.print(f"[bold]{escape(model.name)}[/]: one block and the head, micro-batch "
              f"{prof.micro_batch_size} x seq {prof.seq_len}, {prof.dtype} on {prof.device} "
              f"({prof.meta.get('threads', '?')} threads), median of {prof.repeats}")
    table = Table("part", "measured", f"analytic ({gpu.model})", "measured / analytic")
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
              f"`espresso plan ... --profile {gpu.model}={args.out}`")
    return c.EXIT_OK


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from .. import gpu as gpu_bench

    c.check_output("--json", args.json)
    console = c.console(stderr=args.json == "-")
    info = gpu_bench.status(args.device)
    if not info.get("available"):
        console.print(f"No CUDA GPU to benchmark: {escape(str(info.get('error')))}. Nothing "
                      "measured.")
        if args.json:
            c.write_json("--json", args.json, {"device": info, "results": []})
        return c.EXIT_OK
    catalog = c.load_catalog(args.catalog, getattr(args, "network_gbs", None))
    gpu = (catalog.model_row(args.gpu) if args.gpu
           else gpu_bench.match_catalog(info["name"], catalog))
    with c.console(stderr=True).status(f"Benchmarking {info['name']}"):
        out = gpu_bench.run(args.device, quick=args.quick)
    out["catalog_gpu"] = gpu.model if gpu else None
    if args.json:
        c.write_json("--json", args.json, out)
        if args.json == "-":
            return c.EXIT_OK
    console.print(f"[bold]{escape(info['name'])}[/] (compute {info['compute_capability']}, "
                  f"{info['sms']} SMs, {info['memory_gb']:.0f} GB); catalog type: "
                  f"{gpu.model if gpu else 'none matched (give --gpu)'}")
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
        return c.EXIT_INFEASIBLE
    return c.EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .. import calibrate

    c.check_output("--out", args.out)
    if sum(map(bool, (args.bench, args.profile, args.cpu, args.from_run))) != 1:
        msg = ("calibrate: give exactly one of --bench FILE, --profile FILE, --cpu or "
               "--from-run METRICS")
        raise EspressoError(msg)
    if args.cpu:
        return _calibrate_cpu(args)
    if args.from_run:
        return _calibrate_from_run(args)
    if args.plan or args.cost_model:
        msg = "calibrate: --plan and --cost-model go with --from-run"
        raise EspressoError(msg)
    if args.cost_out or args.cores is not None:
        msg = "calibrate: --cost-out and --cores go with --cpu"
        raise EspressoError(msg)
    catalog = c.load_catalog(args.catalog, getattr(args, "network_gbs", None))
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
    _io.write_text("--out", args.out, yaml.safe_dump(new.to_dict(), sort_keys=False))
    console = c.console()
    for change in changes:
        console.print(f"  {escape(change)}")
    console.print(f"Wrote the calibrated catalog to {args.out}")
    return c.EXIT_OK


def _calibrate_from_run(args: argparse.Namespace) -> int:
    from .. import calibrate
    from ..plan import Plan
    from ..train.metrics import read_metrics

    if args.gpu or args.cost_out or args.cores is not None:
        msg = "calibrate --from-run fits the cost model: drop --gpu, --cost-out and --cores"
        raise EspressoError(msg)
    run = read_metrics(args.from_run)
    plan_path = args.plan or run.header.get("plan")
    if not plan_path:
        msg = "calibrate: the metrics name no plan; give --plan PLAN"
        raise EspressoError(msg)
    plan = Plan.from_json(plan_path)
    catalog = (c.load_catalog(args.catalog, getattr(args, "network_gbs", None))
               if args.catalog else None)
    cost, changes = calibrate.from_run(plan, run, catalog, c.load_cost_model(args.cost_model))
    h = run.header
    _io.write_text("--out", args.out,
        f"# Written by `espresso calibrate --from-run {args.from_run}`: the cost model fitted "
        f"to a run of\n# {plan_path} (engine {h.get('engine', 'espresso')}, "
        f"{h.get('device_name')}, {h.get('precision')}). Use it with\n"
        "# `espresso plan --cost-model THIS_FILE ...`.\n"
        + yaml.safe_dump(cost.to_dict(only_changed=True), sort_keys=False))
    console = c.console()
    for change in changes:
        console.print(f"  {escape(change)}")
    console.print(f"Wrote the cost model to {args.out}; plan with it: espresso plan "
                  f"--cost-model {args.out} ...")
    return c.EXIT_OK


def _calibrate_cpu(args: argparse.Namespace) -> int:
    from .. import calibrate

    if args.catalog or args.gpu:
        msg = "calibrate --cpu measures this machine and writes a new catalog; drop --catalog/--gpu"
        raise EspressoError(msg)
    require("torch")
    cost_out = args.cost_out or str(Path(args.out).with_name(Path(args.out).stem + "-cost.yaml"))
    c.check_output("--cost-out", cost_out)
    with c.console(stderr=True).status("Measuring this machine's CPU (gloo link, AdamW, matmul)"):
        catalog, cost = calibrate.measure_cpu(args.cores)
    g = catalog[calibrate.CPU_NAME]
    _io.write_text("--out", args.out,
        "# Written by `espresso calibrate --cpu`: each core of this machine as one GPU of type "
        "CPU,\n# for rehearsing plans with `espresso launch --local` (one process per core).\n"
        + yaml.safe_dump(catalog.to_dict(), sort_keys=False))
    _io.write_text("--cost-out", cost_out,
        "# Written by `espresso calibrate --cpu`: fp32 training in gloo processes.\n"
        + yaml.safe_dump(cost.to_dict(only_changed=True), sort_keys=False))
    console = c.console()
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
    return c.EXIT_OK


def register(sub: Any) -> None:
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
    c.add_cost_model_arg(p, "for the analytic column (default: the defaults)")
    c.add_catalog_arg(p)
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
    c.add_catalog_arg(p)
    p.add_argument("--quick", action="store_true", help="small sizes: seconds, rougher numbers")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON ('-': stdout)")
    p.set_defaults(func=cmd_bench_gpu)

    p = sub.add_parser(
        "calibrate",
        help="write measured rates (bench-gpu, a profile, or this CPU) into a catalog file",
        description="Set a GPU type's efficiency (and, from bench-gpu, memory bandwidth) from "
        "measurements, and write the catalog to --out for later plans (--catalog OUT). With "
        "--from-run: fit the cost model to a training run (espresso train's metrics.jsonl) "
        "and write it to --out (espresso plan --cost-model OUT). With "
        "--cpu: measure this machine and write a catalog in which each core is one GPU of "
        "type CPU, and a cost model for fp32 gloo processes (--cost-out), to rehearse and "
        "check plans with `espresso launch --local`.",
    )
    p.add_argument("--cpu", action="store_true",
                   help="measure this machine's CPU cores, gloo link and optimizer step")
    p.add_argument("--cores", type=int, help="with --cpu: GPUs in the catalog (default: cores)")
    p.add_argument("--cost-out", metavar="FILE",
                   help="with --cpu: cost model YAML to write (default: OUT's stem + -cost.yaml)")
    c.add_catalog_arg(p, "to start from; default: built-in")
    p.add_argument("--bench", metavar="FILE", help="`espresso bench-gpu --json` output")
    p.add_argument("--profile", metavar="FILE", help="`espresso profile` output")
    p.add_argument("--gpu", help="catalog GPU type the bench result is of (default: its match)")
    p.add_argument("--from-run", metavar="METRICS",
                   help="metrics.jsonl of `espresso train`: fit the cost model's "
                        "sustained_fraction to the run's step time and write the cost model "
                        "to --out")
    p.add_argument("--plan", metavar="FILE",
                   help="with --from-run: the run's plan (default: the one its metrics name)")
    c.add_cost_model_arg(p, "to start from, with --from-run (default: the plan's)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="calibrated catalog YAML (with --from-run: cost-model YAML)")
    p.set_defaults(func=cmd_calibrate)
