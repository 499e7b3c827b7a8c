"""One rank of bench/cpu_validate.py: train the plan's model (espresso.modules) with the
PyTorch runner and record each step's time, the slowest rank's, on rank 0."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import espresso
import espresso.torch as et
from espresso.modules import (
    build_block,
    build_embedding,
    build_head,
    embedding_tp_plan,
    head_tp_plan,
    lm_loss,
    tp_plan,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    plan = espresso.Plan.from_json(os.environ["ESPRESSO_PLAN"])
    m, seq = plan.job.model, plan.job.seq_len

    def block(i: int) -> torch.nn.Module:
        torch.manual_seed(1000 + i)
        return build_block(m)

    torch.manual_seed(0)
    rt = et.setup(plan, embedding=build_embedding(m), blocks=block, num_blocks=m.num_layers,
                  head=build_head(m), loss_fn=lm_loss(m), tp_plan=tp_plan(m),
                  embedding_tp_plan=embedding_tp_plan(m), head_tp_plan=head_tp_plan(m))
    opt = torch.optim.AdamW(rt.module.parameters(), lr=1e-3)
    per = plan.micro_batch_size * plan.num_microbatches
    gen = torch.Generator().manual_seed(rt.info.replica)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, m.vocab_size, (per, seq), generator=gen)
        torch.distributed.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        rt.step(x, x)
        opt.step()
        dt = torch.tensor([time.perf_counter() - t0])
        torch.distributed.all_reduce(dt, op=torch.distributed.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(float(dt))
    if torch.distributed.get_rank() == 0:
        with open(os.environ["ESPRESSO_TIMES"], "w") as f:
            json.dump(times, f)
    et.shutdown()


if __name__ == "__main__":
    main()
