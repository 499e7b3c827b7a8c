"""``metrics.jsonl``: what a training run measured, one JSON object per line. Torch-free.

The first line describes the run (``"kind": "run"``): the plan's file, model, stages and
layout, the devices and precision, tokens and model FLOPs per step, the plan's estimate. Each
step adds ``"kind": "step"``::

    {"kind": "step", "step": 3, "loss": 4.21, "lr": 0.0003, "grad_norm": 1.9,
     "step_s": 0.512, "tokens_per_s": 8000.0, "tflops_per_s": 41.3, "mfu": 0.41,
     "skipped": false,
     "memory": [{"stage": 0, "peak_gb": 3.1, "params_gb": 0.5, "grads_gb": 0.5,
                 "optimizer_gb": 1.0, "activations_gb": 1.1}, ...]}

``mfu`` is the plan's model FLOPs per iteration over the step time and the peak of the plan's
GPUs, and is null where the run did not run on them (a CPU rehearsal). ``memory`` has one entry
per GPU group of the plan (a pipeline stage, or under interleaving the group of its chunks):
the largest over the group's ranks of the peak allocated bytes
(``torch.cuda.max_memory_allocated``; on CPU the sum of the other terms), the bytes of
parameters, gradients and optimizer states held, and the peak of the tensors autograd saved for
the backward (counted with ``torch.autograd.graph.saved_tensors_hooks``; null when not tracked).
Lines are written and flushed as each step ends, so a run cut short keeps every step it made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .. import _io
from ..errors import TrainError

SCHEMA = "espresso.metrics/1"
MEMORY_KEYS = ("peak_gb", "params_gb", "grads_gb", "optimizer_gb", "activations_gb")


class MetricsWriter:
    """Appends the run's lines to ``path`` (created with its folder), flushing each."""

    def __init__(self, path: Path, header: dict[str, Any], *, resumed: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] = open(path, "a" if resumed and path.exists() else "w",  # noqa: SIM115
                                 encoding="utf-8")
        self.write({"kind": "run", "schema": SCHEMA, **header})

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, allow_nan=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


@dataclass(frozen=True)
class RunMetrics:
    """A metrics file read back: the run's header (the last one, for a resumed run) and its
    steps in order (a step written twice, by a run and its resumption, counts once: the
    later)."""

    path: str
    header: dict[str, Any]
    steps: list[dict[str, Any]]

    def timed(self, skip: int) -> list[dict[str, Any]]:
        """The steps that count for timing: all but the first ``skip`` of each run (start-up,
        compilation and shape inference) and those an fp16 overflow skipped."""
        return [s for s in self.steps if s.get("index_in_run", s["step"]) >= skip
                and not s.get("skipped")]


def read_metrics(path: str | Path) -> RunMetrics:
    text = _io.read_text("metrics", path, err=TrainError)
    header: dict[str, Any] | None = None
    steps: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            if n == len(text.splitlines()):  # a line cut short by a killed run
                break
            msg = f"metrics: {path}:{n}: not JSON ({exc})"
            raise TrainError(msg) from None
        if not isinstance(rec, dict) or rec.get("kind") not in ("run", "step"):
            msg = f"metrics: {path}:{n}: expected an object with kind 'run' or 'step'"
            raise TrainError(msg)
        if rec["kind"] == "run":
            if rec.get("schema") != SCHEMA:
                msg = (f"metrics: {path}:{n}: schema {rec.get('schema')!r}, expected "
                       f"{SCHEMA!r}")
                raise TrainError(msg)
            header = rec
            continue
        if header is None:
            msg = f"metrics: {path}:{n}: a step before the run's first line"
            raise TrainError(msg)
        for key in ("step", "step_s", "loss"):
            val = rec.get(key)
            if not isinstance(val, (int, float)) or isinstance(val, bool):
                msg = f"metrics: {path}:{n}: {key}: expected a number, got {val!r}"
                raise TrainError(msg)
        steps[int(rec["step"])] = rec
    if header is None:
        msg = f"metrics: {path}: no run line (is it an espresso train metrics.jsonl?)"
        raise TrainError(msg)
    return RunMetrics(str(path), header, [steps[k] for k in sorted(steps)])
