"""Measured per-block profiles: what one transformer block (and the head) really costs on a GPU
type, to replace the analytic time and memory for that type in ``estimate()`` and ``plan()``.

A :class:`Profile` is plain data (JSON, ``"schema": "espresso.profile/1"``) and needs no
torch; measuring one (:func:`profile_model`, :func:`profile_modules`) needs the torch extra.

How a profile enters the cost model: at the profile's own micro-batch size and sequence
length, the cost model's analytic times of one block's forward and backward on one GPU
(``T_f``, ``T_b``: matmuls, attention, memory-bound work) give the factors
``block_fwd_s / T_f`` and ``block_bwd_s / T_b`` (the same for the head), and
``activation_bytes`` over the analytic stash. The cost model multiplies its compute times
and stashed activations by them, so at the profiled shape the estimate uses the measured
numbers exactly, other micro-batch sizes and sequence lengths scale with the analytic times
and the activation formula, and tensor parallelism divides the work and adds its
all-reduces as before (docs/cost-model.md, "Profiles").
"""

from __future__ import annotations

import functools
import json
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import _io
from . import _validate as v
from ._native import core
from .cost import CostParams
from .errors import ProfileError

SCHEMA = "espresso.profile/1"

# Architecture fields a profile must share with the model it is applied to (the block count
# and the name may differ: one block's profile serves any depth).
_ARCH = ("hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
         "gated_mlp", "tied_embeddings", "norm", "linear_bias")


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """Measured costs of one block and of the head on one GPU type."""

    gpu: str
    """The catalog GPU type this profile describes."""
    model: dict[str, Any]
    """The profiled model's spec (``ModelSpec.to_dict()``)."""
    seq_len: int
    micro_batch_size: int
    block_fwd_s: float
    """Median forward time of one block, one micro-batch."""
    block_bwd_s: float
    """Median backward time of one block (input and weight gradients)."""
    head_fwd_s: float
    """Median forward time of the final norm, LM head and loss."""
    head_bwd_s: float
    block_activation_bytes: float
    """Bytes one block keeps for its backward (saved tensors, parameters excluded)."""
    block_param_bytes: float
    """Bytes of one block's parameters as profiled (a check on the model)."""
    device: str = ""
    """Where it was measured (``cuda:0 NVIDIA H200``, ``cpu x86_64``)."""
    dtype: str = "bfloat16"
    repeats: int = 0
    samples: dict[str, list[float]] = field(default_factory=dict)
    """Every timed run, in seconds, per part."""
    meta: dict[str, Any] = field(default_factory=dict)
    """torch version, threads, date."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "gpu", v.string("profile.gpu", self.gpu, err=ProfileError))
        if not isinstance(self.model, Mapping):
            msg = f"profile.model: expected a model spec mapping, got {self.model!r}"
            raise ProfileError(msg)
        set_(self, "model", dict(self.model))
        set_(self, "seq_len", v.integer("profile.seq_len", self.seq_len, minimum=1,
                                        maximum=1 << 22, err=ProfileError))
        set_(self, "micro_batch_size", v.integer("profile.micro_batch_size",
                                                 self.micro_batch_size, minimum=1,
                                                 maximum=1 << 20, err=ProfileError))
        for name in ("block_fwd_s", "block_bwd_s", "head_fwd_s", "head_bwd_s",
                     "block_activation_bytes", "block_param_bytes"):
            val = v.number(f"profile.{name}", getattr(self, name), err=ProfileError)
            if not val > 0:
                msg = f"profile.{name}: expected a positive number, got {val!r}"
                raise ProfileError(msg)
            set_(self, name, val)

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        data = v.mapping("profile", data, err=ProfileError)
        names = [f.name for f in fields(cls)]
        v.known_keys("profile", data, [*names, "schema"],
                     ["gpu", "model", "seq_len", "micro_batch_size", "block_fwd_s",
                      "block_bwd_s", "head_fwd_s", "head_bwd_s", "block_activation_bytes",
                      "block_param_bytes"], err=ProfileError)
        schema = data.get("schema", SCHEMA)
        if schema != SCHEMA:
            msg = f"profile.schema: expected {SCHEMA!r}, got {schema!r}"
            raise ProfileError(msg)
        return cls(**{k: val for k, val in data.items() if k != "schema"})

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **{f.name: getattr(self, f.name) for f in fields(self)}}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            _io.write_text("profile", path, text, err=ProfileError)
        return text

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_dict(v.load_yaml("profile", path, err=ProfileError))

    def scaled(self, factor: float) -> Profile:
        """The same profile with every time multiplied by ``factor`` (what-if studies)."""
        from dataclasses import replace

        return replace(self, block_fwd_s=self.block_fwd_s * factor,
                       block_bwd_s=self.block_bwd_s * factor,
                       head_fwd_s=self.head_fwd_s * factor, head_bwd_s=self.head_bwd_s * factor)

    # ------------------------------------------------------------------ cost model
    def check_model(self, model: Any) -> None:
        """Refuse a model whose architecture differs from the profiled one."""
        mine, theirs = self.model, model.to_dict()
        diff = [f"{k}: profiled {mine.get(k)!r}, model {theirs.get(k)!r}"
                for k in _ARCH if k in mine and mine.get(k) != theirs.get(k)]
        if diff:
            msg = (f"the profile of {self.gpu} is of another model ({mine.get('name')!r}) than "
                   f"{theirs.get('name')!r}: " + "; ".join(diff))
            raise ProfileError(msg)

    def factors(self, model: Any, gpu: Any, cost: CostParams) -> dict[str, float]:
        """The cost model's factors for ``gpu`` (a GpuType), relative to its analytic times."""
        self.check_model(model)
        if gpu.model != self.gpu:
            msg = f"a profile of {self.gpu} was given for GPU type {gpu.name}"
            raise ProfileError(msg)
        dims = model._dims()
        s, b = self.seq_len, self.micro_batch_size
        eff = gpu.efficiency if gpu.efficiency is not None else cost.efficiency
        # The analytic times the factors replace: one block and the head at the profile's
        # shape on one GPU (no TP), without recomputation.
        w = shape_workload(s, b)
        spec, params = gpu._spec(), cost._core()
        blk = core.block_times(dims, spec, params, w, 1)
        head = core.head_times(dims, spec, params, w, 1)
        act = core.block_activation_bytes(dims, cost._core(), s, b, 1)
        out = {"block_fwd_scale": self.block_fwd_s / blk.fwd,
               "block_bwd_scale": self.block_bwd_s / blk.bwd,
               "head_fwd_scale": self.head_fwd_s / head.fwd,
               "head_bwd_scale": self.head_bwd_s / head.bwd,
               "activation_scale": self.block_activation_bytes / act}
        for k, val in out.items():
            if not 1e-6 <= val <= 1e6:
                msg = (f"the profile of {self.gpu} implies a {k} of {val:.3g} against the "
                       f"catalog's {gpu.bf16_tflops} TFLOP/s at {eff:.0%} "
                       f"(x {cost.sustained_fraction:g} sustained); expected within "
                       "[1e-6, 1e6]: is the catalog entry or the profile wrong?")
                raise ProfileError(msg)
        return out


def shape_workload(seq_len: int, micro_batch_size: int) -> Any:
    """A core Workload of one micro-batch of this shape on one replica, without
    recomputation: the shape a profile is measured at."""
    w = core.Workload()
    w.seq_len, w.micro_batch_size = seq_len, micro_batch_size
    w.num_microbatches, w.dp, w.global_batch_size = 1, 1, micro_batch_size
    return w


def as_profiles(profiles: Any) -> dict[str, Profile]:
    """Normalise ``{gpu: Profile | dict | path}`` or a list of profiles to ``{gpu: Profile}``."""
    if profiles is None:
        return {}
    items: list[tuple[str | None, Any]]
    if isinstance(profiles, Mapping):
        items = list(profiles.items())
    elif isinstance(profiles, (list, tuple)):
        items = [(None, p) for p in profiles]
    else:
        msg = f"profiles: expected {{gpu: profile}} or a list of profiles, got {profiles!r}"
        raise ProfileError(msg)
    out: dict[str, Profile] = {}
    for key, p in items:
        if isinstance(p, (str, Path)):
            p = Profile.load(p)
        elif isinstance(p, Mapping):
            p = Profile.from_dict(p)
        elif not isinstance(p, Profile):
            msg = f"profiles[{key!r}]: expected a Profile, got {type(p).__name__}"
            raise ProfileError(msg)
        if key is not None and key != p.gpu:
            msg = f"profiles[{key!r}]: the profile is of {p.gpu}, not {key}"
            raise ProfileError(msg)
        if p.gpu in out:
            msg = f"profiles: two profiles of {p.gpu}"
            raise ProfileError(msg)
        out[p.gpu] = p
    return out


# ---------------------------------------------------------------------- measuring (torch)
def _timer(torch: Any, device: Any) -> Callable[[Callable[[], Any]], float]:
    if device.type == "cuda":
        def cuda_time(fn: Callable[[], Any]) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3
        return cuda_time

    def wall_time(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return wall_time


def _saved_bytes(torch: Any, fn: Callable[[], Any], params: set[int]) -> tuple[Any, float]:
    """Run ``fn`` and count the distinct storages autograd saves, excluding the parameters'
    (``params``: their storages' addresses; a Linear saves a transposed view of its weight)."""
    seen: dict[Any, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[(st.data_ptr(), t.device)] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, float(sum(seen.values()))


LIMITS = {"micro_batch_size": (1, 1 << 16), "seq_len": (1, 1 << 20), "warmup": (0, 10_000),
          "repeats": (1, 10_000)}
"""The sizes a profile may be measured at (inclusive)."""


def resolve_device(torch: Any, device: Any) -> Any:
    """``device`` as a torch device this machine has (default: cuda when present, else cpu)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        msg = f"device: {str(device)[:80]!r} is not a torch device; expected cpu, cuda or cuda:N"
        raise ProfileError(msg) from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            msg = f"device: {str(device)!r}: no CUDA GPU is available on this machine"
            raise ProfileError(msg)
        if dev.index is not None and dev.index >= count:
            msg = (f"device: {str(device)!r}: this machine has {count} CUDA GPU"
                   f"{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})")
            raise ProfileError(msg)
    return dev


def profile_modules(block: Any, head: Any, loss_fn: Callable[[Any, Any], Any], *, gpu: str,
                    model: Any, micro_batch_size: int, seq_len: int, device: Any = None,
                    dtype: Any = None, warmup: int = 3, repeats: int = 10,
                    progress: Callable[[str], None] | None = None) -> Profile:
    """Profile a user's block and head modules (``block(x) -> x``, ``head(x) -> logits``) on
    ``device`` for one micro-batch of ``micro_batch_size x seq_len`` and return a Profile of
    ``gpu``. ``model`` is the ModelSpec the modules implement (for the shapes and the check
    when the profile is applied). Times are medians of ``repeats`` runs after ``warmup``."""
    from ._optional import require

    torch = require("torch")
    device = resolve_device(torch, device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    repeats, warmup, micro_batch_size, seq_len = (
        v.integer(name, val, minimum=LIMITS[name][0], maximum=LIMITS[name][1], err=ProfileError)
        for name, val in (("repeats", repeats), ("warmup", warmup),
                          ("micro_batch_size", micro_batch_size), ("seq_len", seq_len)))
    try:
        block = block.to(device=device, dtype=dtype)
        head = head.to(device=device, dtype=dtype)
    except (RuntimeError, AssertionError, TypeError) as exc:  # torch's words for a bad device
        msg = f"device: cannot use {str(device)!r} with {dtype}: {str(exc).splitlines()[0]}"
        raise ProfileError(msg) from None
    b, s, h = micro_batch_size, seq_len, model.hidden_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(b, s, h, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    target = torch.randint(0, model.vocab_size, (b, s), generator=gen).to(device)
    timer = _timer(torch, device)
    params = {p.untyped_storage().data_ptr() for p in [*block.parameters(), *head.parameters()]}
    samples: dict[str, list[float]] = {"block_fwd": [], "block_bwd": [], "head_fwd": [],
                                       "head_bwd": []}
    # Activation bytes from one untimed run (the hooks would slow the timed ones).
    y, act_bytes = _saved_bytes(torch, lambda: block(x), params)
    del y
    for i in range(warmup + repeats):
        keep = i >= warmup
        box: dict[str, Any] = {}

        def fwd(box: dict[str, Any] = box) -> None:
            box["y"] = block(x)

        t_f = timer(fwd)
        grad_y = torch.ones_like(box["y"])
        t_b = timer(functools.partial(box["y"].backward, grad_y))
        hx = box["y"].detach().requires_grad_(True)

        def hfwd(box: dict[str, Any] = box, hx: Any = hx) -> None:
            box["loss"] = loss_fn(head(hx), target)

        t_hf = timer(hfwd)
        t_hb = timer(box["loss"].backward)
        if keep:
            samples["block_fwd"].append(t_f)
            samples["block_bwd"].append(t_b)
            samples["head_fwd"].append(t_hf)
            samples["head_bwd"].append(t_hb)
        x.grad = None
        for p in [*block.parameters(), *head.parameters()]:
            p.grad = None
        if progress is not None:
            progress(f"run {i + 1}/{warmup + repeats}" + ("" if keep else " (warm-up)"))
    name = (f"cuda:{device.index or 0} {torch.cuda.get_device_name(device)}"
            if device.type == "cuda" else f"cpu {platform.machine()}")
    return Profile(
        gpu=gpu, model=model.to_dict(), seq_len=s, micro_batch_size=b,
        block_fwd_s=statistics.median(samples["block_fwd"]),
        block_bwd_s=statistics.median(samples["block_bwd"]),
        head_fwd_s=statistics.median(samples["head_fwd"]),
        head_bwd_s=statistics.median(samples["head_bwd"]),
        block_activation_bytes=act_bytes,
        block_param_bytes=float(sum(p.numel() * p.element_size() for p in block.parameters())),
        device=name, dtype=str(dtype).removeprefix("torch."), repeats=repeats, samples=samples,
        meta={"torch": torch.__version__, "threads": torch.get_num_threads(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def profile_model(model: Any, *, gpu: str, micro_batch_size: int = 1, seq_len: int | None = None,
                  device: Any = None, dtype: Any = None, warmup: int = 3, repeats: int = 10,
                  progress: Callable[[str], None] | None = None) -> Profile:
    """Profile a ModelSpec (e.g. a preset) built as a real PyTorch module
    (:mod:`espresso.modules`): one block and the head."""
    from .modules import build_block, build_head, lm_loss

    seq = 2048 if seq_len is None else seq_len
    return profile_modules(build_block(model), build_head(model), lm_loss(model), gpu=gpu,
                           model=model, micro_batch_size=micro_batch_size, seq_len=seq,
                           device=device, dtype=dtype, warmup=warmup, repeats=repeats,
                           progress=progress)
