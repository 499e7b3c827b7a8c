"""Cross-check against the llm-analysis package (test-only dependency; runs offline with the
model and GPU configs it ships).

Where its assumptions match ours the numbers must agree exactly:
* parameters: same attention (with GQA) and 2-matrix MLP, 2h of norm weights per block and
  h for the final norm (our RMSNorm convention), a tied embedding;
* forward FLOPs: its MLP term is 16*b*s*h^2, i.e. it assumes f = 4h, so MLP FLOPs are
  compared only on configurations with f = 4h;
* weights 2 bytes, optimizer states 12 bytes (fp32 master + Adam m, v) per parameter; it
  keeps fp32 gradients (4 bytes), our ``bytes_per_grad=4`` option;
* activations at tp 1 with the attention scores materialised (flash_attn=False), softmax
  dropout, bf16 norm inputs: it omits the MLP's output-dropout mask (1 byte per s*b*h element)
  that Korthikanti et al. count and we count; with full recomputation both keep the block
  input, 2*s*b*h bytes.
They differ by design at tp > 1: llm-analysis assumes sequence parallelism (the replicated
activations also divide by tp); our default, like Megatron without it, does not.
"""

from __future__ import annotations

import logging
import warnings

import pytest

import espresso as es
from espresso import _core

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    try:
        analysis = pytest.importorskip("llm_analysis.analysis")
        config = pytest.importorskip("llm_analysis.config")
    finally:
        logging.disable(logging.NOTSET)

# (llm-analysis model config, our spec of the same architecture)
CONFIGS = {
    "decapoda-research_llama-7b-hf": dict(num_layers=32, hidden_size=4096, num_heads=32,
                                          ffn_hidden_size=16384, vocab_size=32000),
    "facebook_opt-1.3b": dict(num_layers=24, hidden_size=2048, num_heads=32,
                              ffn_hidden_size=8192, vocab_size=50272),
    "EleutherAI_gpt-neo-2.7B": dict(num_layers=32, hidden_size=2560, num_heads=20,
                                    ffn_hidden_size=10240, vocab_size=50257),
    "decapoda-research_llama-13b-hf": dict(num_layers=40, hidden_size=5120, num_heads=40,
                                           ffn_hidden_size=20480, vocab_size=32000),
}
GQA = ("upstage_Llama-2-70b-instruct-v2",
       dict(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
            ffn_hidden_size=32768, vocab_size=32000))


def _analysis(name: str) -> object:
    model = config.get_model_config_by_name(name)
    gpu = config.get_gpu_config_by_name("a100-sxm-80gb")
    return analysis.LLMAnalysis(model, gpu,
                                parallelism_config=config.ParallelismConfig(tp_size=1))


def _ours(name: str, dims: dict[str, int]) -> es.ModelSpec:
    return es.ModelSpec(name=name, gated_mlp=False, tied_embeddings=True, **dims)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [*CONFIGS, GQA[0]])
def test_parameters(name: str) -> None:
    dims = CONFIGS.get(name, GQA[1])
    la, ours = _analysis(name), _ours(name, dims)
    assert ours.params_per_block == la.get_num_params_per_layer()
    assert ours.num_params == la.get_num_params_total()


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(("b", "s"), [(1, 2048), (4, 1024)])
def test_forward_flops(name: str, b: int, s: int) -> None:
    la, ours = _analysis(name), _ours(name, CONFIGS[name])
    d = ours._dims()
    total = ours.num_layers * _core.block_fwd_flops(d, s, b) + _core.head_fwd_flops(d, s, b)
    assert total == pytest.approx(la.get_num_flops_fwd_total(b, s), rel=1e-12)
    assert _core.block_fwd_flops(d, s, b) == pytest.approx(la.get_num_flops_fwd_per_layer(b, s),
                                                            rel=1e-12)


def test_gqa_attention_flops() -> None:
    name, dims = GQA
    la, ours = _analysis(name), _ours(name, dims)
    b, s, h, f = 1, 4096, dims["hidden_size"], dims["ffn_hidden_size"]
    attention = _core.block_fwd_flops(ours._dims(), s, b) - 2 * b * s * 2 * h * f
    assert attention == pytest.approx(la.get_num_flops_fwd_per_layer_attn(b, s), rel=1e-12)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_weight_optimizer_gradient_memory(name: str) -> None:
    la, ours = _analysis(name), _ours(name, CONFIGS[name])
    job = es.Job(model=ours, seq_len=2048, global_batch_size=8, iterations=1, deadline_hours=1)
    plan = es.Plan(job=job, stages=(es.Stage(gpu="H200", layers=(0, 1)),
                                    es.Stage(gpu="H200", layers=(1, ours.num_layers))),
                   num_microbatches=8, cost_model=es.CostParams(bytes_per_grad=4))
    st = es.estimate(plan).stages[0]
    embed = la.get_num_params_embedding()  # the tied table, on stage 0
    per_layer_w = la.get_weight_memory_per_layer()
    opt, grad = la.get_memory_optimizer_state_and_gradient_per_layer()
    opt_e, grad_e = la.get_memory_optimizer_state_and_gradient_embedding()
    assert st.weights_gb * 1e9 == pytest.approx(per_layer_w + la.get_memory_embedding())
    assert st.optimizer_gb * 1e9 == pytest.approx(opt + opt_e)
    assert st.grads_gb * 1e9 == pytest.approx(grad + grad_e)
    assert embed == ours.vocab_size * ours.hidden_size


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(("b", "s"), [(1, 2048), (2, 512)])
def test_activation_memory(name: str, b: int, s: int) -> None:
    la, ours = _analysis(name), _ours(name, CONFIGS[name])
    d = ours._dims()
    params = es.CostParams(flash_attention=False, dropout_masks=True)._core()
    theirs = la.get_activation_memory_per_layer(
        b, s, is_inference=False, activation_recomputation=analysis.ActivationRecomputation.NONE,
        layernorm_dtype_bytes=2, flash_attn=False, softmax_dropout=True)
    mlp_dropout_mask = s * b * ours.hidden_size  # counted by us, not by llm-analysis
    assert _core.block_activation_bytes(d, params, s, b, 1) == pytest.approx(
        theirs + mlp_dropout_mask, rel=1e-12)
    full = la.get_activation_memory_per_layer(
        b, s, is_inference=False, activation_recomputation=analysis.ActivationRecomputation.FULL)
    assert full == 2 * s * b * ours.hidden_size  # what our full recomputation keeps per block
