"""Job: what to train, on how much data, by when."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _validate as v
from .errors import JobError, ModelError
from .model import ModelSpec
from .units import parse_count, parse_hours

OPTIMIZER_STATE_BYTES = {
    "adam": 12.0,  # fp32 master weights + Adam m and v
    "adamw": 12.0,
    "sgd": 8.0,  # fp32 master weights + momentum
    "adam-bf16": 6.0,  # bf16 parameter copy + bf16 Adam m and v (bf16 optimizer states)
}
"""Optimizer-state bytes per parameter under bf16 mixed precision."""

DEFAULT_SEQ_LEN = 4096
"""Sequence length when a job does not give one (the API and the CLI share it)."""
DEFAULT_GLOBAL_BATCH_SIZE = 512
"""Sequences per optimizer step when a job does not give them."""

_FIELDS = ("model", "seq_len", "global_batch_size", "tokens", "iterations", "deadline_hours",
           "optimizer", "deadline_confidence", "precision")

PRECISIONS = ("bf16", "fp16", "fp8")
"""How the blocks' matrix multiplies run: ``bf16`` mixed precision; ``fp16`` mixed precision
with dynamic loss scaling (the same bytes and, on GPUs with both, the same tensor-core rate
as bf16; the only choice on GPUs without bf16, such as V100, T4 and P100); or ``fp8``
(Transformer Engine's recipes: every linear layer's GEMM in fp8, inputs cast per GEMM;
attention, norms, the LM head and the optimizer as in bf16). A bf16 or fp8 job runs only on
GPUs with bf16 tensor cores, an fp8 job only on those with fp8 ones too; an fp16 job on any."""

DEFAULT_DEADLINE_CONFIDENCE = 0.9
"""Probability with which a plan with spot instances must meet the deadline."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A training job: model, batch shape, length, deadline."""

    model: ModelSpec
    """The model (``ModelSpec.preset('llama2-7b')``, ``ModelSpec.load(...)``)."""
    deadline_hours: float
    """Wall-clock limit for the whole job, in hours."""
    seq_len: int = DEFAULT_SEQ_LEN
    """Sequence length in tokens (default 4096)."""
    global_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE
    """Sequences per optimizer step (default 512)."""
    tokens: int | None = None
    """Training tokens; give this or ``iterations``."""
    iterations: int | None = None
    """Optimizer steps; give this or ``tokens``."""
    optimizer: str = "adam"
    """``adam``/``adamw`` (12 state bytes per parameter), ``sgd`` (8) or ``adam-bf16`` (6)."""
    deadline_confidence: float = DEFAULT_DEADLINE_CONFIDENCE
    """Plans with spot instances: the probability with which the deadline must hold, over the
    number of interruptions (docs/cost-model.md, "Spot capacity"); in (0, 1), default 0.9.
    On-demand plans meet it or not for sure."""
    precision: str = "bf16"
    """``bf16`` (default), ``fp16`` (loss-scaled; any GPU) or ``fp8`` (the linear layers'
    GEMMs in fp8; :data:`PRECISIONS`)."""

    def __post_init__(self) -> None:
        err = JobError
        set_ = object.__setattr__
        if not isinstance(self.model, ModelSpec):
            msg = f"job.model: expected a ModelSpec, got {type(self.model).__name__}"
            raise JobError(msg)
        set_(self, "seq_len",
             v.integer("job.seq_len", self.seq_len, minimum=1, maximum=1 << 24, err=err))
        set_(self, "global_batch_size",
             v.integer("job.global_batch_size", self.global_batch_size, minimum=1,
                       maximum=1 << 24, err=err))
        set_(self, "deadline_hours",
             v.number("job.deadline_hours", self.deadline_hours, positive=True, err=err))
        if (self.tokens is None) == (self.iterations is None):
            msg = (
                "job: give exactly one of tokens or iterations, got "
                f"tokens={self.tokens!r} and iterations={self.iterations!r}"
            )
            raise JobError(msg)
        if self.tokens is not None:
            set_(self, "tokens",
                 v.integer("job.tokens", self.tokens, minimum=1, maximum=1 << 62, err=err))
        if self.iterations is not None:
            set_(self, "iterations",
                 v.integer("job.iterations", self.iterations, minimum=1, maximum=1 << 40,
                           err=err))
        set_(self, "optimizer",
             v.choice("job.optimizer", self.optimizer, OPTIMIZER_STATE_BYTES, err=err))
        conf = v.number("job.deadline_confidence", self.deadline_confidence, err=err)
        if not 0 < conf < 1:
            msg = (f"job.deadline_confidence: expected a probability in (0, 1), e.g. 0.9, "
                   f"got {self.deadline_confidence!r}")
            raise JobError(msg)
        set_(self, "deadline_confidence", conf)
        set_(self, "precision", v.choice("job.precision", self.precision, PRECISIONS, err=err))

    @property
    def num_iterations(self) -> int:
        """Optimizer steps: ``iterations``, or ``ceil(tokens / (global_batch_size * seq_len))``."""
        if self.iterations is not None:
            return self.iterations
        assert self.tokens is not None
        return math.ceil(self.tokens / (self.global_batch_size * self.seq_len))

    @property
    def num_tokens(self) -> int:
        return self.num_iterations * self.global_batch_size * self.seq_len

    @property
    def optimizer_state_bytes(self) -> float:
        return OPTIMIZER_STATE_BYTES[self.optimizer]

    @classmethod
    def from_dict(cls, data: Any) -> Job:
        """Build from the job contract; the model may be a preset name, a path or inline.
        Human units are accepted: ``deadline: 7d``, ``tokens: 20B``."""
        data = dict(v.mapping("job", data, err=JobError))
        if "deadline" in data and "deadline_hours" not in data:
            data["deadline_hours"] = data.pop("deadline")
        v.known_keys("job", data, _FIELDS, ("model", "deadline_hours"), err=JobError)
        model_ref = data.pop("model")
        if isinstance(model_ref, ModelSpec):
            model = model_ref
        elif isinstance(model_ref, (str, dict)):
            model = ModelSpec.load(model_ref)
        else:
            msg = f"job.model: expected a preset name, a file path or a mapping, got {model_ref!r}"
            raise ModelError(msg)
        data["deadline_hours"] = parse_hours(data["deadline_hours"], "job.deadline_hours")
        for key in ("tokens", "iterations"):
            if data.get(key) is not None:
                data[key] = parse_count(data[key], f"job.{key}")
        return cls(model=model, **data)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model.to_dict(),
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
        }
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.iterations is not None:
            out["iterations"] = self.iterations
        out["deadline_hours"] = self.deadline_hours
        out["optimizer"] = self.optimizer
        if self.deadline_confidence != DEFAULT_DEADLINE_CONFIDENCE:
            out["deadline_confidence"] = self.deadline_confidence
        if self.precision != "bf16":
            out["precision"] = self.precision
        return out

    @classmethod
    def load(cls, path: str | Path) -> Job:
        job: Job = v.load_spec("job", path, cls.from_dict, err=JobError)
        return job
