"""The rank layout of a plan and the torchrun command for every node (no torch needed).

Layout, derived from the plan alone so every node computes the same one: global ranks are
numbered stage by stage (stage 0 first); inside a stage, replica by replica; inside a
replica, tensor-parallel rank by rank::

    rank = first_rank(stage) + replica * tp(stage) + tp_index
    first_rank(stage) = dp * sum(tp of the earlier stages)

So each stage's ``dp * tp`` ranks are contiguous and live on nodes of that stage's GPU type,
a TP group is contiguous (inside one node), and replicas of a stage sit side by side, as the
cost model's placement assumes (docs/cost-model.md).
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .. import _validate as v
from ..catalog import Catalog
from ..engines import refusal
from ..errors import PlanError, SpecError
from ..plan import Plan, Stage


class LaunchError(SpecError):
    """The hosts cannot hold the plan, or a hosts file is malformed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankInfo:
    """Where one global rank sits in the plan."""

    rank: int
    stage: int
    """The rank's GPU group along the pipeline: its stage, or under interleaving
    (``plan.virtual_stages > 1``) its first stage (it runs ``stages``)."""
    replica: int
    tp_index: int
    gpu: str
    layers: tuple[int, int]
    """The blocks of ``stage``."""
    stages: tuple[int, ...] = ()
    """Every stage the rank runs (``(stage,)`` unless interleaved)."""


def rank_layout(plan: Plan) -> list[RankInfo]:
    """Every global rank of the plan, in rank order (see the module docstring); under
    interleaving, GPU group by GPU group (``plan.pp`` of them)."""
    out: list[RankInfo] = []
    for s, st in enumerate(plan.stages[:plan.pp]):
        for r in range(plan.dp):
            for t in range(st.tp):
                out.append(RankInfo(rank=len(out), stage=s, replica=r, tp_index=t, gpu=st.gpu,
                                    layers=st.layers, stages=plan.device_stages(s)))
    return out


def check_runnable(plan: Plan, num_blocks: int | None = None,
                   batch_size: int | None = None) -> None:
    """Refuse, with PlanError, a plan that ``espresso.torch`` cannot run: stages that do not
    tile the model's blocks (``num_blocks``: the model given, when known), a TP width that does
    not divide the heads, KV heads or MLP width, micro-batching that does not make up the
    global batch (``batch_size``: one replica's batch, when known), or what the espresso
    engine does not run (``espresso.engines.refusal``: per-op selective recomputation)."""
    if not isinstance(plan, Plan):
        msg = f"expected a Plan, got {type(plan).__name__}"
        raise PlanError(msg)
    why = refusal(plan, "espresso")
    if why is not None:
        msg = (f"espresso's runner cannot run this plan ({why}); plan it with --engine espresso "
               "or run it on the engine it was planned for (espresso export)")
        raise PlanError(msg)
    model = plan.job.model
    blocks = model.num_layers if num_blocks is None else num_blocks
    if num_blocks is None and plan.stages[-1].layers[1] != blocks:
        msg = (f"the stages end at block {plan.stages[-1].layers[1]} but the plan's model "
               f"{model.name} has {blocks} blocks")
        raise PlanError(msg)
    if plan.stages[-1].layers[1] != blocks or model.num_layers != blocks:
        msg = (f"the plan covers {plan.stages[-1].layers[1]} blocks (its model has "
               f"{model.num_layers}) but the model given has {blocks}")
        raise PlanError(msg)
    begin = 0
    for i, st in enumerate(plan.stages):
        if st.layers[0] != begin or st.layers[1] <= st.layers[0]:
            msg = f"stage {i} holds layers {list(st.layers)}; expected to start at {begin}"
            raise PlanError(msg)
        begin = st.layers[1]
        for what, n in (("num_heads", model.num_heads), ("num_kv_heads", model.kv_heads),
                        ("ffn_hidden_size", model.ffn)):
            if n % st.tp:
                msg = f"stage {i} has tp {st.tp}, which does not divide the model's {what} {n}"
                raise PlanError(msg)
    gb = plan.dp * plan.micro_batch_size * plan.num_microbatches
    if gb != plan.job.global_batch_size:
        msg = (f"dp {plan.dp} x micro_batch_size {plan.micro_batch_size} x num_microbatches "
               f"{plan.num_microbatches} = {gb}, but the job's global batch is "
               f"{plan.job.global_batch_size}")
        raise PlanError(msg)
    if batch_size is not None and batch_size != plan.micro_batch_size * plan.num_microbatches:
        msg = (f"each replica's batch is {batch_size} sequences but the plan splits "
               f"{plan.num_microbatches} micro-batches of {plan.micro_batch_size}")
        raise PlanError(msg)


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """One machine: its address, GPU type and how many of those GPUs it has.

    A cloud instance may be described by its ``instance_type`` instead (``p4d.24xlarge``):
    its GPU model and count then come from the built-in offer snapshot (give ``gpu`` and
    ``gpus`` for a type the snapshot does not know). Such a host runs the stages whose offer
    is of that instance type; a host given by GPU runs any stage of that GPU model."""

    address: str
    gpu: str | None = None
    gpus: int | None = None
    instance_type: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "address", v.string("host.address", self.address, err=LaunchError))
        if self.instance_type is not None:
            it = v.string("host.instance_type", self.instance_type, err=LaunchError)
            set_(self, "instance_type", it)
            known = _instance_types().get(it)
            if known is None and (self.gpu is None or self.gpus is None):
                msg = (f"host.instance_type: {it!r} is not in the built-in offer snapshot; "
                       "give its gpu and gpus too")
                raise LaunchError(msg)
            if known is not None:
                if self.gpu is not None and self.gpu != known[0]:
                    msg = (f"host.gpu: {self.gpu!r} but instance type {it} has {known[0]} GPUs")
                    raise LaunchError(msg)
                set_(self, "gpu", known[0])
                if self.gpus is None:
                    set_(self, "gpus", known[1])
        for name in ("gpu", "gpus"):
            if getattr(self, name) is None:
                msg = f"host: missing required field {name!r} (or give instance_type)"
                raise LaunchError(msg)
        set_(self, "gpu", v.string("host.gpu", self.gpu, err=LaunchError))
        set_(self, "gpus", v.integer("host.gpus", self.gpus, minimum=1, maximum=1024,
                                     err=LaunchError))

    def runs(self, stage: Stage) -> bool:
        """Whether this host can hold ranks of ``stage``."""
        if self.gpu != stage.gpu:
            return False
        if self.instance_type is None or stage.instance_type is None:
            return True
        return stage.instance_type == self.instance_type

    @property
    def label(self) -> str:
        return f"{self.instance_type} ({self.gpu})" if self.instance_type else str(self.gpu)


@functools.cache
def _instance_types() -> dict[str, tuple[str, int]]:
    """Instance type -> (GPU model, GPUs) over the built-in offer snapshot."""
    out: dict[str, tuple[str, int]] = {}
    for g in Catalog.builtin("cloud"):
        if g.instance_type:
            out.setdefault(g.instance_type, (g.model, g.gpus_per_node))
    return out


def load_hosts(path: str | Path) -> list[Host]:
    """Read ``hosts: [{address, gpu, gpus} or {address, instance_type}, ...]`` from YAML or
    JSON."""
    return hosts_from_dict(v.load_yaml("hosts", path, err=LaunchError))


def hosts_from_dict(data: Any) -> list[Host]:
    data = v.mapping("hosts file", data, err=LaunchError)
    v.known_keys("hosts file", data, ["hosts"], ["hosts"], err=LaunchError)
    items = data["hosts"]
    if not isinstance(items, list) or not items:
        msg = f"hosts: expected a non-empty list of hosts, got {items!r}"
        raise LaunchError(msg)
    hosts = []
    names = [f.name for f in fields(Host)]
    for i, h in enumerate(items):
        h = v.mapping(f"hosts[{i}]", h, err=LaunchError)
        required = ["address"] if "instance_type" in h else ["address", "gpu", "gpus"]
        v.known_keys(f"hosts[{i}]", h, names, required, err=LaunchError)
        hosts.append(Host(**dict(h)))
    return hosts


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAssignment:
    """The ranks one torchrun runs on a host: ``first_rank .. first_rank + nproc - 1`` on
    the host's GPUs ``device_offset .. device_offset + nproc - 1``."""

    node_rank: int
    host: Host
    first_rank: int
    nproc: int
    device_offset: int


def assign_hosts(plan: Plan, hosts: list[Host]) -> list[NodeAssignment]:
    """Give every rank a GPU on a host of its stage's type, filling hosts in file order.

    Raises LaunchError saying precisely what is missing when the hosts cannot hold the plan.
    """
    # What each stage needs, by the instance type of its offer when the hosts name
    # instance types (else by GPU model), against what the hosts that can run it have.
    by_instance = any(h.instance_type for h in hosts)

    def need_key(st: Stage) -> str:
        if by_instance and st.instance_type is not None:
            return f"{st.instance_type} ({st.gpu})"
        return st.gpu

    need: dict[str, int] = {}
    example: dict[str, Stage] = {}
    for st in plan.stages[:plan.pp]:
        k = need_key(st)
        need[k] = need.get(k, 0) + st.tp * plan.dp
        example.setdefault(k, st)
    have = {k: sum(h.gpus or 0 for h in hosts if h.runs(example[k])) for k in need}
    short = [f"{n - have[k]} more {k} (plan needs {n}, hosts have {have[k]})"
             for k, n in need.items() if have[k] < n]
    if short:
        msg = "hosts cannot hold the plan: missing " + "; ".join(short)
        raise LaunchError(msg)
    # Hand out whole TP groups (a TP group needs one host: its all-reduces run over the
    # node's links), in rank order, each to the first host of its type, in file order, with
    # room for it; consecutive groups on one host merge into one block of ranks.
    free = [h.gpus or 0 for h in hosts]
    assigned: list[list[int]] = []  # [host index, first rank, count]
    first = 0
    for s, st in enumerate(plan.stages[:plan.pp]):
        # A stage whose replicas fit one host goes there whole (its DP all-reduce then stays
        # on the host's links, as the cost model charges it); the model places ranks the
        # same way (docs/cost-model.md, "Communication between stages and replicas").
        block = next((i for i, h in enumerate(hosts)
                      if h.runs(st) and free[i] >= st.tp * plan.dp), None)
        for r in range(plan.dp):
            host = block if block is not None else next(
                (i for i, h in enumerate(hosts) if h.runs(st) and free[i] >= st.tp), None)
            if host is None:
                biggest = max((free[i] for i, h in enumerate(hosts) if h.runs(st)), default=0)
                k = need_key(st)
                msg = (f"hosts cannot hold the plan: stage {s} (replica {r}) needs {st.tp} "
                       f"{st.gpu} GPUs on one host for its tensor-parallel group, but the most "
                       f"any {k} host has left is {biggest} (give {k} hosts whose GPU "
                       f"counts are multiples of {st.tp})")
                raise LaunchError(msg)
            free[host] -= st.tp
            if assigned and assigned[-1][0] == host and sum(assigned[-1][1:]) == first:
                assigned[-1][2] += st.tp
            else:
                assigned.append([host, first, st.tp])
            first += st.tp
    # One torchrun per (host, contiguous block); a host holding two blocks of ranks (two
    # stages of its type that are not adjacent) gets two node entries.
    used = dict.fromkeys(range(len(hosts)), 0)
    out = []
    for i, (hi, first, n) in enumerate(assigned):
        out.append(NodeAssignment(node_rank=i, host=hosts[hi], first_rank=first, nproc=n,
                                  device_offset=used[hi]))
        used[hi] += n
    return out


MAX_PORT = 65535
"""The highest port."""


def torchrun_commands(plan_path: str, plan: Plan, hosts: list[Host], script: str, *,
                      master_port: int = 29500, script_args: str = "") -> list[str]:
    """The command to run on each node. Every process reads the plan and its rank from the
    ``ESPRESSO_*`` environment (`espresso.torch.rank_from_env`)."""
    nodes = assign_hosts(plan, hosts)
    master = nodes[0].host.address
    cmds = []
    for n in nodes:
        cmd = node_command(plan_path, n, nnodes=len(nodes), world=plan.num_gpus, master=master,
                           master_port=master_port, script=script, script_args=script_args)
        cmds.append(f"# {n.host.address} ({n.host.label}): ranks {n.first_rank}.."
                    f"{n.first_rank + n.nproc - 1}\n{cmd}")
    return cmds


def node_command(plan_path: str, n: NodeAssignment, *, nnodes: int, world: int, master: str,
                 master_port: int, script: str, script_args: str = "") -> str:
    """One node's torchrun command: its ranks from the ``ESPRESSO_*`` environment, the
    process group at ``master`` (an address, or a shell expression such as
    ``"$MASTER_ADDR"``) and ``master_port``, one port: torchrun's agent on node 0 serves its
    store there and hands it to the ranks (``MASTER_ADDR``/``MASTER_PORT``), which build the
    process group on it. ``script`` is a file, or ``-m MODULE`` (``-m espresso.train``)."""
    master_port = v.integer("master_port", master_port, minimum=1, maximum=MAX_PORT,
                            err=LaunchError)
    env = (f"ESPRESSO_PLAN={shlex.quote(plan_path)} ESPRESSO_FIRST_RANK={n.first_rank} "
           f"ESPRESSO_WORLD_SIZE={world} ESPRESSO_DEVICE_OFFSET={n.device_offset}")
    target = (f"-m {shlex.quote(script[3:].strip())}" if script.startswith("-m ")
              else shlex.quote(script))
    cmd = (f"{env} torchrun --nnodes={nnodes} --node-rank={n.node_rank} "
           f"--nproc-per-node={n.nproc} --master-addr={master} "
           f"--master-port={master_port} {target}")
    return f"{cmd} {script_args}" if script_args else cmd
