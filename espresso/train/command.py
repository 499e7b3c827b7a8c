"""Running ``espresso train``: in this process (one rank, or ``--reference``), or as a local
rehearsal of every rank (``--local``). Shared by the ``espresso`` command line and
``python -m espresso.train``."""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence

from ..errors import EspressoError
from ..plan import Plan
from ..runner.launch import check_runnable
from .options import TrainOptions, add_arguments, from_args, to_argv


def execute(opts: TrainOptions) -> int:
    if opts.local:
        return _local(opts)
    if not opts.reference and "RANK" not in os.environ \
            and "ESPRESSO_FIRST_RANK" not in os.environ:
        # One process of a one-GPU plan: its own process group on this machine.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    from .loop import run

    return run(opts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _local(opts: TrainOptions) -> int:
    """A rehearsal on this machine: one CPU process per GPU of the plan, gloo, through
    torchrun (``--standalone``)."""
    plan = Plan.from_json(opts.plan)
    check_runnable(plan)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={plan.num_gpus}", "-m", "espresso.train",
           *to_argv(opts, drop=("local",))]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.setdefault("OMP_NUM_THREADS", "1")  # each process stands for one GPU
    print(f"running (OMP_NUM_THREADS={env['OMP_NUM_THREADS']}): "
          + " ".join(shlex.quote(c) for c in cmd), flush=True)
    return subprocess.call(cmd, env=env)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m espresso.train",
                                description="Train the plan's model (one rank of the run).")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return execute(from_args(args))
    except EspressoError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
