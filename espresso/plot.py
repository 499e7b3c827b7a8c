"""Pictures of plans and benchmark results (matplotlib, the ``plot`` extra).

* :func:`timeline`: every operation of a plan's pipeline schedule as the estimate simulates
  it (no matplotlib needed);
* :func:`plot_plan`: a plan's pipeline timeline (Gantt chart of the 1F1B or GPipe schedule,
  per stage, then its data-parallel reduction and optimizer step) and its memory per stage
  against each GPU's capacity (``espresso plan --plot FILE``);
* :func:`plot_cost_vs_deadline`: cost against deadline for Espresso and every baseline
  (``espresso bench run`` draws one per model, catalog and training length).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _io
from ._native import core
from ._optional import require
from .errors import SpecError
from .plan import Plan


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a stage: ``kind`` is ``forward``, ``backward``, ``allreduce`` (the
    data-parallel gradient reduction left after the overlap) or ``optimizer``."""

    stage: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float


def timeline(plan: Plan) -> list[Op]:
    """The operations of one iteration of ``plan`` as its estimate simulates them, stage by
    stage in time order. The pipeline ends at ``estimate.pipeline_s``; each stage's
    reduction and optimizer step follow it, so the last ends at ``estimate.iteration_s``.

    Plans with interleaved stages (``virtual_stages > 1``) are not drawn this way (their
    devices run several stages): SpecError."""
    est = plan.estimate
    if est is None:
        msg = "timeline: the plan has no estimate; estimate it first (espresso.estimate)"
        raise SpecError(msg)
    if plan.virtual_stages > 1:
        msg = (f"timeline: plans with interleaved stages (virtual_stages "
               f"{plan.virtual_stages}) are not drawn as a timeline")
        raise SpecError(msg)
    fwd = [st.fwd_s for st in est.stages]
    bwd = [st.bwd_s for st in est.stages]
    send = [st.send_s for st in est.stages[:-1]]
    send_b = list(send)
    if not plan.cost_model.p2p_overlap:  # transfers block both ends (as the estimate folds them)
        for i, s in enumerate(send):
            fwd[i] += s
            fwd[i + 1] += s
            bwd[i + 1] += s
            bwd[i] += s
        send = [0.0] * len(send)
        send_b = list(send)
    schedule = core.Schedule.GPIPE if plan.schedule == "gpipe" else core.Schedule.ONE_F_ONE_B
    ops = [Op(o.stage, "backward" if o.backward else "forward", o.microbatch, o.start_s, o.end_s)
           for o in core.pipeline_timeline(fwd, bwd, send, send_b, plan.num_microbatches,
                                           schedule)]
    end = est.pipeline_s
    for i, st in enumerate(est.stages):
        if st.dp_allreduce_s > 0:
            ops.append(Op(i, "allreduce", -1, end, end + st.dp_allreduce_s))
        if st.optimizer_step_s > 0:
            t0 = end + est.dp_allreduce_s
            ops.append(Op(i, "optimizer", -1, t0, t0 + st.optimizer_step_s))
    return ops


COLORS = {"forward": "#4C78A8", "backward": "#F58518", "allreduce": "#54A24B",
          "optimizer": "#B279A2"}
MEMORY_PARTS = (("weights_gb", "weights"), ("grads_gb", "gradients"),
                ("optimizer_gb", "optimizer"), ("activations_gb", "activations"),
                ("transient_gb", "working"))


def _pyplot() -> Any:
    mpl = require("matplotlib")
    mpl.use("Agg")  # files only: no screen needed
    return require("matplotlib.pyplot")


def _save(fig: Any, path: str | Path) -> Path:
    """Into a regular file (a symlink written through), atomically; the folder is made."""
    out = Path(path)
    _io.make_dir("plot", out.parent if str(out.parent) else Path("."))
    fmt = out.suffix.lstrip(".").lower() or None
    with _io.atomic_output("plot", out, suffix=out.suffix) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format=fmt)
    return out


def plot_plan(plan: Plan, path: str | Path, *, title: str | None = None) -> Path:
    """Draw ``plan``'s pipeline timeline and its memory per stage into ``path`` (the format
    follows the suffix: ``.png``, ``.svg``, ``.pdf``). Returns the path written."""
    plt = _pyplot()
    est = plan.estimate
    if est is None:
        msg = "plot_plan: the plan has no estimate; estimate it first (espresso.estimate)"
        raise SpecError(msg)
    P = len(est.stages)
    labels = [f"{i}: {st.tp}x {st.gpu}" + (f"\n{ps.offer.split('/')[-1]}" if ps.offer else "")
              for i, (st, ps) in enumerate(zip(est.stages, plan.stages, strict=True))]
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(11, 2.2 + 0.75 * P),
                                     gridspec_kw={"height_ratios": [1.4, 1]})
    try:
        try:
            ops = timeline(plan)
        except SpecError as exc:
            ax_t.text(0.5, 0.5, str(exc), ha="center", va="center", transform=ax_t.transAxes)
            ax_t.set_axis_off()
        else:
            ms = est.iteration_s * 1e3
            edge = 0.3 if plan.num_microbatches <= 24 else 0.0  # many: edges would hide bars
            for kind, color in COLORS.items():
                bars = [(o.start_s * 1e3, (o.end_s - o.start_s) * 1e3) for o in ops
                        if o.kind == kind]
                rows = [o.stage for o in ops if o.kind == kind]
                for stage in sorted(set(rows)):
                    ax_t.broken_barh([b for b, r in zip(bars, rows, strict=True) if r == stage],
                                     (stage - 0.4, 0.8), facecolors=color, edgecolors="white",
                                     linewidth=edge, label=kind if stage == min(rows) else None)
            ax_t.set_yticks(range(P), labels)
            ax_t.invert_yaxis()
            ax_t.set_xlim(0, ms * 1.01)
            ax_t.set_xlabel("ms into the iteration")
            ax_t.set_title(
                f"{plan.schedule} schedule, {plan.num_microbatches} micro-batches of "
                f"{plan.micro_batch_size}, dp {plan.dp}: {ms:,.1f} ms per iteration, "
                f"bubble {est.bubble_fraction:.1%}", fontsize=10)
            ax_t.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        left = [0.0] * P
        for attr, name in MEMORY_PARTS:
            vals = [getattr(st, attr) for st in est.stages]
            ax_m.barh(range(P), vals, left=left, height=0.6, label=name)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        caps = [st.capacity_gb for st in est.stages]
        ax_m.scatter(caps, range(P), marker="|", s=400, color="black", label="capacity",
                     zorder=3)
        ax_m.set_yticks(range(P), labels)
        ax_m.invert_yaxis()
        ax_m.set_xlabel("GB per GPU at the peak")
        ax_m.set_xlim(0, max([*caps, *left]) * 1.08)
        ax_m.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.suptitle(title or (
            f"{plan.job.model.name}: ${est.total_usd:,.0f}, {est.total_hours:,.1f} h, "
            f"{sum(est.gpus.values())} GPUs"), fontsize=11)
        fig.tight_layout()
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_cost_vs_deadline(series: Mapping[str, Sequence[tuple[float, float | None]]],
                          path: str | Path, *, title: str,
                          frontier: Sequence[tuple[float, float]] = ()) -> Path:
    """Cost (USD) against deadline (hours), one line per planner: ``series[name]`` is a list
    of ``(deadline_hours, usd or None)`` (``None``: no plan meets that deadline, drawn as a
    gap with an x on the axis). ``frontier``: Espresso's exact cost-deadline steps
    ``(hours, usd)``, from the cheapest plan to the fastest, drawn as a step function."""
    plt = _pyplot()
    ticker = require("matplotlib.ticker")
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        markers = "os^vD<>ph*"
        for k, (name, pts) in enumerate(series.items()):
            pts = sorted(pts)
            xs = [x for x, _ in pts]
            ys = [y if y is not None else math.nan for _, y in pts]
            style = {"linewidth": 2.5, "zorder": 4} if name == "espresso" else {"alpha": 0.85}
            line = ax.plot(xs, ys, marker=markers[k % len(markers)], label=name, **style)[0]
            miss = [x for x, y in pts if y is None]
            if miss:
                ax.scatter(miss, [0.0] * len(miss), marker="x", color=line.get_color(),
                           clip_on=False, zorder=5)
        if frontier:
            steps = sorted(frontier)
            xs, ys = [], []
            for i, (h, usd) in enumerate(steps):
                nxt = steps[i + 1][0] if i + 1 < len(steps) else max(
                    [h * 1.5, *[x for p in series.values() for x, _ in p]])
                xs += [h, nxt]
                ys += [usd, usd]
            ax.plot(xs, ys, color="black", linewidth=1, linestyle="--",
                    label="espresso frontier (exact)", zorder=3)
        ax.set_xscale("log")
        hours = ticker.FuncFormatter(lambda x, _: f"{x:,.4g}")
        ax.xaxis.set_major_formatter(hours)
        ax.xaxis.set_minor_formatter(hours)
        ax.tick_params(axis="x", which="minor", labelsize=7)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"${y:,.0f}"))
        ax.set_xlabel("deadline (hours)")
        ax.set_ylabel("job cost (USD)")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        return _save(fig, path)
    finally:
        plt.close(fig)
