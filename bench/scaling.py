"""Scaling curve of the search: GPU types (4 -> 64) x transformer blocks (24 -> 80).

Run: python bench/scaling.py [--time-limit S] [--out bench/scaling.md]
For each cell: seconds, nodes expanded, allocations placed, whether the optimum was proven
(gap 0), and the number of plans a brute force would estimate over the same space (ordered
stage sequences x layer splits x (recompute, micro-batch, dp) combinations, ignoring
availability, so an upper estimate).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_bench_search import catalog_64

import espresso as es


def widths(model: es.ModelSpec, g: es.GpuType, max_tp: int = 8) -> int:
    n, w = 0, 1
    while w <= min(g.gpus_per_node, max_tp):
        if model.num_heads % w == 0 and model.ffn % w == 0 and (
                model.kv_heads % w == 0 or w % model.kv_heads == 0):
            n += 1
        w *= 2
    return n


def space_size(job: es.Job, catalog: es.Catalog, max_stages: int, mbs: tuple[int, ...]) -> float:
    groups = sum(widths(job.model, g) for g in catalog if g.count > 0)
    B, L = job.global_batch_size, job.model.num_layers
    combos = 0
    for b in mbs:
        if B % b == 0:
            combos += sum(1 for dp in range(1, B // b + 1) if (B // b) % dp == 0)
    combos *= 2  # recomputation none / full
    seqs = sum(groups**p * math.comb(L - 1, p - 1) for p in range(1, min(max_stages, L) + 1))
    return combos * seqs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    full = catalog_64()
    rows = ["| types | blocks | seconds | nodes expanded | allocations placed | proven | best USD "
            "| brute-force plans |",
            "|---:|---:|---:|---:|---:|---|---:|---:|"]
    for n_types in (4, 16, 64):
        cat = es.Catalog(gpus=full.gpus[:n_types])
        for layers in (24, 48, 80):
            model = es.ModelSpec(name=f"llama-{layers}", num_layers=layers, hidden_size=4096,
                                 num_heads=32, num_kv_heads=8, ffn_hidden_size=11008,
                                 vocab_size=32000, gated_mlp=True)
            job = es.Job(model=model, seq_len=4096, global_batch_size=512, tokens=5 * 10**10,
                         deadline_hours=24 * 14)
            r = es.search(job, cat, threads=2, time_limit_s=args.time_limit)
            s = r.stats
            best = f"{r.plans[0].estimate.total_usd:,.0f}" if r.plans else "-"  # type: ignore[union-attr]
            proven = "yes" if s.complete and r.plans else ("no plan" if s.complete else
                                                           f"no (gap {s.gap:.1%})")
            rows.append(f"| {n_types} | {layers} | {s.seconds:.2f} | {s.nodes_expanded:,} | "
                        f"{s.leaves_placed:,} | {proven} | {best} | "
                        f"{space_size(job, cat, 8, (1, 2, 4, 8)):.2e} |")
            print(rows[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
