"""Run a plan with PyTorch: this rank's pipeline stage, schedule and data-parallel group.

Needs the ``torch`` extra. The distributed engine is PyTorch's own
(``torch.distributed.pipelining``, DDP, ``torchrun``). The rank layout is
:func:`espresso.launch.rank_layout`; with ``tp == 1`` on every stage it is the row-major
``(pp, dp)`` device mesh::

    rank = stage * dp + replica

Tensor parallelism inside a stage is not run by this module yet: plans with ``tp > 1`` are
refused before any process group is created.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._optional import require
from .errors import PlanError
from .launch import RankInfo, rank_layout
from .plan import Plan

if TYPE_CHECKING:
    from torch import nn as _nn

torch = require("torch")
nn = torch.nn
dist = torch.distributed


def check_plan(plan: Plan, num_blocks: int, batch_size: int | None = None) -> None:
    """Refuse a plan that does not match the model (or the runner) with a clear message."""
    if not isinstance(plan, Plan):
        msg = f"expected a Plan, got {type(plan).__name__}"
        raise PlanError(msg)
    if plan.stages[-1].layers[1] != num_blocks or plan.job.model.num_layers != num_blocks:
        msg = (f"the plan covers {plan.stages[-1].layers[1]} blocks (its model has "
               f"{plan.job.model.num_layers}) but the model given has {num_blocks}")
        raise PlanError(msg)
    begin = 0
    for i, st in enumerate(plan.stages):
        if st.layers[0] != begin or st.layers[1] <= st.layers[0]:
            msg = f"stage {i} holds layers {list(st.layers)}; expected to start at {begin}"
            raise PlanError(msg)
        begin = st.layers[1]
        if st.tp != 1:
            msg = (f"stage {i} has tp {st.tp}: tensor parallelism inside a stage is not "
                   "supported by espresso.torch yet (plan with max_tp=1)")
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


def rank_from_env() -> tuple[int, int]:
    """(global rank, world size): from ``ESPRESSO_FIRST_RANK + LOCAL_RANK`` and
    ``ESPRESSO_WORLD_SIZE`` (set by ``espresso launch``), else torchrun's ``RANK`` and
    ``WORLD_SIZE``."""
    if "ESPRESSO_FIRST_RANK" in os.environ:
        rank = int(os.environ["ESPRESSO_FIRST_RANK"]) + int(os.environ.get("LOCAL_RANK", "0"))
        return rank, int(os.environ["ESPRESSO_WORLD_SIZE"])
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def stage_module(plan: Plan, stage: int, *, embedding: _nn.Module,
                 blocks: Sequence[_nn.Module] | Callable[[int], _nn.Module],
                 head: _nn.Module) -> _nn.Module:
    """The modules of one stage as an ``nn.Sequential``: the embedding on stage 0, the plan's
    block range, the head on the last stage. With a factory ``blocks(i)``, only this stage's
    blocks are built (other stages' weights are never materialised)."""
    first, last = stage == 0, stage == plan.num_stages - 1
    a, b = plan.stages[stage].layers
    parts: list[_nn.Module] = [embedding] if first else []
    for i in range(a, b):
        parts.append(blocks(i) if callable(blocks) and not isinstance(blocks, nn.Module)
                     else blocks[i])
    if last:
        parts.append(head)
    seq: _nn.Module = nn.Sequential(*parts)
    return seq


@dataclass
class StageRuntime:
    """What this rank runs."""

    info: RankInfo
    module: _nn.Module
    """The stage's modules (wrapped in DDP over the data-parallel group when dp > 1)."""
    stage: Any
    """``torch.distributed.pipelining.PipelineStage``."""
    schedule: Any
    """``Schedule1F1B`` or ``ScheduleGPipe`` with the plan's number of micro-batches."""
    mesh: Any
    """The ``(pp, dp)`` device mesh."""
    dp_group: Any
    pp_group: Any

    @property
    def is_first(self) -> bool:
        return self.info.stage == 0

    @property
    def is_last(self) -> bool:
        return bool(self.info.stage == self.mesh.shape[0] - 1)

    def step(self, inputs: Any = None, targets: Any = None) -> Any:
        """One pipeline step on this replica's batch: the first stage feeds ``inputs``, the
        last receives ``targets`` and returns the micro-batch losses."""
        if self.is_first and self.is_last:
            losses: list[Any] = []
            self.schedule.step(inputs, target=targets, losses=losses)
            return losses
        if self.is_first:
            self.schedule.step(inputs)
            return None
        if self.is_last:
            losses = []
            self.schedule.step(target=targets, losses=losses)
            return losses
        self.schedule.step()
        return None


def setup(plan: Plan, *, embedding: _nn.Module,
          blocks: Sequence[_nn.Module] | Callable[[int], _nn.Module], head: _nn.Module,
          loss_fn: Callable[..., Any], num_blocks: int | None = None,
          device: Any = None, backend: str | None = None, rank: int | None = None,
          world_size: int | None = None) -> StageRuntime:
    """Build this rank's stage, schedule and groups from the plan.

    The plan is checked against the model before any process group is created. The default
    process group is initialised when needed (``MASTER_ADDR``/``MASTER_PORT`` from the
    environment; rank and world size from :func:`rank_from_env` unless given).
    """
    n_blocks = num_blocks if num_blocks is not None else (
        len(blocks) if not callable(blocks) or isinstance(blocks, nn.Module) else None)
    if n_blocks is None:
        msg = "setup: give num_blocks when blocks is a factory"
        raise PlanError(msg)
    check_plan(plan, n_blocks)
    env_rank, env_world = rank_from_env()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if world_size != plan.num_gpus:
        msg = f"the plan needs {plan.num_gpus} processes but the world size is {world_size}"
        raise PlanError(msg)
    if not 0 <= rank < world_size:
        msg = f"rank {rank} is outside the world of {world_size}"
        raise PlanError(msg)
    if device is None:
        if torch.cuda.is_available():
            offset = int(os.environ.get("ESPRESSO_DEVICE_OFFSET", "0"))
            device = torch.device("cuda", offset + int(os.environ.get("LOCAL_RANK", "0")))
        else:
            device = torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    info = rank_layout(plan)[rank]
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    mesh = init_device_mesh(device.type, (plan.num_stages, plan.dp), mesh_dim_names=("pp", "dp"))
    pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    module = stage_module(plan, info.stage, embedding=embedding, blocks=blocks,
                          head=head).to(device)
    if plan.dp > 1:
        module = nn.parallel.DistributedDataParallel(
            module, process_group=dp_group, device_ids=[device] if device.type == "cuda" else None)
    stage = PipelineStage(module, info.stage, plan.num_stages, device, group=pp_group)
    kind = ScheduleGPipe if plan.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, n_microbatches=plan.num_microbatches, loss_fn=loss_fn)
    return StageRuntime(info=info, module=module, stage=stage, schedule=schedule, mesh=mesh,
                        dp_group=dp_group, pp_group=pp_group)
