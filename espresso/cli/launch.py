"""``espresso launch``: torchrun commands for a plan, or a rehearsal on this machine."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from typing import Any

from .. import _io
from .._optional import require
from ..plan import Plan
from ..runner.launch import LaunchError, check_runnable, load_hosts, torchrun_commands
from . import _common as c


def cmd_launch(args: argparse.Namespace) -> int:
    if args.out_dir is not None:
        _io.check_dir("--out-dir", args.out_dir, err=LaunchError)
    plan = Plan.from_json(args.plan)
    check_runnable(plan)  # refuse here, once, what every rank would refuse
    if args.local:
        # A dry rehearsal on this machine: one CPU process per GPU of the plan, gloo.
        require("torch")
        if args.script.startswith("-m "):
            target = ["-m", args.script[3:].strip()]
        elif not os.path.isfile(args.script):
            msg = f"--script: {args.script!r} is not a file"
            raise LaunchError(msg)
        else:
            target = [args.script]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={plan.num_gpus}", *target, *shlex.split(args.script_args)]
        env = {**os.environ, "ESPRESSO_PLAN": str(args.plan), "CUDA_VISIBLE_DEVICES": ""}
        # Each process stands for one GPU: one thread each (as a profile with --threads 1),
        # unless the caller says otherwise.
        env.setdefault("OMP_NUM_THREADS", "1")
        print(f"running (OMP_NUM_THREADS={env['OMP_NUM_THREADS']}): "
              + " ".join(shlex.quote(part) for part in cmd), flush=True)
        return subprocess.call(cmd, env=env)
    if not args.hosts:
        msg = "launch: give --hosts FILE (or --local to rehearse on this machine)"
        raise LaunchError(msg)
    hosts = load_hosts(args.hosts)
    cmds = torchrun_commands(str(args.plan), plan, hosts, args.script,
                             master_port=args.port, script_args=args.script_args or "")
    if args.out_dir:
        out = _io.make_dir("--out-dir", args.out_dir, err=LaunchError)
        for i, cmd_text in enumerate(cmds):
            _io.write_text("--out-dir", out / f"node{i}.sh",
                           "#!/usr/bin/env bash\nset -euo pipefail\n" + cmd_text + "\n",
                           mode=0o755, err=LaunchError)
        print(f"wrote {len(cmds)} scripts to {out}/node*.sh")
    else:
        print("\n\n".join(cmds))
    return c.EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser(
        "launch",
        help="the torchrun command for every node of a plan",
        description="Map the plan's ranks onto hosts (address, GPU type, GPU count) and print "
        "the torchrun command of each node, or write one script per node.",
    )
    p.add_argument("plan", help="plan JSON file")
    p.add_argument("--local", action="store_true",
                   help="rehearse here: one CPU process per GPU of the plan, gloo")
    p.add_argument("--hosts", metavar="FILE",
                   help="YAML: hosts: [{address: 10.0.0.1, gpu: A100-80GB, gpus: 8}, "
                        "{address: 10.0.0.2, instance_type: p4d.24xlarge}, ...]")
    p.add_argument("--script", default="-m espresso.train",
                   help="training script, or -m MODULE (default: -m espresso.train, which "
                        "takes the plan and --data ... in --script-args)")
    p.add_argument("--script-args", default="", help="arguments for the script")
    p.add_argument("--port", type=c.port, default=29500,
                   help="the port of torchrun's rendezvous and the process group on the first "
                        "host (default 29500)")
    p.add_argument("--out-dir", metavar="DIR", help="write node<i>.sh scripts instead")
    p.set_defaults(func=cmd_launch)
