"""espresso.torch on CPU with gloo: pipeline stages from a plan reproduce a single-process
run (losses and every gradient) for an uneven 1F1B split, pp x dp, and GPipe."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")

import espresso as es  # noqa: E402
from espresso.errors import PlanError  # noqa: E402

pytestmark = pytest.mark.torch

V, H, L, SEQ = 32, 16, 4, 8


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(H)
        self.fc1 = torch.nn.Linear(H, 4 * H)
        self.fc2 = torch.nn.Linear(4 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


def build_model() -> tuple[torch.nn.Module, list[torch.nn.Module], torch.nn.Module]:
    torch.manual_seed(0)
    return torch.nn.Embedding(V, H), [Block() for _ in range(L)], torch.nn.Linear(H, V)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(out.reshape(-1, V), target.reshape(-1))


def make_plan(stages: list[tuple[int, int]], dp: int, m: int, schedule: str) -> es.Plan:
    model = es.ModelSpec(name="tiny", num_layers=L, hidden_size=H, num_heads=2, vocab_size=V)
    job = es.Job(model=model, seq_len=SEQ, global_batch_size=dp * m, iterations=1,
                 deadline_hours=1)
    return es.Plan(job=job, dp=dp, micro_batch_size=1, num_microbatches=m, schedule=schedule,
                   stages=tuple(es.Stage(gpu="L4", layers=s) for s in stages))


def worker(rank: int, plan_json: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import espresso.torch as et

    plan = es.Plan.from_json(plan_json)
    world = plan.num_gpus
    emb, blocks, head = build_model()
    B = plan.job.global_batch_size
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, V, (B, SEQ), generator=g)
    y = torch.randint(0, V, (B, SEQ), generator=g)
    # Reference: the whole model in one process on the whole global batch.
    ref_emb, ref_blocks, ref_head = build_model()
    ref = torch.nn.Sequential(ref_emb, *ref_blocks, ref_head)
    ref_loss = loss_fn(ref(x), y)
    ref_loss.backward()

    rt = et.setup(plan, embedding=emb, blocks=blocks, head=head, loss_fn=loss_fn,
                  rank=rank, world_size=world)
    r, per = rt.info.replica, plan.micro_batch_size * plan.num_microbatches
    xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
    losses = rt.step(xs, ys)
    if rt.is_last:
        mean = torch.stack(losses).mean()
        torch.distributed.all_reduce(mean, group=rt.dp_group)
        mean /= plan.dp
        assert torch.allclose(mean, ref_loss, atol=1e-5), (float(mean), float(ref_loss))
    # Every parameter of this stage has the reference gradient.
    a, b = plan.stages[rt.info.stage].layers
    mine = ([emb] if rt.is_first else []) + blocks[a:b] + ([head] if rt.is_last else [])
    theirs = (([ref_emb] if rt.is_first else []) + ref_blocks[a:b]
              + ([ref_head] if rt.is_last else []))
    for m_mine, m_ref in zip(mine, theirs, strict=True):
        for (n, p), (_, q) in zip(m_mine.named_parameters(), m_ref.named_parameters(), strict=True):
            assert p.grad is not None, n
            assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), (rank, n)
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("stages", "dp", "m", "schedule"),
    [
        ([(0, 1), (1, 4)], 1, 4, "1f1b"),   # two stages, uneven split
        ([(0, 3), (3, 4)], 2, 2, "1f1b"),   # pp 2 x dp 2
        ([(0, 2), (2, 4)], 1, 3, "gpipe"),  # GPipe
    ],
)
def test_pipeline_matches_single_process(stages: list[tuple[int, int]], dp: int, m: int,
                                         schedule: str) -> None:
    plan = make_plan(stages, dp, m, schedule)
    torch.multiprocessing.spawn(worker, args=(plan.to_json(), free_port()),
                                nprocs=plan.num_gpus, join=True)


def test_mismatched_plans_are_refused() -> None:
    import espresso.torch as et

    emb, blocks, head = build_model()
    plan = make_plan([(0, 1), (1, 4)], 1, 4, "1f1b")
    with pytest.raises(PlanError, match="the model given has 3"):
        et.setup(plan, embedding=emb, blocks=blocks[:3], head=head, loss_fn=loss_fn,
                 rank=0, world_size=2)
    with pytest.raises(PlanError, match="world size is 3"):
        et.setup(plan, embedding=emb, blocks=blocks, head=head, loss_fn=loss_fn,
                 rank=0, world_size=3)
    bad = es.Plan.from_dict({**plan.to_dict(), "num_microbatches": 3, "gpus": plan.gpus})
    with pytest.raises(PlanError, match="global batch is 4"):
        et.check_plan(bad, L)
    tp2 = make_plan([(0, 1), (1, 4)], 1, 4, "1f1b")
    tp2 = es.Plan.from_dict({**tp2.to_dict(), "stages": [
        {"gpu": "L4", "tp": 2, "layers": [0, 1]}, {"gpu": "L4", "tp": 1, "layers": [1, 4]}],
        "gpus": {"L4": 3}})
    with pytest.raises(PlanError, match="tensor parallelism"):
        et.check_plan(tp2, L)
    assert not torch.distributed.is_initialized()  # refused before any process group


def test_launch_local_runs_the_example(tmp_path: object) -> None:
    """`espresso launch --local` rehearses the example training script on CPU with gloo."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    r = subprocess.run(
        [sys.executable, "-m", "espresso.cli", "launch",
         str(root / "examples/plans/tiny-gpt-2x2.json"), "--local",
         "--script", str(root / "examples/train_gpt.py"), "--script-args", "--steps 3"],
        capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "step 2: loss" in r.stdout
