"""The first questions a user asks, timed as the user runs them (issue 29).

Run: python bench/first_questions.py [--only REGEX] [--time-limit S] [--out FILE.json]
                                     [--previous FILE.json] [--md FILE.md] [--budgets]

Each row is one `espresso plan` command line in a fresh process under `timeout`, on the
built-in snapshot with the default threads: every preset model at 20 x its parameters in
tokens within 14 days and at 1e12 tokens within 60 days; the same with `--max-instances 2`,
with a quota file, and on a synthetic catalog ten times the snapshot's size (its rows
repeated in renamed regions at slightly higher prices); the issue's harder rows; the 530B GPT
over 2,240 A100s; the paper prototype's instance and its faster-link variants. For each: wall
seconds of the whole command, the main search's nodes expanded and proof (gap), and the
answer. `--budgets` adds, after each snapshot row with a plan, the same job asking for the
fastest plan within 1.25 x that plan's cost (no deadline). `--previous` prints the same
table with an earlier run's columns beside (runs are written with `--out`;
bench/results/first_questions.json holds the one made at the last commit that touched the
search or the snapshot, bench/results/first_questions_797_offers.json the last one on the
797-offer snapshot before issue 30, bench/results/first_questions_budgets.json one with
`--budgets`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import espresso as es
from espresso.model import ModelSpec

ROOT = Path(__file__).parents[1]
PROTOTYPE = ROOT / "examples/catalogs/espresso-prototype.yaml"

QUOTA = """\
quotas:
  - {provider: aws, instance_type: "p5*", instances: 2}
  - {provider: aws, instance_type: "p4d*", instances: 4}
  - {provider: aws, instances: 8}
  - {provider: gcp, gpu: H100-SXM, instances: 2}
  - {provider: gcp, instances: 6}
  - {provider: lambda, instances: 3}
"""


def _synthetic_10x(path: Path) -> None:
    """The snapshot ten times over: each copy k in regions renamed '<region>-x<k>' at prices
    1 + k/100 times the original (so no copy is a twin at the same price)."""
    base = es.Catalog.builtin("cloud")
    rows = list(base.gpus)
    for k in range(1, 10):
        rows += [replace(g, name=g.name.replace(f"/{g.region}/", f"/{g.region}-x{k}/"),
                         region=f"{g.region}-x{k}", price_per_hour=g.price_per_hour * (1 + k / 100),
                         spot_price_per_hour=None)
                 for g in base.gpus]
    es.Catalog(gpus=tuple(rows), notes=("synthetic: the snapshot x10",)).save(path)


def _gpt530b(path: Path) -> tuple[list[str], Path]:
    """MT-NLG's 530B GPT (105 blocks, hidden 20480, 128 heads) over 2,240 A100-80GB."""
    model = {"name": "gpt-530b", "num_layers": 105, "hidden_size": 20480, "num_heads": 128,
             "ffn_hidden_size": 81920, "vocab_size": 51200, "gated_mlp": False,
             "norm": "layernorm", "linear_bias": True, "position_embeddings": 2048,
             "tied_embeddings": True}
    mpath = path / "gpt530b.json"
    mpath.write_text(json.dumps(model))
    # Selene's DGX A100 nodes: NVLink 3 inside, 8 x 200 Gb/s HDR InfiniBand out (25 GB/s per
    # GPU); the built-in A100-80GB's price and specs (espresso/data/catalog.yaml).
    cat = {"gpus": [{"name": "A100-80GB", "memory_gb": 80, "bf16_tflops": 312,
                     "mem_bandwidth_gbs": 2039, "price_per_hour": 3.4309, "count": 2240,
                     "gpus_per_node": 8, "intra_node_gbs": 300, "inter_node_gbs": 25}]}
    cpath = path / "a100x2240.json"
    cpath.write_text(json.dumps(cat))
    return ["--model", str(mpath), "--tokens", "2.7e11", "--seq-len", "2048",
            "--global-batch", "1920", "--deadline", "60d"], cpath


def jobs(tmp: Path) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    presets = ModelSpec.preset_names()
    quota = tmp / "quota.yaml"
    quota.write_text(QUOTA)
    big = tmp / "snapshot_x10.json"
    _synthetic_10x(big)
    variants = [("", []), (" --max-instances 2", ["--max-instances", "2"]),
                (" --quota", ["--quota", str(quota)]), (" 10x catalog", ["--catalog", str(big)])]
    for vname, extra in variants:
        for m in presets:
            n = ModelSpec.preset(m).num_params
            out.append((f"{m} 20xP/14d{vname}",
                        ["--model", m, "--tokens", f"{20 * n:.3g}", "--deadline", "14d", *extra]))
            out.append((f"{m} 1e12/60d{vname}",
                        ["--model", m, "--tokens", "1e12", "--deadline", "60d", *extra]))
    for name, model, tokens, flag, value in (
            ("llama2-13b 2.6e11/14d", "llama2-13b", "2.6e11", "--deadline", "14d"),
            ("llama2-70b 1e11/30d", "llama2-70b", "1e11", "--deadline", "30d"),
            ("llama3-8b 1.5e12/30d", "llama3-8b", "1.5e12", "--deadline", "30d"),
            ("llama2-7b budget 2000", "llama2-7b", "2e10", "--budget", "2000")):
        out.append((name, ["--model", model, "--tokens", tokens, flag, value]))
    argv, cat = _gpt530b(tmp)
    out.append(("gpt-530b 2240 x A100", [*argv, "--catalog", str(cat)]))
    proto = ["--model", "open_llama_3b_v2", "--iterations", "1000", "--seq-len", "3000",
             "--global-batch", "64", "--deadline", "100000s", "--catalog", str(PROTOTYPE)]
    out.append(("prototype instance", proto))
    return out


_SEARCH = re.compile(r"Search: ([\d,]+) nodes expanded.*?; ([\d.]+) s on")


def run_one(argv: list[str], limit: float) -> dict[str, object]:
    cmd = [sys.executable, "-m", "espresso.cli", "plan", *argv, "--no-compare"]
    t = time.perf_counter()
    try:
        p = subprocess.run(["timeout", str(limit + 30), *cmd], capture_output=True, text=True,
                           check=False, env={**os.environ, "COLUMNS": "200"})
        out, rc = p.stdout + p.stderr, p.returncode
    except OSError as exc:  # pragma: no cover - no `timeout` binary
        out, rc = str(exc), -1
    secs = time.perf_counter() - t
    row: dict[str, object] = {"seconds": round(secs, 2), "rc": rc}
    m = _SEARCH.search(out)
    if m:
        row["nodes"] = int(m.group(1).replace(",", ""))
    first = re.search(r"the\s+first\s+plan\s+after\s+([\d.]+)\s+s", out)
    if first:
        row["first_plan_s"] = float(first.group(1))
    gap = re.search(r"gap ([\d.]+)%", out)
    row["gap"] = float(gap.group(1)) if gap else (0.0 if "gap 0)" in out else None)
    search_line = next((ln for ln in out.splitlines() if ln.startswith("Search:")), "")
    if "proven optimal" in search_line:  # also "... without interleaving; interleaved ..."
        row["gap"] = 0.0
    total = re.search(r"^Total: (.*)$", out, flags=re.M)
    if total:
        row["answer"] = total.group(1)
    elif "No plan" in out:
        # "no plan meets the deadline" / "fits within the budget" comes from a complete
        # search: the answer is proven; a gap in the message is the explanation's (how far the
        # fastest plan found is from the fastest), reported apart.
        proven = "no plan meets the deadline" in out or "no plan fits within" in out
        row["answer"] = "no plan (proven)" if proven else "no plan"
        if proven:
            row["explain_gap"] = row["gap"] if "not proven" in out else 0.0
            row["gap"] = 0.0
        elif row["gap"] is None:
            row["gap"] = 100.0
    else:
        row["answer"] = out.strip().splitlines()[-1][:80] if out.strip() else "?"
    return row


_COST = re.compile(r"\$([\d,]+\.\d\d) \(deadline")


def _budget_row(name: str, argv: list[str], row: dict[str, object]
                ) -> tuple[str, list[str]] | None:
    """The fastest plan within 1.25 x the cost of a snapshot row's plan, without its deadline
    (issue 29: `--budget` alone, proven on the same jobs within the same times)."""
    m = _COST.search(str(row.get("answer", "")))
    if (m is None or "--deadline" not in argv or "--catalog" in argv or "--quota" in argv
            or "--max-instances" in argv):
        return None
    budget = 1.25 * float(m.group(1).replace(",", ""))
    i = argv.index("--deadline")
    return (f"{name.split('/')[0]} budget 1.25x",
            [*argv[:i], *argv[i + 2:], "--budget", f"{budget:.0f}"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None,
                    help="rows whose name this regular expression matches (re.search)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="espresso's --time-limit")
    ap.add_argument("--out", default=None)
    ap.add_argument("--previous", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--budgets", action="store_true",
                    help="after each snapshot row with a plan, the same job with --budget at "
                         "1.25 x that plan's cost and no deadline (the fastest plan within it)")
    args = ap.parse_args()
    prev = json.loads(Path(args.previous).read_text()) if args.previous else {}
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as d:
        queue = [(name, argv) for name, argv in jobs(Path(d))
                 if not args.only or re.search(args.only, name)]
        while queue:
            name, argv = queue.pop(0)
            row = run_one([*argv, "--time-limit", str(args.time_limit)], args.time_limit)
            results[name] = row
            p = prev.get(name, {})
            print(f"{name:34s} {row['seconds']:7.2f} s  gap {row['gap']!s:>5}  "
                  f"nodes {row.get('nodes', '-')!s:>9}  {str(row['answer'])[:60]}"
                  + (f"   | before {p.get('seconds')} s gap {p.get('gap')}" if p else ""),
                  flush=True)
            if args.out:  # written as it goes: nothing computed is lost
                Path(args.out).write_text(json.dumps(results, indent=1))
            budget = _budget_row(name, argv, row) if args.budgets else None
            if budget is not None:
                queue.insert(0, budget)
    before = " before s | before gap % |" if prev else ""
    lines = ["| job | s | first plan s | nodes | gap % | answer |" + before,
             "|---|---:|---:|---:|---:|---|" + ("---:|---:|" if prev else "")]
    for name, row in results.items():
        p = prev.get(name, {})
        answer = str(row["answer"])
        if row.get("explain_gap"):  # the fastest plan that explains the "no": not proven
            answer += f"; fastest plan within {row['explain_gap']}%"
        lines.append(f"| {name} | {row['seconds']} | {row.get('first_plan_s', '-')} | "
                     f"{row.get('nodes', '-')} | {row['gap']} | "
                     f"{answer} |" + (f" {p.get('seconds', '-')} | {p.get('gap', '-')} |"
                                      if prev else ""))
    secs = [float(r["seconds"]) for r in results.values()]  # type: ignore[arg-type]
    if secs:
        proven = sum(1 for r in results.values() if r["gap"] == 0.0)
        lines.append("")
        firsts = [float(r["first_plan_s"]) for r in results.values()  # type: ignore[arg-type]
                  if "first_plan_s" in r]
        lines.append(f"{len(secs)} jobs: median {statistics.median(secs):.2f} s, slowest "
                     f"{max(secs):.2f} s, proven {proven}/{len(secs)}")
        if firsts:
            lines.append(f"first plan (from the search's start, printed on the Search: line) "
                         f"within 1 s in {sum(f <= 1.0 for f in firsts)} of the {len(firsts)} "
                         f"jobs with a plan; the latest after {max(firsts):.2f} s")
    text = "\n".join(lines)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
