"""How plans and estimates read on the terminal."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engines import runnable
from ..estimate_result import Estimate
from ..plan import Plan
from ..search import SearchStats
from ..units import format_count as _count
from ..units import format_hours as _hours
from ..units import format_seconds as _sec


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """The best single-type plan (or on-demand plan), for the line that says what mixing
    types (or the spot market) saves."""

    plan: Plan | None
    stats: SearchStats | None = None
    skipped: str | None = None
    """Why no comparison was made (e.g. no time left)."""
    kind: str = "single-type"
    """``single-type`` or ``on-demand``: what the plan is compared with."""


def _margin(gb: float) -> str:
    """A memory margin: GB to 0.1, and MB below 0.1 GB (so a thin one never reads 0.0 GB)."""
    return f"{gb:.1f} GB" if gb >= 0.1 else f"{gb * 1e3:.0f} MB"


def _rent(gpus: dict[str, int]) -> str:
    return ", ".join(f"{c} x {g}" for g, c in gpus.items())


def _rented(est: Estimate) -> str:
    """``2 x p4d.24xlarge (spot), aws us-east-1 + ...``, or ``N x GPU`` without a rent list."""
    if not est.rent:
        return _rent(est.gpus)
    parts = []
    for r in est.rent:
        where = f" ({r['provider']} {r['region']})" if r.get("provider") else ""
        spot = " spot" if r.get("market") == "spot" else ""
        parts.append(f"{r['instances']} x {r['instance_type']}{spot}{where}")
    return " + ".join(parts)


def rent_lines(est: Estimate) -> list[str]:
    """``2 x p4d.24xlarge, aws us-east-1: 16 x A100-40GB, $43.92/h`` per catalog row."""
    out = []
    for r in est.rent:
        where = f", {r['provider']} {r['region']}" if r.get("provider") else ""
        idle = f" ({r['idle_gpus']} idle)" if r.get("idle_gpus") else ""
        spot = " (spot)" if r.get("market") == "spot" else ""
        out.append(f"{r['instances']} x {r['instance_type']}{spot}{where}: {r['gpus']} x "
                   f"{r['gpu']}{idle}, ${r['hourly_usd']:,.2f}/h")
    return out


def assumption_lines(est: Estimate) -> list[str]:
    """What bounds the plan's rented offers and what they assume rather than know: per
    offer, ``Availability: k of n x X (the rule that set n)``; ``Network of X: ...`` where
    its network between instances has no published figure; ``Price: ...`` where it is priced
    far below its GPU's other offers."""
    out = []
    for r in est.rent:
        if r.get("availability") and "available" in r:
            out.append(f"Availability: {r['instances']} of {r['available']} x "
                       f"{r['instance_type']}{' (spot)' if r.get('market') == 'spot' else ''}"
                       f"{' (' + r['availability'] + ')' if r.get('availability') else ''}")
        if r.get("network_assumption"):
            out.append(f"Network of {r['instance_type']}: {r['network_assumption']}")
        if r.get("price_note"):
            out.append(f"Price: {r['price_note']}")
    return list(dict.fromkeys(out))


def print_rental(plan: Plan, est: Estimate, console: Console, *, bold: bool = False) -> None:
    """The rent list, where the plan runs, its idle GPUs and its layout."""
    style = ("[bold]", "[/]") if bold else ("", "")
    lines = rent_lines(est)
    if len(lines) == 1:
        console.print(f"Rent: {style[0]}{escape(lines[0])}{style[1]}")
    else:
        console.print(f"Rent (${est.hourly_usd:,.2f}/h):")
        for line in lines:
            console.print(f"  {style[0]}{escape(line)}{style[1]}")
    for line in assumption_lines(est):
        console.print(escape(line))
    dom = domain_words(plan)
    if dom:
        console.print(f"Where: {escape(dom)}")
    if est.idle_gpus:
        console.print(f"Idle: {est.idle_gpus} GPU{'s' if est.idle_gpus > 1 else ''} of the "
                      "rented instances run no stage (whole instances are paid for)")
    extra = "".join((f", sharding {plan.sharding}" if plan.sharding != "none" else "",
                     ", fp8 GEMMs" if plan.job.precision == "fp8" else "",
                     ", sequence parallel" if plan.sequence_parallel else "",
                     (f", interleaved: {plan.virtual_stages} stages per GPU group"
                      if plan.virtual_stages > 1 else "")))
    console.print(f"Layout: dp {plan.dp}, {plan.num_microbatches} micro-batches of "
                  f"{plan.micro_batch_size}, {plan.schedule}, recompute {plan.recompute}{extra}")


def domain_words(plan: Plan) -> str | None:
    dom = plan.domain
    if not dom or not dom.get("provider"):
        return None
    where = " ".join(str(dom[k]) for k in ("provider", "region", "zone") if dom.get(k))
    text = f"{where} ({dom.get('vendor', 'NVIDIA')} GPUs, scope {dom.get('scope', 'region')})"
    if dom.get("spans"):
        text += (f"; spans {dom['spans']}s: links at most {dom.get('cross_link_gbps', 0):g} "
                 f"Gbps per instance, ${dom.get('transfer_usd_per_gb', 0):g}/GB between stages")
    return text

NO_DEADLINE_HOURS = 1e6
"""The deadline `plan --budget` gives a job without one (over a century: none binds); printed
as none."""


def deadline_words(est: Estimate) -> str:
    """``met with X to spare`` / ``missed by X (needs Y)``; with spot instances, at the
    job's confidence."""
    hours, at = est.total_hours, ""
    if est.spot is not None:
        hours, at = est.spot.hours_at_confidence, f" at {est.spot.confidence:.0%} confidence"
        if not math.isfinite(hours):
            return (f"missed{at}: no finite time holds (a confidence of 1, or over ten "
                    "million interruptions expected)")
    if est.meets_deadline:
        return f"met{at} with {_hours(est.deadline_hours - hours)} to spare"
    return (f"missed{at} by {_hours(hours - est.deadline_hours)} "
            f"(needs {_hours(hours)}, deadline {_hours(est.deadline_hours)})")


def spot_lines(est: Estimate) -> list[str]:
    """What interruptions do to a plan with spot instances (empty without)."""
    s = est.spot
    if s is None:
        return []
    worst = s.hours_at_confidence
    worst_usd = est.hourly_usd * worst + est.transfer_usd
    every = (f"one every {_hours(1 / s.interruptions_per_hour)}"
             if s.interruptions_per_hour > 0 else "none expected")
    ckpt = (f"checkpoint every {_hours(s.checkpoint_interval_hours)} of work (writing takes "
            f"{_sec(s.checkpoint_hours * 3600)})" if s.checkpoint_interval_hours > 0
            else "checkpoints free (cost_model.checkpoint_gbs 0)")
    k = s.interruptions_at_confidence
    at = (f"{_hours(worst)}, ${worst_usd:,.2f} ({k} interruption{'' if k == 1 else 's'})"
          if math.isfinite(worst) else "no bound (a confidence of 1, or too many interruptions)")
    return [
        f"Spot: {s.interruptions_per_hour:.4g} interruptions/h ({every}); {ckpt}; a restart "
        f"takes {_hours(s.restart_hours)}",
        f"Spot: expected {_hours(s.expected_hours)}, ${est.total_usd:,.2f} "
        f"({s.interruptions_expected:.1f} interruptions; the work alone "
        f"{_hours(s.work_hours)}); at {s.confidence:.0%} confidence {at}",
    ]


FULL = 0.9
"""Stages whose estimated memory is above this share of usable memory are flagged."""


def _caption(plan: Plan) -> str:
    text = "f+b/mb: forward+backward of one micro-batch; *: bottleneck stage"
    if plan.virtual_stages > 1:
        text += (f"; stage s runs on GPU group s mod {plan.pp}, whose memory (all its stages) "
                 "each of its rows shows")
    return text


def print_estimate(plan: Plan, est: Estimate, console: Console) -> None:
    job = plan.job
    console.print(
        f"[bold]{escape(job.model.name)}[/]: seq {job.seq_len}, "
        f"global batch {job.global_batch_size}, "
        f"{est.iterations:,} iterations ({_count(job.num_tokens)} tokens), "
        f"deadline {_hours(job.deadline_hours)}"
    )
    print_rental(plan, est, console)
    table = Table(caption=_caption(plan))
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
        f"Iteration {_sec(est.iteration_s)} = pipeline {_sec(est.pipeline_s)} + dp sync "
        f"{_sec(est.dp_allreduce_s)} + optimizer {_sec(est.optimizer_step_s)}; bubble "
        f"{est.bubble_fraction:.1%}; bottleneck stage {est.bottleneck_stage} (*); "
        f"MFU {est.mfu:.1%}; {est.tokens_per_s:,.0f} tokens/s"
    )
    transfer = (f" (data transfer ${est.transfer_usd:,.2f}: {est.transfer_gb:,.1f} GB per "
                "iteration between locations)" if est.transfer_usd > 0 else "")
    console.print(f"Total: {_hours(est.total_hours)}, [bold]${est.total_usd:,.2f}[/]{transfer}")
    for line in spot_lines(est):
        console.print(escape(line))
    console.print(escape(engines_line(plan)))
    console.print(f"Deadline: {'' if est.meets_deadline else '[yellow]'}"
                  f"{deadline_words(est)}{'' if est.meets_deadline else '[/]'}")
    reasons = list(est.reasons)
    if not est.meets_deadline:
        reasons.append(f"it does not meet the deadline: {deadline_words(est)}")
    if not reasons:
        console.print("Feasible: [green]yes[/] (fits in memory and meets the deadline)")
        return
    console.print("Feasible: [red]no[/]"
                  + ("" if est.feasible else " (it cannot run as written)")
                  + ("; meets the deadline: no" if not est.meets_deadline else ""))
    for r in reasons:
        console.print(f"  - {escape(r)}")


def proof_words(stats: dict[str, object] | SearchStats | None) -> str:
    if stats is None:
        return "no search statistics"
    gap = stats.gap if isinstance(stats, SearchStats) else stats.get("gap")
    inter = None if isinstance(stats, SearchStats) else stats.get("interleaving")
    if isinstance(inter, dict):
        what = ("proven optimal without interleaving" if gap == 0.0 else
                f"gap {gap:.2%} without interleaving" if isinstance(gap, float)
                and math.isfinite(gap) else "not proven")
        return (f"{what}; interleaved ({inter['virtual_stages']} stages per GPU group) from "
                f"${inter['total_usd_without']:,.2f}, {_hours(inter['total_hours_without'])}")
    if gap == 0.0:
        return "proven optimal within the cost model (gap 0)"
    complete = stats.complete if isinstance(stats, SearchStats) else stats.get("complete")
    if complete and isinstance(gap, float) and math.isfinite(gap):
        return f"proven within {gap:.2%} of the optimum in the cost model (--gap)"
    stopped = (stats.interrupted if isinstance(stats, SearchStats)
               else stats.get("interrupted"))
    why = "interrupted (Ctrl-C)" if stopped else "the time limit stopped the search"
    if isinstance(gap, float) and math.isfinite(gap):
        return f"not proven: gap {gap:.2%} ({why})"
    return f"not proven: no lower bound ({why})"


def _compare_line(plan: Plan, comparison: Comparison, console: Console) -> None:
    est = plan.estimate
    assert est is not None
    objective = (plan.stats or {}).get("objective", "cost")
    label = "on-demand" if comparison.kind == "on-demand" else "single-type"
    if comparison.kind == "on-demand" and est.spot is None:
        console.print("On demand: the best plan already rents no spot instances.")
        return
    if comparison.kind != "on-demand" and len(est.gpus) == 1:
        console.print(f"Single GPU type: the {'cheapest' if objective == 'cost' else 'fastest'} "
                      "plan already uses one type.")
        return
    if comparison.skipped:
        console.print(f"Versus {label} plans: {escape(comparison.skipped)}")
        return
    other = comparison.plan
    unproven = (comparison.stats is not None and not comparison.stats.complete)
    note = (f" (best found, {proof_words(comparison.stats)})" if unproven else "")
    if other is None or other.estimate is None:
        subject = "no on-demand plan" if label == "on-demand" else "no single GPU type"
        why = ("none found before the time limit" if unproven else
               f"{subject} meets the deadline" if objective == "cost" else
               f"{subject} fits within the budget")
        console.print(f"Versus {label} plans: {why}.")
        return
    o_est = other.estimate
    what = (f"the {'cheapest' if objective == 'cost' else 'fastest'} {label} plan "
            f"({escape(_rented(o_est))}, ${o_est.total_usd:,.2f}, "
            f"{_hours(o_est.total_hours)}){note}")
    # Cost: what mixing types saves; time (a budget): how much faster it is.
    ours, theirs = ((est.total_usd, o_est.total_usd) if objective == "cost"
                    else (est.total_hours, o_est.total_hours))
    better = 1 - ours / theirs if theirs > 0 else 0.0
    good, bad = ("saves [bold]{:.1%}[/]", "costs {:.1%} more") if objective == "cost" else (
        "[bold]{:.1%}[/] faster", "{:.1%} slower")
    if better >= 0:
        console.print(f"Versus {what}: " + good.format(better))
    else:
        console.print(f"Versus {what}: " + bad.format(-better) + " (this plan is not proven "
                      "optimal; allow more time with --time-limit)")


def print_plan(plan: Plan, console: Console, comparison: Comparison | None,
               *more: Comparison) -> None:
    est = plan.estimate
    assert est is not None
    job = plan.job
    console.print(
        f"[bold]{escape(job.model.name)}[/] ({_count(job.model.num_params)} parameters): "
        f"seq {job.seq_len}, global batch {job.global_batch_size}, {est.iterations:,} "
        f"iterations ({_count(job.num_tokens)} tokens), "
        + ("no deadline" if job.deadline_hours == NO_DEADLINE_HOURS
           else f"deadline {_hours(job.deadline_hours)}")
    )
    print_rental(plan, est, console, bold=True)
    table = Table(caption=_caption(plan))
    for col in ("stage", "GPU", "TP", "layers", "memory / usable", "f+b/mb", "busy/iter"):
        table.add_column(col, justify="left" if col in ("GPU", "layers") else "right",
                         no_wrap=True)
    full = []
    for st in est.stages:
        mark = " *" if st.index == est.bottleneck_stage else ""
        tight = st.memory_gb > FULL * st.capacity_gb
        if tight:
            full.append(st)
        table.add_row(f"{st.index}{mark}", escape(st.gpu), str(st.tp),
                      f"[{st.layers[0]}, {st.layers[1]})",
                      f"{st.memory_gb:.1f} / {st.capacity_gb:.1f} GB" + (" !" if tight else ""),
                      _sec(st.fwd_s + st.bwd_s), _sec(st.time_s))
    console.print(table)
    if full:
        console.print(escape(
            f"Memory: {len(full)} stage(s) above {FULL:.0%} of usable memory (!; margins "
            + ", ".join(f"stage {st.index} {_margin(st.capacity_gb - st.memory_gb)}"
                        for st in full)
            + "): what the model does not count (allocator cache, fragmentation) may not fit; "
            "--memory-headroom keeps more free"))
    console.print(
        f"Iteration {_sec(est.iteration_s)} (pipeline {_sec(est.pipeline_s)}, bubble "
        f"{est.bubble_fraction:.1%}; dp sync {_sec(est.dp_allreduce_s)}; optimizer "
        f"{_sec(est.optimizer_step_s)}); MFU {est.mfu:.1%}"
    )
    transfer = (f"; data transfer ${est.transfer_usd:,.2f} included" if est.transfer_usd > 0
                else "")
    expected = "expected " if est.spot is not None else ""
    at = f" at {est.spot.confidence:.0%} confidence" if est.spot is not None else ""
    deadline = ("no deadline" if job.deadline_hours == NO_DEADLINE_HOURS else
                f"deadline {_hours(job.deadline_hours)}: "
                f"{'met' if est.meets_deadline else 'missed'}{at}")
    console.print(f"Total: {expected}{_hours(est.total_hours)}, [bold]${est.total_usd:,.2f}[/] "
                  f"({deadline}{transfer})")
    for line in spot_lines(est):
        console.print(escape(line))
    console.print(escape(engines_line(plan)))
    for comp in (comparison, *more):
        if comp is not None:
            _compare_line(plan, comp, console)
    print_search_line(plan.stats, console)


def engines_line(plan: Plan) -> str:
    """``Engines: espresso, torchtitan; not megatron (why)``: who can run the plan."""
    verdicts = runnable(plan)
    yes = [name for name, why in verdicts.items() if why is None]
    no = [f"{name} ({why})" for name, why in verdicts.items() if why is not None]
    return ("Engines: " + ", ".join(yes) + (f"; not {', '.join(no)}" if no else "")
            + " (docs/engines.md)")


def print_search_line(stats: dict[str, object] | None, console: Console) -> None:
    stats = stats or {}
    pruned = stats.get("pruned", {})
    assert isinstance(pruned, dict)
    nodes = stats.get("nodes_expanded", 0)
    leaves = stats.get("leaves_placed", 0)
    seconds = stats.get("seconds", 0.0)
    assert isinstance(nodes, int) and isinstance(leaves, int) and isinstance(seconds, float)
    first = stats.get("first_plan_s")
    first_words = f", the first plan after {first:.2f} s" if isinstance(first, float) else ""
    console.print(
        f"Search: {nodes:,} nodes expanded, {leaves:,} allocations placed, pruned "
        + ", ".join(f"{k} {v:,}" for k, v in pruned.items())
        + f"; {seconds:.2f} s on {stats.get('threads', 1)} threads{first_words}; "
        + proof_words(stats)
    )
    subs = stats.get("subproblems", 1)
    if isinstance(subs, int) and subs > 1:
        console.print(f"Domains: {subs} (domain, vendor) subproblems, "
                      f"{stats.get('subproblems_searched', 0)} searched (the others cut by a "
                      f"bound or the same as one searched); best in {stats.get('domain')}")


def print_top(plans: list[Plan], console: Console) -> None:
    """The k best plans as one compact table."""
    table = Table(title=f"The {len(plans)} best plans", caption="stages: GPU x tp [layers)")
    for col in ("#", "total", "hours", "$/h", "GPUs", "dp", "mb x M", "recompute", "sharding",
                "engines", "stages"):
        table.add_column(col, justify="left" if col in ("GPUs", "stages", "recompute",
                                                        "sharding", "engines")
                         else "right", no_wrap=col != "stages")
    for i, p in enumerate(plans, 1):
        est = p.estimate
        assert est is not None
        stages = " | ".join(f"{s.gpu} x{s.tp} [{s.layers[0]},{s.layers[1]})" for s in p.stages)
        table.add_row(str(i), f"${est.total_usd:,.2f}", f"{est.total_hours:,.1f}",
                      f"{est.hourly_usd:,.2f}", escape(_rent(est.gpus)), str(p.dp),
                      f"{p.micro_batch_size} x {p.num_microbatches}", p.recompute,
                      p.sharding, ", ".join(n for n, why in runnable(p).items() if why is None),
                      escape(stages))
    console.print(table)
