"""espresso.torch on CPU with gloo: pipeline stages from a plan reproduce a single-process
run (losses and every gradient) for an uneven 1F1B split, pp x dp, GPipe, and stages of
different tensor-parallel widths (with and without dp)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _helpers import spawn_ranks  # noqa: E402

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


TP_PLAN = {"fc1": "colwise", "fc2": "rowwise"}


# The runner trains in fp32 here: 4 bytes of weight and 4 of gradient per parameter. The
# memory check compares proportions (sharded over unsharded), whatever the optimizer keeps.
FP32 = es.CostParams(bytes_per_weight=4, bytes_per_grad=4)


def make_plan(stages: list[tuple[int, int]], dp: int, m: int, schedule: str,
              tp: tuple[int, ...] | None = None, *, sharding: str = "none",
              recompute: str = "none", sequence_parallel: bool = False,
              virtual_stages: int = 1) -> es.Plan:
    model = es.ModelSpec(name="tiny", num_layers=L, hidden_size=H, num_heads=2, vocab_size=V)
    job = es.Job(model=model, seq_len=SEQ, global_batch_size=dp * m, iterations=1,
                 deadline_hours=1, optimizer="sgd")
    tps = tp or (1,) * len(stages)
    return es.Plan(job=job, dp=dp, micro_batch_size=1, num_microbatches=m, schedule=schedule,
                   stages=tuple(es.Stage(gpu="L4", layers=s, tp=t)
                                for s, t in zip(stages, tps, strict=True)),
                   sharding=sharding, recompute=recompute,
                   sequence_parallel=sequence_parallel, virtual_stages=virtual_stages,
                   cost_model=FP32)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(rt: object, opt: object) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) this rank holds, in bytes."""
    params = list(rt.module.parameters())  # type: ignore[attr-defined]
    w = sum(_local(p).numel() * p.element_size() for p in params)
    g = sum(_local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None)
    inner = getattr(opt, "optim", opt)
    o = sum(_local(v).numel() * v.element_size() for st in inner.state.values()  # type: ignore[attr-defined]
            for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
    return w, g, o


def worker_many(rank: int, jobs: list[tuple[str, int, str]]) -> None:
    """`worker` for several plans of one world size in the same processes, one after the
    other (each with its own process group): starting the processes (importing torch) is
    most of these tests' time. `jobs`: (plan JSON, port, folder for the held states or
    "")."""
    for plan_json, port, states, *label in jobs:
        if states:
            os.environ["ESPRESSO_TEST_STATES"] = states
        else:
            os.environ.pop("ESPRESSO_TEST_STATES", None)
        try:
            worker(rank, plan_json, port)
        except Exception as exc:
            msg = f"{label[0] if label else 'plan'} (rank {rank}): {exc!r}"
            raise AssertionError(msg) from exc


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

    # The embedding and head of a TP stage split by vocabulary.
    rt = et.setup(plan, embedding=emb, blocks=blocks, head=head, loss_fn=loss_fn,
                  rank=rank, world_size=world, tp_plan=TP_PLAN, embedding_tp_plan="rowwise",
                  head_tp_plan="colwise")
    tp = plan.stages[rt.info.stage].tp
    sharded = plan.sharding in ("zero2", "fsdp") and plan.dp > 1
    for blk in blocks[slice(*plan.stages[rt.info.stage].layers)]:
        # Split over the TP group: this rank holds 1/tp of each MLP matrix (and 1/dp of that
        # when FSDP shards it at rest).
        rows = 4 * H // tp // (plan.dp if sharded else 1)
        assert _local(blk.fc1.weight).shape == (rows, H)
        assert hasattr(blk.fc2.weight, "to_local") == (tp > 1 or sharded)
    if tp > 1:  # 1/tp of the vocabulary (rows of the embedding, columns of the logits)
        split = V // tp // (plan.dp if sharded else 1)
        if rt.is_first:
            assert _local(emb.weight).shape == (split, H)
        if rt.is_last:
            assert _local(head.weight).shape == (split, H)
    r, per = rt.info.replica, plan.micro_batch_size * plan.num_microbatches
    xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
    tokens: list[int] = []  # how many tokens of a micro-batch this rank's blocks see
    a0 = plan.stages[rt.info.stage].layers[0]
    hook = blocks[a0].register_forward_pre_hook(lambda _m, args: tokens.append(args[0].shape[1]))
    losses = rt.step(xs, ys)
    hook.remove()
    # No stage keeps its outputs past the step (torch's last stage would hold every
    # micro-batch's logits through the optimizer step unless told not to return them).
    assert all(not st.output_chunks for st in rt.stages)
    assert tokens and set(tokens) == {SEQ // tp if plan.sequence_parallel else SEQ}
    assert (losses is not None) == rt.reports_loss
    if rt.reports_loss:
        assert losses is not None
        mean = torch.stack(losses).mean()
        torch.distributed.all_reduce(mean, group=rt.dp_group)
        mean /= plan.dp
        assert torch.allclose(mean, ref_loss, atol=1e-5), (float(mean), float(ref_loss))
    # Every parameter of this stage has the reference gradient (a TP shard: the gathered one).
    # This rank's blocks: its stage's, or under interleaving those of all its stages.
    own = [i for s in plan.device_stages(rt.info.stage) for i in range(*plan.stages[s].layers)]
    mine = (([emb] if rt.is_first else []) + [blocks[i] for i in own]
            + ([head] if rt.is_last else []))
    theirs = (([ref_emb] if rt.is_first else []) + [ref_blocks[i] for i in own]
              + ([ref_head] if rt.is_last else []))
    if plan.virtual_stages > 1:
        assert len(rt.stages) == plan.virtual_stages or not rt.is_tp_leader
        assert type(rt.schedule).__name__ == ("ScheduleInterleaved1F1B" if rt.is_tp_leader
                                              else "NoneType")

    def check_grads(step: int) -> None:
        for m_mine, m_ref in zip(mine, theirs, strict=True):
            for (n, p), (_, q) in zip(m_mine.named_parameters(), m_ref.named_parameters(),
                                      strict=True):
                assert p.grad is not None, n
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                assert torch.allclose(g, q.grad, atol=1e-5, rtol=1e-4), (rank, step, n)

    check_grads(0)
    # A second step from zeroed gradients (DDP rebuilds its buckets here; with as many
    # micro-batches as stages it once asserted) gives the same gradients again.
    for p in rt.module.parameters():
        p.grad = None
    rt.step(xs, ys)
    check_grads(1)
    # One optimizer step, sharded as the plan says, moves every parameter as the
    # single-process optimizer does (SGD with momentum: linear in the gradients, so rounding
    # noise stays small; Adam's first step would amplify it to +-lr on tiny gradients).
    opt = rt.optimizer(torch.optim.SGD, lr=0.1, momentum=0.9)
    opt.step()
    ref_opt = torch.optim.SGD([q for m in theirs for q in m.parameters()], lr=0.1, momentum=0.9)
    ref_opt.step()
    for m_mine, m_ref in zip(mine, theirs, strict=True):
        for (n, p), (_, q) in zip(m_mine.named_parameters(), m_ref.named_parameters(),
                                  strict=True):
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            assert torch.allclose(full.detach(), q.detach(), atol=1e-5), (rank, "step", n)
    if os.environ.get("ESPRESSO_TEST_STATES"):
        # What this rank holds, for the memory comparison (written by TP leaders).
        w, g, o = state_bytes(rt, opt)
        if rt.info.tp_index == 0:
            Path(os.environ["ESPRESSO_TEST_STATES"], f"{rank}.txt").write_text(
                f"{rt.info.stage} {w} {g} {o}")
    et.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PIPELINES = [
    # (id, stages, dp, micro-batches, schedule, tp, sequence parallel, virtual stages)
    ("uneven-1f1b", [(0, 1), (1, 4)], 1, 4, "1f1b", None, False, 1),  # two stages, uneven
    ("pp2xdp2", [(0, 3), (3, 4)], 2, 2, "1f1b", None, False, 1),     # pp 2 x dp 2
    ("gpipe", [(0, 2), (2, 4)], 1, 3, "gpipe", None, False, 1),      # GPipe
    ("tp2-tp1", [(0, 1), (1, 4)], 1, 4, "1f1b", (2, 1), False, 1),    # tp 2 feeding tp 1
    ("tp1-tp2-dp2", [(0, 3), (3, 4)], 2, 2, "gpipe", (1, 2), False, 1),  # tp 1 -> tp 2, dp 2
    ("tp2-alone", [(0, 4)], 1, 2, "1f1b", (2,), False, 1),           # one stage of tp 2
    ("m-below-pp", [(0, 1), (1, 2), (2, 4)], 1, 2, "1f1b", None, False, 1),  # M < stages
    ("tp2-sp-tp1", [(0, 1), (1, 4)], 1, 4, "1f1b", (2, 1), True, 1),  # SP on stage 0
    ("tp1-tp2-sp-dp2", [(0, 3), (3, 4)], 2, 2, "gpipe", (1, 2), True, 1),  # ... last, dp 2
    # Interleaved 1F1B: two GPU groups with two stages each (virtual_stages 2)
    ("interleaved", [(0, 1), (1, 2), (2, 3), (3, 4)], 1, 4, "1f1b", None, False, 2),
    ("interleaved-dp2", [(0, 1), (1, 2), (2, 3), (3, 4)], 2, 2, "1f1b", None, False, 2),
    ("interleaved-tp2-sp", [(0, 1), (1, 2), (2, 3), (3, 4)], 1, 2, "1f1b", (2, 1, 2, 1), True,
     2),
]


def _pipeline_plans() -> dict[int, list[tuple[str, es.Plan]]]:
    """The cases by world size: the plans of one size run in the same processes."""
    out: dict[int, list[tuple[str, es.Plan]]] = {}
    for name, stages, dp, m, schedule, tp, sp, v in PIPELINES:
        plan = make_plan(stages, dp, m, schedule, tp, sequence_parallel=sp, virtual_stages=v)
        out.setdefault(plan.num_gpus, []).append((name, plan))
    return out


@pytest.mark.parametrize("world", sorted(_pipeline_plans()),
                         ids=lambda w: "+".join(n for n, _ in _pipeline_plans()[w]))
def test_pipeline_matches_single_process(world: int) -> None:
    """Each plan's losses and every gradient equal one process's, twice, and one SGD step
    moves every parameter alike (`worker`)."""
    jobs = [(plan.to_json(), free_port(), "", name) for name, plan in _pipeline_plans()[world]]
    spawn_ranks(worker_many, (jobs,), world)


@pytest.mark.parametrize(
    ("stages", "tp", "sharding", "recompute", "sp", "v"),
    [
        ([(0, 4)], None, "zero1", "none", False, 1),
        ([(0, 4)], None, "zero2", "none", False, 1),
        ([(0, 4)], None, "fsdp", "full", False, 1),
        ([(0, 2), (2, 4)], None, "fsdp", "selective", False, 1),
        ([(0, 3), (3, 4)], (2, 1), "fsdp", "none", False, 1),   # FSDP over TP shards (2-D)
        ([(0, 3), (3, 4)], (2, 1), "zero2", "selective", True, 1),   # ... with sequence parallelism
        ([(0, 1), (1, 2), (2, 3), (3, 4)], None, "fsdp", "none", False, 2),  # interleaved
    ],
    ids=["zero1", "zero2", "fsdp-full", "pp2-fsdp-selective", "tp2-fsdp", "tp2-sp-zero2",
         "interleaved-fsdp"],
)
def test_sharded_plans_match_single_process(stages: list[tuple[int, int]],
                                            tp: tuple[int, ...] | None, sharding: str,
                                            recompute: str, sp: bool, v: int, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Sharded data parallelism (dp 2, 2 micro-batches per replica) and recomputation: the
    same losses, gradients and AdamW step as one process; and each rank holds the model
    states the estimate says (weights, gradients, optimizer states per GPU)."""
    plan = make_plan(stages, 2, 2, "1f1b", tp, sharding=sharding, recompute=recompute,
                     sequence_parallel=sp, virtual_stages=v)
    plain = make_plan(stages, 2, 2, "1f1b", tp, sequence_parallel=sp, virtual_stages=v)
    (tmp_path / "plain").mkdir()
    # The sharded plan, then the same plan without sharding, in the same processes.
    spawn_ranks(worker_many, ([(plan.to_json(), free_port(), str(tmp_path)),
                               (plain.to_json(), free_port(), str(tmp_path / "plain"))],),
                plan.num_gpus)

    def held(d: Path) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for f in d.glob("*.txt"):
            st, *nums = map(int, f.read_text().split())
            out[st] = [a + b for a, b in zip(out.get(st, [0, 0, 0]), nums, strict=True)]
        return out

    got, base = held(tmp_path), held(tmp_path / "plain")
    est = es.estimate(plan, es.Catalog.builtin("gpus"))
    ref = es.estimate(plain, es.Catalog.builtin("gpus"))
    for st, (w, g, o) in got.items():
        bw, bg, bo = base[st]
        e, r = est.stages[st], ref.stages[st]
        # The fraction of each kind of state a rank keeps, measured vs estimated (FSDP pads
        # and ZeRO-1 partitions whole tensors, hence the tolerance).
        if sharding == "zero2":
            # Gathered from the first forward to the last backward (the estimate's peak),
            # sharded between steps, where this is measured.
            assert w / bw <= e.weights_gb / r.weights_gb * 1.01, ("weights", st)
        else:
            assert w / bw == pytest.approx(e.weights_gb / r.weights_gb, rel=0.15), ("weights", st)
        assert g / bg == pytest.approx(e.grads_gb / r.grads_gb, rel=0.15), ("grads", st)
        assert o / bo == pytest.approx(e.optimizer_gb / r.optimizer_gb, rel=0.15), ("optim", st)


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
    op = es.Plan.from_dict({**plan.to_dict(), "recompute": "selective-op", "gpus": plan.gpus})
    with pytest.raises(PlanError, match=r"runner cannot run this plan \(no selective-op "
                                        r"recomputation\)"):
        et.check_plan(op, L)
    tp2 = make_plan([(0, 1), (1, 4)], 1, 4, "1f1b")
    tp2 = es.Plan.from_dict({**tp2.to_dict(), "stages": [
        {"gpu": "L4", "tp": 2, "layers": [0, 1]}, {"gpu": "L4", "tp": 1, "layers": [1, 4]}],
        "gpus": {"L4": 3}})
    with pytest.raises(PlanError, match="stage 0 has tp 2: give setup"):
        et.check_plan(tp2, L)
    tp4 = es.Plan.from_dict({**tp2.to_dict(), "stages": [
        {"gpu": "L4", "tp": 4, "layers": [0, 1]}, {"gpu": "L4", "tp": 1, "layers": [1, 4]}],
        "gpus": {"L4": 5}})
    with pytest.raises(PlanError, match="tp 4, which does not divide the model's num_heads 2"):
        et.check_plan(tp4, L, tp_plan=TP_PLAN)
    with pytest.raises(PlanError, match="has no such submodule"):
        et.parallelize_blocks(torch.nn.Sequential(emb, blocks[0]), tp2, 0, None,
                              {"attn.q": "colwise"})
    with pytest.raises(PlanError, match="expected 'colwise' or 'rowwise', got 'cols'"):
        et.parallelize_blocks(torch.nn.Sequential(emb, blocks[0]), tp2, 0, None,
                              {"fc1": "cols"})
    from dataclasses import replace

    odd = replace(tp2, sequence_parallel=True,
                  job=replace(tp2.job, seq_len=7))
    with pytest.raises(PlanError, match="tp must divide seq_len"):
        et.setup(odd, embedding=emb, blocks=blocks, head=head,
                 loss_fn=loss_fn, tp_plan=TP_PLAN, rank=0, world_size=tp2.num_gpus)
    with pytest.raises(PlanError, match="head tp_plan names 'out'"):
        et.parallelize_vocab(torch.nn.Sequential(emb, head), tp2, 1, None, None, {"out": "colwise"})
    assert not torch.distributed.is_initialized()  # refused before any process group


@pytest.mark.parametrize("plan_file", ["tiny-gpt-2x2.json", "tiny-gpt-tp.json",
                                       "tiny-gpt-interleaved.json"])
def test_launch_local_matches_a_single_process(plan_file: str) -> None:
    """`espresso launch --local` rehearses the example training script on CPU with gloo; its
    losses equal the same script's single-process reference run (pp 2 x dp 2; tp 2 -> tp 1
    with sequence parallelism; two GPU groups interleaving two stages each)."""
    import re
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    plan, script = root / "examples" / "plans" / plan_file, root / "examples" / "train_gpt.py"
    steps = ["--script-args", "--steps 3"]
    r = subprocess.run([sys.executable, "-m", "espresso.cli", "launch", str(plan), "--local",
                        "--script", str(script), *steps],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = subprocess.run([sys.executable, str(script), "--plan", str(plan), "--reference",
                          "--steps", "3"], capture_output=True, text=True, timeout=120,
                         check=True)
    got = [float(x) for x in re.findall(r"loss (\S+),", r.stdout)]
    want = [float(x) for x in re.findall(r"loss (\S+),", ref.stdout)]
    assert len(got) == len(want) == 3, (r.stdout, ref.stdout)
    assert got == pytest.approx(want, abs=2e-4)
    assert want[2] < want[0]  # it trains


def test_printed_torchrun_commands_run_as_two_nodes(tmp_path: Path) -> None:
    """The node scripts `espresso launch --hosts --out-dir` writes, run side by side on this
    machine as two 'nodes' (an A100 pair for the tp-2 stage, an L4 for the last stage), train
    the example with the losses of the single-process reference."""
    import re
    import subprocess
    import sys

    import yaml

    root = Path(__file__).parents[1]
    plan = root / "examples" / "plans" / "tiny-gpt-tp.json"
    script = root / "examples" / "train_gpt.py"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": [
        {"address": "127.0.0.1", "gpu": "L4", "gpus": 1},
        {"address": "127.0.0.1", "gpu": "A100-80GB", "gpus": 2}]}))
    port = free_port()
    subprocess.run([sys.executable, "-m", "espresso.cli", "launch", str(plan), "--hosts",
                    str(hosts), "--script", str(script), "--script-args", "--steps 2",
                    "--port", str(port), "--out-dir", str(tmp_path / "run")],
                   check=True, capture_output=True, timeout=60)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    nodes = [subprocess.Popen(["bash", str(tmp_path / "run" / f"node{i}.sh")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = []
    for n in nodes:
        try:
            outs.append(n.communicate(timeout=240)[0])
        finally:
            n.kill()
    assert [n.returncode for n in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    ref = subprocess.run([sys.executable, str(script), "--plan", str(plan), "--reference",
                          "--steps", "2"], capture_output=True, text=True, timeout=120,
                         check=True)
    got = [float(x) for x in re.findall(r"loss (\S+),", outs[1])]  # node 1: the last stage
    want = [float(x) for x in re.findall(r"loss (\S+),", ref.stdout)]
    assert len(got) == len(want) == 2
    assert got == pytest.approx(want, abs=2e-4)


GQA = es.ModelSpec(name="tiny-gqa", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                   ffn_hidden_size=48, vocab_size=64, gated_mlp=True)


def builtin_worker(rank: int, plan_json: str, port: int) -> None:
    """The built-in modules (fused QKV of grouped-query attention, fused gate-up, rotary
    positions) split over TP ranks with sequence parallelism and a vocabulary-parallel
    embedding and head: losses and every gradient equal one process's."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import espresso.torch as et
    from espresso import modules as em

    plan = es.Plan.from_json(plan_json)

    def build() -> tuple[torch.nn.Module, list[torch.nn.Module], torch.nn.Module]:
        torch.manual_seed(0)
        return (em.build_embedding(GQA), [em.build_block(GQA) for _ in range(GQA.num_layers)],
                em.build_head(GQA))

    emb, blocks, head = build()
    ref_emb, ref_blocks, ref_head = build()
    B, S = plan.job.global_batch_size, plan.job.seq_len
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, GQA.vocab_size, (B, S), generator=g)
    y = torch.randint(0, GQA.vocab_size, (B, S), generator=g)
    loss = em.lm_loss(GQA)
    ref_loss = loss(torch.nn.Sequential(ref_emb, *ref_blocks, ref_head)(x), y)
    ref_loss.backward()
    rt = et.setup(plan, embedding=emb, blocks=blocks, head=head, loss_fn=loss, rank=rank,
                  world_size=plan.num_gpus, tp_plan=em.tp_plan(GQA),
                  embedding_tp_plan=em.embedding_tp_plan(GQA), head_tp_plan=em.head_tp_plan(GQA))
    losses = rt.step(x, y)
    if rt.reports_loss:
        assert losses is not None
        assert torch.allclose(torch.stack(losses).mean(), ref_loss, atol=1e-5)
    a, b = plan.stages[rt.info.stage].layers
    mine = ([emb] if rt.is_first else []) + blocks[a:b] + ([head] if rt.is_last else [])
    theirs = (([ref_emb] if rt.is_first else []) + ref_blocks[a:b]
              + ([ref_head] if rt.is_last else []))
    for m_mine, m_ref in zip(mine, theirs, strict=True):
        for (n, p), (_, q) in zip(m_mine.named_parameters(), m_ref.named_parameters(),
                                  strict=True):
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            assert torch.allclose(grad, q.grad, atol=1e-5, rtol=1e-4), (rank, n)
    if rt.info.stage == 0:  # this rank holds 2 of the 4 query heads and 1 of the 2 KV heads
        assert _local(blocks[0].attn.qkv.weight).shape == ((2 + 2 * 1) * GQA.head_dim, 32)
    et.shutdown()


def test_builtin_modules_with_sequence_parallelism_match_single_process() -> None:
    job = es.Job(model=GQA, seq_len=8, global_batch_size=2, iterations=1, deadline_hours=1)
    plan = es.Plan(job=job, micro_batch_size=1, num_microbatches=2, sequence_parallel=True,
                   stages=(es.Stage(gpu="L4", layers=(0, 1), tp=2),
                           es.Stage(gpu="L4", layers=(1, 2), tp=2)))
    spawn_ranks(builtin_worker, (plan.to_json(), free_port()), plan.num_gpus)
