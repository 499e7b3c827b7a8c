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
from pathlib import Path

import torch

import espresso as es
from espresso import calibrate
from espresso.profile import profile_model

ROOT = Path(__file__).parents[1]
MODEL = es.ModelSpec(name="cpu-gpt", num_layers=8, hidden_size=512, num_heads=8,
                     ffn_hidden_size=2048, vocab_size=4096, gated_mlp=False, norm="layernorm")
SEQ, MB = 128, 1


def plans(cost: es.CostParams) -> list[tuple[str, es.Plan]]:
    job = es.Job(model=MODEL, seq_len=SEQ, global_batch_size=8, iterations=1000,
                 deadline_hours=1e6)

    def mk(stages: list[tuple[int, int]], dp: int, schedule: str) -> es.Plan:
        return es.Plan(job=job, stages=tuple(es.Stage(gpu="CPU", layers=s) for s in stages),
                       dp=dp, micro_batch_size=MB, num_microbatches=8 // (dp * MB),
                       schedule=schedule, cost_model=cost)

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
    lat, bw = calibrate.measure_link()
    cost = calibrate.cpu_cost_model(lat)  # fp32: 4-byte weights, gradients, activations
    mem_bw = calibrate.measure_optimizer_gbs(MODEL.num_params // 2, cost)
    torch.set_num_threads(1)
    prof = profile_model(MODEL, gpu="CPU", seq_len=SEQ, micro_batch_size=MB, warmup=3,
                         repeats=15)
    print(f"gloo link: {lat * 1e6:.0f} us latency, {bw:.2f} GB/s; AdamW as {mem_bw:.1f} GB/s; "
          f"profile (1 thread): block {prof.block_fwd_s * 1e3:.1f} + {prof.block_bwd_s * 1e3:.1f}"
          f" ms, head {prof.head_fwd_s * 1e3:.1f} + {prof.head_bwd_s * 1e3:.1f} ms")
    # Up to 8 processes (the profile replaces the analytic compute, so the matmul rate only
    # matters for parts no profile covers).
    catalog = calibrate.cpu_catalog(cores=8, memory_gb=20, tflops=calibrate.measure_matmul_tflops(),
                                    mem_gbs=mem_bw, link_gbs=bw)
    rows = []
    for i, (name, plan) in enumerate(plans(cost)):
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
