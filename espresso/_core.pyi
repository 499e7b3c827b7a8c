"""Type stubs of the compiled core (csrc/bindings). tests/test_core.py checks the names."""

from enum import Enum

class Schedule(Enum):
    ONE_F_ONE_B = 0
    GPIPE = 1

class Recompute(Enum):
    NONE = 0
    FULL = 1
    SELECTIVE = 2
    SELECTIVE_OP = 3

class Sharding(Enum):
    NONE = 0
    ZERO1 = 1
    ZERO2 = 2
    FULL = 3

class IssueKind(Enum):
    LAYERS_NOT_COVERED = 0
    LAYERS_OVERLAP = 1
    EMPTY_STAGE = 2
    OUT_OF_MEMORY = 3
    AVAILABILITY = 4
    TP_EXCEEDS_NODE = 5
    TP_NOT_DIVISOR = 6
    BATCH_MISMATCH = 7

class ModelDims:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    gated_mlp: bool
    tied_embeddings: bool
    position_embeddings: int
    layernorm: bool
    linear_bias: bool
    def __init__(self) -> None: ...

class GpuSpec:
    def __copy__(self) -> GpuSpec: ...
    memory_gb: float
    memory_bytes: float
    tflops: float
    fp8_tflops: float
    mem_bandwidth_gbs: float
    intra_node_gbs: float
    inter_node_gbs: float
    efficiency: float
    price_per_hour: float
    count: int
    gpus_per_node: int
    interruptions_per_hour: float
    recovery_hours: float
    block_fwd_scale: float
    block_bwd_scale: float
    head_fwd_scale: float
    head_bwd_scale: float
    activation_scale: float
    def __init__(self) -> None: ...

class CostParams:
    efficiency: float
    sustained_fraction: float
    attention_efficiency: float
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    fp8_efficiency: float
    nccl_gb_per_group: float
    p2p_overlap: bool
    p2p_scatter_gather: bool
    bytes_per_weight: float
    bytes_per_grad: float
    zero1: bool
    flash_attention: bool
    dropout_masks: bool
    bytes_per_activation: float
    bytes_per_logit: float
    loss_bytes_per_logit: float
    stash_stage_io: bool
    clone_stage_input: bool
    persistent_recv_buffers: bool
    recv_buffers_per_microbatch: bool
    short_1f1b_as_gpipe: bool
    optimizer_transient_bytes_per_param: float
    unfused_fp32_copies: bool
    kept_last_buffers: int
    blas_workspace_mib: float
    reserved_gb: float
    memory_reserve_fraction: float
    link_efficiency: float
    link_latency_s: float
    optimizer_step_bytes_per_param: float
    memory_bandwidth_efficiency: float
    checkpoint_gbs: float
    restart_hours: float
    def __init__(self) -> None: ...

class Workload:
    seq_len: int
    micro_batch_size: int
    num_microbatches: int
    dp: int
    global_batch_size: int
    schedule: Schedule
    recompute: Recompute
    sharding: Sharding
    sequence_parallel: bool
    fp8: bool
    virtual_stages: int
    optimizer_bytes_per_param: float
    iterations: float
    deadline_hours: float
    transfer_usd_per_gb: float
    deadline_confidence: float
    def __init__(self) -> None: ...

class StageSpec:
    gpu: int
    tp: int
    layer_begin: int
    layer_end: int
    def __init__(self, gpu: int = ..., tp: int = ..., layer_begin: int = ...,
                 layer_end: int = ...) -> None: ...

class Issue:
    @property
    def kind(self) -> IssueKind: ...
    @property
    def stage(self) -> int: ...
    @property
    def gpu(self) -> int: ...
    @property
    def value(self) -> float: ...
    @property
    def limit(self) -> float: ...
    @property
    def what(self) -> str: ...

class StageEstimate:
    num_layers: int
    params: float
    fwd_flops: float
    fwd_s: float
    bwd_s: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    transient_bytes: float
    persistent_bytes: float
    memory_bytes: float
    capacity_bytes: float
    in_flight: int
    send_s: float
    send_intra_node: bool
    dp_allreduce_s: float
    optimizer_step_s: float

class EstimateResult:
    stages: list[StageEstimate]
    gpus_used: list[int]
    pipeline_s: float
    dp_allreduce_s: float
    optimizer_step_s: float
    iteration_s: float
    closed_form_s: float
    bubble_fraction: float
    bottleneck_stage: int
    hourly_usd: float
    instances: list[int]
    idle_gpus: int
    transfer_gb: float
    transfer_usd: float
    total_hours: float
    total_usd: float
    work_hours: float
    interruptions_per_hour: float
    checkpoint_interval_hours: float
    checkpoint_hours: float
    restart_hours: float
    hours_at_confidence: float
    interruptions_expected: float
    interruptions_at_confidence: int
    model_flops_per_iteration: float
    feasible: bool
    meets_deadline: bool
    issues: list[Issue]

class PipelineResult:
    makespan_s: float
    busy_s: list[float]
    bubble_fraction: float

class TimelineOp:
    stage: int
    microbatch: int
    backward: bool
    start_s: float
    end_s: float

def block_params(model: ModelDims) -> float: ...
def embedding_params(model: ModelDims) -> float: ...
def head_params(model: ModelDims) -> float: ...
def final_norm_params(model: ModelDims) -> float: ...
def total_params(model: ModelDims) -> float: ...
def block_fwd_flops(model: ModelDims, seq_len: int, micro_batch: int) -> float: ...
def head_fwd_flops(model: ModelDims, seq_len: int, micro_batch: int) -> float: ...
def block_activation_bytes(model: ModelDims, params: CostParams, seq_len: int,
                           micro_batch: int, tp: int,
                           sequence_parallel: bool = False) -> float: ...
class BlockTimes:
    fwd: float
    bwd: float
    recompute: float
    tp_comm: float

def block_times(model: ModelDims, gpu: GpuSpec, params: CostParams, work: Workload,
                tp: int) -> BlockTimes: ...
def head_times(model: ModelDims, gpu: GpuSpec, params: CostParams, work: Workload,
               tp: int) -> BlockTimes: ...
def block_bound_flops(model: ModelDims, params: CostParams, seq_len: int,
                      micro_batch: int) -> float: ...
class SpotOutcome:
    interval_hours: float
    expected_hours: float
    hours_at_confidence: float
    interruptions_expected: float
    interruptions_at_confidence: int
    bounded: bool

def optimal_interval_hours(rate: float, checkpoint: float) -> float: ...
def spot_factor(rate: float, checkpoint: float, restart: float) -> float: ...
def spot_factor_at(rate: float, checkpoint: float, restart: float, interval: float) -> float: ...
def spot_outcome(work_hours: float, rate: float, checkpoint: float, restart: float,
                 confidence: float) -> SpotOutcome: ...
def hours_at_confidence_lb(work_hours: float, rate: float, checkpoint: float, restart: float,
                           confidence: float, cap: float = ...) -> float: ...
def checkpoint_hours(model: ModelDims, params: CostParams, work: Workload) -> float: ...
def ring_allreduce_s(bytes: float, k: int, gbs: float, params: CostParams) -> float: ...
def validate_model(model: ModelDims) -> None: ...
def validate_cost_params(params: CostParams) -> None: ...
def estimate(model: ModelDims, gpus: list[GpuSpec], params: CostParams, work: Workload,
             stages: list[StageSpec]) -> EstimateResult: ...
def simulate_pipeline(fwd_s: list[float], bwd_s: list[float], send_fwd_s: list[float],
                      send_bwd_s: list[float], num_microbatches: int,
                      schedule: Schedule) -> PipelineResult: ...
def pipeline_timeline(fwd_s: list[float], bwd_s: list[float], send_fwd_s: list[float],
                      send_bwd_s: list[float], num_microbatches: int,
                      schedule: Schedule) -> list[TimelineOp]: ...
def interleaved_makespan(fwd_s: list[float], bwd_s: list[float], send_fwd_s: list[float],
                         send_bwd_s: list[float], num_devices: int,
                         num_microbatches: int, abort_above: float = ...) -> float: ...
def interleaved_run(fwd_s: list[float], bwd_s: list[float], send_fwd_s: list[float],
                    send_bwd_s: list[float], num_devices: int, num_microbatches: int,
                    under_backward: list[float] = ..., under_forward: list[float] = ...,
                    exposed: list[float] = ...) -> tuple[float, list[float]]: ...
def interleaved_peak(per_chunk: list[float], num_devices: int, device: int,
                     num_microbatches: int) -> float: ...
def closed_form_s(fwd_s: list[float], bwd_s: list[float], num_microbatches: int) -> float: ...
def in_flight(schedule: Schedule, stage: int, num_stages: int, num_microbatches: int,
              short_as_gpipe: bool = ...) -> int: ...

class StageGroup:
    gpu: int
    tp: int
    def __init__(self, gpu: int, tp: int) -> None: ...

class PlaceOptions:
    cutoff_s: float
    node_limit: int
    memo_limit: int
    ratio_order: bool
    even_split: bool
    middle_equal: bool
    fixed_order: bool
    time_limit_s: float
    table_limit: int
    def __init__(self) -> None: ...

class Placement:
    found: bool
    stages: list[StageSpec]
    iteration_s: float
    lower_bound_s: float
    exhaustive: bool
    timed_out: bool
    nodes: int
    leaves: int

class SearchMonitor:
    @property
    def best(self) -> float: ...
    @property
    def lower_bound(self) -> float: ...
    @property
    def nodes_expanded(self) -> int: ...
    @property
    def leaves_placed(self) -> int: ...
    def cancel(self) -> None: ...
    def __init__(self) -> None: ...

class SharedIncumbent:
    @property
    def value(self) -> float: ...
    def __init__(self) -> None: ...

class Crew:
    def __init__(self) -> None: ...
    def help(self) -> None: ...
    def stop_after(self, seconds: float) -> None: ...
    def share(self, seconds: float) -> None: ...
    def yield_now(self) -> None: ...
    @property
    def helpers(self) -> int: ...

class Objective(Enum):
    COST = 0
    TIME = 1

class SearchOptions:
    micro_batch_sizes: list[int]
    recompute: list[Recompute]
    sharding: list[Sharding]
    virtual_stages: list[int]
    schedule: Schedule
    max_stages: int
    max_stages_by_types: list[int]
    max_tp: int
    min_tp: int
    max_dp: int
    objective: Objective
    budget_usd: float
    enforce_deadline: bool
    time_limit_s: float
    max_gpu_types: int
    incumbent: float
    gap: float
    shared: SharedIncumbent | None
    share_plans: bool
    monitor: SearchMonitor | None
    crew: Crew | None
    threads: int
    top_k: int
    max_frontier: int
    placer: PlaceOptions
    prune_cost: bool
    prune_deadline: bool
    prune_memory: bool
    prune_dominance: bool
    def __init__(self) -> None: ...

class SearchStats:
    nodes_expanded: int
    nodes_generated: int
    pruned_cost: int
    pruned_deadline: int
    pruned_memory: int
    pruned_availability: int
    pruned_dominance: int
    leaves_placed: int
    placer_nodes: int
    placer_leaves: int
    frontier_peak: int
    dives: int
    combos: int
    seconds: float
    first_plan_s: float
    lower_bound: float
    complete: bool
    timed_out: bool
    threads: int

class SearchPlan:
    work: Workload
    stages: list[StageSpec]
    estimate: EstimateResult
    objective: float

class SearchResult:
    plans: list[SearchPlan]
    stats: SearchStats

def place(model: ModelDims, gpus: list[GpuSpec], params: CostParams, work: Workload,
          groups: list[StageGroup], options: PlaceOptions) -> Placement: ...
def search(model: ModelDims, gpus: list[GpuSpec], params: CostParams, job: Workload,
           options: SearchOptions) -> SearchResult: ...
