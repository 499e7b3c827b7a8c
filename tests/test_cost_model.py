"""The cost model against hand calculations (every number below is worked out in the
comments from the formulas of docs/cost-model.md, not taken from the code)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _helpers import make_plan

import espresso as es
from espresso import _core

# Tiny model (conftest): h=64, a=4, kv dim 32, f=128 SwiGLU, V=100; micro-batch b=2, s=8.
BLOCK_PARAMS = 36992                        # 12288 attention + 24576 MLP + 128 norms
BLOCK_FWD = 2 * 16 * 36864 + 4 * 2 * 64 * 64  # 1,212,416 FLOPs
HEAD_FWD = 2 * 16 * 64 * 100                # 204,800 FLOPs
# Time of a block in FLOPs at the GPU's rate: the matmuls (1,179,648 forward, twice that
# backward) and the flash-attention core, which skips the causally masked half of its
# 32,768 FLOPs (16,384 run forward, 2.5 x that backward).
GEMM_FWD = 2 * 16 * 36864
ATTN_RUN = 0.5 * 4 * 2 * 64 * 64
BLOCK_T_F = GEMM_FWD + ATTN_RUN             # 1,196,032
BLOCK_T_B = 2 * GEMM_FWD + 2.5 * ATTN_RUN   # 2,400,256
# Activations per block, tp 1, flash attention, dropout masks (bytes):
#   replicated: QKV in, MLP in, two norm inputs: 4*s*b*h*2 = 8192; masks 2*s*b*h = 2048
#   split: Q + out-proj input 2*s*b*h*2 = 4096, K and V 2*s*b*32*2 = 2048,
#          SwiGLU interior 4*s*b*f*2 = 16384, log-sum-exp 4*a*s*b = 256
BLOCK_ACT = 8192 + 2048 + 4096 + 2048 + 16384 + 256
# A block's backward working set: the gradients at its output and input 2*s*b*h*2 = 4096,
# the MLP's two interior gradients 2*s*b*f*2 = 8192, the attention's Q, K, V gradients
# s*b*(h + 2*32)*2 = 4096.
BLOCK_BWD = 4096 + 8192 + 4096
IDS = 8 * 2 * 8  # the first stage's token ids (int64) per micro-batch in flight
# The last stage's loss: s*b*V*6 bytes of logits at a fused cross-entropy's peak (9600), and
# the final norm's and the head's inputs, 2*s*b*h*2 = 4096; less than BLOCK_BWD here.
LOSS = 9600 + 4096


def test_block_activation_bytes_by_hand(tiny_model: es.ModelSpec) -> None:
    p = es.CostParams()._core()
    assert _core.block_activation_bytes(tiny_model._dims(), p, 8, 2, 1) == BLOCK_ACT
    # tp 2 splits everything but the 10240 replicated bytes.
    assert _core.block_activation_bytes(tiny_model._dims(), p, 8, 2, 2) == (
        10240 + (BLOCK_ACT - 10240) / 2)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("s", [512, 2048])
def test_activations_match_korthikanti(tp: int, s: int) -> None:
    # Korthikanti et al. 2022, eq. 2 (tensor parallel, no sequence parallelism):
    # s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes for a GPT block (MHA, 4h GeLU MLP, dropout).
    m = es.ModelSpec(name="gpt", num_layers=1, hidden_size=1024, num_heads=16, vocab_size=10)
    p = es.CostParams(flash_attention=False, dropout_masks=True)._core()
    b, h, a = 2, 1024, 16
    expected = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert _core.block_activation_bytes(m._dims(), p, s, b, tp) == pytest.approx(expected)


@pytest.mark.parametrize("tp", [2, 8])
def test_selective_recomputation_keeps_korthikantis_34_sbh_over_t(tp: int) -> None:
    """Korthikanti et al. 2022, eq. 6: with sequence parallelism and selective recomputation a
    GPT block stores 34*s*b*h/t bytes (the score-sized tensors are rebuilt, one block at a
    time); without recomputation it stores 5*a*s^2*b/t more."""
    m = es.ModelSpec(name="gpt", num_layers=4, hidden_size=1024, num_heads=16, vocab_size=1024)
    job = es.Job(model=m, seq_len=2048, global_batch_size=2, iterations=1, deadline_hours=1)
    cost = es.CostParams(flash_attention=False, dropout_masks=True)
    s, b, h, a = 2048, 2, 1024, 16

    def stage(recompute: str) -> object:
        plan = es.Plan(job=job, stages=(es.Stage(gpu="H100-SXM", tp=tp, layers=(0, 4)),),
                       micro_batch_size=b, num_microbatches=1, recompute=recompute,
                       sequence_parallel=True, cost_model=cost)
        return es.estimate(plan).stages[0]

    sel, none = stage("selective"), stage("none")
    scores = 5 * a * s * s * b / tp
    ids = s * b * 8  # the token ids the embedding keeps
    assert sel.activations_gb * 1e9 == pytest.approx(4 * 34 * s * b * h / tp + ids)
    assert none.activations_gb * 1e9 == pytest.approx(4 * 34 * s * b * h / tp + 4 * scores + ids)
    assert sel.transient_gb * 1e9 >= scores  # one block's scores while it is rebuilt


def test_two_stage_plan_by_hand(tiny_job: es.Job, tiny_catalog: es.Catalog,
                                exact_links: es.CostParams) -> None:
    plan = make_plan(tiny_job, [("X", 1, 0, 3), ("Y", 1, 3, 4)], dp=2, micro_batch_size=2,
                     num_microbatches=4, cost_model=exact_links)
    est = es.estimate(plan, tiny_catalog)
    s0, s1 = est.stages
    # Stage 0 on X (5e8 FLOP/s): 3 blocks. Stage 1 on Y (1e9 FLOP/s): 1 block + LM head.
    assert s0.fwd_s == pytest.approx(3 * BLOCK_T_F / 5e8)            # 7.176192 ms
    assert s0.bwd_s == pytest.approx(3 * BLOCK_T_B / 5e8)            # 14.401536 ms
    assert s1.fwd_s == pytest.approx((BLOCK_T_F + HEAD_FWD) / 1e9)   # 1.400832 ms
    assert s1.bwd_s == pytest.approx((BLOCK_T_B + 2 * HEAD_FWD) / 1e9)  # 2.809856 ms
    # Boundary: s*b*h*2 = 2048 bytes over min(1, 0.5) GB/s (different types: network).
    assert not s0.send_intra_node
    assert s0.send_s == pytest.approx(2048 / 0.5e9)
    # 1F1B, P=2, M=4 simulated by hand (ms): stage 0 is never idle, so the makespan is
    # its busy time 4 * (7.176192 + 14.401536) = 86.310912 ms.
    assert est.pipeline_s == pytest.approx(0.086310912)
    # The closed form sum(f+b) + 3*max(f+b) = 21.577728 + 4.210688 + 64.733184 ms is
    # *above* the simulation: with 1F1B a slow first stage hides the later ones.
    assert est.closed_form_s == pytest.approx(0.0905216)
    # DP all-reduce (dp 2, ring: 2*(2-1)/2 * bytes / bw): stage 0 holds 3 blocks + the
    # embedding = 117376 params -> 234752 grad bytes; stage 1 holds 43456 params -> 86912
    # bytes. dp * tp = 2 GPUs fit an 8-GPU node, so both use the 10 GB/s intra-node link.
    assert s0.dp_allreduce_s == pytest.approx(234752 / 10e9)
    assert s1.dp_allreduce_s == pytest.approx(86912 / 10e9)
    assert est.dp_allreduce_s == pytest.approx(234752 / 10e9)
    # Optimizer step: 28 bytes of traffic per parameter at memory bandwidth (1e6 GB/s).
    assert est.optimizer_step_s == pytest.approx(117376 * 28 / 1e15)
    iteration = 0.086310912 + 0.0000234752 + 117376 * 28 / 1e15
    assert est.iteration_s == pytest.approx(iteration)
    # Memory (bytes per GPU): 2 + 2 + 12 bytes per parameter, activations in flight (and
    # the token ids on the first stage), one block's backward working set.
    assert s0.in_flight == 2 and s1.in_flight == 1
    assert s0.memory_gb * 1e9 == pytest.approx(117376 * 16 + 2 * (3 * BLOCK_ACT + IDS) +
                                               BLOCK_BWD)
    # Last stage: the larger of the loss's working set and a block's backward.
    assert s1.memory_gb * 1e9 == pytest.approx(43456 * 16 + 1 * BLOCK_ACT + max(LOSS, BLOCK_BWD))
    assert s1.transient_gb * 1e9 == pytest.approx(BLOCK_BWD)
    assert s0.capacity_gb == pytest.approx(4 * 0.95 - 1.5)
    # Cost: 2 GPUs of X at $2 and 2 of Y at $3, rented as whole 8-GPU instances: one of
    # each, 6 idle GPUs in each, 8 * 2 + 8 * 3 = $40/h; 1000 iterations.
    assert est.gpus == {"X": 2, "Y": 2}
    assert est.instances == {"X": 1, "Y": 1}
    assert est.idle_gpus == 12
    assert est.hourly_usd == pytest.approx(40.0)
    assert est.total_hours == pytest.approx(1000 * iteration / 3600)
    assert est.total_usd == pytest.approx(40.0 * 1000 * iteration / 3600)
    assert est.transfer_usd == 0
    assert est.feasible and est.meets_deadline
    assert est.bottleneck_stage == 0
    # bubble: 1 - 4 * (21.577728 + 4.210688) / (2 * 86.310912)
    assert est.bubble_fraction == pytest.approx(1 - 4 * (0.021577728 + 0.004210688) / 0.172621824)


def test_tensor_parallel_time_and_memory(tiny_job: es.Job, tiny_catalog: es.Catalog,
                                         exact_links: es.CostParams) -> None:
    plan = make_plan(tiny_job, [("X", 2, 0, 4)], dp=1, micro_batch_size=2, num_microbatches=8,
                     cost_model=exact_links)
    (s0,) = es.estimate(plan, tiny_catalog).stages
    # Compute splits over 2 GPUs; each block adds 2 all-reduces of s*b*h*2 = 2048 bytes
    # forward (ring over 2: 2*(1/2)*2048 / 10 GB/s = 204.8 ns) and 2 backward.
    ar = 2048 / 10e9
    assert s0.fwd_s == pytest.approx((4 * BLOCK_T_F + HEAD_FWD) / (2 * 5e8) + 4 * 2 * ar)
    assert s0.bwd_s == pytest.approx((4 * BLOCK_T_B + 2 * HEAD_FWD) / (2 * 5e8) + 4 * 2 * ar)
    # One stage holds everything; parameters split over the 2 TP ranks.
    params = 4 * BLOCK_PARAMS + 6400 + 6400 + 64
    act = 10240 + (BLOCK_ACT - 10240) / 2
    # The backward's gradients at the block's output and input are replicated over the TP
    # ranks, the MLP's and attention's split; the loss's logits are split too.
    bwd = 4096 + (8192 + 4096) / 2
    loss = 9600 / 2 + 4096
    assert s0.transient_gb * 1e9 == pytest.approx(max(bwd, loss))
    assert s0.memory_gb * 1e9 == pytest.approx(params / 2 * 16 + 1 * (4 * act + IDS) +
                                               max(bwd, loss))


def test_full_recomputation(tiny_job: es.Job, tiny_catalog: es.Catalog,
                            exact_links: es.CostParams) -> None:
    base = make_plan(tiny_job, [("X", 1, 0, 2), ("X", 1, 2, 4)], micro_batch_size=2,
                     num_microbatches=8, cost_model=exact_links)
    full = make_plan(tiny_job, [("X", 1, 0, 2), ("X", 1, 2, 4)], micro_batch_size=2,
                     num_microbatches=8, cost_model=exact_links, recompute="full")
    e0, e1 = es.estimate(base, tiny_catalog), es.estimate(full, tiny_catalog)
    # Recomputation adds one forward of the blocks to the backward ...
    assert e1.stages[0].bwd_s == pytest.approx(e0.stages[0].bwd_s + 2 * BLOCK_T_F / 5e8)
    assert e1.stages[0].fwd_s == e0.stages[0].fwd_s
    # ... and keeps only each block's input (s*b*h*2 = 2048 bytes) per micro-batch in
    # flight, plus one block's full activations while it is recomputed (with its backward's
    # gradients).
    assert e1.stages[0].activations_gb * 1e9 == pytest.approx(2 * (2 * 2048 + IDS))
    assert e1.stages[0].transient_gb * 1e9 == pytest.approx(BLOCK_ACT + BLOCK_BWD)
    assert e0.stages[0].transient_gb * 1e9 == pytest.approx(BLOCK_BWD)
    assert e0.stages[0].activations_gb * 1e9 == pytest.approx(2 * (2 * BLOCK_ACT + IDS))
    # Same type, 1 + 1 GPUs fit one 8-GPU node: the boundary uses the intra-node link.
    assert e0.stages[0].send_intra_node
    assert e0.stages[0].send_s == pytest.approx(2048 / 10e9)


def test_placement_rules(tiny_job: es.Job, tiny_catalog: es.Catalog,
                         exact_links: es.CostParams) -> None:
    kw = dict(micro_batch_size=1, cost_model=exact_links)
    # dp 2 x (4 + 4) = 16 GPUs of X do not fit one 8-GPU node: the boundary crosses the
    # network (1 GB/s); each stage's dp x tp = 8 GPUs share a node for the DP all-reduce.
    e = es.estimate(make_plan(tiny_job, [("X", 4, 0, 2), ("X", 4, 2, 4)], dp=2,
                              num_microbatches=8, **kw), tiny_catalog)
    assert not e.stages[0].send_intra_node
    assert e.stages[0].send_s == pytest.approx(1024 / 1e9)  # s*b*h*2 = 8*1*64*2 bytes
    grads0 = e.stages[0].grads_gb * 1e9
    assert e.stages[0].dp_allreduce_s == pytest.approx(grads0 / 10e9)
    # dp 4 x tp 4 = 16 > 8: the DP all-reduce goes over the network.
    e = es.estimate(make_plan(tiny_job, [("X", 4, 0, 4)], dp=4, num_microbatches=4, **kw),
                    tiny_catalog)
    grads = e.stages[0].grads_gb * 1e9
    assert e.stages[0].dp_allreduce_s == pytest.approx(2 * 3 / 4 * grads / 1e9)


def test_gpipe_holds_every_microbatch(tiny_job: es.Job, tiny_catalog: es.Catalog) -> None:
    plan = make_plan(tiny_job, [("X", 1, 0, 2), ("Y", 1, 2, 4)], micro_batch_size=2,
                     num_microbatches=8, schedule="gpipe")
    est = es.estimate(plan, tiny_catalog)
    assert [s.in_flight for s in est.stages] == [8, 8]
    one = es.estimate(make_plan(tiny_job, [("X", 1, 0, 2), ("Y", 1, 2, 4)], micro_batch_size=2,
                                num_microbatches=8), tiny_catalog)
    assert [s.in_flight for s in one.stages] == [2, 1]
    assert est.pipeline_s >= est.closed_form_s


def test_zero1_and_fp32_grads(tiny_job: es.Job, tiny_catalog: es.Catalog) -> None:
    kw = dict(dp=4, micro_batch_size=1, num_microbatches=4)
    plain = es.estimate(make_plan(tiny_job, [("X", 1, 0, 4)], **kw), tiny_catalog).stages[0]
    z = es.estimate(make_plan(tiny_job, [("X", 1, 0, 4)], cost_model=es.CostParams(zero1=True),
                              **kw), tiny_catalog).stages[0]
    g4 = es.estimate(make_plan(tiny_job, [("X", 1, 0, 4)],
                               cost_model=es.CostParams(bytes_per_grad=4), **kw),
                     tiny_catalog).stages[0]
    assert z.optimizer_gb == pytest.approx(plain.optimizer_gb / 4)
    assert g4.grads_gb == pytest.approx(plain.grads_gb * 2)


@pytest.mark.parametrize(("optimizer", "nbytes"), [("sgd", 8), ("adam-bf16", 6), ("adam", 12)])
def test_optimizer_bytes(tiny_model: es.ModelSpec, tiny_catalog: es.Catalog, optimizer: str,
                         nbytes: int) -> None:
    job = es.Job(model=tiny_model, seq_len=8, global_batch_size=4, iterations=1,
                 deadline_hours=1, optimizer=optimizer)
    st = es.estimate(make_plan(job, [("X", 1, 0, 4)], num_microbatches=4), tiny_catalog).stages[0]
    params = 4 * BLOCK_PARAMS + 6400 + 6400 + 64
    assert st.optimizer_gb * 1e9 == pytest.approx(params * nbytes)
    assert es.Job.from_dict(job.to_dict()).optimizer == optimizer


def test_mfu_is_model_flops_over_peak(tiny_job: es.Job, tiny_catalog: es.Catalog,
                                      exact_links: es.CostParams) -> None:
    plan = make_plan(tiny_job, [("X", 1, 0, 4)], micro_batch_size=2, num_microbatches=8,
                     cost_model=exact_links)
    est = es.estimate(plan, tiny_catalog)
    flops = 3 * 8 * (4 * BLOCK_FWD + HEAD_FWD)
    assert est.mfu == pytest.approx(flops / est.iteration_s / 1e9)
    # Never above the efficiency the compute time assumes, except for the causally masked
    # half of the attention that model FLOPs count and flash attention skips.
    run = 8 * (4 * (BLOCK_T_F + BLOCK_T_B) + 3 * HEAD_FWD)
    assert 0.45 < est.mfu <= 0.5 * flops / run


def test_1f1b_with_fewer_microbatches_than_stages_is_estimated_as_gpipe(
        tiny_job: es.Job, tiny_catalog: es.Catalog) -> None:
    """PyTorch's 1F1B needs a micro-batch per stage, so the runner runs such a plan with
    GPipe: the estimate says what runs (time and memory); with one micro-batch the two
    schedules are the same."""
    stages = [("X", 1, 0, 1), ("Y", 1, 1, 2), ("X", 1, 2, 4)]
    for m in (2, 1):
        kw = dict(dp=16 // (2 * m), micro_batch_size=2, num_microbatches=m)
        one = es.estimate(make_plan(tiny_job, stages, **kw), tiny_catalog)
        gp = es.estimate(make_plan(tiny_job, stages, schedule="gpipe", **kw), tiny_catalog)
        assert one.iteration_s == gp.iteration_s
        assert [s.in_flight for s in one.stages] == [m, m, m]
    # With a micro-batch per stage, 1F1B is 1F1B: the last stage holds one.
    kw = dict(dp=2, micro_batch_size=2, num_microbatches=4)
    assert [s.in_flight for s in es.estimate(make_plan(tiny_job, stages, **kw),
                                             tiny_catalog).stages] == [3, 2, 1]


def test_selective_op_keeps_torchtitans_saved_outputs(tiny_job: es.Job, tiny_catalog: es.Catalog,
                                                      exact_links: es.CostParams) -> None:
    """torchtitan's per-op policy (every other matmul's output and the attention kernel's
    saved): per block and micro-batch the input, wq, wv, w1, w2 and the attention output with
    its log-sum-exp; the rest is rebuilt in the backward, one block at a time."""
    plans = {rc: make_plan(tiny_job, [("X", 1, 0, 2), ("X", 1, 2, 4)], micro_batch_size=2,
                           num_microbatches=8, cost_model=exact_links, recompute=rc)
             for rc in ("none", "selective-op", "full")}
    est = {rc: es.estimate(p, tiny_catalog).stages[0] for rc, p in plans.items()}
    sb, h, kv, f, a = 16, 64, 32, 128, 4
    kept = sb * (h + h + kv + f + h + h) * 2 + 4 * a * sb  # input, wq, wv, w1, out, w2; lse
    assert est["selective-op"].activations_gb * 1e9 == pytest.approx(2 * (2 * kept + IDS))
    assert est["selective-op"].transient_gb * 1e9 == pytest.approx(BLOCK_ACT - kept + BLOCK_BWD)
    # Between none and full in memory and in time.
    assert (est["full"].activations_gb < est["selective-op"].activations_gb
            < est["none"].activations_gb)
    assert est["none"].bwd_s < est["selective-op"].bwd_s < est["full"].bwd_s
    assert est["selective-op"].fwd_s == est["none"].fwd_s


def test_unfused_fp32_copies_by_hand(tiny_model: es.ModelSpec) -> None:
    """HF-style blocks: each of the two RMSNorms keeps an fp32 copy of its input (4 bytes per
    element) and the fp32 rotary embedding fp32 copies of Q and K; a learned-position model
    has no rotary copies."""
    plain = es.CostParams()._core()
    unfused = es.CostParams(unfused_fp32_copies=True)._core()
    sb, h, kv = 16, 64, 32
    extra = 2 * 4 * sb * h + 4 * sb * (h + kv)
    assert (_core.block_activation_bytes(tiny_model._dims(), unfused, 8, 2, 1)
            - _core.block_activation_bytes(tiny_model._dims(), plain, 8, 2, 1)) == extra
    # Split over TP ranks: the rotary copies of Q and K only.
    assert (_core.block_activation_bytes(tiny_model._dims(), unfused, 8, 2, 2)
            - _core.block_activation_bytes(tiny_model._dims(), plain, 8, 2, 2)) == (
        2 * 4 * sb * h + 4 * sb * (h + kv) / 2)
    learned = replace(tiny_model, position_embeddings=16)
    assert (_core.block_activation_bytes(learned._dims(), unfused, 8, 2, 1)
            - _core.block_activation_bytes(learned._dims(), plain, 8, 2, 1)) == 2 * 4 * sb * h
