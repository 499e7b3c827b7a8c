"""Write measured rates into a catalog (``espresso calibrate``), so later plans use them.

* From ``espresso bench-gpu --json``: ``efficiency`` becomes the measured bf16 matrix-multiply
  rate over the catalog's dense peak, and ``mem_bandwidth_gbs`` the measured triad bandwidth
  divided by the cost model's ``memory_bandwidth_efficiency``, so that the bandwidth the model
  achieves (peak x that efficiency) equals the measurement.
* From a profile (``espresso profile``): ``efficiency`` becomes the matmul efficiency at which
  the cost model's block time (forward + backward at the profiled shape: matmuls, attention,
  memory-bound work) equals the measured one, found by bisection. (A profile can also be used
  as it is, with ``--profile``, which keeps forward, backward, head and memory apart.)
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ._native import core
from ._optional import require
from .catalog import Catalog, GpuType
from .cost import CostParams
from .errors import CatalogError
from .model import ModelSpec
from .profile import Profile, _timer, shape_workload


def _with(catalog: Catalog, gpu: GpuType) -> Catalog:
    """The catalog with the calibrated spec fields of ``gpu`` on every row of its model
    (a GPU model is the same wherever it is rented)."""
    return Catalog(gpus=tuple(
        replace(g, efficiency=gpu.efficiency, mem_bandwidth_gbs=gpu.mem_bandwidth_gbs)
        if g.model == gpu.model else g for g in catalog), notes=catalog.notes)


def _efficiency(name: str, value: float, what: str) -> float:
    if not 0 < value <= 1:
        msg = (f"{name}: the measured {what} implies an efficiency of {value:.3g} of the "
               "catalog's peak; expected within (0, 1]: is bf16_tflops right for this GPU?")
        raise CatalogError(msg)
    return value


def from_bench(catalog: Catalog, bench: dict[str, Any], gpu: str,
               cost: CostParams | None = None) -> tuple[Catalog, list[str]]:
    """The catalog with ``gpu`` calibrated from a bench-gpu result; and what changed."""
    cost = cost or CostParams()
    g = catalog.model_row(gpu)
    by_name = {r["name"]: r for r in bench.get("results", [])}
    changes: list[str] = []
    new = g
    if "gemm_bf16" in by_name and by_name["gemm_bf16"].get("verified"):
        tflops = float(by_name["gemm_bf16"]["rate"])
        eff = _efficiency(gpu, tflops / g.bf16_tflops, f"{tflops:.1f} TFLOP/s")
        changes.append(f"efficiency {g.efficiency} -> {eff:.4f} ({tflops:.1f} of "
                       f"{g.bf16_tflops:g} TFLOP/s)")
        new = replace(new, efficiency=round(eff, 4))
    if "triad" in by_name and by_name["triad"].get("verified"):
        gbs = float(by_name["triad"]["rate"])
        bw = gbs / cost.memory_bandwidth_efficiency
        changes.append(f"mem_bandwidth_gbs {g.mem_bandwidth_gbs:g} -> {bw:.0f} (triad "
                       f"{gbs:.0f} GB/s / memory_bandwidth_efficiency "
                       f"{cost.memory_bandwidth_efficiency:g})")
        new = replace(new, mem_bandwidth_gbs=round(bw, 1))
    if not changes:
        msg = "the bench-gpu result has no verified gemm_bf16 or triad measurement"
        raise CatalogError(msg)
    return _with(catalog, new), changes


def from_profile(catalog: Catalog, profile: Profile,
                 cost: CostParams | None = None) -> tuple[Catalog, list[str]]:
    """The catalog with the profile's GPU type calibrated from its block times: the matmul
    efficiency at which the cost model's block forward + backward at the profiled shape
    takes what the profile measured (found by bisection: the time falls as it rises)."""
    cost = cost or CostParams()
    g = catalog.model_row(profile.gpu)
    model = ModelSpec.from_dict(profile.model)
    dims, params = model._dims(), cost._core()
    w = shape_workload(profile.seq_len, profile.micro_batch_size)
    measured = profile.block_fwd_s + profile.block_bwd_s

    def block_s(eff: float) -> float:
        t = core.block_times(dims, replace(g, efficiency=eff)._spec(), params, w, 1)
        return float(t.fwd + t.bwd)

    if block_s(1.0) > measured:
        msg = (f"{g.name}: the profile's block ({measured:.3g} s) is faster than the cost model "
               f"allows at 100% of {g.bf16_tflops:g} TFLOP/s; is bf16_tflops right for this "
               "GPU?")
        raise CatalogError(msg)
    lo, hi = 1e-6, 1.0  # block_s(lo) >= measured >= block_s(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if block_s(mid) > measured else (lo, mid)
    eff = _efficiency(g.name, hi, "block time")
    flops = core.block_fwd_flops(dims, profile.seq_len, profile.micro_batch_size)
    achieved = 3 * flops / measured
    changes = [f"efficiency {g.efficiency} -> {eff:.4g} ({achieved / 1e12:.2f} of "
               f"{g.bf16_tflops:g} TFLOP/s in {model.name}'s blocks on {profile.device})"]
    return _with(catalog, replace(g, efficiency=float(f"{eff:.6g}"))), changes


# ---------------------------------------------------------------------- this machine's CPU
# A catalog in which each CPU core stands for one GPU, so that a plan can be rehearsed with
# `espresso launch --local` (one gloo process per "GPU", one thread each) and its estimate
# compared with the run. Needs the torch extra.

CPU_NAME = "CPU"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pingpong(rank: int, port: int, sizes: list[int], out: str) -> None:
    """One side of a gloo ping-pong (a torch.multiprocessing.spawn target)."""
    torch = require("torch")
    dist = torch.distributed
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    res = {}
    for n in sizes:
        t = torch.zeros(n // 4)
        times = []
        for i in range(40):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            if i >= 5:
                times.append((time.perf_counter() - t0) / 2)
        res[n] = min(times)  # the noise of a shared machine only adds
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def measure_link() -> tuple[float, float]:
    """(latency s, bandwidth GB/s) of one gloo message between two local processes: the
    minimum of 35 ping-pongs at 4 KiB and at 32 MiB, a line through the two."""
    torch = require("torch")
    small, big = 4 << 10, 32 << 20
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "pingpong.json")
        torch.multiprocessing.spawn(_pingpong, args=(_free_port(), [small, big], out),
                                    nprocs=2)
        res = {int(k): float(t) for k, t in json.loads(Path(out).read_text()).items()}
    bw = (big - small) / max(res[big] - res[small], 1e-9) / 1e9
    lat = max(1e-7, res[small] - small / (bw * 1e9))
    return lat, bw


def _best_seconds(fn: Callable[[], Any], *, warmup: int, repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``fn`` on one torch thread, after ``warmup`` (the
    noise of a shared machine only adds)."""
    torch = require("torch")
    timer = _timer(torch, torch.device("cpu"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(warmup):
            fn()
        return min(timer(fn) for _ in range(repeats))
    finally:
        torch.set_num_threads(threads)


def measure_optimizer_gbs(params: int = 4_000_000, cost: CostParams | None = None) -> float:
    """The memory bandwidth (GB/s) at which the cost model's optimizer-step formula
    (``optimizer_step_bytes_per_param`` at ``memory_bandwidth_efficiency``) gives the measured
    time of one AdamW step over ``params`` fp32 parameters on one thread."""
    torch = require("torch")
    cost = cost or CostParams()
    p = torch.nn.Parameter(torch.zeros(params))
    p.grad = torch.ones(params)
    t = _best_seconds(torch.optim.AdamW([p], lr=1e-3).step, warmup=3, repeats=15)
    return params * cost.optimizer_step_bytes_per_param / (
        t * cost.memory_bandwidth_efficiency) / 1e9


def measure_matmul_tflops(n: int = 512) -> float:
    """fp32 TFLOP/s of an n x n matrix product on one thread (best of 10): the "peak" of a
    CPU core in the catalog."""
    torch = require("torch")
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best_seconds(lambda: a @ b, warmup=2, repeats=10) / 1e12


def cpu_cost_model(link_latency_s: float) -> CostParams:
    """The cost model for fp32 training on CPU processes: 4-byte weights, gradients and
    activations, the measured message latency, links at their measured (not nominal) rate,
    and no memory reserved for a CUDA context."""
    return CostParams(bytes_per_weight=4.0, bytes_per_grad=4.0, bytes_per_activation=4.0,
                      link_efficiency=1.0, reserved_gb=0.0, link_latency_s=link_latency_s)


def cpu_catalog(*, cores: int, memory_gb: float, tflops: float, mem_gbs: float,
                link_gbs: float) -> Catalog:
    """A one-type catalog: ``cores`` "GPUs" of type ``CPU`` on one node, each with its share
    of the memory, priced at 1 per core-hour."""
    return Catalog(gpus=(GpuType(
        name=CPU_NAME, memory_gb=memory_gb, bf16_tflops=tflops, mem_bandwidth_gbs=mem_gbs,
        price_per_hour=1.0, count=cores, gpus_per_node=cores, intra_node_gbs=link_gbs,
        inter_node_gbs=link_gbs, efficiency=1.0),))


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return 8e9


def measure_cpu(cores: int | None = None) -> tuple[Catalog, CostParams]:
    """Measure this machine (gloo link, AdamW step, one-thread matmul) and return the CPU
    catalog and its cost model."""
    n = (os.cpu_count() or 1) if cores is None else cores
    if not 1 <= n <= 4096:
        msg = f"calibrate: --cores {n} is out of range; expected 1 to 4096"
        raise CatalogError(msg)
    lat, link = measure_link()
    cost = cpu_cost_model(lat)
    cat = cpu_catalog(cores=n, memory_gb=round(_memory_bytes() / 1e9 / n, 2),
                      tflops=round(measure_matmul_tflops(), 4),
                      mem_gbs=round(measure_optimizer_gbs(cost=cost), 2),
                      link_gbs=round(link, 3))
    return cat, cost


# ---------------------------------------------------------------------- from a training run
def from_run(plan: Any, run: Any, catalog: Catalog | None = None,
             cost: CostParams | None = None, *, skip: int = 2) -> tuple[CostParams, list[str]]:
    """The cost model refitted to a training run of ``plan`` (``espresso train``'s
    ``metrics.jsonl``, read as :class:`espresso.train.metrics.RunMetrics`): the
    ``sustained_fraction`` (the fraction of the matmul benchmark's rate that the engine's
    training step sustains) at which the estimate's iteration time equals the run's median
    step time, found by bisection (the time falls as it rises). Everything else is kept: the
    run is one equation, so it fits one constant, the engine's."""
    from .estimate import estimate

    h = run.header
    gpus = sorted({s.gpu for s in plan.stages})
    if h.get("reference"):
        msg = "calibrate: a --reference run does not run the plan; give a run of the plan"
        raise CatalogError(msg)
    if h.get("device") == "cpu" and gpus != ["CPU"]:
        msg = (f"calibrate: the run was a CPU rehearsal of a plan for {', '.join(gpus)}: its "
               "times say nothing about those GPUs (calibrate a CPU plan, made on the "
               "catalog of `espresso calibrate --cpu`, or a run on the plan's GPUs)")
        raise CatalogError(msg)
    timed = run.timed(skip) or run.timed(0)
    if not timed:
        msg = f"calibrate: {run.path} has no completed step"
        raise CatalogError(msg)
    measured = sorted(s["step_s"] for s in timed)[len(timed) // 2]
    base = cost or plan.cost_model or CostParams()

    def iteration_s(frac: float) -> float:
        est = estimate(plan, catalog, cost_model=replace(base, sustained_fraction=frac))
        return float(est.iteration_s)

    fastest = iteration_s(1.0)
    if fastest > measured:
        msg = (f"calibrate: the run's step ({measured:.4g} s) is faster than the cost model "
               f"allows even at sustained_fraction 1 ({fastest:.4g} s): its other constants "
               "(the GPUs' efficiency and peak, links) are off; calibrate those first "
               "(--bench or --profile)")
        raise CatalogError(msg)
    lo, hi = 1e-4, 1.0  # iteration_s(lo) >= measured >= iteration_s(hi), when reachable
    if iteration_s(lo) < measured:
        msg = (f"calibrate: the run's step ({measured:.4g} s) is slower than the cost model "
               "gives at any compute rate: its time goes to what sustained_fraction does not "
               "scale (communication, the optimizer); check the links and the run")
        raise CatalogError(msg)
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if iteration_s(mid) > measured else (lo, mid)
    frac = float(f"{hi:.4g}")
    before = iteration_s(base.sustained_fraction)
    engine = h.get("engine", "espresso")
    changes = [f"sustained_fraction {base.sustained_fraction:g} -> {frac:g}: iteration "
               f"{before:.4g} s predicted, {measured:.4g} s measured (median of "
               f"{len(timed)} steps) for engine {engine} on {h.get('device_name')} "
               f"({', '.join(gpus)})"]
    return replace(base, sustained_fraction=frac), changes
