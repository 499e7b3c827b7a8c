"""Checkpoints of a running plan: each rank's stage (model and optimizer states), the step and
the data position, written with ``torch.distributed.checkpoint`` (DCP) and read back after a
restart (docs/runner.md, "Checkpoints and restarts").

Keys are the plan's, not the hosts': a stage's tensors are named ``stage<s>.model.<fqn>`` and
``stage<s>.optim.<...>`` (optimizer states flattened per parameter name), so a checkpoint
loads into any run of a plan with the same stages, dp and TP widths, on any hosts. Replicated
states (data-parallel replicas without sharding) are written once (DCP keeps one copy of
equal keys); sharded ones (TP DTensors, FSDP2 shards, ZeRO-1 partitions) each by its owner.

Layout of a checkpoint folder::

    DIR/step_00000012/          one DCP checkpoint (``.metadata`` and per-rank files)
    DIR/step_00000012/espresso.json   step, data position, the plan's stages (written last)
    DIR/latest                  the newest complete step folder's name

A step folder without ``espresso.json`` is incomplete (a write cut short) and is never read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._optional import require
from ..errors import PlanError

torch = require("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as _dcp_load  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import save as _dcp_save  # noqa: E402

if TYPE_CHECKING:
    from ..plan import Plan
    from .stage import StageRuntime

_META = "espresso.json"
_LATEST = "latest"
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def interval_steps(plan: Plan) -> int | None:
    """Steps between checkpoints at the plan's interval (``estimate.spot``: the interval that
    minimises the expected time under interruptions), at least 1; ``None`` for a plan without
    spot instances or an estimate."""
    est = plan.estimate
    if est is None or est.spot is None or est.spot.checkpoint_interval_hours <= 0:
        return None
    return max(1, int(est.spot.checkpoint_interval_hours * 3600 / est.iteration_s))


class Checkpointer:
    """Save and resume one rank's part of a plan.

    ``every``: steps between checkpoints (default: the plan's interval,
    :func:`interval_steps`; 0: only explicit :meth:`save` calls). Every rank of the world
    constructs one and makes the same calls (saves and loads are collective)::

        ck = Checkpointer(rt, opt, "ckpt/")
        start, data = ck.resume()          # (0, None) without a checkpoint
        for step in range(start, steps):
            ...
            ck.step_done(step, data=step + 1)   # saves every `every` steps

    ``data`` is any JSON value that says where the input stream stands (a sample index, a
    shard and offset); it comes back from :meth:`resume`.
    """

    def __init__(self, rt: StageRuntime, optimizer: Any, directory: str | os.PathLike[str], *,
                 plan: Plan | None = None, every: int | None = None) -> None:
        self.rt = rt
        self.optimizer = optimizer
        self.directory = Path(directory)
        self.plan = plan
        if every is None:
            every = (interval_steps(plan) if plan is not None else None) or 0
        if not isinstance(every, int) or every < 0:
            msg = f"Checkpointer: every: expected a number of steps >= 0, got {every!r}"
            raise PlanError(msg)
        self.every = every
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        # One module naming the rank's stages by their index in the plan (the same names on
        # every TP rank and replica of a stage, whatever wraps them at run time).
        self._module = torch.nn.ModuleDict(
            {f"stage{s}": c for s, c in zip(rt.info.stages or (rt.info.stage,), rt.chunks,
                                             strict=True)})
        # ZeRO-1 keeps each replica's share of the states in a local optimizer.
        self._optim = getattr(optimizer, "optim", optimizer)

    # ------------------------------------------------------------------ state
    def _state(self) -> dict[str, Any]:
        return {"model": get_model_state_dict(self._module),
                "optim": get_optimizer_state_dict(self._module, self._optim, options=_OPTIONS)}

    def _layout(self) -> list[list[Any]]:
        plan = self.plan
        if plan is None:
            return []
        # Stages (blocks and TP width) and dp decide the tensors' names and shards; the GPU
        # types and hosts may differ.
        return [[st.tp, list(st.layers)] for st in plan.stages] + [[plan.dp]]

    # ------------------------------------------------------------------ save / load
    def save(self, step: int, data: Any = None) -> Path:
        """Write the checkpoint of `step` (collective) and return its folder."""
        name = f"step_{step:08d}"
        path = self.directory / name
        if self.rank == 0:
            if path.exists():  # a previous attempt at this step, cut short
                shutil.rmtree(path)
            path.mkdir(parents=True, exist_ok=True)
        _barrier()
        _dcp_save(self._state(), checkpoint_id=str(path))
        _barrier()
        if self.rank == 0:
            meta = {"step": step, "data": data, "layout": self._layout()}
            _write_atomic(path / _META, json.dumps(meta))
            _write_atomic(self.directory / _LATEST, name)
        _barrier()
        return path

    def latest(self) -> Path | None:
        """The newest complete checkpoint folder, or None."""
        pointer = self.directory / _LATEST
        names = []
        if pointer.is_file():
            names.append(pointer.read_text().strip())
        if self.directory.is_dir():
            names += sorted((p.name for p in self.directory.glob("step_*")), reverse=True)
        for n in names:
            if (self.directory / n / _META).is_file():
                return self.directory / n
        return None

    def resume(self) -> tuple[int, Any]:
        """Load the newest complete checkpoint, if any (collective): returns (the next step to
        run, the data position saved with it), or ``(0, None)``."""
        path = self.latest()
        # Every rank must agree on the folder: rank 0 decides.
        chosen = [str(path) if path is not None else ""]
        if dist.is_initialized():
            dist.broadcast_object_list(chosen, src=0)
        if not chosen[0]:
            return 0, None
        path = Path(chosen[0])
        meta = json.loads((path / _META).read_text())
        if self.plan is not None and meta.get("layout") and meta["layout"] != self._layout():
            msg = (f"checkpoint {path} was written by a plan with other stages "
                   f"({meta['layout']}); it loads only into a plan with the same stages, dp "
                   "and TP widths")
            raise PlanError(msg)
        state = self._state()
        _dcp_load(state, checkpoint_id=str(path))
        set_model_state_dict(self._module, state["model"])
        set_optimizer_state_dict(self._module, self._optim, state["optim"], options=_OPTIONS)
        _barrier()
        return int(meta["step"]) + 1, meta.get("data")

    def step_done(self, step: int, data: Any = None) -> Path | None:
        """Call after each step: saves when ``every`` steps have passed since step 0."""
        if self.every and (step + 1) % self.every == 0:
            return self.save(step, data)
        return None


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
