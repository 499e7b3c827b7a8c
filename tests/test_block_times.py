"""Properties of the per-block time model (issue 13) that the search relies on, over random
models, GPUs and workloads: every block's forward and backward take at least their
bound FLOPs at the GPU's sustained matmul rate (the search's rate bounds), recomputation and
sharding only add time, and more memory bandwidth or peak never slows a block down."""

from __future__ import annotations

from dataclasses import replace

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
