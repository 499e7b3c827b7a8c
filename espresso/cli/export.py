"""``espresso export skypilot``: a plan as SkyPilot tasks."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import _io
from ..errors import SpecError
from ..plan import Plan
from ..runner.launch import load_hosts
from . import _common as c


def cmd_export_skypilot(args: argparse.Namespace) -> int:
    from ..cloud.skypilot_export import export
    from ..estimate import estimate

    _io.check_dir("--out", args.out, err=SpecError)
    plan = Plan.from_json(args.plan)
    # A catalog given is read (and must be good) even when the plan's estimate makes it
    # unneeded: a wrong --catalog is never silently ignored.
    catalog = c.load_available(args) if args.catalog or args.spot else None
    if plan.estimate is None:  # the rent list comes from the estimate
        from dataclasses import replace

        plan = replace(plan, estimate=estimate(plan, catalog))
    done = export(plan, args.out, script=args.script, script_args=args.script_args or "",
                  data=args.data, train_args=args.train_args or "", workdir=args.workdir,
                  setup=args.setup, wheel=args.wheel, port=args.port,
                  checkpoint_bucket=args.checkpoint_bucket)
    con = c.console()
    con.print(f"Wrote {len(done.files)} files to {args.out}:")
    root = Path(args.out).resolve()
    for f in done.files:
        con.print(f"  {f.resolve().relative_to(root)}")
    con.print(f"Start with: bash {args.out}/launch.sh   (after an interruption: "
              f"bash {args.out}/recover.sh)")
    for note in done.notes:
        con.print(f"Note: {note}")
    return c.EXIT_OK


def _plan_with_estimate(args: argparse.Namespace) -> Plan:
    plan = Plan.from_json(args.plan)
    return plan if plan.estimate is not None else plan.with_estimate()


def _report(out: str, files: list[Path], notes: list[str], start: str) -> int:
    con = c.console()
    root = Path(out).resolve()
    con.print(f"Wrote {len(files)} files to {out}:")
    for f in files:
        con.print(f"  {f.resolve().relative_to(root)}")
    con.print(start)
    for note in notes:
        con.print(f"Note: {note}")
    return c.EXIT_OK


def _engine_export(args: argparse.Namespace, export: Any, **options: Any) -> tuple[Any, ...]:
    """Run an engine export on the command's plan: (files, notes, hosts given)."""
    _io.check_dir("--out", args.out, err=SpecError)
    hosts = load_hosts(args.hosts) if args.hosts else None
    files, notes = export(_plan_with_estimate(args), args.out, hosts=hosts,
                          master_port=args.port, lr=args.lr, **options)
    return files, notes, hosts is not None


def cmd_export_torchtitan(args: argparse.Namespace) -> int:
    from ..export.torchtitan import export

    files, notes, hosts = _engine_export(args, export, dataset=args.dataset,
                                         tokenizer=args.tokenizer)
    return _report(args.out, files, notes,
                   f"Start: bash {args.out}/node<i>.sh on each host (torchtitan installed)"
                   if hosts else "Start: torchrun ... -m torchtitan.train "
                                 f"--job.config_file {args.out}/torchtitan.toml")


def cmd_export_megatron(args: argparse.Namespace) -> int:
    from ..export.megatron import export

    files, notes, hosts = _engine_export(args, export, data_path=args.data_path,
                                         tokenizer_model=args.tokenizer_model)
    return _report(args.out, files, notes,
                   f"Start: MEGATRON=/path/to/Megatron-LM bash {args.out}/"
                   + ("node<i>.sh on each host" if hosts else "pretrain_gpt.sh --nnodes ..."))


def _engine_parser(tools: Any, name: str, help_: str, description: str) -> Any:
    s = tools.add_parser(name, help=help_, description=description)
    s.add_argument("plan", help="plan JSON file (made with --engine " + name + ")")
    s.add_argument("--out", required=True, metavar="DIR", help="folder for the files")
    s.add_argument("--hosts", metavar="FILE",
                   help="hosts YAML (as espresso launch takes it): also write each node's "
                        "torchrun command")
    s.add_argument("--port", type=c.port, default=29500, help="torchrun's port (29500)")
    s.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (3e-4)")
    return s


def register(sub: Any) -> None:
    p = sub.add_parser("export", help="a plan for another tool (SkyPilot, torchtitan, "
                       "Megatron-LM)",
                       description="Write a plan in another tool's format.")
    tools = p.add_subparsers(dest="tool", required=True, metavar="TOOL")
    s = tools.add_parser(
        "skypilot", help="SkyPilot task YAMLs and launch scripts",
        description="One SkyPilot task per rented offer (cloud, region, instance type, count, "
        "use_spot), each node starting the torchrun command of `espresso launch`'s rank "
        "layout; launch.sh provisions and starts them, recover.sh restarts after an "
        "interruption (docs/runner.md, \"Running on SkyPilot\").")
    s.add_argument("plan", help="plan JSON file")
    s.add_argument("--out", required=True, metavar="DIR", help="folder for the files")
    s.add_argument("--data",
                   help="what espresso train reads on the nodes: a file or folder in the "
                        "workdir, hf:NAME[:CONFIG][@SPLIT], or synthetic")
    s.add_argument("--train-args", default="",
                   help="more arguments for espresso train (e.g. \"--steps 1000 --lr 3e-4 "
                        "--tokenizer meta-llama/Llama-2-7b-hf\")")
    s.add_argument("--script",
                   help="run this training script (a file in the workdir) instead of "
                        "espresso train")
    s.add_argument("--script-args", default="", help="arguments for --script")
    s.add_argument("--workdir", default=".",
                   help="folder SkyPilot syncs to every node (default: the current one)")
    s.add_argument("--setup",
                   help="setup command of every node (default: install espresso with its "
                        "torch and train extras from its source tree, or from --wheel)")
    s.add_argument("--wheel", metavar="FILE",
                   help="install espresso on the nodes from this wheel or source archive")
    s.add_argument("--port", type=c.port, default=29500,
                   help="the port of the process group and torchrun's rendezvous (default 29500)")
    s.add_argument("--checkpoint-bucket", metavar="URI",
                   help="bucket mounted at /checkpoints on every node, where the script "
                        "checkpoints (--checkpoint-dir); required for spot plans")
    s.add_argument("--catalog", help="catalog to estimate a plan without an estimate")
    s.add_argument("--spot", action="store_true",
                   help="with --catalog: add the spot rows the plan names")
    s.set_defaults(func=cmd_export_skypilot, quota=None, max_instances=None, spot_only=False,
                   spot_rate=None, spot_recovery=None)
    t = _engine_parser(tools, "torchtitan", "torchtitan's job config (TOML) and node commands",
                       "torchtitan's job config for a plan torchtitan can run (one TP width; "
                       "plan with --engine torchtitan), and with --hosts each node's torchrun "
                       "command (docs/engines.md).")
    t.add_argument("--dataset", default="c4", help="torchtitan dataset name (c4)")
    t.add_argument("--tokenizer", default="./assets/hf/Llama-3.1-8B",
                   help="model.hf_assets_path: the tokenizer's folder")
    t.set_defaults(func=cmd_export_torchtitan)
    m = _engine_parser(tools, "megatron", "Megatron-LM's pretrain_gpt.py arguments",
                       "pretrain_gpt.py's arguments for a plan Megatron-LM can run (plan with "
                       "--engine megatron), as megatron_args.txt and a launch script "
                       "(docs/engines.md).")
    m.add_argument("--data-path", help="Megatron's --data-path (default: --mock-data)")
    m.add_argument("--tokenizer-model", help="a Hugging Face tokenizer for --data-path")
    m.set_defaults(func=cmd_export_megatron)
