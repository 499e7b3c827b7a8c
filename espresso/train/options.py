"""The settings of a training run (``espresso train`` and ``python -m espresso.train``):
argparse arguments shared by both entry points, read into :class:`TrainOptions`. Torch-free."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import TrainError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainOptions:
    plan: str
    data: str
    steps: int | None = None
    """Steps to train; None: the plan's iterations."""
    tokenizer: str | None = None
    eos_id: int | None = None
    text_field: str = "text"
    token_dtype: str = "uint16"
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None
    """None: 5% of the steps (at least 1)."""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    clip: float = 1.0
    seed: int = 0
    precision: str = "auto"
    compile: bool = False
    out: str | None = None
    metrics: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    log_every: int = 1
    track_activations: bool | None = None
    """Count saved activations with autograd hooks (default: on CPU only)."""
    reference: bool = False
    local: bool = False

    @property
    def out_dir(self) -> Path:
        return Path(self.out) if self.out else Path("runs") / Path(self.plan).stem

    @property
    def metrics_path(self) -> Path:
        return Path(self.metrics) if self.metrics else self.out_dir / (
            "reference.jsonl" if self.reference else "metrics.jsonl")

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint_dir) if self.checkpoint_dir else self.out_dir / "checkpoints"

    def warmup(self, steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, steps // 20)

    def lr_at(self, step: int, steps: int) -> float:
        """Linear warm-up to ``lr`` over the warm-up steps, then cosine decay to
        ``min_lr_ratio * lr`` at the last step."""
        warm = self.warmup(steps)
        if step < warm:
            return self.lr * (step + 1) / warm
        span = max(1, steps - warm)
        frac = min(1.0, (step - warm) / span)
        low = self.lr * self.min_lr_ratio
        return low + (self.lr - low) * 0.5 * (1 + math.cos(math.pi * frac))


def _int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            msg = f"expected a whole number >= {minimum}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return n

    return parse


_positive_int = _int_at_least(1)
_count = _int_at_least(0)


def _number(lo: float, hi: float, *, closed_lo: bool = True) -> Any:
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            msg = f"expected a number, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
        ok = (lo <= x if closed_lo else lo < x) and x <= hi and math.isfinite(x)
        if not ok:
            side = "[" if closed_lo else "("
            msg = f"expected a number in {side}{lo:g}, {hi:g}], got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return x

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", nargs="?", default=None,
                   help="plan JSON file (espresso plan --json); default: $ESPRESSO_PLAN, which "
                        "espresso launch sets")
    d = p.add_argument_group("data")
    d.add_argument("--data", required=True,
                   help="a text/markdown/jsonl file or a folder of them; tokens in a .npy or "
                        ".bin file; hf:NAME[:CONFIG][@SPLIT] (a Hugging Face dataset, "
                        "streamed); or 'synthetic' (counting sequences, smoke tests only)")
    d.add_argument("--tokenizer", help="'byte' (default: UTF-8 bytes, for small models), a "
                                       "tokenizer.json, a folder holding one, or a Hub name")
    d.add_argument("--eos-id", type=_count, help="end-of-text id (default: the tokenizer's)")
    d.add_argument("--text-field", default="text", help="jsonl/dataset field of the text")
    d.add_argument("--token-dtype", default="uint16",
                   help="integer type of a .bin token file (uint16, uint32, int32, int64)")
    o = p.add_argument_group("optimization")
    o.add_argument("--steps", type=_positive_int,
                   help="steps to train (default: the plan's iterations)")
    o.add_argument("--lr", type=_number(0, 10, closed_lo=False), default=3e-4,
                   help="peak learning rate of AdamW (3e-4)")
    o.add_argument("--min-lr-ratio", type=_number(0, 1), default=0.1,
                   help="cosine decay ends at this fraction of --lr (0.1)")
    o.add_argument("--warmup-steps", type=_count,
                   help="linear warm-up steps (default: 5%% of the steps, at least 1)")
    o.add_argument("--weight-decay", type=_number(0, 10), default=0.1, help="(0.1)")
    o.add_argument("--beta1", type=_number(0, 1), default=0.9, help="(0.9)")
    o.add_argument("--beta2", type=_number(0, 1), default=0.95, help="(0.95)")
    o.add_argument("--clip", type=_number(0, 1e9), default=1.0,
                   help="clip the gradient norm over the whole model to this (1.0; 0: off)")
    o.add_argument("--seed", type=_count, default=0, help="weights and data order (0)")
    o.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="auto: bf16 autocast on GPUs with bf16, fp16 with loss scaling on "
                        "those without, fp32 on CPU")
    o.add_argument("--compile", action="store_true", help="torch.compile each block")
    r = p.add_argument_group("outputs")
    r.add_argument("--out", help="run folder: metrics.jsonl and checkpoints/ "
                                 "(default runs/<plan name>)")
    r.add_argument("--metrics", help="metrics file (default OUT/metrics.jsonl)")
    r.add_argument("--checkpoint-dir", help="checkpoints (default OUT/checkpoints); a run "
                                            "resumes from the newest there")
    r.add_argument("--checkpoint-every", type=_count,
                   help="steps between checkpoints (default: the plan's interval for spot "
                        "plans, else only at the end; 0: never)")
    r.add_argument("--log-every", type=_positive_int, default=1, help="print every N steps (1)")
    r.add_argument("--track-activations", action=argparse.BooleanOptionalAction, default=None,
                   help="count saved activations with autograd hooks (default: on CPU)")
    m = p.add_argument_group("how to run")
    m.add_argument("--local", action="store_true",
                   help="rehearse here: one CPU process per GPU of the plan (gloo)")
    m.add_argument("--reference", action="store_true",
                   help="train the same model in one process without the plan's parallelism "
                        "(to compare losses with a run of the plan)")


def from_args(args: argparse.Namespace) -> TrainOptions:
    names = {f.name for f in fields(TrainOptions)}
    given = {k: v for k, v in vars(args).items() if k in names}
    given["plan"] = given.get("plan") or os.environ.get("ESPRESSO_PLAN")
    if not given["plan"]:
        msg = "train: give the plan (PLAN, or $ESPRESSO_PLAN as espresso launch sets it)"
        raise TrainError(msg)
    opts = TrainOptions(**given)
    if opts.local and opts.reference:
        msg = "--local and --reference: choose one (the reference runs in this process)"
        raise TrainError(msg)
    return opts


def to_argv(opts: TrainOptions, *, drop: tuple[str, ...] = ()) -> list[str]:
    """Command-line arguments that give ``opts`` back (without those named in ``drop``)."""
    out = [opts.plan]
    defaults = TrainOptions(plan="", data="")
    for f in fields(TrainOptions):
        if f.name in ("plan", *drop):
            continue
        val = getattr(opts, f.name)
        if f.name != "data" and val == getattr(defaults, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(val, bool):
            if f.name == "track_activations":
                out.append(flag if val else "--no-track-activations")
            elif val:
                out.append(flag)
        else:
            out += [flag, str(val)]
    return out
