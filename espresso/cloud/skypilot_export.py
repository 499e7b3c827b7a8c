"""A plan as SkyPilot tasks: one task (one cluster) per rented offer, each node starting the
torchrun command of ``espresso launch``'s rank layout (docs/runner.md, "Running on SkyPilot").

SkyPilot gives every node of a task the same instance type, so a plan that rents several
offers becomes several tasks, launched side by side: ``launch.sh`` provisions every cluster
first (the task's run step is skipped while ``ESPRESSO_PROVISION_ONLY`` is set), reads the
private address of the node that holds rank 0, then starts every group with it as
``MASTER_ADDR``. Spot groups are ``use_spot: true``; ``recover.sh`` brings reclaimed
clusters back and restarts every group, which resumes from the newest checkpoint
(``--checkpoint-bucket``, mounted at ``/checkpoints`` on every node). ``jobs.sh`` runs every
group as a SkyPilot managed job instead, which SkyPilot recovers by itself: the group of rank
0 writes its address to the bucket on every start and the others read it (a plan of one
offer needs no bucket for that).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import _io
from ..errors import PlanError
from ..plan import Plan
from ..runner.launch import Host, NodeAssignment, assign_hosts, node_command
from .networks import network_for
from .skypilot import gcp_attached

CHECKPOINT_MOUNT = "/checkpoints"
MASTER_FILE = f"{CHECKPOINT_MOUNT}/espresso/master-addr"
PLAN_PATH = "/tmp/espresso/plan.json"
SOURCE_MOUNT = "/tmp/espresso/src"
WHEEL_MOUNT = "/tmp/espresso/dist"
EXTRAS = "torch,train"
TRAIN = "-m espresso.train"
RUN_DIR = "~/espresso-run"
"""Where ``espresso train`` writes ``metrics.jsonl`` on the node of the last stage (and its
checkpoints without a bucket)."""
FABRIC_TIER = {"aws": "EFA", "gcp": "GPUDirect-TCPX/TCPXO"}
"""Clouds where SkyPilot's ``network_tier: best`` switches on the fabric the plan's network
figures assume (docs/catalog.md, "Network figures")."""


@dataclass(frozen=True, slots=True)
class NodeRun:
    """What every node installs and runs."""

    script: str
    """A file in the workdir (relative to it), or ``-m espresso.train``."""
    script_args: str
    setup: str
    mounts: dict[str, str] = field(default_factory=dict)
    """Extra file mounts (the package's source or wheel)."""


def source_root() -> Path | None:
    """The source tree this espresso was installed from (an editable or in-tree install),
    or None (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text()
    except OSError:
        return None
    return root if re.search(r'^name\s*=\s*"espresso-planner"', text, re.M) else None


def _inside(path: Path, folder: Path) -> Path | None:
    try:
        return path.resolve().relative_to(folder.resolve())
    except ValueError:
        return None


def _in_workdir(name: str, work: Path, *, file: bool) -> str | None:
    """``name`` (relative to the workdir, or absolute) as a path relative to the workdir, when
    it exists there (a file, with ``file``); else None."""
    path = Path(name)
    rel = _inside(path if path.is_absolute() else work / path, work)
    if rel is None or not ((work / rel).is_file() if file else (work / rel).exists()):
        return None
    return rel.as_posix()


def install_command(workdir: Path, *, setup: str | None = None,
                    wheel: str | None = None) -> tuple[str, dict[str, str]]:
    """The setup command that installs espresso with its torch and train extras on a node, and
    the file mounts it needs: ``setup`` as given; else the ``wheel`` given (mounted); else
    the source tree, from the synced workdir when it holds the tree, else mounted."""
    if setup is not None:
        return setup, {}
    if wheel is not None:
        path = Path(wheel)
        if not path.is_file() or not path.name.endswith((".whl", ".tar.gz")):
            msg = f"--wheel: {wheel!r} is not a wheel (.whl) or source archive (.tar.gz) file"
            raise PlanError(msg)
        target = f"{WHEEL_MOUNT}/{path.name}"
        return (f'pip install "{target}[{EXTRAS}]"', {target: str(path.resolve())})
    root = source_root()
    if root is None:
        msg = ("export: espresso was installed from a wheel, so there is no source tree to "
               "install on the nodes: give --wheel FILE (build one with `pip wheel --no-deps .` "
               "in espresso's source, or `pip download espresso-planner`) or --setup COMMAND")
        raise PlanError(msg)
    rel = _inside(root, workdir)
    if rel is not None:  # the workdir (synced to every node) holds the source
        where = "." if str(rel) == "." else f"./{rel.as_posix()}"
        return f'pip install "{where}[{EXTRAS}]"', {}
    return f'pip install "{SOURCE_MOUNT}[{EXTRAS}]"', {SOURCE_MOUNT: str(root)}


def node_run(workdir: str | Path, *, script: str | None = None, script_args: str = "",
             data: str | None = None, train_args: str = "", setup: str | None = None,
             wheel: str | None = None) -> NodeRun:
    """What the nodes run: ``espresso train`` on ``data`` (with ``train_args``), or the user's
    ``script`` (which must be in the workdir, the folder SkyPilot syncs to every node)."""
    work = Path(workdir)
    if not work.is_dir():
        msg = f"--workdir: {str(workdir)!r} is not a folder"
        raise PlanError(msg)
    command, mounts = install_command(work, setup=setup, wheel=wheel)
    if script is not None:
        if data is not None or train_args:
            msg = "export: --data and --train-args go with espresso train, not with --script"
            raise PlanError(msg)
        rel = _in_workdir(script, work, file=True)
        if rel is None:
            msg = (f"--script: {script!r} is not a file in the workdir {str(work.resolve())!r} "
                   "(the folder SkyPilot syncs to every node; see --workdir)")
            raise PlanError(msg)
        return NodeRun(rel, script_args, command, mounts)
    if script_args:
        msg = "export: --script-args go with --script; for espresso train use --train-args"
        raise PlanError(msg)
    if data is None:
        msg = ("export: give --data (a text/jsonl/token file or folder in the workdir, "
               "hf:NAME[:CONFIG][@SPLIT], or synthetic) for espresso train, or --script FILE")
        raise PlanError(msg)
    if data != "synthetic" and not data.startswith("hf:"):
        rel = _in_workdir(data, work, file=False)
        if rel is None:
            msg = (f"--data: {data!r} is not in the workdir {str(work.resolve())!r}: the nodes "
                   "get the workdir only; give a path inside it, hf:NAME, or synthetic")
            raise PlanError(msg)
        data = rel
    args = f"{PLAN_PATH} --data {shlex.quote(data)} --out {RUN_DIR}"
    return NodeRun(TRAIN, f"{args} {train_args}".strip(), command, mounts)


def fabric_of(instance_type: str) -> str:
    """The fabric an instance type's network figure needs ('' when plain networking)."""
    net = network_for(instance_type)
    return net.fabric if net is not None else ""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """The instances of one offer: one SkyPilot task."""

    index: int
    provider: str
    region: str
    zone: str | None
    instance_type: str
    instances: int
    gpus_per_instance: int
    gpu: str
    spot: bool

    @property
    def cluster(self) -> str:
        return f"espresso-g{self.index}"

    def host(self, node: int) -> str:
        return f"g{self.index}n{node}"


def node_groups(plan: Plan) -> list[NodeGroup]:
    """The plan's rented offers (its estimate's rent list) as node groups."""
    est = plan.estimate
    if est is None or not est.rent:
        msg = ("export: the plan has no estimate with a rent list; estimate it first "
               "(`espresso estimate PLAN --json OUT`)")
        raise PlanError(msg)
    zone = (plan.domain or {}).get("zone")
    out = []
    for i, r in enumerate(est.rent):
        if not r.get("provider") or not r.get("region"):
            msg = (f"export: the plan rents {r.get('instance_type')} from a plain GPU-type "
                   "catalog; SkyPilot needs cloud offers (provider, region, instance type): "
                   "plan on the cloud snapshot or a SkyPilot catalog")
            raise PlanError(msg)
        n = int(r["instances"])
        out.append(NodeGroup(index=i, provider=str(r["provider"]), region=str(r["region"]),
                             zone=str(zone) if zone else None,
                             instance_type=str(r["instance_type"]), instances=n,
                             gpus_per_instance=int(r["gpus"]) // max(1, n), gpu=str(r["gpu"]),
                             spot=r.get("market") == "spot"))
    return out


def layout(plan: Plan, groups: list[NodeGroup]) -> list[NodeAssignment]:
    """Ranks onto the groups' nodes, as ``espresso launch`` assigns them to hosts."""
    hosts = [Host(address=g.host(j), gpu=g.gpu, gpus=g.gpus_per_instance,
                  instance_type=g.instance_type)
             for g in groups for j in range(g.instances)]
    return assign_hosts(plan, hosts)


def _node_command(a: NodeAssignment, nnodes: int, world: int, run: NodeRun, port: int,
                  checkpoint: bool) -> str:
    args = run.script_args
    if checkpoint:
        args = f"{args} --checkpoint-dir {CHECKPOINT_MOUNT}/espresso".strip()
    return node_command(PLAN_PATH, a, nnodes=nnodes, world=world, master='"$MASTER_ADDR"',
                        master_port=port, script=run.script, script_args=args)


def task(plan: Plan, group: NodeGroup, nodes: list[NodeAssignment], *, run: NodeRun,
         workdir: str, port: int, checkpoint_bucket: str | None, master: tuple[int, int],
         managed: bool = False, plan_file: str = "plan.json",
         fast_network: bool = False) -> dict[str, Any]:
    """The SkyPilot task of one node group (a dict for ``yaml.safe_dump``)."""
    world = plan.num_gpus
    nnodes = len(nodes)
    cases = []
    for j in range(group.instances):
        mine = [a for a in nodes if a.host.address == group.host(j)]
        cmds = [_node_command(a, nnodes, world, run, port, checkpoint_bucket is not None)
                for a in mine]
        body = (cmds[0] if len(cmds) == 1 else
                " & ".join(cmds) + " & wait" if cmds else "echo 'no ranks on this node'")
        cases.append(f"  {j}) {body} ;;")
    master_group, master_node = master
    shared = managed and checkpoint_bucket is not None  # the address travels by the bucket
    if group.index == master_group:
        find = f'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | sed -n {master_node + 1}p)\n'
        if shared:
            find += (f'if [ "$SKYPILOT_NODE_RANK" = {master_node} ]; then mkdir -p '
                     f'{CHECKPOINT_MOUNT}/espresso; echo "$MASTER_ADDR" > {MASTER_FILE}.$$ && '
                     f'mv {MASTER_FILE}.$$ {MASTER_FILE}; fi\n')
    elif shared:
        # Written by the group of rank 0 each time it starts; a stale one (it was
        # reclaimed and came back elsewhere) fails the rendezvous, and the restart reads anew.
        find = (f"for _ in $(seq 360); do [ -s {MASTER_FILE} ] && break; sleep 5; done\n"
                f"MASTER_ADDR=$(cat {MASTER_FILE})\n")
    else:
        find = ('if [ -z "${MASTER_ADDR:-}" ]; then echo "MASTER_ADDR is not set: launch '
                'with launch.sh" >&2; exit 2; fi\n')
    run_step = ('if [ -n "${ESPRESSO_PROVISION_ONLY:-}" ]; then exit 0; fi\n' + find
                + "set -x\n" + 'case "$SKYPILOT_NODE_RANK" in\n' + "\n".join(cases)
                + "\nesac\n")
    resources: dict[str, Any] = {"cloud": group.provider, "region": group.region,
                                 "instance_type": group.instance_type,
                                 "use_spot": group.spot}
    attached = gcp_attached(group.instance_type) if group.provider == "gcp" else None
    if attached is not None:
        # GPUs attached to an N1 host: SkyPilot takes the machine and the accelerators apart.
        resources["instance_type"] = attached[0]
        resources["accelerators"] = f"{attached[1]}:{group.gpus_per_instance}"
    if group.zone and group.zone.startswith(group.region):
        resources["zone"] = group.zone  # a zone name (not an AZ id such as use1-az6)
    if fast_network:
        # The fabric the plan's inter-node figures assume (EFA, GPUDirect-TCPX/TCPXO):
        # SkyPilot's best network tier switches it on and sets NCCL's variables for it.
        resources["network_tier"] = "best"
    if managed:
        # Recover in the same place (the plan's prices and links are this region's); a group
        # whose peers were reclaimed fails too and restarts, resuming from the checkpoint.
        resources["job_recovery"] = {"strategy": "FAILOVER", "max_restarts_on_errors": 20}
    envs: dict[str, Any] = {"ESPRESSO_PLAN": PLAN_PATH}
    if group.index != master_group and not shared:
        # Given at launch (launch.sh: --env MASTER_ADDR=...). Empty rather than null: SkyPilot
        # refuses to load a task with a null variable that no --env sets.
        envs["MASTER_ADDR"] = ""
    out: dict[str, Any] = {
        "name": f"espresso-{_slug(plan.job.model.name)}-g{group.index}",
        "num_nodes": group.instances,
        "resources": resources,
        "workdir": workdir,
        "envs": envs,
        "file_mounts": {PLAN_PATH: plan_file, **run.mounts},
        "setup": run.setup,
        "run": run_step,
    }
    if checkpoint_bucket is not None:
        out["file_mounts"][CHECKPOINT_MOUNT] = {"source": checkpoint_bucket, "mode": "MOUNT"}
    return out


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    """Multi-line strings (setup, run) as literal blocks, as people write them."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def _yaml(spec: dict[str, Any]) -> str:
    return str(yaml.dump(spec, Dumper=_Dumper, sort_keys=False, width=1000))


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or "plan"


@dataclass(frozen=True, slots=True)
class Exported:
    files: list[Path]
    """Every file written, in order."""
    notes: list[str]
    """What the user should know: files not written and why, networks not switched on."""


def export(plan: Plan, out: str | Path, *, script: str | None = None, script_args: str = "",
           data: str | None = None, train_args: str = "", workdir: str = ".",
           setup: str | None = None, wheel: str | None = None, port: int = 29500,
           checkpoint_bucket: str | None = None) -> Exported:
    """Write the SkyPilot tasks of ``plan`` and their scripts to folder ``out``. Each node
    installs espresso (:func:`install_command`) and runs ``espresso train`` on ``data`` or the
    user's ``script`` (:func:`node_run`). Spot plans need ``checkpoint_bucket`` (a bucket URI
    SkyPilot can mount) so that restarts resume."""
    groups = node_groups(plan)
    if any(g.spot for g in groups) and checkpoint_bucket is None:
        msg = ("export: the plan rents spot instances; give --checkpoint-bucket (e.g. "
               "s3://my-bucket/run1) so that a restart resumes from the newest checkpoint")
        raise PlanError(msg)
    run = node_run(workdir, script=script, script_args=script_args, data=data,
                   train_args=train_args, setup=setup, wheel=wheel)
    nodes = layout(plan, groups)
    master_host = nodes[0].host.address  # holds rank 0
    master = next((g.index, j) for g in groups for j in range(g.instances)
                  if g.host(j) == master_host)
    notes: list[str] = []
    many_nodes = sum(g.instances for g in groups) > 1
    fast: dict[int, bool] = {}
    for g in groups:
        fabric = fabric_of(g.instance_type)
        fast[g.index] = bool(fabric) and many_nodes and g.provider in FABRIC_TIER
        if fabric and many_nodes and not fast[g.index]:
            notes.append(f"group {g.index} ({g.instance_type} on {g.provider}): the plan "
                         f"assumes its {fabric} network, which the export cannot switch on "
                         "there; re-plan with a catalog that gives it the plain network")
    folder = _io.make_dir("--out", out, err=PlanError)
    written = [_write(folder / "plan.json", plan.to_json())]
    workdir = str(Path(workdir).resolve())
    # Absolute: SkyPilot checks local mount sources wherever it is run from.
    plan_file = str((folder / "plan.json").resolve())
    files = []
    for g in groups:
        spec = task(plan, g, nodes, run=run, workdir=workdir, port=port,
                    checkpoint_bucket=checkpoint_bucket, master=master, plan_file=plan_file,
                    fast_network=fast[g.index])
        name = f"group{g.index}.yaml"
        header = (f"# espresso: node group {g.index} of {len(groups)}: {g.instances} x "
                  f"{g.instance_type}{' (spot)' if g.spot else ''}, {g.provider} {g.region}\n")
        written.append(_write(folder / name, header + _yaml(spec)))
        files.append((g, name))
    # Managed jobs (SkyPilot recovers each group): one group finds its master itself; several
    # share rank 0's address through the checkpoint bucket.
    if len(groups) == 1 or checkpoint_bucket is not None:
        jobs = _io.make_dir("--out", folder / "jobs", err=PlanError)
        for g in groups:
            spec = task(plan, g, nodes, run=run, workdir=workdir, port=port,
                        checkpoint_bucket=checkpoint_bucket, master=master, managed=True,
                        plan_file=plan_file, fast_network=fast[g.index])
            written.append(_write(jobs / f"group{g.index}.yaml",
                                  f"# espresso: node group {g.index} as a SkyPilot managed job "
                                  "(jobs.sh launches them all)\n" + _yaml(spec)))
        written.append(_write(folder / "jobs.sh", _jobs_script(groups), mode=0o755))
    else:
        notes.append(f"jobs.sh (SkyPilot managed jobs) is not written: the plan's {len(groups)} "
                     "node groups find rank 0's address through a shared bucket; give "
                     "--checkpoint-bucket for it")
    written.append(_write(folder / "launch.sh", _launch_script(files, master), mode=0o755))
    written.append(_write(folder / "recover.sh", _recover_script(files, master), mode=0o755))
    return Exported(written, notes)


def _jobs_script(groups: list[NodeGroup]) -> str:
    return ("#!/usr/bin/env bash\n# Every node group as a SkyPilot managed job: SkyPilot "
            "brings reclaimed spot\n# instances back and restarts the group, which resumes "
            "from the newest checkpoint.\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n"
            + "".join(f"sky jobs launch -y -d -n {g.cluster} jobs/group{g.index}.yaml\n"
                      for g in groups))


def _write(path: Path, text: str, mode: int | None = None) -> Path:
    _io.write_text("--out", path, text, mode=mode, err=PlanError)
    return path


def _start(files: list[tuple[NodeGroup, str]], master: tuple[int, int]) -> str:
    m_group, m_node = master
    cluster = files[m_group][0].cluster
    lines = [
        "# The private address of the node holding rank 0 (node "
        f"{m_node} of {cluster}).",
        f"MASTER_ADDR=$(ssh {cluster}{'' if m_node == 0 else f'-worker{m_node}'} "
        "\"hostname -I | awk '{print \\$1}'\")",
        'echo "MASTER_ADDR=$MASTER_ADDR"',
    ]
    for g, name in files:
        lines.append(f"sky exec {g.cluster} {name} --env MASTER_ADDR=\"$MASTER_ADDR\" -d")
    return "\n".join(lines) + "\n"


def _launch_script(files: list[tuple[NodeGroup, str]], master: tuple[int, int]) -> str:
    head = ("#!/usr/bin/env bash\n# Provision every node group, then start them all "
            "(espresso export skypilot).\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n")
    prov = "".join(f"sky launch -y -c {g.cluster} {name} --env ESPRESSO_PROVISION_ONLY=1 "
                   f"--env MASTER_ADDR=pending &\n" for g, name in files)
    return head + prov + "wait\n" + _start(files, master)


def _recover_script(files: list[tuple[NodeGroup, str]], master: tuple[int, int]) -> str:
    head = ("#!/usr/bin/env bash\n# After an interruption: bring reclaimed clusters back, "
            "stop what still runs, and\n# restart every group; the training resumes from the "
            "newest checkpoint.\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n")
    body = "".join(f"sky cancel -y -a {g.cluster} || true\n"
                   f"sky launch -y -c {g.cluster} {name} --env ESPRESSO_PROVISION_ONLY=1 "
                   f"--env MASTER_ADDR=pending\n" for g, name in files)
    return head + body + _start(files, master)
