"""Live tensor memory on any device, CPU included (torch extra).

``torch.cuda.max_memory_allocated`` exists only on CUDA; :class:`LiveTensors` counts the
storages every operation creates while it is active (a ``TorchDispatchMode``), each once,
until the storage is freed, and keeps their peak. Storages created before it starts (the
parameters, their gradients) or passed to :meth:`LiveTensors.ignore` are left out, so the
count is what a training step adds on top of its model states: activations kept for the
backward, the stage's outputs, the backward's working set. Used to check the cost model's
memory terms against the package's own modules, term by term (tests/test_memory_terms.py).

It sees what operators return, not a kernel's private scratch, nor the caching allocator's
rounding and fragmentation (which the usable-memory head-room covers).
"""

from __future__ import annotations

import weakref
from typing import Any

from .._optional import require

torch = require("torch")


class LiveTensors(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[misc, name-defined]
    """Bytes of the storages created while active and still alive (``live``), and their
    largest total (``peak``); use as a context manager."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        self._ignored: set[int] = set()

    def ignore(self, *tensors: Any) -> None:
        """Leave the storages of ``tensors`` out (e.g. parameters and their gradients)."""
        for t in tensors:
            if t is not None:
                self._ignored.add(t.untyped_storage().data_ptr())

    def reset_peak(self) -> None:
        self.peak = self.live

    def _add(self, t: Any) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._sizes or key in self._ignored:
            return
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._drop, key)

    def _drop(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._add(t)
        return out
