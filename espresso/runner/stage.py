"""Run a plan with PyTorch: this rank's pipeline stage, schedule, tensor- and data-parallel groups.

Needs the ``torch`` extra. The distributed engine is PyTorch's own: pipelining
(``torch.distributed.pipelining``), tensor parallelism (``parallelize_module`` with DTensor
``ColwiseParallel``/``RowwiseParallel``), DDP, ``torchrun``. The rank layout is
:func:`espresso.runner.launch.rank_layout`::

    rank = dp * sum(tp of the earlier stages) + replica * tp(stage) + tp_index

How a stage with ``tp > 1`` runs
--------------------------------
Stages may have different tensor-parallel widths (an A100 stage of tp 2 feeding an L40S stage
of tp 1), which PyTorch's pipeline stages, one rank per stage, do not express. So each
``(stage, replica)`` has a *leader*, its TP rank 0, and the leaders of a replica form that
replica's pipeline group: they run PyTorch's ``PipelineStage`` and the plan's schedule and do
all the point-to-point sends. The other TP ranks of the stage (*followers*) run the same
stage module in lock-step: before each forward the leader broadcasts the stage input over the
TP group, and at the start of each backward the output gradient. Activations between stages
are replicated across a TP group (``RowwiseParallel`` returns replicated outputs), so this is
exact, and each follower's sharded weights get the same gradients as in a single process.

Gradients are averaged over the ``dp`` replicas of a stage: by DDP on the stage's data-parallel
group when ``tp == 1``, and for ``tp > 1`` by one bucketed all-reduce of the local gradient
shards over the data-parallel group of the same TP index, after the schedule.

Sharding (``plan.sharding``) over a stage's data-parallel group
----------------------------------------------------------------
``zero1``: gradients are averaged as above and :meth:`StageRuntime.optimizer` builds a
``ZeroRedundancyOptimizer``: each replica keeps and updates the optimizer states of its share
of the parameters and broadcasts them. ``zero2`` and ``fsdp``: every block (and the stage
module) is wrapped by FSDP2's ``fully_shard`` over the data-parallel mesh (after the TP split,
so TP stages shard 2-D); parameters, gradients and optimizer states are sharded at rest. With
``fsdp`` a block's parameters are gathered for its forward and freed after it
(``reshard_after_forward=True``), with ``zero2`` kept until the step's backward is done. Each
micro-batch's gradients are reduce-scattered as its backward produces them (PyTorch's
pipelining would otherwise keep whole gradients until the last micro-batch), as the cost
model charges it (docs/cost-model.md, "Data parallelism and sharding").

Recomputation (``plan.recompute``): ``full`` checkpoints every block
(``torch.utils.checkpoint``); ``selective`` recomputes only the attention core of each block
(softmax, batched matmuls, scaled-dot-product attention) with PyTorch's selective
checkpointing and saves every other tensor.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._optional import require
from ..errors import PlanError
from ..plan import Plan
from .launch import RankInfo, check_runnable, rank_layout
from .states import is_fsdp as _is_fsdp
from .states import recomputed, shard_stage, wrap_blocks
from .tp import (
    SequenceBoundary,
    TPLeader,
    TPPlan,
    _sum_grads_over,
    _token_partial,
    _TPBridge,
    end_step,
    follow,
    parallelize_blocks,
    parallelize_vocab,
)

if TYPE_CHECKING:
    from torch import nn as _nn

torch = require("torch")
nn = torch.nn
dist = torch.distributed

__all__ = ["SequenceBoundary", "StageRuntime", "TPPlan", "check_plan", "parallelize_blocks",
           "parallelize_vocab", "rank_from_env", "setup", "shutdown", "stage_module"]


def check_plan(plan: Plan, num_blocks: int, batch_size: int | None = None, *,
               tp_plan: TPPlan | None = None) -> None:
    """Refuse a plan that does not match the model (or the runner) with a clear message."""
    check_runnable(plan, num_blocks, batch_size)
    for i, st in enumerate(plan.stages):
        if plan.sequence_parallel and st.tp > 1 and plan.job.seq_len % st.tp:
            msg = (f"stage {i} has tp {st.tp} and the plan has sequence_parallel, which splits "
                   f"each micro-batch's {plan.job.seq_len} tokens over the TP group: tp must "
                   "divide seq_len")
            raise PlanError(msg)
    for i, st in enumerate(plan.stages):
        if st.tp == 1:
            continue
        if tp_plan is None:
            msg = (f"stage {i} has tp {st.tp}: give setup(tp_plan=...) saying which layers of a "
                   "block to split (e.g. {'attn.qkv': 'colwise', ..., 'mlp.fc2': 'rowwise'}), "
                   "or plan with max_tp=1")
            raise PlanError(msg)
        stage_cls = _pipelining().PipelineStage
        if not (hasattr(stage_cls, "_forward_metadata_inference")
                and hasattr(stage_cls, "_backward_metadata_inference")):
            msg = (f"stage {i} has tp {st.tp}, but this torch ({torch.__version__}) has a "
                   "PipelineStage without metadata inference; tp > 1 needs torch >= 2.13")
            raise PlanError(msg)


def _pipelining() -> Any:
    import torch.distributed.pipelining as pipelining

    return pipelining


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

def _stage_class() -> Any:
    """PipelineStage whose shape inference (an extra forward and backward on the first step)
    is invisible to DDP and marked for TP followers.

    DDP: the inference forward would otherwise run the DDP module with gradient sync on, so
    its reducer records every parameter's readiness in the inference backward and again in the
    step's last real backward, and asserts at the next step when no forward fell in between
    (1F1B or GPipe with as many micro-batches as stages). TP: the followers are told a pass is
    inference (it accumulates no parameter gradients there)."""
    base = _pipelining().PipelineStage
    from torch.distributed.pipelining._backward import stage_backward as stage_backward_fn

    class _Stage(base):  # type: ignore[misc, valid-type]
        bridge: _TPBridge | None = None
        reshard_each = True  # fsdp: free gathered weights after each backward; zero2: keep

        @contextlib.contextmanager
        def _inference(self) -> Any:
            if self.bridge is not None:
                self.bridge.inference = True
            ddp = isinstance(self.submod, nn.parallel.DistributedDataParallel)
            sync = self.submod.no_sync() if ddp else contextlib.nullcontext()
            fsdp = _is_fsdp(self.submod)
            if fsdp:
                self.submod.set_requires_gradient_sync(False)
            try:
                with sync:
                    yield
            finally:
                if fsdp:
                    self.submod.set_requires_gradient_sync(True)
                if self.bridge is not None:
                    self.bridge.inference = False

        def backward_maybe_with_nosync(self, backward_type: Any, bwd_kwargs: dict[str, Any],
                                       last_backward: bool = False) -> Any:
            if not _is_fsdp(self.submod) or backward_type != "full":
                return super().backward_maybe_with_nosync(backward_type, bwd_kwargs,
                                                          last_backward)
            # Sharded gradients: reduce-scatter every micro-batch's as its backward makes
            # them; FSDP keeps gathered weights until the last backward only under zero2.
            self.submod.set_is_last_backward(True)
            self.submod.set_requires_gradient_sync(True)
            self.submod.set_reshard_after_backward(self.reshard_each or last_backward)
            grads = stage_backward_fn(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                      bwd_kwargs["input_values"])
            return grads, None

        def perform_reduce_grad(self, grad_scale_factor: int) -> None:
            if not _is_fsdp(self.submod):
                super().perform_reduce_grad(grad_scale_factor)
            elif grad_scale_factor != 1:  # reduced already, micro-batch by micro-batch
                self.scale_grads(grad_scale_factor)

        def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
            with self._inference():
                return super()._forward_metadata_inference(*args, **kwargs)

        def _backward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
            with self._inference():
                return super()._backward_metadata_inference(*args, **kwargs)

    return _Stage

def _average_grads(params: list[Any], group: Any, size: int) -> None:
    """Average the local gradient (shards) over a data-parallel group in one all-reduce."""
    if size > 1:
        _sum_grads_over(params, group, scale=1.0 / size)


def shutdown() -> None:
    """End this rank's part: wait for every rank, then destroy the process groups.

    Destroying them while a peer still talks, or leaving them to interpreter shutdown, can
    abort a gloo process ("terminate called without an active exception")."""
    import gc

    if dist.is_initialized():
        dist.barrier()
        gc.collect()  # drop DTensor/DeviceMesh references to the groups first
        dist.destroy_process_group()


@dataclass
class StageRuntime:
    """What this rank runs."""

    info: RankInfo
    module: _nn.Module
    """The stage's modules (in DDP over the data-parallel group when dp > 1 and tp == 1); on a
    TP leader, wrapped to drive its followers. Under interleaving an ``nn.ModuleList`` of the
    rank's stages. Hand its parameters to the optimizer (:meth:`optimizer`)."""
    stage: Any
    """``torch.distributed.pipelining.PipelineStage`` (None on a TP follower); under
    interleaving the first of :attr:`stages`."""
    schedule: Any
    """``Schedule1F1B``, ``ScheduleGPipe`` or, with ``plan.virtual_stages > 1``,
    ``ScheduleInterleaved1F1B``, with the plan's number of micro-batches (None on a TP
    follower, which mirrors its leader)."""
    mesh: Any
    """This stage's ``(dp, tp)`` device mesh; ``mesh["tp"]`` is the TP mesh the blocks are
    split over."""
    dp_group: Any
    """The ranks of this stage with the same TP index, one per replica."""
    pp_group: Any
    """This replica's pipeline: the TP leader of every stage (None on a follower)."""
    tp_group: Any
    """The TP ranks of this stage and replica."""
    num_stages: int
    sharding: str = "none"
    """The plan's sharding of this stage's model states over its data-parallel group."""
    stages: list[Any] = field(default_factory=list)
    """Every ``PipelineStage`` this rank runs (one unless interleaved; none on a follower)."""
    _chunks: list[Any] = field(default_factory=list)
    """A TP follower's stage modules, in the order of ``info.stages``."""
    chunks: list[Any] = field(default_factory=list)
    """This rank's stage modules as built (TP-split, sharded; not wrapped for DDP or as a TP
    leader), in the order of ``info.stages``: what a checkpoint names by stage."""
    _bridge: _TPBridge | None = None
    _avg_grads: bool = False
    _token_partial: list[tuple[Any, str]] | None = None
    """Block parameters whose gradients are summed over the TP group after a step (sequence
    parallelism: each rank saw only its tokens)."""
    _grad_scale: int = 1
    """A TP follower divides its gradients by this after a step, as its leader's schedule
    does (the mean over micro-batches)."""

    @property
    def is_first(self) -> bool:
        return self.info.stage == 0

    @property
    def is_last(self) -> bool:
        return (self.info.stages or (self.info.stage,))[-1] == self.num_stages - 1

    @property
    def is_tp_leader(self) -> bool:
        return self.info.tp_index == 0

    @property
    def reports_loss(self) -> bool:
        """True on the ranks that get the micro-batch losses: last stage, TP index 0."""
        return self.is_last and self.is_tp_leader

    def optimizer(self, cls: Any = None, **kwargs: Any) -> Any:
        """The optimizer of this rank's parameters (``cls``, default ``torch.optim.AdamW``,
        with ``kwargs``), sharded as the plan says: under ``zero1`` a
        ``ZeroRedundancyOptimizer`` over the data-parallel group; under ``zero2``/``fsdp`` the
        parameters are already shards, so are its states."""
        cls = torch.optim.AdamW if cls is None else cls
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self.sharding == "zero1" and dist.get_world_size(self.dp_group) > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, optimizer_class=cls,
                                           process_group=self.dp_group, **kwargs)
        return cls(params, **kwargs)

    def step(self, inputs: Any = None, targets: Any = None) -> Any:
        """One pipeline step on this replica's batch: the first stage feeds ``inputs``, the
        last receives ``targets``; returns the micro-batch losses where :attr:`reports_loss`,
        else None. Every rank calls it once per step (TP followers too)."""
        losses: list[Any] | None = None
        if self.schedule is None:
            assert self._bridge is not None
            follow(self._chunks, self._bridge)
            if self._grad_scale != 1:
                for p in self.module.parameters():
                    if p.grad is not None:
                        p.grad.div_(self._grad_scale)
        else:
            kw: dict[str, Any] = {}
            if self.is_last:
                losses = []
                kw = {"target": targets, "losses": losses}
            if _step_returns_outputs(self.schedule):
                # Otherwise the last stage keeps every micro-batch's logits (its
                # ``output_chunks``) through the optimizer step and concatenates them.
                kw["return_outputs"] = False
            if self.is_first:
                self.schedule.step(inputs, **kw)
            else:
                self.schedule.step(**kw)
            if self._bridge is not None:
                end_step(self._bridge)
        if self._token_partial:
            _sum_grads_over([getattr(m, n) for m, n in self._token_partial], self.tp_group)
        if self._avg_grads:
            _average_grads(list(self.module.parameters()), self.dp_group,
                           dist.get_world_size(self.dp_group))
        return losses if self.reports_loss else None


def _step_returns_outputs(schedule: Any) -> bool:
    """Whether the schedule's ``step`` takes ``return_outputs`` (torch >= 2.6)."""
    import inspect

    try:
        return "return_outputs" in inspect.signature(schedule.step).parameters
    except (TypeError, ValueError):
        return False


def setup(plan: Plan, *, embedding: _nn.Module,
          blocks: Sequence[_nn.Module] | Callable[[int], _nn.Module], head: _nn.Module,
          loss_fn: Callable[..., Any], num_blocks: int | None = None,
          tp_plan: TPPlan | None = None,
          embedding_tp_plan: TPPlan | str | None = None, head_tp_plan: TPPlan | str | None = None,
          device: Any = None, backend: str | None = None, rank: int | None = None,
          world_size: int | None = None) -> StageRuntime:
    """Build this rank's stage, schedule and groups from the plan.

    The plan is checked against the model before any process group is created. The default
    process group is initialised when needed (``MASTER_ADDR``/``MASTER_PORT`` from the
    environment; rank and world size from :func:`rank_from_env` unless given). Every rank of
    the world must call it (it creates the groups of every stage).

    ``tp_plan`` says how to split a block over a stage's TP group (see :data:`TPPlan`); it is
    needed when any stage has ``tp > 1``, and the blocks must read their local head count
    from the tensor shapes (``q.view(b, s, -1, head_dim)``), as in ``examples/train_gpt.py``.
    ``embedding_tp_plan`` and ``head_tp_plan`` split the embedding and the head of a TP stage
    by vocabulary (``"rowwise"`` for an ``nn.Embedding``, ``"colwise"`` for the head's
    ``nn.Linear``, or a plan of their submodules such as ``{"tok": "rowwise"}``); without them
    those stay whole on every TP rank. Under ``plan.sequence_parallel`` the blocks of a TP
    stage hold their tokens split over the TP group (docs/runner.md, "Sequence parallelism").
    """
    n_blocks = num_blocks if num_blocks is not None else (
        len(blocks) if not callable(blocks) or isinstance(blocks, nn.Module) else None)
    if n_blocks is None:
        msg = "setup: give num_blocks when blocks is a factory"
        raise PlanError(msg)
    check_plan(plan, n_blocks, tp_plan=tp_plan)
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
    layout = rank_layout(plan)
    info = layout[rank]
    from torch.distributed.device_mesh import DeviceMesh

    # Groups are collective over the world: every rank creates every group, in one order.
    groups = plan.stages[:plan.pp]  # the GPU groups (one per stage unless interleaved)
    first = [0]
    for st in groups:
        first.append(first[-1] + plan.dp * st.tp)
    meshes = [DeviceMesh(device.type, torch.arange(first[s], first[s + 1]).view(plan.dp, st.tp),
                         mesh_dim_names=("dp", "tp")) for s, st in enumerate(groups)]
    pp_groups = [dist.new_group([first[s] + r * st.tp for s, st in enumerate(groups)])
                 for r in range(plan.dp)]
    mesh = meshes[info.stage]
    tp = plan.stages[info.stage].tp
    dp_group, tp_group = mesh.get_group("dp"), mesh.get_group("tp")
    leader = first[info.stage] + info.replica * tp

    fsdp = plan.sharding in ("zero2", "fsdp") and plan.dp > 1
    sp = tp > 1 and plan.sequence_parallel
    chunks: list[_nn.Module] = []
    token_partial: list[tuple[Any, str]] = []
    for s in info.stages:  # one stage, or the rank's chunks under interleaving
        chunk = stage_module(plan, s, embedding=embedding, blocks=blocks, head=head).to(device)
        if tp > 1:
            assert tp_plan is not None
            parallelize_blocks(chunk, plan, s, mesh["tp"], tp_plan)
            parallelize_vocab(chunk, plan, s, mesh["tp"], embedding_tp_plan, head_tp_plan)
            if sp:
                token_partial += _token_partial(chunk, plan, s)
        if plan.recompute != "none":
            wrap_blocks(chunk, plan, s, lambda blk: recomputed(blk, plan.recompute))
        if fsdp:
            shard_stage(chunk, plan, s, mesh["dp"])
        if sp and plan.stages[s].num_layers > 0:
            assert isinstance(chunk, nn.Sequential)
            start = 1 if s == 0 else 0
            chunk.insert(start + plan.stages[s].num_layers,
                         SequenceBoundary(tp_group, scatter=False))
            chunk.insert(start, SequenceBoundary(tp_group, scatter=True))
        chunks.append(chunk)

    def one(mods: list[_nn.Module]) -> _nn.Module:
        return mods[0] if len(mods) == 1 else nn.ModuleList(mods)

    bridge = None
    # PyTorch's schedules average gradients over micro-batches (scale_grads=True).
    grad_scale = plan.num_microbatches
    if tp > 1:
        bridge = _TPBridge(tp_group, leader, device)
        if info.tp_index > 0:
            return StageRuntime(info=info, module=one(chunks), stage=None, schedule=None,
                                mesh=mesh, dp_group=dp_group, pp_group=None, tp_group=tp_group,
                                num_stages=plan.num_stages, sharding=plan.sharding,
                                _chunks=chunks, chunks=chunks, _bridge=bridge,
                                _avg_grads=plan.dp > 1 and not fsdp,
                                _token_partial=token_partial or None, _grad_scale=grad_scale)
        wrapped: list[_nn.Module] = [TPLeader(c, bridge, k) for k, c in enumerate(chunks)]
    elif plan.dp > 1 and not fsdp:
        wrapped = [nn.parallel.DistributedDataParallel(
            c, process_group=dp_group, device_ids=[device] if device.type == "cuda" else None)
            for c in chunks]
    else:
        wrapped = chunks
    pp = _pipelining()
    pp_group = pp_groups[info.replica]
    stages = []
    for s, w in zip(info.stages, wrapped, strict=True):
        stage = _stage_class()(w, s, plan.num_stages, device, group=pp_group)
        stage.bridge = bridge
        stage.reshard_each = plan.sharding == "fsdp"
        stages.append(stage)
    if plan.virtual_stages > 1:
        schedule = pp.ScheduleInterleaved1F1B(stages, n_microbatches=plan.num_microbatches,
                                              loss_fn=loss_fn)
    else:
        kind = pp.ScheduleGPipe if plan.schedule == "gpipe" else pp.Schedule1F1B
        if kind is pp.Schedule1F1B and plan.num_microbatches < plan.num_stages:
            # PyTorch's 1F1B refuses M < stages: such plans run with GPipe, which is how the
            # cost model estimates them (docs/cost-model.md, "The pipeline"); the search never
            # proposes them.
            if plan.num_microbatches > 1:
                warnings.warn(f"plan has {plan.num_microbatches} micro-batches for "
                              f"{plan.num_stages} stages: running it with GPipe (PyTorch's 1F1B "
                              "needs one per stage), as its estimate assumes", stacklevel=2)
            kind = pp.ScheduleGPipe
        schedule = kind(stages[0], n_microbatches=plan.num_microbatches, loss_fn=loss_fn)
    return StageRuntime(info=info, module=one(wrapped), stage=stages[0], schedule=schedule,
                        mesh=mesh, dp_group=dp_group, pp_group=pp_group, tp_group=tp_group,
                        num_stages=plan.num_stages, sharding=plan.sharding, stages=stages,
                        chunks=chunks, _bridge=bridge,
                        _avg_grads=bridge is not None and plan.dp > 1 and not fsdp,
                        _token_partial=token_partial or None)
