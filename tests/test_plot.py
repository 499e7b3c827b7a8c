"""espresso.plot: the timeline is the schedule the estimate simulates (every operation as soon
as its stage and its input allow, in the schedule's order), and the figures are drawn."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

import espresso as es
from espresso import _core as core
from espresso.cli import main
from espresso.plot import plot_cost_vs_deadline, plot_plan, timeline

CAT = es.Catalog.builtin("gpus")


def _plans() -> list[es.Plan]:
    rng = random.Random(7)
    names = ["A100-80GB", "H100-SXM", "L40S", "RTX-4090", "MI300X"]
    out = []
    for k in range(10):
        P = rng.randint(1, 4)
        groups = [(rng.choice(names), rng.choice([1, 2])) for _ in range(P)]
        job = es.Job(model=es.ModelSpec.preset("gpt3-1.3b"), tokens=10**9, deadline_hours=1e4,
                     global_batch_size=rng.choice([2, 8, 16]), seq_len=1024)
        try:
            out.append(es.place(job, groups, catalog=CAT, schedule="gpipe" if k % 3 == 0
                                else "1f1b", dp=rng.choice([1, 2])))
        except es.InfeasibleError:
            continue
    assert len(out) >= 6
    return out


@pytest.mark.parametrize("plan", _plans(), ids=lambda p: f"P{len(p.stages)}-{p.schedule}")
def test_timeline_is_the_simulated_schedule(plan: es.Plan) -> None:
    est = plan.estimate
    assert est is not None
    ops = timeline(plan)
    P, M = len(est.stages), plan.num_microbatches
    pipe = [o for o in ops if o.kind in ("forward", "backward")]
    assert len(pipe) == 2 * P * M
    end = {(o.stage, o.kind, o.microbatch): o.end_s for o in pipe}
    send = [st.send_s for st in est.stages]
    for i in range(P):
        mine = sorted((o for o in pipe if o.stage == i), key=lambda o: o.start_s)
        free = 0.0
        for o in mine:
            f = est.stages[i].fwd_s if o.kind == "forward" else est.stages[i].bwd_s
            assert o.end_s - o.start_s == pytest.approx(f, rel=1e-9, abs=1e-12)
            if o.kind == "forward":
                ready = 0.0 if i == 0 else end[(i - 1, "forward", o.microbatch)] + send[i - 1]
            elif i == P - 1:
                ready = end[(i, "forward", o.microbatch)]
            else:
                ready = end[(i + 1, "backward", o.microbatch)] + send[i]
            # as soon as the stage is free and the input has arrived
            assert o.start_s == pytest.approx(max(free, ready), rel=1e-9, abs=1e-12)
            free = o.end_s
        if plan.schedule == "gpipe" or M < P:  # all forwards first
            kinds = [o.kind for o in mine]
            assert kinds == ["forward"] * M + ["backward"] * M
        else:  # 1F1B: at most P - i forwards ahead of the backwards
            ahead = 0
            for o in mine:
                ahead += 1 if o.kind == "forward" else -1
                assert 0 <= ahead <= P - i
    assert max(o.end_s for o in pipe) == pytest.approx(est.pipeline_s, rel=1e-12)
    assert max(o.end_s for o in ops) == pytest.approx(est.iteration_s, rel=1e-12)


def test_timeline_refuses_what_it_cannot_draw() -> None:
    job = es.Job(model=es.ModelSpec.preset("gpt3-1.3b"), tokens=10**9, deadline_hours=1e4,
                 global_batch_size=8, seq_len=1024)
    inter = es.place(job, [("A100-80GB", 1), ("A100-80GB", 1)], catalog=CAT, virtual_stages=2)
    with pytest.raises(es.SpecError, match="interleaved"):
        timeline(inter)
    with pytest.raises(es.SpecError, match="no estimate"):
        timeline(dataclasses.replace(_plans()[0], estimate=None))
    with pytest.raises(ValueError, match="P forward and backward times"):
        core.pipeline_timeline([1.0, 1.0], [1.0], [0.0], [0.0], 2, core.Schedule.GPIPE)
    with pytest.raises(ValueError, match="num_microbatches"):
        core.pipeline_timeline([1.0], [1.0], [], [], 0, core.Schedule.GPIPE)


def test_figures_are_drawn(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plan = _plans()[1]
    out = plot_plan(plan, tmp_path / "plan.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    svg = plot_cost_vs_deadline({"espresso": [(10.0, 5.0), (20.0, 4.0)],
                                 "other": [(10.0, None), (20.0, 6.0)]},
                                tmp_path / "c.svg", title="t", frontier=[(8.0, 5.5), (15.0, 4.0)])
    assert "<svg" in svg.read_text(encoding="utf-8")[:500]


def test_plan_plot_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    assert main(["plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "30d",
                 "--catalog", "builtin:gpus", "--plot", str(out), "--no-compare"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "timeline and memory per stage" in capsys.readouterr().out
    assert main(["plan", "--model", "gpt3-1.3b", "--plot", str(tmp_path / "p.txt")]) == 2
    assert "--plot: expected a .png" in capsys.readouterr().err
