"""The cost model's memory terms against the package's own modules on the CPU, term by term.

A plan's stages are run as the runner runs them (``espresso.modules`` blocks, embedding, head
and loss in bf16; a 1F1B stage holds its in-flight micro-batches' forwards, then runs their
backwards), with every storage they create counted while alive (``LiveTensors``). The block's
saved activations come from the package's profiler (saved-tensor hooks, ``profile_model``),
which the estimate applies as the profile's ``activation_scale``; everything else is the cost
model's own: the micro-batches in flight, the stage outputs kept with them, the backward's
working set and the loss over the logits.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import espresso as es  # noqa: E402
from espresso.engines import profile_constants  # noqa: E402
from espresso.modules import build_block, build_embedding, build_head, lm_loss  # noqa: E402
from espresso.profile import profile_model  # noqa: E402
from espresso.runner.memory import LiveTensors  # noqa: E402

pytestmark = pytest.mark.torch

SEQ, MB, STAGES, BLOCKS = 64, 2, 3, 2
MICROBATCHES = 4  # the plan's


def spec(hidden: int, ffn: int, vocab: int) -> es.ModelSpec:
    return es.ModelSpec(name="tiny", num_layers=STAGES * BLOCKS, hidden_size=hidden,
                        num_heads=4, num_kv_heads=2, ffn_hidden_size=ffn, vocab_size=vocab,
                        gated_mlp=True)


def estimate(model: es.ModelSpec, cost: es.CostParams, recompute: str = "none",
             profiles: dict[str, es.Profile] | None = None) -> es.Estimate:
    """The plan of these tests: STAGES stages of BLOCKS blocks on L4s, 4 micro-batches of MB."""
    job = es.Job(model=model, seq_len=SEQ, global_batch_size=MICROBATCHES * MB, iterations=1,
                 deadline_hours=1)
    stages = tuple(es.Stage(gpu="L4", layers=(i * BLOCKS, (i + 1) * BLOCKS)) for i in range(STAGES))
    return es.estimate(es.Plan(job=job, stages=stages, micro_batch_size=MB,
                               num_microbatches=MICROBATCHES,
                               recompute=recompute, cost_model=cost, profiles=profiles or {}))


def measure(model: es.ModelSpec, index: int, in_flight: int,
            recompute: str = "none") -> tuple[int, int]:
    """Bytes a stage holds after its in-flight forwards, and its peak through their
    backwards, over its parameters and gradients (blocks wrapped as the runner wraps them
    for ``recompute``)."""
    from espresso.runner.states import recomputed

    torch.manual_seed(index)
    dt = torch.bfloat16
    first, last = index == 0, index == STAGES - 1
    blocks = torch.nn.ModuleList(
        build_block(model) if recompute == "none" else recomputed(build_block(model), recompute)
        for _ in range(BLOCKS)).to(dt)
    emb = build_embedding(model).to(dt) if first else None
    head = build_head(model).to(dt) if last else None
    loss_fn = lm_loss(model)

    # torch's PipelineStage allocates a receive buffer per micro-batch for the activation
    # (all but the first stage) and for the gradient (all but the last) before the first
    # step, and runs each micro-batch on its buffers (set up inside the tracking below).
    recv: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []

    def buffers() -> None:
        shape = (MB, SEQ, model.hidden_size)
        recv[:] = [] if first else [torch.empty(shape, dtype=dt).requires_grad_()
                                    for _ in range(MICROBATCHES)]
        grads[:] = [] if last else [torch.empty(shape, dtype=dt) for _ in range(MICROBATCHES)]

    def forward(j: int = 0) -> tuple[object, object]:
        if emb is not None:  # token ids in, as the runner's first stage takes them
            x = torch.randint(0, model.vocab_size, (MB, SEQ))
            y = emb(x)
        else:  # the activation received from the previous stage, into its buffer
            x = recv[j]
            with torch.no_grad():
                x.normal_()
            y = x
        for blk in blocks:
            y = blk(y)
        if head is not None:
            y = loss_fn(head(y), torch.randint(0, model.vocab_size, (MB, SEQ)))
        return x, y

    def backward(x: object, y: torch.Tensor, j: int = 0) -> None:
        if last:
            y.backward()
        else:  # the gradient received from the next stage, into its buffer
            grads[j].normal_()
            y.backward(grads[j])
        if isinstance(x, torch.Tensor) and x.requires_grad:
            x.grad = None  # sent to the previous stage, as the stage's backward hands it on

    mods = [m for m in (blocks, emb, head) if m is not None]
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.AdamW(params, foreach=True)
    buffers()
    backward(*forward())  # gradients and optimizer states exist, as after a first step
    opt.step()
    track = LiveTensors()
    track.ignore(*params, *(p.grad for p in params),
                 *(t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)))
    with track:
        buffers()  # counted: the estimate counts them (the untracked ones are dropped)
        pending = [(*forward(j), j) for j in range(in_flight)]
        held = track.live
        while pending:
            backward(*pending.pop(0))
        opt.step()  # its foreach intermediates, once the activations are freed
    return held, track.peak


@pytest.mark.parametrize(("hidden", "ffn", "vocab", "recompute"),
                         [(128, 344, 500, "none"), (192, 512, 1000, "none"),
                          (128, 344, 500, "full"), (192, 512, 1000, "full")])
def test_memory_terms_match_the_runner_modules(hidden: int, ffn: int, vocab: int,
                                               recompute: str) -> None:
    model = spec(hidden, ffn, vocab)
    prof = profile_model(model, gpu="L4", seq_len=SEQ, micro_batch_size=MB,
                         dtype=torch.bfloat16, warmup=0, repeats=1)
    # The profile's optimizer step counts fp32 parameters (4 bytes of intermediates each);
    # these modules hold bf16 ones, so 2. A CPU run has no cuBLAS workspace.
    profile = profile_constants("torch-native")
    assert profile["optimizer_transient_bytes_per_param"] == 4
    assert profile["blas_workspace_mib"] == 32
    cost = es.CostParams(**{**profile, "optimizer_transient_bytes_per_param": 2,
                            "blas_workspace_mib": 0})
    assert cost.stash_stage_io and cost.loss_bytes_per_logit == 14
    est = estimate(model, cost, recompute, {"L4": prof})
    for i, st in enumerate(est.stages):
        assert st.in_flight == STAGES - i
        held, peak = measure(model, i, st.in_flight, recompute)
        predicted_held = st.activations_gb * 1e9
        predicted_peak = (st.activations_gb + st.transient_gb) * 1e9
        if i < STAGES - 1:
            # Kept activations (the profiled blocks', or under full recomputation each block's
            # input), the stage inputs and outputs, the first stage's token ids: exact, but
            # for the norms' fp32 statistics' rounding.
            assert predicted_held == pytest.approx(held, rel=2e-3), (i, predicted_held, held)
        # Every stage (the last with its loss over fp32 logits, and the optimizer step's
        # intermediates where they exceed the activations): never below, within 10%.
        assert peak <= predicted_peak * (1 + 1e-9) <= 1.10 * peak, (i, predicted_peak, peak)


def test_megatron_frees_stage_outputs_and_counts_its_fused_loss() -> None:
    """The Megatron-LM profile: no stage inputs or outputs kept beyond the blocks', 6 bytes per
    logit at the loss."""
    model = spec(128, 344, 500)
    mega = estimate(model, es.CostParams(**profile_constants("megatron")))
    keep = estimate(model, es.CostParams(**profile_constants("megatron"), stash_stage_io=True))
    out = SEQ * MB * model.hidden_size * 2  # one bf16 stage output
    for i, (a, b) in enumerate(zip(mega.stages, keep.stages, strict=True)):
        extra = a.in_flight * out * ((i > 0) + (i < STAGES - 1))
        assert (b.activations_gb - a.activations_gb) * 1e9 == pytest.approx(extra, abs=1.0)
    logits = SEQ * MB * model.vocab_size
    kv = model.hidden_size // model.num_heads * model.kv_heads
    back = (2 * model.hidden_size + 2 * model.ffn + model.hidden_size + 2 * kv) * SEQ * MB * 2
    assert mega.stages[-1].transient_gb * 1e9 == pytest.approx(
        max(6 * logits + 2 * SEQ * MB * model.hidden_size * 2, back))


def test_a_cloned_stage_input_is_kept_beside_the_checkpointed_one() -> None:
    """Under full recomputation the stage's input is the first block's checkpointed input,
    unless the engine runs the stage on a copy of it (DeepSpeed's pipeline engine)."""
    model = spec(128, 344, 500)
    native = profile_constants("torch-native")
    shared = estimate(model, es.CostParams(**native), "full")
    cloned = estimate(model, es.CostParams(**native, clone_stage_input=True), "full")
    hidden = SEQ * MB * model.hidden_size * 2
    for i, (a, b) in enumerate(zip(shared.stages, cloned.stages, strict=True)):
        extra = a.in_flight * hidden if i > 0 else 0
        assert (b.activations_gb - a.activations_gb) * 1e9 == pytest.approx(extra, abs=1.0)


@pytest.mark.parametrize("per_microbatch", [False, True])
def test_receive_buffers_are_kept_through_the_optimizer_step(per_microbatch: bool) -> None:
    """Receive buffers allocated once (DeepSpeed's one per direction; torch's PipelineStage one
    per micro-batch and direction) count on every stage that receives, and stay while the
    optimizer step allocates its intermediates."""
    model = spec(128, 344, 500)
    base = es.CostParams(**profile_constants("megatron"))
    plain = estimate(model, base)
    kept = estimate(model, es.CostParams(**{**base.to_dict(), "persistent_recv_buffers": True,
                                            "recv_buffers_per_microbatch": per_microbatch}))
    hidden = SEQ * MB * model.hidden_size * 2
    n = MICROBATCHES if per_microbatch else 1
    for i, (a, b) in enumerate(zip(plain.stages, kept.stages, strict=True)):
        extra = n * hidden * ((i > 0) + (i < STAGES - 1))
        assert (b.activations_gb - a.activations_gb) * 1e9 == pytest.approx(extra, abs=1.0)
    # A step whose intermediates exceed every activation: states + buffers + step.
    big = estimate(model, es.CostParams(**{**base.to_dict(), "persistent_recv_buffers": True,
                                           "recv_buffers_per_microbatch": per_microbatch,
                                           "optimizer_transient_bytes_per_param": 1e3}))
    for i, st in enumerate(big.stages):
        params = st.weights_gb * 1e9 / 2  # bf16 weights
        states = (st.weights_gb + st.grads_gb + st.optimizer_gb) * 1e9
        buffers = n * hidden * ((i > 0) + (i < STAGES - 1)) + base.blas_workspace_mib * 2**20
        assert st.memory_gb * 1e9 == pytest.approx(states + buffers + 1e3 * params, rel=1e-9)


def test_kept_last_buffers_and_the_blas_workspace_stay_through_the_step() -> None:
    """DeepSpeed's last stage keeps its pipe buffers (each: the bf16 logits and three hidden
    states of the last micro-batch it ran), at most one per micro-batch; the cuBLAS workspace
    is held on every stage. Both stay while the optimizer step allocates its intermediates."""
    model = spec(128, 344, 500)
    base = es.CostParams(**{**profile_constants("megatron"), "blas_workspace_mib": 0})
    hidden = SEQ * MB * model.hidden_size * 2
    logits = SEQ * MB * model.vocab_size * 2
    plain = estimate(model, base)
    for kept, held in [(1, 1), (2, 2), (MICROBATCHES + 3, MICROBATCHES)]:
        est = estimate(model, es.CostParams(**{**base.to_dict(), "kept_last_buffers": kept,
                                               "blas_workspace_mib": 8.125}))
        for i, (a, b) in enumerate(zip(plain.stages, est.stages, strict=True)):
            extra = 8.125 * 2**20 + (held * (logits + 3 * hidden) if i == STAGES - 1 else 0)
            assert (b.activations_gb - a.activations_gb) * 1e9 == pytest.approx(extra, abs=1.0)
    big = estimate(model, es.CostParams(**{**base.to_dict(), "kept_last_buffers": 2,
                                           "optimizer_transient_bytes_per_param": 1e3}))
    last = big.stages[-1]
    states = (last.weights_gb + last.grads_gb + last.optimizer_gb) * 1e9
    step = 1e3 * last.weights_gb * 1e9 / 2
    assert last.memory_gb * 1e9 == pytest.approx(states + 2 * (logits + 3 * hidden) + step,
                                                  rel=1e-9)
    with pytest.raises(es.SpecError, match="kept_last_buffers"):
        es.CostParams(kept_last_buffers=-1)
    with pytest.raises(es.SpecError, match="blas_workspace_mib"):
        es.CostParams(blas_workspace_mib=float("inf"))
