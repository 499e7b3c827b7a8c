"""What a stage holds in memory, as the plan says: recomputation of its blocks and sharding of
its model states over its data-parallel mesh (FSDP2). Needs the ``torch`` extra; used by
:mod:`espresso.torch` (docs/runner.md, "Sharding and recomputation")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._optional import require
from ..plan import Plan

if TYPE_CHECKING:
    from torch import nn as _nn

torch = require("torch")
nn = torch.nn


def attention_ops() -> set[Any]:
    """The ops of an attention core that selective recomputation runs again."""
    aten = torch.ops.aten
    names = ("_softmax", "softmax", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "native_dropout")
    ops: set[Any] = set()
    for n in names:
        op = getattr(aten, n, None)
        if op is not None:
            ops.update(getattr(op, o) for o in op.overloads())
    return ops


class _Recomputed(nn.Module):  # type: ignore[misc, name-defined]
    """A block whose activations are recomputed in the backward: all of them (``full``) or the
    attention core's only (``selective``)."""

    def __init__(self, block: _nn.Module, mode: str) -> None:
        super().__init__()
        self.block = block
        self.mode = mode

    def forward(self, *args: Any) -> Any:
        from torch.utils.checkpoint import (
            CheckpointPolicy,
            checkpoint,
            create_selective_checkpoint_contexts,
        )

        if self.mode == "full":
            return checkpoint(self.block, *args, use_reentrant=False)
        recompute = attention_ops()

        def policy(ctx: Any, op: Any, *a: Any, **kw: Any) -> Any:
            return (CheckpointPolicy.PREFER_RECOMPUTE if op in recompute
                    else CheckpointPolicy.MUST_SAVE)

        def contexts() -> Any:
            return create_selective_checkpoint_contexts(policy)  # type: ignore[no-untyped-call]

        return checkpoint(self.block, *args, use_reentrant=False, context_fn=contexts)


def recomputed(block: _nn.Module, mode: str) -> _nn.Module:
    """``block`` wrapped to recompute its activations (``mode``: ``full`` or ``selective``)."""
    out: _nn.Module = _Recomputed(block, mode)
    return out


def wrap_blocks(module: _nn.Module, plan: Plan, stage: int, wrap: Callable[[Any], Any]) -> None:
    """Replace every transformer block of a stage module (``espresso.torch.stage_module``)
    by ``wrap(block)`` (kept when ``wrap`` returns None)."""
    assert isinstance(module, nn.Sequential)
    first = 1 if stage == 0 else 0
    for j in range(first, first + plan.stages[stage].num_layers):
        out = wrap(module[j])
        if out is not None:
            module[j] = out


def shard_stage(module: _nn.Module, plan: Plan, stage: int, dp_mesh: Any) -> None:
    """FSDP2 over the stage's data-parallel mesh: each block, then the stage module;
    ``fsdp`` frees a block's gathered weights after its forward, ``zero2`` keeps them."""
    from torch.distributed.fsdp import fully_shard

    reshard = plan.sharding == "fsdp"
    wrap_blocks(module, plan, stage,
                lambda blk: fully_shard(blk, mesh=dp_mesh, reshard_after_forward=reshard))
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard)


def is_fsdp(module: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)
