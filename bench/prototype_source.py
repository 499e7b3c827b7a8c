"""The paper's prototype planner, run from its source, beside its reconstruction and Espresso on
the paper's own instance (issue 29, item 5; docs/baselines.md).

Run: python bench/prototype_source.py [--source DIR] [--python EXE] [--out FILE.json]
                                      [--md FILE.md]

DIR: a checkout of GitHub Espresso111/Espresso (default $ESPRESSO_PROTOTYPE_SRC); EXE: an
interpreter with its dependencies, fire and deepspeed (default $ESPRESSO_PROTOTYPE_PYTHON,
else this one). The instance: examples/catalogs/espresso-prototype.yaml (its four GPU types,
prices and availability), open_llama_3b_v2, sequences of 3,000 tokens, 64 per step, 1,000
steps at 100 s each (its example's SLO). Every plan is estimated by Espresso's cost model (the
default engine profile); the prototype's own figures are printed beside its plan.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import espresso as es
from espresso.baselines import BASELINES
from espresso.prototype_source import run_prototype, source_dir, unavailable

ROOT = Path(__file__).parents[1]
CATALOG = ROOT / "examples/catalogs/espresso-prototype.yaml"


def _row(name: str, plan: es.Plan | None, seconds: float, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"planner": name, "planner_s": round(seconds, 3), **extra}
    if plan is None or plan.estimate is None:
        return {**row, "plan": None}
    est = plan.estimate
    row.update(
        plan=" + ".join(f"{s.gpu} ({s.layers[1] - s.layers[0]} layers)" for s in plan.stages),
        dp=plan.dp, micro_batch_size=plan.micro_batch_size, recompute=plan.recompute,
        gpus=sum(est.gpus.values()), iteration_s=round(est.iteration_s, 2),
        hourly_usd=round(est.hourly_usd, 2), total_usd=round(est.total_usd, 2),
        meets_slo=bool(est.meets_deadline))
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=None, help="checkout of GitHub Espresso111/Espresso")
    ap.add_argument("--python", default=None, help="interpreter with its dependencies")
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    if source_dir(args.source) is None:
        print(f"prototype source: {unavailable()}", file=sys.stderr)
        return 2
    catalog = es.Catalog.load(CATALOG)
    job = es.Job(model=es.ModelSpec.preset("open_llama_3b_v2"), seq_len=3000,
                 global_batch_size=64, iterations=1000, deadline_hours=100_000 / 3600)
    rows = []
    print("running the prototype's planner (about a minute) ...", flush=True)
    run = run_prototype(job, catalog, source=args.source, python=args.python)
    rows.append(_row("prototype (its source)", run.plan, run.seconds,
                     own_iteration_s=round(run.result.get("time_cost", float("nan")), 2),
                     own_usd=round(run.result.get("money_cost", float("nan"))
                                   * job.num_iterations, 2)))
    t = time.perf_counter()
    rec = BASELINES["prototype"].plan(job, catalog)
    rows.append(_row("prototype (reconstruction)", rec, time.perf_counter() - t))
    t = time.perf_counter()
    best = es.plan(job, catalog)
    rows.append(_row("espresso", best, time.perf_counter() - t,
                     gap=(best.stats or {}).get("gap")))
    for r in rows:
        print(json.dumps(r))
    if args.out:
        Path(args.out).write_text(json.dumps({"job": "open_llama_3b_v2, 3000 x 64, 1000 "
                                              "steps, 100 s each", "rows": rows}, indent=1))
    cols = ["planner", "planner_s", "plan", "dp", "micro_batch_size", "recompute", "gpus",
            "iteration_s", "hourly_usd", "total_usd", "meets_slo", "own_iteration_s",
            "own_usd"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.md:
        Path(args.md).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
