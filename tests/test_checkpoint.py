"""Checkpoints and restarts of the runner (espresso.torch.Checkpointer): a rank killed with
SIGKILL mid-run, a restart from the newest checkpoint, and the losses of an uninterrupted run;
on CPU with gloo through `espresso launch --local`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import espresso as es  # noqa: E402
from espresso.errors import PlanError  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "examples" / "train_gpt.py"


def _launch(plan: Path, args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "espresso.cli", "launch", str(plan), "--local",
                           "--script", str(SCRIPT), "--script-args", args],
                          capture_output=True, text=True, timeout=300, check=False)


def _losses(out: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in re.findall(r"step (\d+): loss (\S+),", out)}


@pytest.mark.parametrize(("plan_file", "sharding", "kill_rank"), [
    ("tiny-gpt-2x2.json", "zero1", 1),   # pp 2 x dp 2, ZeRO-1 partitions; a first-stage rank
    ("tiny-gpt-tp.json", None, 2),       # tp 2 -> tp 1 with sequence parallelism; the last stage
])
def test_a_killed_rank_resumes_to_the_losses_of_an_uninterrupted_run(
        tmp_path: Path, plan_file: str, sharding: str | None, kill_rank: int) -> None:
    plan = ROOT / "examples" / "plans" / plan_file
    if sharding is not None:
        data = json.loads(plan.read_text())
        data["sharding"] = sharding
        plan = tmp_path / plan_file
        plan.write_text(json.dumps(data))
    ck = tmp_path / "ckpt"
    # The uninterrupted run's losses: the single-process reference, which `espresso launch
    # --local` reproduces (tests/test_torch_runner.py).
    ref = subprocess.run([sys.executable, str(SCRIPT), "--plan", str(plan), "--reference",
                          "--steps", "6"], capture_output=True, text=True, timeout=120,
                         check=True)
    want = _losses(ref.stdout)
    assert sorted(want) == list(range(6))
    # Checkpoints after steps 1 and 3; the rank is killed after step 4 (no clean-up).
    killed = _launch(plan, f"--steps 6 --checkpoint-dir {ck} --checkpoint-every 2 "
                           f"--kill-at-step 4 --kill-rank {kill_rank}")
    assert killed.returncode != 0
    before = _losses(killed.stdout)
    assert max(before) <= 4
    assert [before[s] for s in range(4)] == pytest.approx([want[s] for s in range(4)], abs=2e-4)
    assert (ck / "latest").read_text() == "step_00000003"
    resumed = _launch(plan, f"--steps 6 --checkpoint-dir {ck} --checkpoint-every 2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed after step 3" in resumed.stdout
    got = _losses(resumed.stdout)
    assert sorted(got) == [4, 5]
    assert [got[s] for s in (4, 5)] == pytest.approx([want[s] for s in (4, 5)], abs=2e-4)
    assert want[5] < want[0]  # it trains


def test_checkpoints_load_only_into_plans_with_the_same_stages(tmp_path: Path) -> None:
    """One process (a one-stage plan): save, resume, and refuse a checkpoint whose recorded
    stages differ; an incomplete step folder (no espresso.json) is never read."""
    import espresso.torch as et

    model = es.ModelSpec(name="t", num_layers=2, hidden_size=16, num_heads=2, vocab_size=32)
    job = es.Job(model=model, seq_len=8, global_batch_size=2, iterations=4, deadline_hours=1)
    plan = es.Plan(job=job, stages=(es.Stage(gpu="L4", layers=(0, 2)),), dp=1,
                   micro_batch_size=1, num_microbatches=2)
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32)
    blocks = [torch.nn.Linear(16, 16) for _ in range(2)]
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    rt = et.setup(plan, embedding=emb, blocks=blocks, head=head, rank=0, world_size=1,
                  loss_fn=lambda o, t: torch.nn.functional.cross_entropy(
                      o.reshape(-1, 32), t.reshape(-1)))
    try:
        opt = rt.optimizer(torch.optim.AdamW, lr=1e-2)
        ck = et.Checkpointer(rt, opt, tmp_path, plan=plan)
        assert ck.every == 0  # an on-demand plan carries no interval
        assert ck.resume() == (0, None)
        x = torch.randint(0, 32, (2, 8))
        rt.step(x, x)
        opt.step()
        saved = {k: v.clone() for k, v in rt.module.state_dict().items()}
        ck.save(0, data={"sample": 2})
        (tmp_path / "step_00000009").mkdir()  # cut short: no espresso.json
        with torch.no_grad():
            for p in rt.module.parameters():
                p.zero_()
        assert ck.resume() == (1, {"sample": 2})
        for k, v in rt.module.state_dict().items():
            assert torch.equal(v, saved[k]), k
        meta = tmp_path / "step_00000000" / "espresso.json"
        data = json.loads(meta.read_text())
        data["layout"] = [[1, [0, 1]], [1, [1, 2]], [1]]
        meta.write_text(json.dumps(data))
        with pytest.raises(PlanError, match="other stages"):
            ck.resume()
        with pytest.raises(PlanError, match="every"):
            et.Checkpointer(rt, opt, tmp_path, every=-1)
    finally:
        et.shutdown()


def test_interval_steps_follow_the_plans_spot_estimate() -> None:
    import espresso.torch as et
    from espresso.cloud.spot import with_spot

    base = es.Catalog.builtin("gpus")["A100-80GB"]
    row = es.GpuType(**{**base.to_dict(), "spot_price_per_hour": 1.0, "count": 16})
    cat = es.Catalog(gpus=(with_spot(es.Catalog(gpus=(row,)), rate=0.05).gpus[1],))
    job = es.Job(model=es.ModelSpec.preset("llama2-7b"), deadline_hours=1000, tokens=5 * 10**9,
                 global_batch_size=64)
    p = es.place(job, [(cat.names[0], 2)] * 2, dp=2, catalog=cat)
    est = p.estimate
    assert est is not None and est.spot is not None
    steps = et.interval_steps(p)
    assert steps == int(est.spot.checkpoint_interval_hours * 3600 / est.iteration_s)
    assert et.interval_steps(replace(p, estimate=replace(est, spot=None))) is None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
