"""What the engine exports share: the refusal of a plan the engine cannot run, the node
commands (torchrun, one per host assignment of the plan's rank layout), and writing files."""

from __future__ import annotations

import shlex
from pathlib import Path

from .. import _io
from ..engines import refusal
from ..errors import PlanError
from ..plan import Plan
from ..runner.launch import Host, assign_hosts


def check_engine(plan: Plan, engine: str) -> None:
    why = refusal(plan, engine)
    if why is not None:
        msg = (f"export {engine}: {engine} cannot run this plan ({why}); plan it with "
               f"--engine {engine}")
        raise PlanError(msg)


def node_commands(plan: Plan, hosts: list[Host], target: str, args: str, *,
                  master_port: int) -> list[str]:
    """One torchrun per host assignment, in rank order: ``--node-rank`` follows the plan's
    rank layout, so torchrun's global ranks (node by node) are the plan's, and the engine's
    own mesh (pipeline outermost, then data, then tensor parallelism) puts each stage on the
    hosts of its GPU type. Several assignments on one host see only their GPUs."""
    nodes = sorted(assign_hosts(plan, hosts), key=lambda n: n.first_rank)
    master = nodes[0].host.address
    out = []
    for i, n in enumerate(nodes):
        devices = ",".join(str(n.device_offset + k) for k in range(n.nproc))
        out.append(f"# {n.host.address} ({n.host.label}): ranks {n.first_rank}.."
                   f"{n.first_rank + n.nproc - 1}\n"
                   f"CUDA_VISIBLE_DEVICES={devices} torchrun --nnodes={len(nodes)} "
                   f"--node-rank={i} --nproc-per-node={n.nproc} "
                   f"--master-addr={shlex.quote(master)} --master-port={master_port} "
                   f"{target} {args}".rstrip())
    return out


def write(folder: Path, name: str, text: str, *, mode: int | None = None) -> Path:
    path = folder / name
    _io.write_text("--out", path, text, mode=mode, err=PlanError)
    return path


def toml_value(x: object) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (int, float)):
        return repr(x)
    if isinstance(x, str):
        import json

        return json.dumps(x)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(toml_value(y) for y in x) + "]"
    msg = f"cannot write {x!r} as TOML"
    raise TypeError(msg)


def toml(sections: dict[str, dict[str, object]], header: str = "") -> str:
    """Tables of scalars and lists as TOML (what torchtitan's job configs hold)."""
    out = [header] if header else []
    for name, keys in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {toml_value(v)}" for k, v in keys.items() if v is not None]
        out.append("")
    return "\n".join(out)
