"""`espresso train` on CPU with gloo: a tiny Llama trained from plans of every shape the
runner supports (uneven split, TP with sequence parallelism, ZeRO-1/2 and FSDP, interleaved)
on the text file in examples/ gives the same losses and gradient norms, step by step, as the
same model trained in one process; the loss goes down; a run resumed from its checkpoint
continues exactly; metrics.jsonl holds what `espresso compare` reads."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _helpers import spawn_ranks  # noqa: E402

import espresso as es  # noqa: E402
from espresso.errors import TrainError  # noqa: E402
from espresso.train.command import execute  # noqa: E402
from espresso.train.metrics import read_metrics  # noqa: E402
from espresso.train.options import TrainOptions  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).parents[1]
TEXT = str(ROOT / "examples" / "data" / "espresso.txt")
UNEVEN = ROOT / "examples" / "plans" / "tiny-llama-uneven.json"
MODEL = es.ModelSpec.load(ROOT / "examples" / "models" / "tiny-llama.yaml")
STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plan_of(stages: list[tuple[int, int, int]], *, dp: int = 1, m: int = 4,
            sharding: str = "none", sp: bool = False, v: int = 1,
            recompute: str = "none") -> es.Plan:
    job = es.Job(model=MODEL, seq_len=32, global_batch_size=dp * m, iterations=STEPS,
                 deadline_hours=1)
    return es.Plan(job=job, dp=dp, micro_batch_size=1, num_microbatches=m,
                   sharding=sharding, sequence_parallel=sp, virtual_stages=v,
                   recompute=recompute,
                   stages=tuple(es.Stage(gpu="L4", layers=(a, b), tp=t) for a, b, t in stages))


def losses(path: Path) -> list[float]:
    """Each step's loss and gradient norm, in order."""
    return [x for s in read_metrics(path).steps for x in (s["loss"], s["grad_norm"])]


def opts(plan: Path, out: Path, **kw: object) -> TrainOptions:
    base: dict[str, object] = {"plan": str(plan), "data": TEXT, "lr": 3e-3, "out": str(out),
                               "checkpoint_every": 0}
    return TrainOptions(**{**base, **kw})  # type: ignore[arg-type]


def rank_worker(rank: int, o: TrainOptions, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    execute(o)


def train_plan(plan: es.Plan, tmp: Path, **kw: object) -> tuple[Path, Path]:
    """(metrics of the plan's run, metrics of the one-process reference)."""
    pf = tmp / "plan.json"
    pf.write_text(plan.to_json())
    spawn_ranks(rank_worker, (opts(pf, tmp / "run", **kw), plan.num_gpus, free_port()),
                plan.num_gpus)
    execute(opts(pf, tmp / "ref", reference=True, **kw))
    return tmp / "run" / "metrics.jsonl", tmp / "ref" / "reference.jsonl"


SHAPES = {
    # id: (stages (first, end, tp), dp, micro-batches, sharding, sequence parallel, virtual)
    "zero1-dp2-pp2": ([(0, 2, 1), (2, 6, 1)], 2, 2, "zero1", False, 1),
    "fsdp-dp2-tp2-sp": ([(0, 6, 2)], 2, 2, "fsdp", True, 1),
    "zero2-dp2": ([(0, 6, 1)], 2, 2, "zero2", False, 1),
    "interleaved": ([(0, 1, 1), (1, 3, 1), (3, 4, 1), (4, 6, 1)], 1, 4, "none", False, 2),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_plan_shapes_train_like_one_process(shape: str, tmp_path: Path) -> None:
    stages, dp, m, sharding, sp, v = SHAPES[shape]
    plan = plan_of(stages, dp=dp, m=m, sharding=sharding, sp=sp, v=v)
    run, ref = train_plan(plan, tmp_path)
    got, want = losses(run), losses(ref)
    assert len(got) == len(want) == 2 * STEPS
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    meta = read_metrics(run)
    assert meta.header["world_size"] == plan.num_gpus
    mem = meta.steps[-1]["memory"]
    assert [g["stage"] for g in mem] == list(range(plan.pp))
    assert all(g["params_gb"] > 0 and g["optimizer_gb"] > 0 and g["activations_gb"] > 0
               for g in mem)


def test_cli_rehearsal_of_an_uneven_plan_learns_like_one_process(tmp_path: Path) -> None:
    """`espresso train PLAN --local` (torchrun, 4 processes: stages of 1, 3 and 2 blocks, the
    middle one TP 2 with sequence parallelism) on the example text: the loss goes down over
    a few steps and equals `--reference`'s step by step; `espresso compare` reads the run."""
    common = [str(UNEVEN), "--data", TEXT, "--steps", "6", "--lr", "3e-3",
              "--checkpoint-every", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "espresso.cli", "train", *common, "--local",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r2 = subprocess.run([sys.executable, "-m", "espresso.train", *common, "--reference",
                         "--out", str(tmp_path / "ref")], capture_output=True, text=True,
                        timeout=300, env=env)
    assert r2.returncode == 0, r2.stderr
    got = losses(tmp_path / "run" / "metrics.jsonl")
    want = losses(tmp_path / "ref" / "reference.jsonl")
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert got[-2] < got[0] - 0.3  # it learns: the last loss against the first
    c = subprocess.run([sys.executable, "-m", "espresso.cli", "compare", str(UNEVEN),
                        str(tmp_path / "run" / "metrics.jsonl")], capture_output=True,
                       text=True, timeout=60, env={**env, "COLUMNS": "120"})
    assert c.returncode == 0, c.stderr
    assert "iteration time" in c.stdout and "group 1 (L40S x2) peak" in c.stdout
    assert "not on the plan's GPUs" in c.stdout


def test_a_resumed_run_continues_exactly(tmp_path: Path) -> None:
    """Checkpoints every 2 steps; the run is cut back to its step-1 checkpoint and resumed:
    steps 2-3 come out as in the uninterrupted run (weights, optimizer, data position)."""
    plan = plan_of([(0, 6, 1)], m=2)
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    o = opts(pf, tmp_path / "run", steps=4, checkpoint_every=2)
    execute(o)
    whole = losses(tmp_path / "run" / "metrics.jsonl")
    ck = tmp_path / "run" / "checkpoints"
    shutil.rmtree(ck / "step_00000003")
    (ck / "latest").write_text("step_00000001")
    execute(o)
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl").steps
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert steps[2]["index_in_run"] == 0  # written by the resumed run
    assert losses(tmp_path / "run" / "metrics.jsonl") == pytest.approx(whole, rel=1e-6)
    meta = json.loads((ck / "step_00000003" / "espresso.json").read_text())
    assert meta["data"]["sequences"] == 4 * plan.job.global_batch_size


def test_a_multi_gpu_plan_outside_a_launcher_is_explained(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    for var in ("RANK", "ESPRESSO_FIRST_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(TrainError, match=r"the plan runs 4 processes: rehearse it .* --local"):
        execute(opts(UNEVEN, tmp_path))
    with pytest.raises(TrainError, match="fp16: autocast to fp16 needs a GPU"):
        execute(opts(UNEVEN, tmp_path, reference=True, precision="fp16"))


def test_auto_precision_follows_the_plans_gpus() -> None:
    """fp32 on CPU; on a GPU, fp16 with loss scaling when a stage's GPU type lacks bf16
    (V100, T4), else bf16; the loss scaler halves on overflow and grows after good steps."""
    from espresso.train.loop import LossScaler, plan_lacks_bf16, resolve_precision

    plan = es.Plan.from_json(UNEVEN)
    assert resolve_precision("auto", plan, torch.device("cpu")) == "fp32"
    assert plan_lacks_bf16(plan) == []
    v100 = plan_of([(0, 3, 1), (3, 6, 1)])
    from dataclasses import replace

    v100 = replace(v100, stages=(replace(v100.stages[0], gpu="V100-32GB"), v100.stages[1]))
    assert plan_lacks_bf16(v100) == ["V100-32GB"]
    sc = LossScaler(scale=8.0, interval=2)
    sc.update(True)
    assert sc.scale == 4.0
    sc.update(False)
    sc.update(False)
    assert sc.scale == 8.0
