"""ModelSpec: the decoder-only transformer being trained, and the built-in presets."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import _io
from . import _validate as v
from ._native import core
from .errors import ModelError

_NORMS = ("rmsnorm", "layernorm")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer: grouped-query attention, gated or plain MLP."""

    name: str
    """Display name, e.g. ``llama2-7b``."""
    num_layers: int
    """Transformer blocks."""
    hidden_size: int
    """Model width ``h``."""
    num_heads: int
    """Attention (query) heads ``a``; must divide ``hidden_size``."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); ``None`` means ``num_heads``."""
    ffn_hidden_size: int | None = None
    """MLP width ``f``; ``None`` means ``4 * hidden_size``."""
    vocab_size: int
    """Vocabulary ``V``."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three matrices (gate, up, down) instead of two."""
    tied_embeddings: bool = False
    """The LM head shares the token-embedding matrix."""
    position_embeddings: int = 0
    """Rows of a learned absolute position table (GPT-2/3); 0 for rotary embeddings."""
    norm: str = "rmsnorm"
    """``rmsnorm`` (weight only) or ``layernorm`` (weight and bias)."""
    linear_bias: bool = False
    """Biases on the linear layers (GPT-2/3 style)."""

    def __post_init__(self) -> None:
        err = ModelError
        set_ = object.__setattr__
        set_(self, "name", v.string("model.name", self.name, err=err))
        for f in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
            set_(self, f, v.integer(f"model.{f}", getattr(self, f), minimum=1, err=err))
        if self.num_layers > 100_000:
            msg = f"model.num_layers: expected at most 100000 blocks, got {self.num_layers}"
            raise ModelError(msg)
        if self.hidden_size > 1 << 20 or self.vocab_size > 1 << 24:
            msg = (
                f"model {self.name!r}: hidden_size {self.hidden_size} or vocab_size "
                f"{self.vocab_size} is beyond what the cost model supports (2^20, 2^24)"
            )
            raise ModelError(msg)
        if self.hidden_size % self.num_heads:
            msg = (
                f"model.num_heads: expected a divisor of hidden_size {self.hidden_size}, "
                f"got {self.num_heads}"
            )
            raise ModelError(msg)
        kv = self.num_heads if self.num_kv_heads is None else self.num_kv_heads
        kv = v.integer("model.num_kv_heads", kv, minimum=1, maximum=self.num_heads, err=err)
        if self.num_heads % kv:
            msg = f"model.num_kv_heads: expected a divisor of num_heads {self.num_heads}, got {kv}"
            raise ModelError(msg)
        set_(self, "num_kv_heads", kv)
        ffn = 4 * self.hidden_size if self.ffn_hidden_size is None else self.ffn_hidden_size
        set_(
            self,
            "ffn_hidden_size",
            v.integer("model.ffn_hidden_size", ffn, minimum=1, maximum=1 << 20, err=err),
        )
        set_(self, "gated_mlp", v.boolean("model.gated_mlp", self.gated_mlp, err=err))
        set_(
            self,
            "tied_embeddings",
            v.boolean("model.tied_embeddings", self.tied_embeddings, err=err),
        )
        set_(
            self,
            "position_embeddings",
            v.integer(
                "model.position_embeddings",
                self.position_embeddings,
                minimum=0,
                maximum=1 << 24,
                err=err,
            ),
        )
        set_(self, "norm", v.choice("model.norm", self.norm, _NORMS, err=err))
        set_(self, "linear_bias", v.boolean("model.linear_bias", self.linear_bias, err=err))

    # ------------------------------------------------------------------ counts
    @property
    def kv_heads(self) -> int:
        """``num_kv_heads`` after defaulting (never ``None`` once constructed)."""
        assert self.num_kv_heads is not None
        return self.num_kv_heads

    @property
    def ffn(self) -> int:
        """``ffn_hidden_size`` after defaulting."""
        assert self.ffn_hidden_size is not None
        return self.ffn_hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_params(self) -> int:
        """Total parameters (a tied LM head counted once)."""
        return round(core.total_params(self._dims()))

    @property
    def params_per_block(self) -> int:
        return round(core.block_params(self._dims()))

    def _dims(self) -> Any:
        d = core.ModelDims()
        d.num_layers = self.num_layers
        d.hidden_size = self.hidden_size
        d.num_heads = self.num_heads
        d.num_kv_heads = self.kv_heads
        d.ffn_hidden_size = self.ffn
        d.vocab_size = self.vocab_size
        d.gated_mlp = self.gated_mlp
        d.tied_embeddings = self.tied_embeddings
        d.position_embeddings = self.position_embeddings
        d.layernorm = self.norm == "layernorm"
        d.linear_bias = self.linear_bias
        return d

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, data: Any, *, name: str | None = None) -> ModelSpec:
        """Build from the inline mapping of the model contract (see DESIGN)."""
        data = v.mapping("model", data, err=ModelError)
        allowed = [f.name for f in fields(cls)]
        v.known_keys("model", data, allowed, err=ModelError)
        kwargs = dict(data)
        if name is not None and "name" not in kwargs:
            kwargs["name"] = name
        for req in ("name", "num_layers", "hidden_size", "num_heads", "vocab_size"):
            if req not in kwargs:
                msg = f"model: missing required field {req!r}"
                raise ModelError(msg)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """A built-in preset by name (``espresso models`` lists them)."""
        table = _preset_table()
        if name not in table:
            hint = v.suggest(name, table)
            msg = f"model: unknown preset {name!r}{hint}; presets: {', '.join(table)}"
            raise ModelError(msg)
        data = dict(table[name])
        data.pop("published_params", None)
        return cls.from_dict(data, name=name)

    @staticmethod
    def preset_names() -> list[str]:
        return list(_preset_table())

    @staticmethod
    def published_params(name: str) -> float:
        """The size the preset's source publishes (for checks)."""
        return float(_preset_table()[name]["published_params"])

    @classmethod
    def from_hf_config(cls, path: str | Path, *, name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` from disk (Llama-, Mistral-, Qwen2-, GPT-2-,
        GPT-NeoX-style decoders)."""
        path = Path(path)
        text = _io.read_text("model", path, err=ModelError)
        try:
            cfg = _io.loads_json(text)
        except (ValueError, RecursionError) as exc:
            msg = f"model: {path}: cannot read as a config.json (not valid JSON: {exc})"
            raise ModelError(msg) from None
        if not isinstance(cfg, dict):
            msg = f"model: {str(path)!r} is not a JSON object"
            raise ModelError(msg)
        return _from_hf(cfg, name or _hf_name(cfg, path))

    @classmethod
    def load(cls, ref: str | Path | dict[str, Any]) -> ModelSpec:
        """A preset name, a path to a HF ``config.json`` or a YAML/JSON model file, or an
        inline mapping."""
        if isinstance(ref, dict):
            return cls.from_dict(ref)
        ref_s = str(ref)
        if ref_s in _preset_table():
            return cls.preset(ref_s)
        path = Path(ref_s)
        if os.path.isdir(path) and _io.exists(path / "config.json"):
            path = path / "config.json"
        if _io.exists(path):  # not a regular file (a FIFO, say): the reader refuses it
            if path.suffix in (".yaml", ".yml"):
                data = v.load_yaml("model", path, err=ModelError)
                return cls.from_dict(data, name=path.stem)
            data = v.load_yaml("model", path, err=ModelError)
            if isinstance(data, dict) and "hidden_size" in data and "num_layers" in data:
                return cls.from_dict(data, name=path.stem)
            return cls.from_hf_config(path)
        hint = v.suggest(ref_s, _preset_table()) if len(ref_s) < 200 else ""
        msg = (
            f"model: {_io.shown_path(ref_s)!r} is neither a preset{hint} nor an existing file; "
            f"presets: {', '.join(_preset_table())}"
        )
        raise ModelError(msg)


@cache
def _preset_table() -> dict[str, dict[str, Any]]:
    text = resources.files("espresso").joinpath("data/models.yaml").read_text()
    table = yaml.safe_load(text)
    assert isinstance(table, dict)
    return table


def _hf_name(cfg: dict[str, Any], path: Path) -> str:
    name = cfg.get("_name_or_path") or path.parent.name or path.stem
    return str(name).rstrip("/").split("/")[-1] or "model"


def _need(cfg: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    msg = f"model: config.json has none of the fields {', '.join(repr(k) for k in keys)}"
    raise ModelError(msg)


def _from_hf(cfg: dict[str, Any], name: str) -> ModelSpec:
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type in ("gpt2", "gpt_neo", "gptj"):
        h = _need(cfg, "n_embd", "hidden_size")
        return ModelSpec(
            name=name,
            num_layers=_need(cfg, "n_layer", "num_layers", "num_hidden_layers"),
            hidden_size=h,
            num_heads=_need(cfg, "n_head", "num_heads", "num_attention_heads"),
            ffn_hidden_size=cfg.get("n_inner") or cfg.get("intermediate_size") or 4 * h,
            vocab_size=_need(cfg, "vocab_size"),
            gated_mlp=False,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            position_embeddings=int(
                cfg.get("n_positions") or cfg.get("max_position_embeddings") or 0
            )
            if model_type != "gptj"
            else 0,
            norm="layernorm",
            linear_bias=True,
        )
    if model_type == "gpt_neox":
        return ModelSpec(
            name=name,
            num_layers=_need(cfg, "num_hidden_layers"),
            hidden_size=_need(cfg, "hidden_size"),
            num_heads=_need(cfg, "num_attention_heads"),
            ffn_hidden_size=_need(cfg, "intermediate_size"),
            vocab_size=_need(cfg, "vocab_size"),
            gated_mlp=False,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            norm="layernorm",
            linear_bias=True,
        )
    # Llama family and look-alikes (mistral, qwen2, gemma, ...): gated MLP when the
    # activation is SiLU/GELU-gated, RMSNorm.
    act = str(cfg.get("hidden_act", "silu")).lower()
    heads = _need(cfg, "num_attention_heads", "n_head")
    return ModelSpec(
        name=name,
        num_layers=_need(cfg, "num_hidden_layers", "n_layer"),
        hidden_size=_need(cfg, "hidden_size", "n_embd"),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        ffn_hidden_size=_need(cfg, "intermediate_size", "ffn_hidden_size"),
        vocab_size=_need(cfg, "vocab_size"),
        gated_mlp=act in ("silu", "swiglu", "gelu_pytorch_tanh", "geglu") or "llama" in model_type,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        norm="rmsnorm",
        linear_bias=bool(cfg.get("attention_bias", False) or cfg.get("mlp_bias", False)),
    )
