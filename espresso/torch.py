"""``espresso.torch``: run a plan with PyTorch (the ``torch`` extra).

The public face of the runner package :mod:`espresso.runner`: this rank's pipeline stage,
schedule, tensor- and data-parallel groups (:func:`setup`, :class:`StageRuntime`), and its
checkpoints (:class:`Checkpointer`). How each part works is told in its module
(:mod:`espresso.runner.stage`, :mod:`espresso.runner.tp`, :mod:`espresso.runner.states`,
:mod:`espresso.runner.checkpoint`) and in docs/runner.md.
"""

from __future__ import annotations

from .runner.checkpoint import Checkpointer, interval_steps
from .runner.stage import (
    StageRuntime,
    check_plan,
    rank_from_env,
    setup,
    shutdown,
    stage_module,
)
from .runner.tp import SequenceBoundary, TPPlan, parallelize_blocks, parallelize_vocab

__all__ = ["Checkpointer", "SequenceBoundary", "StageRuntime", "TPPlan", "check_plan",
           "interval_steps", "parallelize_blocks", "parallelize_vocab", "rank_from_env", "setup",
           "shutdown", "stage_module"]
