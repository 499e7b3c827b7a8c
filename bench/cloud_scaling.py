"""Scaling of the search over the number of cloud offers.

Run: python bench/cloud_scaling.py [--time-limit S] [--out FILE]
(ESPRESSO_BENCH_SNAPSHOT=FILE: on another snapshot file, as bench/test_bench_cloud.py)

llama2-70b, 1e11 tokens, 20 days, at most two instances per offer (as in
bench/test_bench_cloud.py), over growing parts of the built-in snapshot: one region, one
provider, two providers, the GPU clouds of issue 30, all of it; and random subsets of N offers
(seeded). For each: offers,
(domain, vendor) subproblems and those searched, seconds, whether proven (gap), best plan.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_bench_cloud import JOB, check, snapshot

import espresso as es


def subset(cat: es.Catalog, keep: Callable[[es.GpuType], bool]) -> es.Catalog:
    return es.Catalog(gpus=tuple(g for g in cat.gpus if keep(g)), notes=cat.notes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    full = snapshot(2)
    rng = random.Random(0)
    cases: list[tuple[str, es.Catalog]] = [
        ("aws us-east-1", subset(full, lambda g: g.provider == "aws" and g.region == "us-east-1")),
        ("lambda (all regions)", subset(full, lambda g: g.provider == "lambda")),
        ("gcp (all regions)", subset(full, lambda g: g.provider == "gcp")),
        ("aws (all regions)", subset(full, lambda g: g.provider == "aws")),
        ("aws + gcp", subset(full, lambda g: g.provider in ("aws", "gcp"))),
    ]
    gpu_clouds = ("vast", "shadeform", "nebius", "cudo", "hyperbolic")  # (issue 30)
    if any(g.provider in gpu_clouds for g in full.gpus):
        cases.append(("the five GPU clouds", subset(full, lambda g: g.provider in gpu_clouds)))
    for n in (100, 200, 400):
        keep = set(rng.sample(range(len(full.gpus)), n))
        cases.append((f"random {n}", es.Catalog(
            gpus=tuple(g for i, g in enumerate(full.gpus) if i in keep), notes=full.notes)))
    cases.append(("whole snapshot", full))
    rows = ["| offers | catalog | subproblems (searched) | seconds | proven | best plan |",
            "|---:|---|---:|---:|---|---|"]
    for name, cat in cases:
        t = time.perf_counter()
        res = es.search(JOB, cat, time_limit_s=args.time_limit)
        secs = time.perf_counter() - t
        check(res, cat)
        st = res.stats
        if res.plans:
            p = res.plans[0]
            best = f"${p.estimate.total_usd:,.0f} in {st.domain}"  # type: ignore[union-attr]
        else:
            best = "none meets the deadline" if st.complete else "none found"
        proven = "yes" if st.complete else f"no (gap {st.gap:.1%})"
        rows.append(f"| {len(cat.gpus)} | {name} | {st.subproblems} ({st.subproblems_searched}) "
                    f"| {secs:.2f} | {proven} | {best} |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
