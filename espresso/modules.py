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
    """Causal grouped-query self-attention (flash/SDPA kernel) with one fused QKV projection.

    The projection's output is laid out group by group, as Megatron-LM does: for each of the
    ``kv_heads`` groups, its ``num_heads / kv_heads`` query heads, then its key head, then its
    value head. Split by output columns over a TP group whose width divides ``kv_heads``, each
    rank gets whole groups, and the forward reads the local group count from the tensor shape,
    so a tensor-parallel shard runs unchanged with one all-reduce-equivalent per direction."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, bias = spec.hidden_size, spec.linear_bias
        self.head_dim = spec.head_dim
        self.group = spec.num_heads // spec.kv_heads
        self.rotary = spec.position_embeddings == 0
        self.qkv = nn.Linear(h, (spec.num_heads + 2 * spec.kv_heads) * self.head_dim, bias=bias)
        self.o = nn.Linear(spec.num_heads * self.head_dim, h, bias=bias)

    def forward(self, x: Any) -> Any:
        g, d = self.group, self.head_dim
        y = self.qkv(x)  # all the tokens, also when x holds a sequence-parallel share of them
        b, s = y.shape[:2]
        y = y.view(b, s, -1, g + 2, d)                     # (b, s, kv groups, g + 2, d)
        q = y[..., :g, :].reshape(b, s, -1, d).transpose(1, 2)
        k, v = (y[..., i, :].transpose(1, 2) for i in (g, g + 1))
        if self.rotary:
            q, k = _rotary(q), _rotary(k)
        if g > 1:
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):  # type: ignore[misc, name-defined]
    """The MLP; a gated one has one fused gate-and-up projection whose outputs interleave
    (gate j, up j), so any column split over TP ranks keeps each pair on one rank."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f, bias = spec.hidden_size, spec.ffn, spec.linear_bias
        self.gated = spec.gated_mlp
        self.up = nn.Linear(h, (2 if self.gated else 1) * f, bias=bias)
        self.down = nn.Linear(f, h, bias=bias)

    def forward(self, x: Any) -> Any:
        y = self.up(x)
        if self.gated:
            y = y.unflatten(-1, (-1, 2))
            return self.down(F.silu(y[..., 0]) * y[..., 1])
        return self.down(F.gelu(y))


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
    """How :class:`Block` splits over a tensor-parallel group (``espresso.torch.setup``):
    the fused QKV and (gate-)up projections by output columns, the output and down
    projections by input rows, so a block does one all-reduce-equivalent per half in each
    direction (four per block, as the cost model charges)."""
    return {"attn.qkv": "colwise", "attn.o": "rowwise", "mlp.up": "colwise", "mlp.down": "rowwise"}


def embedding_tp_plan(spec: ModelSpec) -> dict[str, str]:
    """The vocabulary-parallel embedding of a TP stage: each rank holds ``vocab / tp`` rows."""
    return {"tok": "rowwise"}


def head_tp_plan(spec: ModelSpec) -> dict[str, str]:
    """The vocabulary-parallel LM head of a TP stage: each rank computes ``vocab / tp`` of the
    logits."""
    return {"out": "colwise"}


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
