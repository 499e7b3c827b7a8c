"""CostParams: every constant of the analytic cost model, named, with its default.

The formulas that use them are in docs/cost-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from . import _validate as v
from ._native import core
from .errors import SpecError


@dataclass(frozen=True, slots=True, kw_only=True)
class CostParams:
    """Constants of the cost model."""

    efficiency: float = 0.8
    """Matrix-multiply fraction of peak FLOP/s, as a matmul benchmark measures it, for a GPU
    type that gives no ``efficiency`` (the built-in specs carry measured ones: 0.78-0.87
    for B200, H100, H200 and A100; docs/cost-model.md, "Compute")."""
    sustained_fraction: float = 0.8
    """The fraction of that benchmark peak a training step sustains in its matmuls (clocks
    under sustained power, kernel tails). Calibrated on Megatron-LM's published A100 runs and
    checked on three other sources (bench/validate_published.py, bench/README.md)."""
    fp8_efficiency: float = 0.8
    """In an fp8 plan, the linear layers' GEMMs reach this fraction of the bf16 GEMMs' matmul
    efficiency, of the fp8 peak (``fp8_tflops``). Fitted with sustained_fraction on every
    published run (``python bench/validate_published.py --loo``; the fp8 runs are NVIDIA's
    dgxc-benchmarking and MLPerf GPT-3 175B tables on H100): 0.8; fitted without dgxc 0.75,
    without MLPerf 0.8. 1: as efficient as bf16 (no published fp8 matmul benchmark table)."""
    attention_efficiency: float = 0.5
    """Fraction of peak that fused (flash) attention kernels reach (FlashAttention-2: 50-73%
    of A100 peak forward, less backward; Dao 2023)."""
    overlap_grad_reduce: bool = True
    """The data-parallel gradient reduction overlaps the backward pass (DDP buckets,
    FSDP, Megatron-LM's overlap_grad_reduce); only the part that outlasts the last
    micro-batch's backward is exposed."""
    overlap_param_gather: bool = False
    """With ``zero1`` sharding: the weights' all-gather after the sharded optimizer step runs
    under the next step's first forward (Megatron-LM's ``--overlap-param-gather``, NeMo's
    ``overlap_param_sync``); off: it is exposed at the end of the step."""
    p2p_overlap: bool = True
    """Pipeline sends and receives overlap compute (asynchronous, as Espresso's runner and
    PyTorch's pipelining schedules run them); off: each transfer blocks both stages, as in
    Megatron-LM's 2021 schedules and DeepSpeed's pipeline engine."""
    p2p_scatter_gather: bool = False
    """Each TP rank sends 1/tp of a boundary's activation and the receiving group
    all-gathers it over its in-instance link (Megatron-LM's scatter/gather optimisation,
    Narayanan et al. 2021, sec. 4.1); off: every TP rank sends the whole tensor."""
    bytes_per_weight: float = 2.0
    """bf16 weights."""
    bytes_per_grad: float = 2.0
    """bf16 gradients; 4 for fp32 gradient accumulation as Megatron-LM does."""
    zero1: bool = False
    """Shard optimizer states over the data-parallel replicas (ZeRO stage 1)."""
    flash_attention: bool = True
    """Attention without materialised scores: drops the ``5 a s / h`` activation term."""
    dropout_masks: bool = True
    """Count the 1-byte dropout masks of Korthikanti et al.; off for dropout-free models."""
    bytes_per_activation: float = 2.0
    """bf16 activations and pipeline messages."""
    bytes_per_logit: float = 4.0
    """fp32 logits: the bytes per logit the head writes and the loss reads (time)."""
    loss_bytes_per_logit: float = 6.0
    """Bytes per logit of one micro-batch the last stage holds at the loss's peak (memory):
    6 for a fused vocabulary-parallel cross-entropy (Megatron-LM: the fp32 softmax it keeps,
    its gradient computed in place, and the bf16 gradient handed to the head); 14 for
    PyTorch's ``cross_entropy`` over bf16 logits cast to fp32 (the bf16 logits, the fp32
    log-probabilities it keeps and, in its backward, their gradient and the logits'
    gradient; the torch-native profile). docs/cost-model.md, "Memory per GPU of a stage"."""
    stash_stage_io: bool = False
    """Each micro-batch in flight keeps its stage's input and output tensors until its
    backward (``torch.distributed.pipelining`` keeps both in its forward cache to run the
    backward from them; under full or per-op recomputation the input is already the first
    block's checkpointed input); off: the engine frees the output once sent and the input is
    counted as the first block's (Megatron-LM's ``deallocate_output_tensor``)."""
    clone_stage_input: bool = False
    """With ``stash_stage_io``: the engine runs each stage on a copy of the input it received
    (DeepSpeed's pipeline engine, ``_exec_forward_pass``), so the received buffer is kept
    besides the first block's checkpointed input under recomputation too."""
    persistent_recv_buffers: bool = False
    """The engine allocates its pipeline receive buffers once and keeps them for the run,
    through the optimizer step: one for the activation (every stage but the first) and one for
    the gradient (every stage but the last), as DeepSpeed's pipeline engine does
    (``pipe_recv_buf``, ``grad_layer``); off: each received tensor is allocated per message
    and freed with its micro-batch (Megatron-LM)."""
    recv_buffers_per_microbatch: bool = False
    """With ``persistent_recv_buffers``: one buffer per micro-batch and direction, as
    ``torch.distributed.pipelining``'s ``PipelineStage`` allocates them before the first step
    (``_setup_forward_recv_info``, ``_create_grad_recv_info``); the stage runs on the buffer
    itself, so a kept input is counted there (the torch-native profile)."""
    optimizer_transient_bytes_per_param: float = 0.0
    """Bytes per parameter the optimizer step allocates for its intermediates, on the share
    of the parameters a GPU updates; the step runs after the last backward, so they count
    where they exceed the activations. 0 for fused optimizers (Megatron-LM's FusedAdam); 4 in
    the torch-native profile: PyTorch's foreach Adam "uses ~ sizeof(params) more peak memory
    than the for-loop version due to the intermediates being a tensorlist" (torch.optim's
    ``foreach`` documentation), fp32 parameters."""
    unfused_fp32_copies: bool = False
    """Unfused (Hugging Face style) block code: each RMSNorm keeps the fp32 copy of its input
    (``x.to(float32).pow(2)``), and a rotary embedding computed in fp32 keeps fp32 copies of
    Q and K (CoLLiE's ``RMSNormalize`` and ``RotaryPositionEmbedding``); off: fused kernels,
    Korthikanti et al.'s count."""
    kept_last_buffers: int = 0
    """Pipe buffers the last stage never frees, each keeping the last micro-batch it ran: its
    bf16 logits and three hidden-state tensors (the input's copy and what the output dict
    carries), through the optimizer step and the next forward. DeepSpeed's pipeline engine:
    2 (its ``_exec_backward_pass`` returns on the last stage before releasing its buffers;
    ``TrainSchedule.num_pipe_buffers`` gives it ``max(2, min(P - i, M))``); 0: freed after
    the backward (Megatron-LM, ``torch.distributed.pipelining``)."""
    blas_workspace_mib: float = 0.0
    """The cuBLAS workspace PyTorch takes from its caching allocator on the first matmul of a
    stream and keeps for the run (it counts in ``max_memory_allocated``): 32 MiB on Hopper,
    8.125 MiB (``:4096:2:16:8``) before it, since PyTorch 2.0 (pytorch/pytorch#89027,
    #91564). 0 leaves it out (a CPU run)."""
    short_1f1b_as_gpipe: bool = True
    """Memory of a 1F1B plan with fewer micro-batches than stages: held as GPipe holds it (all
    ``M`` on every stage), as espresso's runner runs such a plan (PyTorch's 1F1B needs a
    micro-batch per stage); off: as 1F1B, stage ``i`` holding ``min(P - i, M)`` (Megatron-LM,
    DeepSpeed). Its time is GPipe's either way (the order differs only after the warm-up)."""
    reserved_gb: float = 1.5
    """Memory per GPU that training cannot use: the CUDA context (about 0.3-0.4 GB with
    CUDA's lazy module loading, PyTorch's default since 1.13: pytorch/pytorch#86509,
    #109888), the libraries' kernels loaded into it, and the NCCL buffers unless
    ``nccl_gb_per_group`` counts them. The engine profiles set 0.5 with NCCL counted apart;
    1.5 (the default, both together) keeps older plans as they were."""
    nccl_gb_per_group: float = 0.0
    """NCCL buffers of each communicator a stage's GPU runs collectives in (its TP group,
    its DP group, the pipeline's), taken off that stage's usable memory. NCCL gives every
    channel of a ring connection its three protocols' buffers: 4 MiB (Simple), 4.69 MiB
    (LL128) and 0.5 MiB (LL), 9.19 MiB (NCCL src/init.cc, DEFAULT_BUFFSIZE and the LL/LL128
    defaults from src/include/device.h); a ring has two connections per channel whatever its
    size, and NVLink H100 communicators open 32 channels (NVIDIA/nccl#1685, #986): 0.62 GB,
    the engine profiles' value. Tree and NVLS algorithms, all-to-all and more channels take
    more (NVIDIA/nccl#864 measured about 1.6 GB for one communicator). 0: counted in
    ``reserved_gb``."""
    memory_reserve_fraction: float = 0.05
    """Fraction of memory lost to allocator fragmentation."""
    link_efficiency: float = 0.8
    """Achieved fraction of a link's nominal bandwidth."""
    link_latency_s: float = 1e-5
    """Latency of one message (per ring step in collectives)."""
    optimizer_step_bytes_per_param: float = 28.0
    """Memory traffic of one Adam step per parameter: read fp32 master, m, v and bf16 grad
    (14 B), write master, m, v and bf16 weight (14 B)."""
    memory_bandwidth_efficiency: float = 0.8
    """Achieved fraction of device-memory bandwidth in the optimizer step."""
    checkpoint_gbs: float = 2.0
    """Plans with spot instances: aggregate GB/s at which the model and optimizer states are
    written to durable storage and read back on a restart (0: free). An assumption, not a
    measurement: set it to what your storage sustains (docs/cost-model.md, "Spot capacity")."""
    restart_hours: float = 0.05
    """Plans with spot instances: a restart's hours besides new capacity and reading the
    checkpoint (processes, rendezvous, warm-up); an assumption (3 minutes)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            val = getattr(self, f.name)
            if f.type in ("bool", bool):
                v.boolean(f"cost_model.{f.name}", val)
            elif f.type in ("int", int):
                object.__setattr__(self, f.name, v.integer(f"cost_model.{f.name}", val, minimum=0))
            else:
                object.__setattr__(self, f.name, v.number(f"cost_model.{f.name}", val))
        try:
            core.validate_cost_params(self._core())
        except ValueError as exc:
            raise SpecError(str(exc)) from None

    def _core(self) -> Any:
        c = core.CostParams()
        for f in fields(self):
            setattr(c, f.name, getattr(self, f.name))
        return c

    @classmethod
    def from_dict(cls, data: Any) -> CostParams:
        data = v.mapping("cost_model", data)
        v.known_keys("cost_model", data, [f.name for f in fields(cls)])
        return cls(**dict(data))

    def to_dict(self, *, only_changed: bool = False) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if only_changed:
            default = CostParams()
            out = {k: val for k, val in out.items() if getattr(default, k) != val}
        return out
