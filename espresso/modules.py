"""A ModelSpec as real PyTorch modules (torch extra): one decoder block, the embedding and the
head, with the architecture the cost model counts (grouped-query attention, RMSNorm or
LayerNorm, gated SiLU or plain GeLU MLP, optional biases, rotary or learned positions).

Used to profile presets (``espresso profile --model llama2-7b``); the parameter count of
:func:`build_block` equals ``ModelSpec.params_per_block`` (checked in the tests).
"""

from __future__ import annotations

from typing import Any

from ._optional import require
from .model import ModelSpec

torch = require("torch")
nn = torch.nn
F = nn.functional


def _norm(spec: ModelSpec) -> Any:
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.hidden_size)
    return nn.RMSNorm(spec.hidden_size)


def _rotary(x: Any) -> Any:
    """Rotary position embedding over the last dimension (pairs of halves)."""
    s, d = x.shape[-2], x.shape[-1]
    half = d // 2
    freq = 1.0 / (10000 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    angle = torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, x[..., 2 * half:]], dim=-1)


class Attention(nn.Module):  # type: ignore[misc, name-defined]
    """Causal grouped-query self-attention (flash/SDPA kernel). Head counts are read from the
    projection widths, so a tensor-parallel shard of it runs unchanged."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, bias = spec.hidden_size, spec.linear_bias
        self.head_dim = spec.head_dim
        self.group = spec.num_heads // spec.kv_heads
        self.rotary = spec.position_embeddings == 0
        self.q = nn.Linear(h, spec.num_heads * self.head_dim, bias=bias)
        self.k = nn.Linear(h, spec.kv_heads * self.head_dim, bias=bias)
        self.v = nn.Linear(h, spec.kv_heads * self.head_dim, bias=bias)
        self.o = nn.Linear(spec.num_heads * self.head_dim, h, bias=bias)

    def forward(self, x: Any) -> Any:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        if self.rotary:
            q, k = _rotary(q), _rotary(k)
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)
            v = v.repeat_interleave(self.group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):  # type: ignore[misc, name-defined]
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f, bias = spec.hidden_size, spec.ffn, spec.linear_bias
        self.gated = spec.gated_mlp
        self.up = nn.Linear(h, f, bias=bias)
        self.gate = nn.Linear(h, f, bias=bias) if self.gated else None
        self.down = nn.Linear(f, h, bias=bias)

    def forward(self, x: Any) -> Any:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):  # type: ignore[misc, name-defined]
    """A pre-norm decoder block."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.attn, self.mlp = Attention(spec), MLP(spec)

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):  # type: ignore[misc, name-defined]
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos = (nn.Embedding(spec.position_embeddings, spec.hidden_size)
                    if spec.position_embeddings else None)

    def forward(self, idx: Any) -> Any:
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return x


class Head(nn.Module):  # type: ignore[misc, name-defined]
    """Final norm and LM head (untied; a tied head shares the embedding's weight)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm = _norm(spec)
        self.out = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, x: Any) -> Any:
        return self.out(self.norm(x))


def tp_plan(spec: ModelSpec) -> dict[str, str]:
    """How :class:`Block` splits over a tensor-parallel group (``espresso.torch.setup``)."""
    out = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise",
           "mlp.up": "colwise", "mlp.down": "rowwise"}
    if spec.gated_mlp:
        out["mlp.gate"] = "colwise"
    return out


def build_block(spec: ModelSpec) -> Any:
    return Block(spec)


def build_head(spec: ModelSpec) -> Any:
    return Head(spec)


def build_embedding(spec: ModelSpec) -> Any:
    return Embedding(spec)


def lm_loss(spec: ModelSpec) -> Any:
    vocab = spec.vocab_size

    def loss(logits: Any, target: Any) -> Any:
        return F.cross_entropy(logits.float().reshape(-1, vocab), target.reshape(-1))

    return loss
