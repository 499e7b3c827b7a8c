"""``espresso train`` (train the plan's model) and ``espresso compare`` (a run against its
plan)."""

from __future__ import annotations

import argparse
from typing import Any

from ..train import options


def cmd_train(args: argparse.Namespace) -> int:
    from ..train.command import execute

    return execute(options.from_args(args))


def cmd_compare(args: argparse.Namespace) -> int:
    from ..train.compare import compare, render

    result = compare(args.plan, args.metrics, skip=args.skip)
    render(result)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train the plan's model on real data (one rank; --local rehearses every rank)",
        description="Build the plan's model stage by stage with its parallelism and train it: "
        "AdamW with warm-up and cosine decay, clipping, bf16/fp16, checkpoints and resume; "
        "every step goes to metrics.jsonl. Run it under `espresso launch` or torchrun on the "
        "plan's nodes, with --local on this machine (one CPU process per GPU), or with "
        "--reference in one process.",
    )
    options.add_arguments(p)
    p.set_defaults(func=cmd_train)
    c = sub.add_parser(
        "compare",
        help="a training run's metrics against its plan's predictions",
        description="Predicted against measured: iteration time, tokens/s, MFU, memory per "
        "stage, and the job's hours and dollars at the measured speed.",
    )
    c.add_argument("plan", help="plan JSON file")
    c.add_argument("metrics", help="metrics.jsonl of a run of the plan (espresso train)")
    c.add_argument("--skip", type=int, default=2,
                   help="leave the first N steps of each run out of the timing (2)")
    c.set_defaults(func=cmd_compare)
