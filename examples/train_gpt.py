"""Train a small GPT with a plan: run under torchrun (or `espresso launch --local`).

    espresso launch examples/plans/tiny-gpt-2x2.json --local --script examples/train_gpt.py
    # or, on real nodes, the commands `espresso launch PLAN --hosts hosts.yaml` prints.

Each process reads the plan (ESPRESSO_PLAN or --plan), builds only its own stage (blocks come
from a factory), and trains on synthetic tokens, logging loss and step time on the last stage.
Works on CPU with gloo and on GPUs with NCCL.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

import espresso
import espresso.torch as et


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a GeLU MLP."""

    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn = nn.MultiheadAttention(h, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        mask = torch.triu(torch.full((s, s), float("-inf"), device=x.device), diagonal=1)
        y = self.ln1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    def __init__(self, vocab: int, h: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, h), nn.Embedding(seq, h)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    def __init__(self, vocab: int, h: int) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(h), nn.Linear(h, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default=os.environ.get("ESPRESSO_PLAN"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    plan = espresso.Plan.from_json(args.plan)
    m = plan.job.model
    seq = plan.job.seq_len

    def block(i: int) -> nn.Module:
        torch.manual_seed(1000 + i)  # the same weights whichever rank builds block i
        return Block(m.hidden_size, m.num_heads)

    torch.manual_seed(0)
    vocab = m.vocab_size

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, vocab), target.reshape(-1))

    rt = et.setup(plan, embedding=Embed(vocab, m.hidden_size, seq), blocks=block,
                  num_blocks=m.num_layers, head=Head(vocab, m.hidden_size), loss_fn=loss_fn)
    opt = torch.optim.AdamW(rt.module.parameters(), lr=args.lr)
    per_replica = plan.micro_batch_size * plan.num_microbatches
    gen = torch.Generator().manual_seed(rt.info.replica)
    dev = next(rt.module.parameters()).device
    for step in range(args.steps):
        # Counting sequences from random starts: the next token is always the current + 1.
        start = torch.randint(0, vocab, (per_replica, 1), generator=gen)
        x = ((start + torch.arange(seq)) % vocab).to(dev)
        y = (x + 1) % vocab
        t0 = time.perf_counter()
        opt.zero_grad()
        losses = rt.step(x, y)
        opt.step()
        dt = time.perf_counter() - t0
        if rt.is_last and rt.info.replica == 0:
            loss = torch.stack(losses).mean().item()
            print(f"step {step}: loss {loss:.4f}, {dt * 1e3:.0f} ms", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
