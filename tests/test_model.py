from __future__ import annotations

import json
from pathlib import Path

import pytest

import espresso as es
from espresso import _core


def test_tiny_model_parameters_by_hand(tiny_model: es.ModelSpec) -> None:
    # attention: h*(h + 2*kv_dim) + h*h = 64*(64+64) + 64*64 = 12288
    # SwiGLU MLP: 3*h*f = 3*64*128 = 24576; two RMSNorms: 2*64 = 128
    assert tiny_model.params_per_block == 12288 + 24576 + 128
    # 4 blocks + embedding 100*64 + untied head 100*64 + final norm 64
    assert tiny_model.num_params == 4 * 36992 + 6400 + 6400 + 64


def test_tied_gpt_style_parameters_by_hand() -> None:
    m = es.ModelSpec(name="g", num_layers=2, hidden_size=8, num_heads=2, ffn_hidden_size=32,
                     vocab_size=10, tied_embeddings=True, position_embeddings=16,
                     norm="layernorm", linear_bias=True)
    # attention 4*64 = 256, MLP 2*8*32 = 512, 2 LayerNorms with bias 4*8 = 32,
    # biases: qkv 24 + out 8 + fc1 32 + fc2 8 = 72  -> 872 per block
    assert m.params_per_block == 256 + 512 + 32 + 72
    # token table 80 + position table 128, tied head (counted once), final LayerNorm 16
    assert m.num_params == 2 * 872 + 80 + 128 + 16


@pytest.mark.parametrize("name", es.ModelSpec.preset_names())
def test_presets_match_published_sizes(name: str) -> None:
    m = es.ModelSpec.preset(name)
    published = es.ModelSpec.published_params(name)
    assert abs(m.num_params / published - 1) < 0.02, (name, m.num_params, published)


def test_llama_presets_exact() -> None:
    # The Llama presets are exact to the parameter (counts from their model cards).
    assert es.ModelSpec.preset("llama2-7b").num_params == 6_738_415_616
    assert es.ModelSpec.preset("llama2-70b").num_params == 68_976_648_192
    assert es.ModelSpec.preset("llama3-8b").num_params == 8_030_261_248


def test_required_presets_present() -> None:
    need = {"gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "open_llama_3b_v2", "llama2-7b",
            "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b"}
    assert need <= set(es.ModelSpec.preset_names())


def test_block_flops_by_hand(tiny_model: es.ModelSpec) -> None:
    d = tiny_model._dims()
    # 2*b*s*(matmul params 36864) + 4*b*s^2*h with b=2, s=8
    assert _core.block_fwd_flops(d, 8, 2) == 2 * 16 * 36864 + 4 * 2 * 64 * 64
    assert _core.head_fwd_flops(d, 8, 2) == 2 * 16 * 64 * 100


def test_roundtrip_dict(tiny_model: es.ModelSpec) -> None:
    assert es.ModelSpec.from_dict(tiny_model.to_dict()) == tiny_model


def test_defaults_fill_in() -> None:
    m = es.ModelSpec(name="m", num_layers=1, hidden_size=64, num_heads=8, vocab_size=10)
    assert m.num_kv_heads == 8
    assert m.ffn_hidden_size == 256


def test_hf_llama_config(tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "_name_or_path": "meta-llama/Llama-2-7b-hf",
           "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
           "hidden_act": "silu", "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = es.ModelSpec.from_hf_config(path)
    assert m.name == "Llama-2-7b-hf"
    assert m.num_params == es.ModelSpec.preset("llama2-7b").num_params
    # A directory holding config.json works too, through ModelSpec.load.
    assert es.ModelSpec.load(tmp_path).num_params == m.num_params


def test_hf_gpt2_config(tmp_path: Path) -> None:
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
           "vocab_size": 50257}
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(cfg))
    m = es.ModelSpec.from_hf_config(path, name="gpt2")
    # GPT-2 small has 124,439,808 parameters (tied head).
    assert m.num_params == 124_439_808


def test_hf_config_errors(tmp_path: Path) -> None:
    with pytest.raises(es.ModelError, match="no such file"):
        es.ModelSpec.from_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(es.ModelError, match="cannot read"):
        es.ModelSpec.from_hf_config(bad)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(es.ModelError, match="num_attention_heads"):
        es.ModelSpec.from_hf_config(partial)


def test_unknown_preset_suggests() -> None:
    with pytest.raises(es.ModelError, match="did you mean 'llama2-7b'"):
        es.ModelSpec.preset("llama2_7b")
    with pytest.raises(es.ModelError, match="neither a preset"):
        es.ModelSpec.load("no-such-model")


BASE = dict(name="m", num_layers=2, hidden_size=64, num_heads=4, vocab_size=100)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("name", "", "model.name"),
        ("name", 3, "model.name"),
        ("num_layers", 0, "model.num_layers"),
        ("num_layers", 2.5, "model.num_layers"),
        ("num_layers", "2", "model.num_layers"),
        ("num_layers", 10**6, "model.num_layers"),
        ("hidden_size", -64, "model.hidden_size"),
        ("hidden_size", 1 << 21, "beyond what the cost model supports"),
        ("num_heads", 5, "divisor of hidden_size"),
        ("num_heads", 0, "model.num_heads"),
        ("num_kv_heads", 3, "divisor of num_heads"),
        ("num_kv_heads", 8, "model.num_kv_heads"),
        ("num_kv_heads", 0, "model.num_kv_heads"),
        ("ffn_hidden_size", 0, "model.ffn_hidden_size"),
        ("vocab_size", 0, "model.vocab_size"),
        ("vocab_size", True, "model.vocab_size"),
        ("gated_mlp", "yes", "model.gated_mlp"),
        ("tied_embeddings", 1, "model.tied_embeddings"),
        ("position_embeddings", -1, "model.position_embeddings"),
        ("norm", "batchnorm", "model.norm"),
        ("linear_bias", None, "model.linear_bias"),
    ],
)
def test_bad_model_fields(field: str, value: object, match: str) -> None:
    with pytest.raises(es.ModelError, match=match):
        es.ModelSpec(**{**BASE, field: value})  # type: ignore[arg-type]


def test_bad_model_dict() -> None:
    with pytest.raises(es.ModelError, match="did you mean 'hidden_size'"):
        es.ModelSpec.from_dict({**BASE, "hiden_size": 64})
    with pytest.raises(es.ModelError, match="missing required field 'vocab_size'"):
        es.ModelSpec.from_dict({k: v for k, v in BASE.items() if k != "vocab_size"})
    with pytest.raises(es.ModelError, match="mapping"):
        es.ModelSpec.from_dict([1, 2])
