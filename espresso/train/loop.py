"""The training loop of ``espresso train`` (torch extra): the plan's model built stage by stage
through the runner (:mod:`espresso.runner`), AdamW with warm-up and cosine decay, clipping of
the whole model's gradient norm, bf16 autocast or fp16 with dynamic loss scaling, checkpoints
and resume (:class:`~espresso.runner.checkpoint.Checkpointer`), and ``metrics.jsonl``
(:mod:`espresso.train.metrics`). docs/training.md is the walk-through."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
import warnings
import weakref
from typing import Any

from .. import modules as em
from .._optional import require
from ..errors import TrainError
from ..model import ModelSpec
from ..plan import Plan
from . import data as td
from .metrics import MetricsWriter
from .options import TrainOptions

torch = require("torch")
nn = torch.nn
dist = torch.distributed

GB = 1e9
INIT_STD = 0.02


# ------------------------------------------------------------------ the model
def _init(module: Any, std: float, out_std: float) -> None:
    """GPT-2/Megatron initialisation: normal(0, std) for weights, the projections that write
    into the residual stream scaled down by sqrt(2 * layers), zero biases, unit norms."""
    for name, sub in module.named_modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            s = out_std if name.endswith(("attn.o", "mlp.down")) else std
            nn.init.normal_(sub.weight, 0.0, s)
            if getattr(sub, "bias", None) is not None:
                nn.init.zeros_(sub.bias)


def model_parts(spec: ModelSpec, seed: int) -> tuple[Any, Any, Any]:
    """(embedding, block factory, head): each part's weights depend only on the seed and the
    part's index, so every rank builds the same weights for the blocks it holds, and a single
    process builds the same model."""
    out_std = INIT_STD / math.sqrt(2 * spec.num_layers)

    def seeded(offset: int, build: Any) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + offset)
            part = build(spec)
            _init(part, INIT_STD, out_std)
        return part

    embedding = seeded(0, em.build_embedding)
    head = seeded(1, em.build_head)

    def block(i: int) -> Any:
        return seeded(2 + i, em.build_block)

    return embedding, block, head


# ------------------------------------------------------------------ precision
def plan_lacks_bf16(plan: Plan) -> list[str]:
    """The plan's GPU types without bf16 tensor cores (V100, T4, ...: the spec table's
    ``bf16: false``)."""
    from ..cloud.specs import SpecTable

    table = SpecTable.builtin()
    names = {st.gpu for st in plan.stages}
    return sorted(n for n in names if n in table and not table[n].bf16)


def resolve_precision(requested: str, plan: Plan, device: Any) -> str:
    """``auto``: fp32 on CPU; on GPUs bf16 autocast, or fp16 with loss scaling where the plan
    says fp16 (``job.precision``) or its GPUs (or this device) lack bf16."""
    if requested != "auto":
        if requested == "fp16" and device.type == "cpu":
            msg = "--precision fp16: autocast to fp16 needs a GPU; use bf16 or fp32 on CPU"
            raise TrainError(msg)
        return requested
    if device.type != "cuda":
        return "fp32"
    if (plan.job.precision == "fp16" or plan_lacks_bf16(plan)
            or not torch.cuda.is_bf16_supported()):
        return "fp16"
    return "bf16"


class LossScaler:
    """Dynamic loss scaling for fp16 (as ``torch.amp.GradScaler``, but agreed over every rank
    of a pipeline, since each rank holds only its stage's gradients): the loss is multiplied
    by ``scale``; a step whose gradients overflow anywhere is skipped and the scale halved;
    after ``interval`` good steps it doubles."""

    def __init__(self, scale: float = 2.0**16, interval: int = 2000) -> None:
        self.scale, self.interval, self.good = scale, interval, 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale = max(self.scale / 2, 1.0)
            self.good = 0
        else:
            self.good += 1
            if self.good % self.interval == 0:
                self.scale *= 2


# ------------------------------------------------------------------ memory accounting
class SavedTensors:
    """The bytes of tensors autograd saves for the backward, live and at their peak: each
    saved tensor's storage is counted once while any graph holds it."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._refs: dict[int, int] = {}

    def _pack(self, t: Any) -> Any:
        inner = getattr(t, "_local_tensor", t)  # a DTensor holds its local shard
        try:
            if inner.device.type == "meta":
                return t
            storage = inner.untyped_storage()
            key = storage.data_ptr()
        except (RuntimeError, NotImplementedError):  # no storage of its own (a fake tensor)
            return t
        if key not in self._refs:
            self._refs[key] = 0
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self._refs[key] += 1
        holder = _Held(t)
        weakref.finalize(holder, self._drop, key, storage.nbytes())
        return holder

    def _drop(self, key: int, nbytes: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.live -= nbytes

    @staticmethod
    def _unpack(holder: Any) -> Any:
        return holder.tensor if isinstance(holder, _Held) else holder

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)


class _Held:
    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors: Any) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def optimizer_bytes(opt: Any) -> int:
    inner = getattr(opt, "optim", opt)  # ZeRO-1 keeps this rank's share in a local optimizer
    return sum(_bytes(v for v in st.values() if torch.is_tensor(v))
               for st in inner.state.values())


# ------------------------------------------------------------------ gradients
def _owned_grads(params: list[Any], replica: int, tp_index: int) -> list[Any]:
    """The local gradients this rank counts in the global norm: each element of the model's
    gradient once over the world. A DTensor's shards are counted by their holders and its
    replicas by coordinate 0 of each replicated mesh dimension; a plain tensor (held whole by
    every TP rank and every replica, unless FSDP shards it) by TP index 0 of replica 0."""
    out = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if hasattr(g, "device_mesh"):
            mesh, own = g.device_mesh, True
            names = mesh.mesh_dim_names or ()
            for d, placement in enumerate(g.placements):
                if placement.is_replicate() and mesh.get_local_rank(d) != 0:
                    own = False
            if ("dp" not in names and replica) or ("tp" not in names and tp_index):
                own = False
            if own:
                out.append(g.to_local())
        elif replica == 0 and tp_index == 0:
            out.append(g)
    return out


def clip_and_check(params: list[Any], clip: float, replica: int, tp_index: int,
                   inv_scale: float = 1.0) -> tuple[float, bool]:
    """Unscale (fp16), measure the whole model's gradient norm over every rank, clip to
    ``clip`` (0: no clipping): returns (norm, overflow). Collective over the world."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    if inv_scale != 1.0:
        for g in grads:
            g.mul_(inv_scale)
    owned = _owned_grads(params, replica, tp_index)
    dev = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros(1, dtype=torch.float64, device=dev)
    for g in owned:
        total += g.detach().double().pow(2).sum()
    if dist.is_initialized():
        dist.all_reduce(total)
    sq = float(total.item())
    if not math.isfinite(sq):
        return sq, True
    norm = math.sqrt(sq)
    if clip > 0:
        coef = clip / (norm + 1e-6)
        if coef < 1:
            for g in grads:
                g.mul_(coef)
    return norm, False


# ------------------------------------------------------------------ the run
class _Single:
    """The whole model in one process, without the plan's parallelism (``--reference``)."""

    def __init__(self, plan: Plan, parts: tuple[Any, Any, Any], loss_fn: Any) -> None:
        embedding, block, head = parts
        spec = plan.job.model
        self.module = nn.Sequential(embedding, *(block(i) for i in range(spec.num_layers)),
                                    head)
        self.loss_fn = loss_fn
        self.reports_loss, self.replica, self.tp_index, self.stage = True, 0, 0, 0

    def step(self, x: Any, y: Any) -> Any:
        loss = self.loss_fn(self.module(x), y)
        loss.backward()
        return [loss.detach()]


def _tie(parts: tuple[Any, Any, Any], plan: Plan) -> list[str]:
    spec = plan.job.model
    if not spec.tied_embeddings:
        return []
    embedding, _, head = parts
    if plan.num_stages == 1 and plan.stages[0].tp == 1:
        head.out.weight = embedding.tok.weight
        return []
    return [f"the model ties its embeddings, but the plan puts the embedding and the head on "
            f"{'different stages' if plan.num_stages > 1 else 'a TP stage'}: training them "
            f"untied ({spec.vocab_size * spec.hidden_size:,} more parameters)"]


def _device_name(device: Any) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return "cpu"


def run(opts: TrainOptions) -> int:
    """Train as ``opts`` says (this rank's part of the plan, or ``--reference``)."""
    plan = Plan.from_json(opts.plan)
    spec = plan.job.model
    steps = opts.steps or plan.job.num_iterations
    tok = td.open_tokenizer(opts.tokenizer, opts.eos_id)
    if opts.data != "synthetic" and not opts.data.endswith((".npy", ".bin")):
        td.check_tokenizer(tok, spec.vocab_size, spec.name)
    source = td.open_source(opts.data, tokenizer=tok, vocab_size=spec.vocab_size,
                            seed=opts.seed, text_field=opts.text_field,
                            token_dtype=opts.token_dtype)
    loss_fn = em.lm_loss(spec)
    parts = model_parts(spec, opts.seed)
    notes = _tie(parts, plan)
    scaler_box: list[LossScaler | None] = [None]

    def scaled_loss(out: Any, target: Any) -> Any:
        loss = loss_fn(out, target)
        sc = scaler_box[0]
        return loss * sc.scale if sc is not None else loss

    if opts.reference:
        rt: Any = _Single(plan, parts, scaled_loss)
        device = torch.device("cpu")
        world_rank, pp_groups = 0, 1
    else:
        from ..runner import stage as et

        if "RANK" not in os.environ and "ESPRESSO_FIRST_RANK" not in os.environ \
                and plan.num_gpus > 1:
            msg = (f"the plan runs {plan.num_gpus} processes: rehearse it on this machine with "
                   f"`espresso train {opts.plan} --local ...`, start it on its nodes with "
                   f"`espresso launch {opts.plan} --hosts FILE --script-args '--data ...'` "
                   "(or torchrun -m espresso.train), or train the reference in one process "
                   "with --reference")
            raise TrainError(msg)
        embedding, block, head = parts
        rt = et.setup(plan, embedding=embedding, blocks=block, num_blocks=spec.num_layers,
                      head=head, loss_fn=scaled_loss, tp_plan=em.tp_plan(spec),
                      embedding_tp_plan=em.embedding_tp_plan(spec),
                      head_tp_plan=em.head_tp_plan(spec))
        device = next(rt.module.parameters()).device
        world_rank, pp_groups = dist.get_rank(), plan.pp
    precision = resolve_precision(opts.precision, plan, device)
    if precision == "fp16":
        scaler_box[0] = LossScaler()
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if opts.compile:
        _compile(rt)

    module = rt.module
    params = [p for p in module.parameters() if p.requires_grad]
    betas = (opts.beta1, opts.beta2)
    if opts.reference:
        opt = torch.optim.AdamW(params, lr=opts.lr, betas=betas, weight_decay=opts.weight_decay)
    else:
        opt = rt.optimizer(torch.optim.AdamW, lr=opts.lr, betas=betas,
                           weight_decay=opts.weight_decay)

    replica = rt.replica if opts.reference else rt.info.replica
    tp_index = rt.tp_index if opts.reference else rt.info.tp_index
    my_group = rt.stage if opts.reference else rt.info.stage
    writer_rank = rt.reports_loss and replica == 0

    # Checkpoints and the data position.
    ck, start, position = None, 0, 0
    if not opts.reference:
        from ..runner.checkpoint import Checkpointer

        every = opts.checkpoint_every
        ck = Checkpointer(rt, opt, opts.checkpoint_path, plan=plan, every=every)
        start, saved = ck.resume()
        if isinstance(saved, dict):
            position = int(saved.get("sequences", 0))
            if scaler_box[0] is not None and saved.get("loss_scale"):
                scaler_box[0].scale = float(saved["loss_scale"])
        elif isinstance(saved, int):
            position = saved
    needs_data = opts.reference or rt.is_first or rt.is_last
    batches = (td.Batches(source, seq_len=plan.job.seq_len,
                          global_batch=plan.job.global_batch_size,
                          vocab_size=spec.vocab_size, skip=position) if needs_data else None)

    tokens_per_step = plan.job.global_batch_size * plan.job.seq_len
    est = plan.estimate
    flops = est.model_flops_per_iteration if est is not None else 0.0
    # MFU against the plan's GPUs where the run is on them: on GPUs, or a CPU plan (made on
    # the catalog of `espresso calibrate --cpu`) on CPU.
    cpu_plan = all(st.gpu == "CPU" for st in plan.stages)
    on_plan = device.type == "cuda" or (device.type == "cpu" and cpu_plan)
    peak = est.peak_flops if est is not None and on_plan and not opts.reference else 0.0
    track = opts.track_activations if opts.track_activations is not None \
        else device.type == "cpu"
    writer = None
    if world_rank == 0:
        for n in notes:
            warnings.warn(n, stacklevel=1)
    if writer_rank:
        header = {
            "plan": str(opts.plan), "model": spec.name, "engine": "espresso",
            "stages": [{"gpu": s.gpu, "tp": s.tp, "layers": list(s.layers)}
                       for s in plan.stages],
            "dp": plan.dp, "micro_batch_size": plan.micro_batch_size,
            "num_microbatches": plan.num_microbatches, "sharding": plan.sharding,
            "recompute": plan.recompute, "virtual_stages": plan.virtual_stages,
            "world_size": 1 if opts.reference else dist.get_world_size(),
            "reference": opts.reference, "device": device.type,
            "device_name": _device_name(device), "precision": precision,
            "data": td.describe(source), "tokenizer": tok.name, "seed": opts.seed,
            "steps": steps, "start_step": start, "tokens_per_step": tokens_per_step,
            "model_flops_per_iteration": flops or None,
            "estimate": None if est is None else {
                "iteration_s": est.iteration_s, "mfu": est.mfu,
                "tokens_per_s": est.tokens_per_s, "stage_memory_gb": list(est.stage_memory_gb),
                "hourly_usd": est.hourly_usd, "total_hours": est.total_hours,
                "total_usd": est.total_usd, "iterations": est.iterations,
                "peak_flops": est.peak_flops or None},
            "notes": notes, "torch": torch.__version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        writer = MetricsWriter(opts.metrics_path, header, resumed=start > 0)
        if start:
            print(f"resumed at step {start} (data position {position} sequences)", flush=True)
    saved_tensors = SavedTensors() if track else None
    per_replica = plan.micro_batch_size * plan.num_microbatches
    times: list[float] = []
    try:
        for step in range(start, steps):
            lr = opts.lr_at(step, steps)
            for g in opt.param_groups:
                g["lr"] = lr
            x = y = None
            if batches is not None:
                xs, ys = batches.next()
                rows = slice(None) if opts.reference else slice(
                    replica * per_replica, (replica + 1) * per_replica)
                x = torch.as_tensor(xs[rows]).to(device)
                y = torch.as_tensor(ys[rows]).to(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                torch.cuda.synchronize(device)
            if saved_tensors is not None:
                saved_tensors.peak = saved_tensors.live
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            amp = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype
                   else contextlib.nullcontext())
            hooks = saved_tensors.hooks() if saved_tensors is not None \
                else contextlib.nullcontext()
            with amp, hooks:
                losses = rt.step(x, y)
            sc = scaler_box[0]
            norm, overflow = clip_and_check(params, opts.clip, replica, tp_index,
                                            1.0 / sc.scale if sc is not None else 1.0)
            if not overflow:
                opt.step()
            elif sc is None:
                msg = (f"step {step}: the gradient norm is not finite (loss diverged); "
                       "lower --lr or raise --warmup-steps")
                raise TrainError(msg)
            if sc is not None:
                sc.update(overflow)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            times.append(dt)
            memory = _memory(params, opt, saved_tensors, device, my_group, pp_groups)
            loss = _loss(losses, rt, opts.reference, plan, sc)
            if writer is not None:
                assert loss is not None
                rec = {"kind": "step", "step": step, "index_in_run": step - start,
                       "loss": loss, "lr": lr, "grad_norm": norm, "step_s": dt,
                       "tokens_per_s": tokens_per_step / dt,
                       "tflops_per_s": flops / dt / 1e12 if flops else None,
                       "mfu": flops / (dt * peak) if flops and peak else None,
                       "skipped": overflow, "epoch": batches.epoch if batches else 0,
                       "memory": memory}
                if sc is not None:
                    rec["loss_scale"] = sc.scale
                writer.write(rec)
                if (step - start) % opts.log_every == 0 or step == steps - 1:
                    mfu = f", MFU {rec['mfu']:.1%}" if rec["mfu"] else ""
                    print(f"step {step}: loss {loss:.4f}, lr {lr:.3g}, grad norm {norm:.3g}, "
                          f"{dt * 1e3:.0f} ms, {tokens_per_step / dt:,.0f} tokens/s{mfu}"
                          + (" (skipped: fp16 overflow)" if overflow else ""), flush=True)
            # Save every `every` steps, or at the end when no interval applies; the data
            # position is agreed (a collective) only for a save.
            final = opts.checkpoint_every is None and ck is not None and ck.every == 0 \
                and step == steps - 1
            if ck is not None and (final or (ck.every and (step + 1) % ck.every == 0)):
                data: dict[str, Any] = {"sequences": batches.position if batches else 0}
                if sc is not None:
                    data["loss_scale"] = sc.scale
                ck.save(step, _agreed_position(data, rt))
        if writer is not None and times:
            timed = times[min(2, len(times) - 1):]
            print(f"median step time {statistics.median(timed):.3f} s over {len(timed)} steps; "
                  f"metrics in {opts.metrics_path}", flush=True)
    finally:
        if writer is not None:
            writer.close()
    if not opts.reference:
        from ..runner import stage as et

        et.shutdown()
    return 0


def _agreed_position(data: dict[str, Any], rt: Any) -> dict[str, Any]:
    """The data position every rank saves: the first stage's (ranks without data know none)."""
    pos = torch.tensor([data["sequences"]], dtype=torch.int64,
                       device=next(rt.module.parameters()).device)
    dist.all_reduce(pos, op=dist.ReduceOp.MAX)
    return {**data, "sequences": int(pos.item())}


def _loss(losses: Any, rt: Any, reference: bool, plan: Plan, sc: LossScaler | None) -> Any:
    """The step's mean loss over micro-batches and replicas, on the ranks that write it."""
    if losses is None:
        return None
    loss = torch.stack([x.detach().float() for x in losses]).mean()
    if sc is not None:
        loss = loss / sc.scale
    if not reference and plan.dp > 1:
        dist.all_reduce(loss, group=rt.dp_group)
        loss = loss / plan.dp
    return float(loss.item())


def _memory(params: list[Any], opt: Any, saved: SavedTensors | None, device: Any,
            group: int, groups: int) -> list[dict[str, Any]]:
    """Per GPU group of the plan, the largest over its ranks of each memory term (GB)."""
    p_bytes = _bytes(params)
    g_bytes = _bytes(p.grad for p in params if p.grad is not None)
    o_bytes = optimizer_bytes(opt)
    a_bytes = saved.peak if saved is not None else -1
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = p_bytes + g_bytes + o_bytes + max(a_bytes, 0)
    row = torch.zeros((groups, 5), dtype=torch.float64, device=device)
    row[:, 4] = -1  # activations not tracked, unless some rank of the group tracked them
    row[group] = torch.tensor([peak, p_bytes, g_bytes, o_bytes, a_bytes], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(row, op=dist.ReduceOp.MAX)
    out = []
    for s in range(groups):
        peak_b, pb, gb, ob, ab = row[s].tolist()
        out.append({"stage": s, "peak_gb": peak_b / GB, "params_gb": pb / GB,
                    "grads_gb": gb / GB, "optimizer_gb": ob / GB,
                    "activations_gb": ab / GB if ab >= 0 else None})
    return out


def _compile(rt: Any) -> None:
    """``torch.compile`` every transformer block the rank holds, in place."""
    chunks = getattr(rt, "chunks", None) or [rt.module]
    for chunk in chunks:
        for sub in chunk.modules():
            if isinstance(sub, em.Block):
                sub.compile()
