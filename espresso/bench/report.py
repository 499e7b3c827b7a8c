"""The summary of a results folder: ``summary.md`` (Espresso's saving against each baseline,
where each has no plan, search times, every cell) and ``plots/`` (cost against deadline per
curve, with Espresso's exact frontier when the suite computed it, and the timeline and
memory of Espresso's plan at each curve's tightest deadline). Everything is computed from
``rows.jsonl`` (and the plan and frontier files it names), so ``espresso bench report DIR``
redraws it from the raw table alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import _io
from ..errors import MissingExtraError, SpecError
from ..plan import Plan
from .run import _order, curve_slug, read_rows

Row = dict[str, Any]


def saving(espresso_usd: float, baseline_usd: float) -> float:
    """Espresso's saving against a baseline: ``1 - espresso / baseline``."""
    return 1.0 - espresso_usd / baseline_usd


def _cells(rows: Iterable[Row]) -> dict[int, dict[str, Row]]:
    out: dict[int, dict[str, Row]] = {}
    for r in rows:
        out.setdefault(int(r["cell"]), {})[str(r["planner"])] = r
    return out


def _planners(rows: Iterable[Row]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        p = str(r["planner"])
        if p not in seen and p not in ("espresso", "frontier"):
            seen.append(p)
    return seen


def savings_table(rows: list[Row]) -> list[dict[str, Any]]:
    """Per baseline: cells where both found a plan, the median and largest saving, and the
    cells where only one of them found a plan."""
    cells = _cells(rows)
    out = []
    for b in _planners(rows):
        both: list[float] = []
        sure: list[float] = []  # neither search stopped by its time limit with a gap
        only_e = only_b = neither = dearer = cheaper = 0
        for by in cells.values():
            e, x = by.get("espresso"), by.get(b)
            if e is None or x is None:
                continue
            fe, fx = bool(e["found"]), bool(x["found"])
            if fe and fx:
                s = saving(float(e["usd"]), float(x["usd"]))
                both.append(s)
                if not _open(e) and not _open(x):
                    sure.append(s)
                dearer += s > 1e-9
                cheaper += s < -1e-9
            elif fe:
                only_e += 1
            elif fx:
                only_b += 1
            else:
                neither += 1
        out.append({"baseline": b, "both": len(both),
                    "median": statistics.median(both) if both else None,
                    "max": max(both) if both else None, "proven": len(sure),
                    "median_proven": statistics.median(sure) if sure else None,
                    "max_proven": max(sure) if sure else None,
                    "dearer": dearer, "cheaper": cheaper,
                    "only_espresso": only_e, "only_baseline": only_b, "neither": neither})
    return out


def _open(r: Row) -> bool:
    """The row's search stopped at its time limit with a gap (its plan may not be the best
    of its space)."""
    gap = r.get("gap")
    return gap is not None and float(gap) > 0


def _money(x: Any) -> str:
    return "—" if x is None else f"${float(x):,.0f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _length(r: Row) -> str:
    if r.get("tokens"):
        return f"{float(r['tokens']):.3g}".replace("e+0", "e").replace("e+", "e") + " tokens"
    return f"{r['iterations']} iterations"


def summary_markdown(rows: list[Row], suite: dict[str, Any] | None = None,
                     plots: list[str] | None = None, out: Path | None = None) -> str:
    suite = suite or {}
    plan_rows = [r for r in rows if r["planner"] != "frontier"]
    cells = _cells(plan_rows)
    planners = _planners(plan_rows)
    lines = [f"# Benchmark: {suite.get('name', plan_rows[0]['suite'] if plan_rows else '')}",
             ""]
    if suite.get("description"):
        lines += [str(suite["description"]), ""]
    e_rows = [r for r in plan_rows if r["planner"] == "espresso"]
    proven = sum(1 for r in e_rows if r.get("proven"))
    found = sum(1 for r in e_rows if r["found"])
    lines += [f"{len(cells)} cells x {1 + len(planners)} planners; Espresso found a plan in "
              f"{found} cells and proved it optimal in {proven}.", "",
              "## Espresso's saving against each baseline", "",
              "Saving = 1 - Espresso's job cost / the baseline's, over the cells where both "
              "found a plan that meets the deadline.", "",
              "| baseline | cells, both found | median saving | max saving | of them, both "
              "proven | median, max there | baseline dearer | baseline cheaper | baseline no "
              "plan (Espresso has one) | Espresso no plan (baseline has one) | neither |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in savings_table(plan_rows):
        lines.append(f"| {s['baseline']} | {s['both']} | {_pct(s['median'])} | "
                     f"{_pct(s['max'])} | {s['proven']} | {_pct(s['median_proven'])}, "
                     f"{_pct(s['max_proven'])} | {s['dearer']} | {s['cheaper']} | "
                     f"{s['only_espresso']} | {s['only_baseline']} | {s['neither']} |")
    lines += ["", "\"Both proven\": cells where neither search stopped at its time limit with "
              "a gap (the prototype does not search; its plans count as they are). A saving "
              "against a baseline whose search stopped with a gap may be its time limit's, not "
              "its space's. A baseline cheaper than Espresso can only be a plan outside "
              "Espresso's search space or one its search did not reach within the time limit "
              "(see the cell's gap).", "", "## Search time", "",
              "| planner | median s | max s | total s |", "|---|---:|---:|---:|"]
    for p in ("espresso", *planners):
        ts = [float(r["search_s"]) for r in plan_rows if r["planner"] == p]
        if ts:
            lines.append(f"| {p} | {statistics.median(ts):.2f} | {max(ts):.2f} | "
                         f"{sum(ts):.1f} |")
    lines += ["", "## Every cell", "",
              "| cell | model | catalog | quota | length | deadline h | espresso | gap | "
              + " | ".join(planners) + " |",
              "|" + "---|" * 5 + "---:|" * (3 + len(planners))]
    for idx in sorted(cells):
        by = cells[idx]
        e = by.get("espresso") or next(iter(by.values()))
        gap = e.get("gap")
        cols = [str(idx), str(e["model"]), str(e["catalog"]), str(e["quota"]), _length(e),
                f"{float(e['deadline_hours']):,.1f}",
                _money(e["usd"]) if e["found"] else "no plan",
                "—" if gap is None else _pct(float(gap))]
        for p in planners:
            x = by.get(p)
            cols.append("—" if x is None else (_money(x["usd"]) if x["found"] else "no plan"))
        lines.append("| " + " | ".join(cols) + " |")
    errors = [r for r in rows if r.get("error")]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- cell {r['cell']} {r['planner']}: {r['error']}" for r in errors]
    fr = [r for r in rows if r["planner"] == "frontier"]
    if fr:
        lines += ["", "## Frontiers", "", "Espresso's exact cost-deadline frontier per curve "
                  "(every point a proven optimum unless marked).", ""]
        for r in fr:
            data = _frontier_file(out, r)
            what = "no frontier" if data is None else (
                f"{len(data['points'])} points"
                + ("" if data.get("complete") else " (incomplete: the time limit or max_points "
                   "stopped it)")
                + "".join(f"; {p['hours']:,.1f} h at ${p['total_usd']:,.0f}"
                          + ("" if p.get("proven") else " (not proven)")
                          for p in data["points"]))
            lines.append(f"- {r['model']} on {r['catalog']} ({r['quota']}), {_length(r)}, "
                         f"{r['search_s']:.1f} s: {what}")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _frontier_file(out: Path | None, row: Row) -> dict[str, Any] | None:
    if out is None or not row.get("plan_file") or not _io.exists(out / str(row["plan_file"])):
        return None
    data = _io.load_yaml("bench", out / str(row["plan_file"]), err=SpecError)
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list) or not all(
            isinstance(p, dict) and all(isinstance(p.get(k), (int, float))
                                        and not isinstance(p.get(k), bool)
                                        for k in ("hours", "total_usd")) for p in points):
        msg = (f"bench: {out / str(row['plan_file'])}: not a frontier file (schema "
               "espresso.frontier/1)")
        raise SpecError(msg)
    return dict(data)


def draw(out: Path, rows: list[Row]) -> list[str]:
    """The plots of a results folder; returns their paths relative to ``out``."""
    from ..plot import plot_cost_vs_deadline, plot_plan

    plan_rows = [r for r in rows if r["planner"] != "frontier"]
    groups: dict[str, list[Row]] = {}
    for r in plan_rows:
        groups.setdefault(curve_slug(r), []).append(r)
    fronts = {curve_slug(r): r for r in rows if r["planner"] == "frontier" and r.get("plan_file")}
    made: list[str] = []
    _io.make_dir("bench", out / "plots", err=SpecError)
    for old in [*(out / "plots").glob("cost-vs-deadline-*.png"),
                *(out / "plots").glob("plan-cell-*.png")]:
        old.unlink()  # a redraw replaces the last one's plots
    for g, rs in sorted(groups.items()):
        series: dict[str, list[tuple[float, float | None]]] = {}
        for r in rs:
            series.setdefault(str(r["planner"]), []).append(
                (float(r["deadline_hours"]), float(r["usd"]) if r["found"] else None))
        first = rs[0]
        data = _frontier_file(out, fronts[g]) if g in fronts else None
        fr = [(float(p["hours"]), float(p["total_usd"])) for p in (data or {}).get("points", [])]
        name = f"plots/cost-vs-deadline-{g}.png"
        plot_cost_vs_deadline(series, out / name, frontier=fr, title=(
            f"{first['model']} on {first['catalog']} ({first['quota']}), {_length(first)}"))
        made.append(name)
        tight = sorted((r for r in rs if r["planner"] == "espresso" and r["found"]
                        and r.get("plan_file") and _io.exists(out / r["plan_file"])),
                       key=lambda r: float(r["deadline_hours"]))
        if tight:
            r = tight[0]
            plan = Plan.from_json(out / r["plan_file"])
            name = f"plots/plan-cell-{int(r['cell']):04d}.png"
            plot_plan(plan, out / name, title=(
                f"Espresso's plan for {r['model']} in {float(r['deadline_hours']):,.1f} h "
                f"(cell {r['cell']}): ${float(r['usd']):,.0f}"))
            made.append(name)
    return made


def load_results(out: Path) -> tuple[dict[str, Any], list[Row]]:
    """``suite.json`` and the rows of a results folder, in cell and planner order."""
    suite_path = out / "suite.json"
    suite = (_io.load_yaml("bench", suite_path, err=SpecError) if _io.exists(suite_path)
             else {})
    baselines = suite.get("baselines", []) if isinstance(suite, dict) else None
    if not isinstance(baselines, list) or not all(isinstance(b, str) for b in baselines):
        msg = (f"bench: {suite_path}: expected the suite as a JSON object with a list of "
               "baseline names")
        raise SpecError(msg)
    order = _order(suite.get("baselines", ()))
    rows = sorted(read_rows(out), key=lambda r: (r["cell"], order.get(r["planner"], 99)))
    return suite, rows


def report(out: str | Path, *, plots: bool = True) -> tuple[Path, list[str], str | None]:
    """Write ``summary.md`` (and ``plots/`` unless ``plots`` is false) from the rows in
    ``out``. Returns the summary's path, the plots drawn, and why none were drawn (the
    ``plot`` extra missing) or None."""
    out = Path(out)
    suite, rows = load_results(out)
    made: list[str] = []
    why: str | None = None
    if plots:
        try:
            made = draw(out, rows)
        except MissingExtraError as exc:
            why = str(exc)
    path = out / "summary.md"
    _io.write_text("bench", path, summary_markdown(rows, suite, made, out), err=SpecError)
    return path, made, why
