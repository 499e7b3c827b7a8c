"""Tensor parallelism of a stage (torch extra): splitting blocks, the embedding and the head
over a TP mesh (``parallelize_module``), sequence parallelism's token scatter and gather, and
the leader/follower protocol by which the TP ranks of a stage mirror the pipeline rank that
runs PyTorch's schedule (docs/runner.md, "Stages of different TP widths"). Used by
:mod:`espresso.torch`, which re-exports the public names."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._optional import require
from ..errors import PlanError
from ..plan import Plan

if TYPE_CHECKING:
    from torch import nn as _nn

torch = require("torch")
nn = torch.nn
dist = torch.distributed

TPPlan = Mapping[str, Any] | Callable[[Any, Any], Any]
"""How to split one block over a TP group: a ``parallelize_module`` plan (submodule name ->
``ColwiseParallel()``/``RowwiseParallel()`` or the strings ``"colwise"``/``"rowwise"``), or a
callable ``(block, tp_mesh) -> block``."""


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
    broadcast over the stage's TP group from the leader. Each event names the chunk (the
    rank's stage, under interleaving one of several) it concerns."""

    _HEAD = 5 + _MAX_DIMS  # op, flags, chunk, dtype, ndim, shape

    def __init__(self, group: Any, leader: int, device: Any) -> None:
        self.group, self.leader, self.device = group, leader, device
        self.inference = False
        """Set while PyTorch's PipelineStage infers shapes (its extra forward/backward)."""

    def send(self, op: int, flags: int = 0, tensor: Any = None, chunk: int = 0) -> None:
        head = torch.zeros(self._HEAD, dtype=torch.int64)
        head[0], head[1], head[2] = op, flags, chunk
        if tensor is not None:
            name = str(tensor.dtype).removeprefix("torch.")
            if name not in _DTYPES or tensor.dim() > _MAX_DIMS:
                msg = (f"a TP stage cannot pass a {tensor.dtype} tensor of {tensor.dim()} "
                       f"dimensions between stages (dtypes {_DTYPES}, at most {_MAX_DIMS} dims)")
                raise PlanError(msg)
            head[3], head[4] = _DTYPES.index(name), tensor.dim()
            head[5:5 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        dist.broadcast(head.to(self.device), src=self.leader, group=self.group)
        if tensor is not None:
            dist.broadcast(tensor.detach().contiguous(), src=self.leader, group=self.group)

    def recv(self) -> tuple[int, int, int, Any]:
        """``(op, flags, chunk, tensor)`` of the leader's next event."""
        head = torch.zeros(self._HEAD, dtype=torch.int64, device=self.device)
        dist.broadcast(head, src=self.leader, group=self.group)
        op, flags, chunk, dtype, ndim, *shape = head.tolist()
        if op == _END:
            return op, flags, chunk, None
        t = torch.empty(shape[:ndim], dtype=getattr(torch, _DTYPES[dtype]), device=self.device)
        dist.broadcast(t, src=self.leader, group=self.group)
        return op, flags, chunk, t


class _BroadcastGrad(torch.autograd.Function):  # type: ignore[misc, name-defined]
    """Identity forward; in backward, hands the output gradient to the followers."""

    @staticmethod
    def forward(ctx: Any, out: Any, bridge: _TPBridge, chunk: int) -> Any:
        ctx.bridge, ctx.chunk = bridge, chunk
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        bridge = ctx.bridge
        bridge.send(_BWD, _INFERENCE if bridge.inference else 0, grad, ctx.chunk)
        return grad, None, None


class TPLeader(nn.Module):  # type: ignore[misc, name-defined]
    """The leader's module of one stage (``chunk``: its index among the rank's stages),
    announcing each forward and backward to the followers of its TP group."""

    def __init__(self, inner: _nn.Module, bridge: _TPBridge, chunk: int = 0) -> None:
        super().__init__()
        self.inner = inner
        self._bridge = bridge
        self._chunk = chunk

    def forward(self, x: Any) -> Any:
        grad = torch.is_grad_enabled()
        flags = ((_GRAD if grad else 0) | (_REQUIRES_GRAD if x.requires_grad else 0)
                 | (_INFERENCE if self._bridge.inference else 0))
        self._bridge.send(_FWD, flags, x, self._chunk)
        out = self.inner(x)
        if not isinstance(out, torch.Tensor):
            msg = (f"a stage with tp > 1 must return one tensor, got {type(out).__name__}")
            raise PlanError(msg)
        if grad and out.requires_grad:
            out = _BroadcastGrad.apply(out, self._bridge, self._chunk)
        return out


def follow(chunks: Sequence[_nn.Module], bridge: _TPBridge) -> int:
    """Mirror the leader until it ends the step, running each event on the chunk it names;
    returns the number of backward passes. A chunk's backwards come in the order of its
    forwards (every schedule PyTorch runs keeps that order per stage)."""
    pending: list[deque[Any]] = [deque() for _ in chunks]
    probe: list[tuple[Any, Any] | None] = [None for _ in chunks]
    backwards = 0
    while True:
        op, flags, c, t = bridge.recv()
        if op == _END:
            left = sum(len(q) for q in pending)
            if left:
                msg = f"TP follower: {left} forward passes had no backward"
                raise RuntimeError(msg)
            return backwards
        if op == _FWD:
            if flags & _REQUIRES_GRAD:
                t.requires_grad_(True)
            with torch.set_grad_enabled(bool(flags & _GRAD)):
                out = chunks[c](t)
            if flags & _INFERENCE:
                probe[c] = (t, out)
            elif flags & _GRAD:
                pending[c].append(out)
        elif flags & _INFERENCE:
            seen = probe[c]
            if seen is None:
                msg = "TP follower: a shape-inference backward came before its forward"
                raise RuntimeError(msg)
            probe[c] = None
            x, out = seen
            torch.autograd.grad([out], [x], [t], allow_unused=True)
        else:
            torch.autograd.backward([pending[c].popleft()], [t])
            backwards += 1


def end_step(bridge: _TPBridge) -> None:
    """Tell the followers the leader's step is over."""
    bridge.send(_END)
