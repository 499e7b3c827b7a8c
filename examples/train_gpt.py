"""Train a small GPT with a plan: run under torchrun (or `espresso launch --local`).

    espresso launch examples/plans/tiny-gpt-2x2.json --local --script examples/train_gpt.py
    # or, on real nodes, the commands `espresso launch PLAN --hosts hosts.yaml` prints.

Each process reads the plan (ESPRESSO_PLAN or --plan), builds only its own stage (blocks come
from a factory), and trains on synthetic tokens, logging loss and step time on the last stage.
Stages with tp > 1 split each block's attention and MLP matrices over their TP group
(TP_PLAN: Megatron's column-then-row split) and the embedding and head by vocabulary; the tp
example plan also has sequence_parallel, so its blocks hold half the tokens each. Works on CPU
with gloo and on GPUs with NCCL.

    espresso launch examples/plans/tiny-gpt-tp.json --local --script examples/train_gpt.py
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

import torch
from torch import nn

import espresso
import espresso.torch as et


class Attention(nn.Module):
    """Causal self-attention with one fused QKV projection, laid out head by head (q, k, v of
    head 0, then of head 1, ...) so that a column split over TP ranks gives each rank whole
    heads. Head and token counts are read from the projection's output, so the same code runs
    on a TP rank that holds heads / tp of them, and under sequence parallelism, where the
    block's input holds only this rank's share of the tokens."""

    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.head_dim = h // heads
        self.qkv, self.o = nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.qkv(x)
        b, s = y.shape[:2]
        q, k, v = y.view(b, s, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, h: int, ffn: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a GeLU MLP."""

    def __init__(self, h: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn, self.mlp = Attention(h, heads), MLP(h, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


# How a stage with tp > 1 splits a block: qkv and fc1 by output columns (each rank gets
# whole heads), o and fc2 by input rows, so each half needs one all-reduce (Megatron-LM);
# and the embedding and head by vocabulary.
TP_PLAN = {"attn.qkv": "colwise", "attn.o": "rowwise", "mlp.fc1": "colwise", "mlp.fc2": "rowwise"}
EMBEDDING_TP_PLAN = {"tok": "rowwise"}
HEAD_TP_PLAN = {"out": "colwise"}


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


def batch(gen: torch.Generator, size: int, seq: int, vocab: int) -> torch.Tensor:
    """Counting sequences from random starts: the next token is always the current + 1."""
    start = torch.randint(0, vocab, (size, 1), generator=gen)
    return (start + torch.arange(seq)) % vocab


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default=os.environ.get("ESPRESSO_PLAN"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=3,
                    help="steps left out of the median step time at the end (3)")
    ap.add_argument("--reference", action="store_true",
                    help="train the same model in this one process, without the plan, to "
                         "compare losses with a pipelined run")
    ap.add_argument("--checkpoint-dir", help="save checkpoints here and resume from the newest")
    ap.add_argument("--checkpoint-every", type=int,
                    help="steps between checkpoints (default: the plan's interval, which "
                         "spot plans carry; else none)")
    ap.add_argument("--kill-at-step", type=int,
                    help="rehearse a preemption: SIGKILL rank --kill-rank after this step")
    ap.add_argument("--kill-rank", type=int, default=0)
    args = ap.parse_args()
    if not args.plan:
        ap.error("give --plan PLAN.json (or set ESPRESSO_PLAN)")
    plan = espresso.Plan.from_json(args.plan)
    m = plan.job.model
    seq, vocab, gbs = plan.job.seq_len, m.vocab_size, plan.job.global_batch_size

    def block(i: int) -> nn.Module:
        torch.manual_seed(1000 + i)  # the same weights whichever rank builds block i
        return Block(m.hidden_size, m.num_heads, m.ffn)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, vocab), target.reshape(-1))

    torch.manual_seed(0)
    embed, head = Embed(vocab, m.hidden_size, seq), Head(vocab, m.hidden_size)
    gen = torch.Generator().manual_seed(0)  # the global batch of each step, on every rank
    if args.reference:
        model = nn.Sequential(embed, *(block(i) for i in range(m.num_layers)), head)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        for step in range(args.steps):
            x = batch(gen, gbs, seq, vocab)
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(model(x), (x + 1) % vocab)
            loss.backward()
            opt.step()
            print(f"step {step}: loss {loss.item():.4f}, "
                  f"{(time.perf_counter() - t0) * 1e3:.0f} ms", flush=True)
        return

    rt = et.setup(plan, embedding=embed, blocks=block, num_blocks=m.num_layers, head=head,
                  loss_fn=loss_fn, tp_plan=TP_PLAN, embedding_tp_plan=EMBEDDING_TP_PLAN,
                  head_tp_plan=HEAD_TP_PLAN)
    opt = rt.optimizer(torch.optim.AdamW, lr=args.lr)  # sharded as the plan says
    per_replica = plan.micro_batch_size * plan.num_microbatches
    dev = next(rt.module.parameters()).device
    r = rt.info.replica
    ck = None
    start = 0
    if args.checkpoint_dir:
        ck = et.Checkpointer(rt, opt, args.checkpoint_dir, plan=plan, every=args.checkpoint_every)
        start, consumed = ck.resume()
        for _ in range(consumed or 0):  # the data position: batches already trained on
            batch(gen, gbs, seq, vocab)
        if start and r == 0 and rt.reports_loss:
            print(f"resumed after step {start - 1} from {ck.latest()}", flush=True)
    times = []
    losses = None
    for step in range(start, args.steps):
        x = batch(gen, gbs, seq, vocab)[r * per_replica:(r + 1) * per_replica].to(dev)
        t0 = time.perf_counter()
        opt.zero_grad()
        losses = rt.step(x, (x + 1) % vocab)
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        if losses is not None:  # last stage, TP rank 0: the mean over all replicas
            loss = torch.stack(losses).mean()
            torch.distributed.all_reduce(loss, group=rt.dp_group)
            if r == 0:
                print(f"step {step}: loss {loss.item() / plan.dp:.4f}, {dt * 1e3:.0f} ms",
                      flush=True)
        if ck is not None:
            ck.step_done(step, data=step + 1)
        if args.kill_at_step == step and torch.distributed.get_rank() == args.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # as a reclaimed instance: no clean-up
    timed = times[args.warmup:]
    if losses is not None and r == 0 and timed:
        est, med = plan.estimate, statistics.median(timed)
        gpus = ", ".join(sorted({st.gpu for st in plan.stages}))
        if est is None:
            vs = ""
        elif dev.type == "cpu" and gpus != "CPU":  # a rehearsal of a GPU plan
            vs = f" (the plan's estimate, {est.iteration_s:.4g} s, is for {gpus})"
        else:
            vs = (f"; the plan's estimate: {est.iteration_s:.3f} s "
                  f"({(est.iteration_s - med) / med:+.1%})")
        print(f"median step time {med:.3f} s over steps "
              f"{args.warmup}-{args.steps - 1}{vs}", flush=True)
    et.shutdown()


if __name__ == "__main__":
    main()
