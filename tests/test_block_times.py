"""Properties of the per-block time model (issue 13) that the search relies on, over random
models, GPUs and workloads: every block's forward and backward take at least their
bound FLOPs at the GPU's sustained matmul rate (the search's rate bounds), recomputation and
sharding only add time, and more memory bandwidth or peak never slows a block down."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import espresso as es
from espresso._native import core

HEADS = st.sampled_from([(8, 8), (8, 2), (16, 4), (32, 8)])


@st.composite
def cases(draw: st.DrawFn) -> tuple[es.ModelSpec, es.GpuType, es.CostParams, int, int, int]:
    heads, kv = draw(HEADS)
    head_dim = draw(st.sampled_from([16, 64, 128]))
    h = heads * head_dim
    model = es.ModelSpec(name="m", num_layers=4, hidden_size=h, num_heads=heads,
                         num_kv_heads=kv, ffn_hidden_size=h * draw(st.sampled_from([2, 4])),
                         vocab_size=draw(st.sampled_from([1000, 32000])),
                         gated_mlp=draw(st.booleans()))
    gpu = es.GpuType(name="G", memory_gb=80, bf16_tflops=draw(st.floats(10, 2000)),
                     mem_bandwidth_gbs=draw(st.floats(100, 8000)), price_per_hour=1, count=8,
                     gpus_per_node=8, intra_node_gbs=draw(st.floats(10, 900)),
                     inter_node_gbs=10, efficiency=draw(st.floats(0.3, 1.0)))
    cost = es.CostParams(flash_attention=draw(st.booleans()),
                         dropout_masks=draw(st.booleans()),
                         attention_efficiency=draw(st.floats(0.1, 1.0)),
                         sustained_fraction=draw(st.floats(0.3, 1.0)))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0]))
    return model, gpu, cost, draw(st.sampled_from([1, 64, 512, 4096])), \
        draw(st.sampled_from([1, 2, 8])), tp


def work(s: int, b: int, recompute: str = "none", sp: bool = False) -> object:
    w = core.Workload()
    w.seq_len, w.micro_batch_size, w.num_microbatches, w.global_batch_size = s, b, 1, b
    w.recompute = {"none": core.Recompute.NONE, "full": core.Recompute.FULL,
                   "selective": core.Recompute.SELECTIVE}[recompute]
    w.sequence_parallel = sp
    return w


@settings(max_examples=200, deadline=None)
@given(cases())
def test_block_time_is_at_least_its_bound_flops_at_the_sustained_rate(case: tuple) -> None:
    model, gpu, cost, s, b, tp = case
    dims, spec, params = model._dims(), gpu._spec(), cost._core()
    t = core.block_times(dims, spec, params, work(s, b), tp)
    rate = gpu.bf16_tflops * 1e12 * gpu.efficiency * cost.sustained_fraction * tp
    flops = core.block_bound_flops(dims, params, s, b)
    assert t.fwd >= flops / rate * (1 - 1e-12)
    assert t.bwd >= 2 * flops / rate * (1 - 1e-12)
    assert t.fwd <= t.bwd  # a backward is never faster than its forward
    head = core.head_times(dims, spec, params, work(s, b), tp)
    assert head.fwd >= core.head_fwd_flops(dims, s, b) / rate * (1 - 1e-12)
    assert head.bwd >= 2 * core.head_fwd_flops(dims, s, b) / rate * (1 - 1e-12)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_recomputation_adds_and_faster_hardware_never_slows(case: tuple) -> None:
    model, gpu, cost, s, b, tp = case
    dims, params = model._dims(), cost._core()
    base = core.block_times(dims, gpu._spec(), params, work(s, b), tp)
    sel = core.block_times(dims, gpu._spec(), params, work(s, b, "selective"), tp)
    full = core.block_times(dims, gpu._spec(), params, work(s, b, "full"), tp)
    assert base.recompute == 0 <= sel.recompute <= full.recompute
    assert full.recompute >= base.fwd * (1 - 1e-12)  # the whole forward again
    assert sel.fwd == base.fwd and full.bwd == base.bwd
    # Sequence parallelism: the same TP traffic, never more time.
    sp = core.block_times(dims, gpu._spec(), params, work(s, b, sp=True), tp)
    assert sp.tp_comm == base.tp_comm and sp.fwd <= base.fwd * (1 + 1e-12)
    for faster in (replace(gpu, mem_bandwidth_gbs=gpu.mem_bandwidth_gbs * 2),
                   replace(gpu, bf16_tflops=gpu.bf16_tflops * 2),
                   replace(gpu, intra_node_gbs=gpu.intra_node_gbs * 2)):
        t = core.block_times(dims, faster._spec(), params, work(s, b), tp)
        assert t.fwd <= base.fwd * (1 + 1e-12) and t.bwd <= base.bwd * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(cases(), st.sampled_from([2, 4, 16]))
def test_sharding_only_adds_time_and_only_removes_memory(case: tuple, dp: int) -> None:
    """A stage's per-micro-batch times never fall and its model states never grow as the
    sharding level rises (none -> zero1 -> zero2 -> fsdp); the optimizer step shrinks."""
    model, gpu, cost, s, b, tp = case
    job = es.Job(model=model, seq_len=max(s, 1), global_batch_size=dp * b * 2, iterations=1,
                 deadline_hours=1e9)
    cat = es.Catalog(gpus=(replace(gpu, count=dp * tp * 2),))
    prev = None
    for sharding in ("none", "zero1", "zero2", "fsdp"):
        plan = es.Plan(job=job, stages=(es.Stage(gpu="G", tp=tp, layers=(0, 4)),), dp=dp,
                       micro_batch_size=b, num_microbatches=2, sharding=sharding,
                       cost_model=cost)
        st0 = es.estimate(plan, cat).stages[0]
        states = st0.weights_gb + st0.grads_gb + st0.optimizer_gb
        if prev is not None:
            assert st0.fwd_s >= prev[0] * (1 - 1e-12) and st0.bwd_s >= prev[1] * (1 - 1e-12)
            assert states <= prev[2] * (1 + 1e-12)
            assert st0.optimizer_step_s <= prev[3] * (1 + 1e-12)
        prev = (st0.fwd_s, st0.bwd_s, states, st0.optimizer_step_s)


@settings(max_examples=200, deadline=None)
@given(cases(), st.floats(1.2, 4.0), st.booleans(), st.floats(0.3, 1.0))
def test_fp8_runs_the_linear_gemms_at_the_fp8_peak(case: tuple, ratio: float, sp: bool,
                                                   fp8_efficiency: float) -> None:
    """An fp8 plan's block: its four linear layers' GEMMs at the fp8 peak times
    fp8_efficiency, everything else as in bf16 (with bandwidth to spare, the times differ by
    exactly the GEMMs' saving), and never faster than the search's bound FLOPs at the larger
    of the fp8 and bf16 rates (the rate its bounds use)."""
    model, gpu, cost, s, b, tp = case
    cost = replace(cost, fp8_efficiency=fp8_efficiency)
    fp8 = replace(gpu, fp8_tflops=gpu.bf16_tflops * ratio)
    wide = replace(fp8, mem_bandwidth_gbs=1e9)
    dims, params = model._dims(), cost._core()
    w16, w8 = work(s, b, sp=sp), work(s, b, sp=sp)
    w8.fp8 = True
    h, f, kv = model.hidden_size, model.ffn, model.kv_heads * model.hidden_size // model.num_heads
    linear = 2.0 * s * b * (h * (h + 2 * kv) + h * h + (2 if model.gated_mlp else 1) * f * h
                            + f * h) / tp
    rate = gpu.bf16_tflops * 1e12 * gpu.efficiency * cost.sustained_fraction
    t16 = core.block_times(dims, wide._spec(), params, w16, tp)
    t8 = core.block_times(dims, wide._spec(), params, w8, tp)
    saved = linear / rate * (1 - 1 / (ratio * cost.fp8_efficiency))
    # ... less the casts to fp8 with their transposes (read 2 bytes, write 1 + 1): the four
    # GEMM inputs in the forward, the gradients at their four outputs in the backward.
    whole = h / tp if sp else h
    up = (2 if model.gated_mlp else 1) * f
    hbm = 1e9 * 1e9 * cost.memory_bandwidth_efficiency
    cast_f = s * b * 4.0 * (2 * whole + h / tp + f / tp) / hbm
    cast_b = s * b * 4.0 * ((h + 2 * kv) / tp + up / tp + 2 * whole) / hbm
    assert t16.fwd - t8.fwd == pytest.approx(saved - cast_f, rel=1e-9, abs=1e-18)
    assert t16.bwd - t8.bwd == pytest.approx(2 * saved - cast_b, rel=1e-9, abs=1e-18)
    # Any bandwidth: at least the bound FLOPs at the fp8 rate.
    t = core.block_times(dims, fp8._spec(), params, w8, tp)
    flops = core.block_bound_flops(dims, params, s, b)
    assert t.fwd >= flops / (rate * ratio * tp) * (1 - 1e-12)
    # A GPU without fp8 runs an fp8 workload as bf16 (the Python layer refuses the plan).
    assert core.block_times(dims, gpu._spec(), params, w8, tp).fwd == \
        core.block_times(dims, gpu._spec(), params, w16, tp).fwd
