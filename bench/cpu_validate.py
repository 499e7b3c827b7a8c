"""The estimator against real runs on this machine's CPU (gloo), with measured profiles.

    python bench/cpu_validate.py [--steps 8] [--json OUT]

1. Measure what the cost model needs from this machine: a gloo point-to-point latency and
   bandwidth between two processes (ping-pong at two sizes), and the time of an AdamW step
   (as the memory bandwidth the optimizer-step formula implies).
2. Profile one block and the head of the model on one CPU thread (as each torchrun worker
   gets) with ``espresso.profile``.
3. Build a one-type catalog "CPU" from those numbers, run the PyTorch runner
   (``espresso.torch``) under several plans with ``torchrun --standalone``, and compare the
   median step time with ``estimate()``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import espresso as es
from espresso.profile import profile_model

ROOT = Path(__file__).parents[1]
MODEL = es.ModelSpec(name="cpu-gpt", num_layers=8, hidden_size=512, num_heads=8,
                     ffn_hidden_size=2048, vocab_size=4096, gated_mlp=False, norm="layernorm")
SEQ, MB = 128, 1
# fp32 on the CPU: 4 bytes per weight, gradient and activation message.
COST = dict(bytes_per_weight=4.0, bytes_per_grad=4.0, bytes_per_activation=4.0,
            link_efficiency=1.0, reserved_gb=0.0)


def _pingpong(rank: int, port: int, sizes: list[int], out: str) -> None:
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
    dist.destroy_process_group()


def measure_link() -> tuple[float, float]:
    """(latency s, bandwidth GB/s) of one gloo message on loopback."""
    small, big = 4 << 10, 32 << 20
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "pp.json")
        torch.multiprocessing.spawn(_pingpong, args=(29611, [small, big], out), nprocs=2)
        res = {int(k): v for k, v in json.loads(Path(out).read_text()).items()}
    bw = (big - small) / (res[big] - res[small]) / 1e9
    lat = max(1e-7, res[small] - small / (bw * 1e9))
    return lat, bw


def measure_optimizer(params: int) -> float:
    """Memory bandwidth (GB/s) at which the cost model's optimizer-step formula (28 bytes per
    parameter at memory_bandwidth_efficiency 0.8) gives the measured AdamW step."""
    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.zeros(params))
    p.grad = torch.ones(params)
    opt = torch.optim.AdamW([p], lr=1e-3)
    for _ in range(3):
        opt.step()
    t0 = time.perf_counter()
    for _ in range(10):
        opt.step()
    t = (time.perf_counter() - t0) / 10
    return params * 28.0 / (t * 0.8) / 1e9


def plans() -> list[tuple[str, es.Plan]]:
    job = es.Job(model=MODEL, seq_len=SEQ, global_batch_size=8, iterations=1000,
                 deadline_hours=1e6)

    def mk(stages: list[tuple[int, int]], dp: int, schedule: str) -> es.Plan:
        return es.Plan(job=job, stages=tuple(es.Stage(gpu="CPU", layers=s) for s in stages),
                       dp=dp, micro_batch_size=MB, num_microbatches=8 // (dp * MB),
                       schedule=schedule, cost_model=es.CostParams(**COST))  # type: ignore[arg-type]

    return [
        ("pp 2, uneven [0,3)+[3,8), 1F1B, M 8", mk([(0, 3), (3, 8)], 1, "1f1b")),
        ("pp 2, [0,4)+[4,8), GPipe, M 8", mk([(0, 4), (4, 8)], 1, "gpipe")),
        ("dp 2, one stage, M 4", mk([(0, 8)], 2, "1f1b")),
        ("pp 2 x dp 2, 1F1B, M 4 (4 processes on 2 cores)", mk([(0, 4), (4, 8)], 2, "1f1b")),
    ]


def run_plan(plan: es.Plan, steps: int, port: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        pj, out = Path(d) / "plan.json", Path(d) / "times.json"
        plan.to_json(pj)
        env = {**os.environ, "ESPRESSO_PLAN": str(pj), "ESPRESSO_TIMES": str(out),
               "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={plan.num_gpus}", f"--master-port={port}",
               str(ROOT / "bench" / "_cpu_worker.py"), "--steps", str(steps)]
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=900)
        times = json.loads(out.read_text())
    return float(statistics.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8, help="timed steps per plan (after 3)")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON")
    args = ap.parse_args()
    lat, bw = measure_link()
    mem_bw = measure_optimizer(MODEL.num_params // 2)
    torch.set_num_threads(1)
    prof = profile_model(MODEL, gpu="CPU", seq_len=SEQ, micro_batch_size=MB, warmup=3,
                         repeats=15)
    print(f"gloo link: {lat * 1e6:.0f} us latency, {bw:.2f} GB/s; AdamW as {mem_bw:.1f} GB/s; "
          f"profile (1 thread): block {prof.block_fwd_s * 1e3:.1f} + {prof.block_bwd_s * 1e3:.1f}"
          f" ms, head {prof.head_fwd_s * 1e3:.1f} + {prof.head_bwd_s * 1e3:.1f} ms")
    catalog = es.Catalog(gpus=(es.GpuType(
        name="CPU", memory_gb=20, bf16_tflops=0.05, mem_bandwidth_gbs=mem_bw,
        price_per_hour=1.0, count=8, gpus_per_node=8, intra_node_gbs=bw, inter_node_gbs=bw),))
    rows = []
    for i, (name, plan) in enumerate(plans()):
        plan = es.Plan.from_dict({**plan.to_dict(), "cost_model": {
            **COST, "link_latency_s": lat}})
        est = es.estimate(plan, catalog, profiles={"CPU": prof})
        # More processes than cores: each gets a share of one; the profile had a whole core.
        share = max(1.0, plan.num_gpus / (os.cpu_count() or 1))
        shared = es.estimate(plan, catalog, profiles={"CPU": prof.scaled(share)})
        measured = run_plan(plan, args.steps, 29700 + i)
        err = (est.iteration_s - measured) / measured
        rows.append({"plan": name, "processes": plan.num_gpus, "estimate_s": est.iteration_s,
                     "measured_s": measured, "error": err,
                     "estimate_shared_cores_s": shared.iteration_s})
        extra = (f"  (compute x{share:g} for {plan.num_gpus} processes on {os.cpu_count()} "
                 f"cores: {shared.iteration_s:.3f} s, "
                 f"{(shared.iteration_s - measured) / measured:+.1%})" if share > 1 else "")
        print(f"{name:52s} estimate {est.iteration_s:7.3f} s  measured {measured:7.3f} s  "
              f"error {err:+.1%}{extra}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"link_latency_s": lat, "link_gbs": bw,
                                               "mem_gbs": mem_bw, "profile": prof.to_dict(),
                                               "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
