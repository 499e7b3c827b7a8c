"""Run a plan with PyTorch: this rank's pipeline stage, schedule, tensor- and data-parallel groups.

Needs the ``torch`` extra. The distributed engine is PyTorch's own: pipelining
(``torch.distributed.pipelining``), tensor parallelism (``parallelize_module`` with DTensor
``ColwiseParallel``/``RowwiseParallel``), DDP, ``torchrun``. The rank layout is
:func:`espresso.launch.rank_layout`::

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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._optional import require
from ._torch_states import is_fsdp as _is_fsdp
from ._torch_states import recomputed, shard_stage, wrap_blocks
from .errors import PlanError
from .launch import RankInfo, check_runnable, rank_layout
from .plan import Plan

if TYPE_CHECKING:
    from torch import nn as _nn

torch = require("torch")
nn = torch.nn
dist = torch.distributed

TPPlan = Mapping[str, Any] | Callable[[Any, Any], Any]
"""How to split one block over a TP group: a ``parallelize_module`` plan (submodule name ->
``ColwiseParallel()``/``RowwiseParallel()`` or the strings ``"colwise"``/``"rowwise"``), or a
callable ``(block, tp_mesh) -> block``."""


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


_MODULE_ROLES = ("block", "embedding", "head")


def _style(name: str, style: Any, role: str, sequence_parallel: bool) -> Any:
    """A ``parallelize_module`` style from a plan entry: a ParallelStyle is used as given;
    ``"colwise"``/``"rowwise"`` become the style that keeps what flows between the stage's
    modules as :func:`setup` lays it out (replicated, or sequence shards inside the blocks
    under sequence parallelism; the head's logits gathered for the leader's loss)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if not isinstance(style, str):
        return style
    if style not in ("colwise", "rowwise"):
        msg = f"{role} tp_plan[{name!r}]: expected 'colwise' or 'rowwise', got {style!r}"
        raise PlanError(msg)
    colwise = style == "colwise"
    if role == "embedding":
        return (ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
                if colwise else RowwiseParallel(input_layouts=Replicate()))
    if role == "head":
        return (ColwiseParallel(output_layouts=Replicate()) if colwise
                else RowwiseParallel(input_layouts=Shard(-1)))
    if sequence_parallel:
        # Megatron-LM's sequence parallelism: the residual stream, the norms and the
        # element-wise work hold 1/tp of the tokens; a column-split projection all-gathers its
        # input, a row-split one reduce-scatters its output.
        return (ColwiseParallel(input_layouts=Shard(1)) if colwise
                else RowwiseParallel(output_layouts=Shard(1)))
    return ColwiseParallel() if colwise else RowwiseParallel()


def _parallelize(module: _nn.Module, tp_mesh: Any, tp_plan: TPPlan | str, role: str,
                 where: str, sequence_parallel: bool = False) -> _nn.Module:
    """Split one module over the TP mesh as ``tp_plan`` says; returns the module to use."""
    from torch.distributed.tensor.parallel import parallelize_module

    if callable(tp_plan) and not isinstance(tp_plan, Mapping):
        out = tp_plan(module, tp_mesh)
        return module if out is None else out
    if not isinstance(tp_plan, Mapping):  # one style for the module itself
        parallelize_module(module, tp_mesh, _style("", tp_plan, role, sequence_parallel))
        return module
    resolved = {}
    for name, style in tp_plan.items():
        if "*" not in name:
            try:
                module.get_submodule(name)
            except AttributeError:
                msg = (f"{role} tp_plan names {name!r}, but {where} "
                       f"({type(module).__name__}) has no such submodule")
                raise PlanError(msg) from None
        resolved[name] = _style(name, style, role, sequence_parallel)
    parallelize_module(module, tp_mesh, resolved)
    return module


def parallelize_blocks(module: _nn.Module, plan: Plan, stage: int, tp_mesh: Any,
                       tp_plan: TPPlan) -> None:
    """Split every transformer block of a stage module (from :func:`stage_module`) over the TP
    mesh (with sequence-parallel layouts when the plan has ``sequence_parallel``)."""
    first = 1 if stage == 0 else 0
    n = plan.stages[stage].num_layers
    assert isinstance(module, nn.Sequential)
    for j in range(first, first + n):
        index = plan.stages[stage].layers[0] + j - first
        module[j] = _parallelize(module[j], tp_mesh, tp_plan, "block", f"block {index}",
                                 plan.sequence_parallel)


def parallelize_vocab(module: _nn.Module, plan: Plan, stage: int, tp_mesh: Any,
                      embedding_tp_plan: TPPlan | str | None,
                      head_tp_plan: TPPlan | str | None) -> None:
    """Split the embedding (stage 0) and the head (last stage) of a stage module over the TP
    mesh by vocabulary, where plans for them are given: each rank holds ``vocab / tp`` rows of
    the embedding and computes ``vocab / tp`` of the logits, which are gathered for the loss."""
    assert isinstance(module, nn.Sequential)
    if stage == 0 and embedding_tp_plan is not None:
        module[0] = _parallelize(module[0], tp_mesh, embedding_tp_plan, "embedding",
                                 "the embedding")
    if stage == plan.num_stages - 1 and head_tp_plan is not None:
        module[-1] = _parallelize(module[-1], tp_mesh, head_tp_plan, "head", "the head")


class _ScatterSequence(torch.autograd.Function):  # type: ignore[misc, name-defined]
    """This TP rank's share of the tokens (dim 1) of a replicated tensor; backward gathers the
    shares' gradients into the whole one."""

    @staticmethod
    def forward(ctx: Any, x: Any, group: Any) -> Any:
        ctx.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        return x.chunk(size, dim=1)[rank].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return _gather_tokens(grad, ctx.group), None


class _GatherSequence(torch.autograd.Function):  # type: ignore[misc, name-defined]
    """The whole tensor from every TP rank's share of its tokens; backward keeps this rank's
    share of the (replicated) gradient."""

    @staticmethod
    def forward(ctx: Any, x: Any, group: Any) -> Any:
        ctx.group = group
        return _gather_tokens(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(size, dim=1)[rank].contiguous(), None


def _gather_tokens(x: Any, group: Any) -> Any:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


class SequenceBoundary(nn.Module):  # type: ignore[misc, name-defined]
    """Where a sequence-parallel TP stage's blocks begin (``scatter``: keep this rank's tokens)
    or end (gather every rank's tokens), so what the stage passes on stays replicated."""

    def __init__(self, group: Any, scatter: bool) -> None:
        super().__init__()
        self._group, self.scatter = group, scatter

    def forward(self, x: Any) -> Any:
        fn = _ScatterSequence if self.scatter else _GatherSequence
        return fn.apply(x, self._group)


def _token_partial(module: _nn.Module, plan: Plan, stage: int) -> list[tuple[Any, str]]:
    """The block parameters that TP leaves whole (norms, biases of no split projection): under
    sequence parallelism each rank sees only its tokens, so their gradients are partial sums,
    added over the TP group after the step (Megatron-LM does the same)."""
    from torch.distributed.tensor import DTensor

    assert isinstance(module, nn.Sequential)
    first = 1 if stage == 0 else 0
    out = []
    for j in range(first, first + plan.stages[stage].num_layers):
        for sub in module[j].modules():
            for name, p in sub.named_parameters(recurse=False):
                if p.requires_grad and not isinstance(p, DTensor):
                    out.append((sub, name))
    return out


def _sum_grads_over(params: list[Any], group: Any, scale: float = 1.0) -> None:
    """Add the local gradients (shards) over a group in one all-reduce, times ``scale``."""
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
             for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    if scale != 1.0:
        flat *= scale
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


# ------------------------------------------------------------------ TP leader/follower
_END, _FWD, _BWD = 0, 1, 2
_GRAD, _REQUIRES_GRAD, _INFERENCE = 1, 2, 4
_MAX_DIMS = 8
_DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8",
           "uint8", "bool")


class _TPBridge:
    """The leader's side channel to its followers: one header tensor and one payload per event,
    broadcast over the stage's TP group from the leader."""

    def __init__(self, group: Any, leader: int, device: Any) -> None:
        self.group, self.leader, self.device = group, leader, device
        self.inference = False
        """Set while PyTorch's PipelineStage infers shapes (its extra forward/backward)."""

    def send(self, op: int, flags: int = 0, tensor: Any = None) -> None:
        head = torch.zeros(4 + _MAX_DIMS, dtype=torch.int64)
        head[0], head[1] = op, flags
        if tensor is not None:
            name = str(tensor.dtype).removeprefix("torch.")
            if name not in _DTYPES or tensor.dim() > _MAX_DIMS:
                msg = (f"a TP stage cannot pass a {tensor.dtype} tensor of {tensor.dim()} "
                       f"dimensions between stages (dtypes {_DTYPES}, at most {_MAX_DIMS} dims)")
                raise PlanError(msg)
            head[2], head[3] = _DTYPES.index(name), tensor.dim()
            head[4:4 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        dist.broadcast(head.to(self.device), src=self.leader, group=self.group)
        if tensor is not None:
            dist.broadcast(tensor.detach().contiguous(), src=self.leader, group=self.group)

    def recv(self) -> tuple[int, int, Any]:
        head = torch.zeros(4 + _MAX_DIMS, dtype=torch.int64, device=self.device)
        dist.broadcast(head, src=self.leader, group=self.group)
        op, flags, dtype, ndim, *shape = head.tolist()
        if op == _END:
            return op, flags, None
        t = torch.empty(shape[:ndim], dtype=getattr(torch, _DTYPES[dtype]), device=self.device)
        dist.broadcast(t, src=self.leader, group=self.group)
        return op, flags, t


class _BroadcastGrad(torch.autograd.Function):  # type: ignore[misc, name-defined]
    """Identity forward; in backward, hands the output gradient to the followers."""

    @staticmethod
    def forward(ctx: Any, out: Any, bridge: _TPBridge) -> Any:
        ctx.bridge = bridge
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        bridge = ctx.bridge
        bridge.send(_BWD, _INFERENCE if bridge.inference else 0, grad)
        return grad, None


class _TPLeader(nn.Module):  # type: ignore[misc, name-defined]
    """The leader's stage module: the stage's modules, announcing each forward and backward to
    the followers of its TP group."""

    def __init__(self, inner: _nn.Module, bridge: _TPBridge) -> None:
        super().__init__()
        self.inner = inner
        self._bridge = bridge

    def forward(self, x: Any) -> Any:
        grad = torch.is_grad_enabled()
        flags = ((_GRAD if grad else 0) | (_REQUIRES_GRAD if x.requires_grad else 0)
                 | (_INFERENCE if self._bridge.inference else 0))
        self._bridge.send(_FWD, flags, x)
        out = self.inner(x)
        if not isinstance(out, torch.Tensor):
            msg = (f"a stage with tp > 1 must return one tensor, got {type(out).__name__}")
            raise PlanError(msg)
        if grad and out.requires_grad:
            out = _BroadcastGrad.apply(out, self._bridge)
        return out


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


def _follow(module: _nn.Module, bridge: _TPBridge) -> int:
    """Mirror the leader until it ends the step; returns the number of backward passes."""
    pending: deque[Any] = deque()
    probe: tuple[Any, Any] | None = None
    backwards = 0
    while True:
        op, flags, t = bridge.recv()
        if op == _END:
            if pending:
                msg = f"TP follower: {len(pending)} forward passes had no backward"
                raise RuntimeError(msg)
            return backwards
        if op == _FWD:
            if flags & _REQUIRES_GRAD:
                t.requires_grad_(True)
            with torch.set_grad_enabled(bool(flags & _GRAD)):
                out = module(t)
            if flags & _INFERENCE:
                probe = (t, out)
            elif flags & _GRAD:
                pending.append(out)
        elif flags & _INFERENCE:
            if probe is None:
                msg = "TP follower: a shape-inference backward came before its forward"
                raise RuntimeError(msg)
            x, out = probe
            probe = None
            torch.autograd.grad([out], [x], [t], allow_unused=True)
        else:
            torch.autograd.backward([pending.popleft()], [t])
            backwards += 1


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
    TP leader, wrapped to drive its followers. Hand its parameters to the optimizer."""
    stage: Any
    """``torch.distributed.pipelining.PipelineStage`` (None on a TP follower)."""
    schedule: Any
    """``Schedule1F1B`` or ``ScheduleGPipe`` with the plan's number of micro-batches (None on a
    TP follower, which mirrors its leader)."""
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
        return self.info.stage == self.num_stages - 1

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
            _follow(self.module, self._bridge)
            if self._grad_scale != 1:
                for p in self.module.parameters():
                    if p.grad is not None:
                        p.grad.div_(self._grad_scale)
        else:
            kw: dict[str, Any] = {}
            if self.is_last:
                losses = []
                kw = {"target": targets, "losses": losses}
            if self.is_first:
                self.schedule.step(inputs, **kw)
            else:
                self.schedule.step(**kw)
            if self._bridge is not None:
                self._bridge.send(_END)
        if self._token_partial:
            _sum_grads_over([getattr(m, n) for m, n in self._token_partial], self.tp_group)
        if self._avg_grads:
            _average_grads(list(self.module.parameters()), self.dp_group,
                           dist.get_world_size(self.dp_group))
        return losses if self.reports_loss else None


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
    first = [0]
    for st in plan.stages:
        first.append(first[-1] + plan.dp * st.tp)
    meshes = [DeviceMesh(device.type, torch.arange(first[s], first[s + 1]).view(plan.dp, st.tp),
                         mesh_dim_names=("dp", "tp")) for s, st in enumerate(plan.stages)]
    pp_groups = [dist.new_group([first[s] + r * st.tp for s, st in enumerate(plan.stages)])
                 for r in range(plan.dp)]
    mesh = meshes[info.stage]
    tp = plan.stages[info.stage].tp
    dp_group, tp_group = mesh.get_group("dp"), mesh.get_group("tp")
    leader = first[info.stage] + info.replica * tp

    module = stage_module(plan, info.stage, embedding=embedding, blocks=blocks,
                          head=head).to(device)
    bridge = None
    # PyTorch's schedules average gradients over micro-batches (scale_grads=True).
    grad_scale = plan.num_microbatches
    sp = tp > 1 and plan.sequence_parallel
    token_partial = None
    if tp > 1:
        assert tp_plan is not None
        parallelize_blocks(module, plan, info.stage, mesh["tp"], tp_plan)
        parallelize_vocab(module, plan, info.stage, mesh["tp"], embedding_tp_plan, head_tp_plan)
        if sp:
            token_partial = _token_partial(module, plan, info.stage)
    if plan.recompute != "none":
        wrap_blocks(module, plan, info.stage, lambda blk: recomputed(blk, plan.recompute))
    fsdp = plan.sharding in ("zero2", "fsdp") and plan.dp > 1
    if fsdp:
        shard_stage(module, plan, info.stage, mesh["dp"])
    if sp and plan.stages[info.stage].num_layers > 0:
        assert isinstance(module, nn.Sequential)
        start = 1 if info.stage == 0 else 0
        module.insert(start + plan.stages[info.stage].num_layers,
                      SequenceBoundary(tp_group, scatter=False))
        module.insert(start, SequenceBoundary(tp_group, scatter=True))
    if tp > 1:
        bridge = _TPBridge(tp_group, leader, device)
        if info.tp_index > 0:
            return StageRuntime(info=info, module=module, stage=None, schedule=None, mesh=mesh,
                                dp_group=dp_group, pp_group=None, tp_group=tp_group,
                                num_stages=plan.num_stages, sharding=plan.sharding,
                                _bridge=bridge, _avg_grads=plan.dp > 1 and not fsdp,
                                _token_partial=token_partial, _grad_scale=grad_scale)
        module = _TPLeader(module, bridge)
    elif plan.dp > 1 and not fsdp:
        module = nn.parallel.DistributedDataParallel(
            module, process_group=dp_group, device_ids=[device] if device.type == "cuda" else None)
    pp = _pipelining()
    pp_group = pp_groups[info.replica]
    stage = _stage_class()(module, info.stage, plan.num_stages, device, group=pp_group)
    stage.bridge = bridge
    stage.reshard_each = plan.sharding == "fsdp"
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
    schedule = kind(stage, n_microbatches=plan.num_microbatches, loss_fn=loss_fn)
    return StageRuntime(info=info, module=module, stage=stage, schedule=schedule, mesh=mesh,
                        dp_group=dp_group, pp_group=pp_group, tp_group=tp_group,
                        num_stages=plan.num_stages, sharding=plan.sharding, _bridge=bridge,
                        _avg_grads=bridge is not None and plan.dp > 1 and not fsdp,
                        _token_partial=token_partial)
