// The analytic cost model: parameters, FLOPs, memory, communication and the
// iteration/job estimate of a pipeline-parallel plan. Pure C++ (no pybind11) so
// it can be tested and fuzzed natively. Formulas and sources: docs/cost-model.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace espresso {

enum class Schedule : int { OneFOneB = 0, GPipe = 1 };
// Full: every block's forward runs again in the backward; Selective: only the attention
// core (Korthikanti et al. 2022), which keeps every other tensor the block saves.
// SelectiveOp: torchtitan's per-op selective activation checkpointing ("selective" with
// selective_ac_option "op"): the outputs of every other matmul and of the attention kernel are
// saved, everything else is recomputed (docs/cost-model.md, "Memory per GPU of a stage").
enum class Recompute : int { None = 0, Full = 1, Selective = 2, SelectiveOp = 3 };
// How a stage's model states are sharded over its data-parallel replicas (ZeRO stages,
// Rajbhandari et al. 2020): optimizer states (Zero1), plus gradients (Zero2), plus the
// weights themselves, gathered block by block for compute (Full: FSDP / ZeRO-3).
enum class Sharding : int { None = 0, Zero1 = 1, Zero2 = 2, Full = 3 };

// Decoder-only transformer, as the Python ModelSpec.
struct ModelDims {
    std::int64_t num_layers = 0;
    std::int64_t hidden_size = 0;
    std::int64_t num_heads = 0;
    std::int64_t num_kv_heads = 0;
    std::int64_t ffn_hidden_size = 0;
    std::int64_t vocab_size = 0;
    bool gated_mlp = false;
    bool tied_embeddings = false;
    std::int64_t position_embeddings = 0;  // rows of a learned position table (0: rotary)
    bool layernorm = false;                // LayerNorm with bias; false: RMSNorm
    bool linear_bias = false;              // biases on the linear layers
};

// One GPU type of the catalog, in the units of the catalog contract.
struct GpuSpec {
    double memory_gb = 0;           // GB (1e9 bytes) per GPU
    double memory_bytes = 0;        // the card's capacity as the driver reports it; 0: memory_gb GB
    double tflops = 0;              // dense bf16 (fp16) peak, TFLOP/s
    double fp8_tflops = 0;          // dense fp8 peak, TFLOP/s; 0: no fp8 tensor cores
    double mem_bandwidth_gbs = 0;   // GB/s
    double intra_node_gbs = 0;      // GB/s per GPU, one direction
    double inter_node_gbs = 0;      // GB/s per GPU, one direction
    double efficiency = 0;          // matmul fraction of peak (MAMF); 0: use CostParams
    double price_per_hour = 0;      // USD per GPU-hour (an instance's price / gpus_per_node)
    std::int64_t count = 0;         // availability, GPUs (whole instances: a multiple of the node)
    std::int64_t gpus_per_node = 1; // GPUs per instance; a plan rents whole instances
    // Spot market (0: on-demand): interruptions per instance-hour, and the hours until a
    // reclaimed instance is replaced (docs/cost-model.md, "Spot capacity").
    double interruptions_per_hour = 0;
    double recovery_hours = 0;
    // A limit shared with other offers (a cloud quota such as AWS's vCPUs per instance
    // family, SearchOptions::pools): its index (-1: none) and what one instance uses of it.
    std::int64_t pool = -1;
    double pool_units = 0;
    // Measured profile (espresso.profile), as factors on the analytic model: a block's
    // forward and backward compute time, the head's, and a block's stashed activations.
    // 1: analytic. profile_min_time_scale() is the least of the four time factors.
    double block_fwd_scale = 1.0;
    double block_bwd_scale = 1.0;
    double head_fwd_scale = 1.0;
    double head_bwd_scale = 1.0;
    double activation_scale = 1.0;
};

// The least time factor of a GPU type's profile (1 without one): every FLOP it runs takes
// at least this fraction of its analytic time, which keeps the search's bounds admissible.
double profile_min_time_scale(const GpuSpec& g);
// The least backward/forward ratio of the profile's time factors relative to the analytic
// ratio (at most 1): bounds that assume a backward costs q-1 forwards use q-1 times this.
double profile_bwd_fwd_ratio(const GpuSpec& g);

// Every constant of the model, named; defaults are documented in docs/cost-model.md.
struct CostParams {
    double efficiency = 0.8;                  // matmul fraction of peak (MAMF) when a GPU type gives none
    double sustained_fraction = 0.8;          // of that, what a training step sustains (calibrated)
    double fp8_efficiency = 0.8;              // fp8 GEMMs' matmul efficiency relative to bf16's (fitted)
    double attention_efficiency = 0.5;        // fused (flash) attention kernels, fraction of peak
    bool overlap_grad_reduce = true;          // DP gradient reduction overlaps the backward
    bool overlap_param_gather = false;        // ZeRO-1's weight all-gather overlaps the next forward
    bool p2p_overlap = true;                  // pipeline sends overlap compute (async)
    bool p2p_scatter_gather = false;          // each TP rank sends 1/tp of a boundary's tensor
    double bytes_per_weight = 2.0;            // bf16 weights
    double bytes_per_grad = 2.0;              // bf16 grads (4: fp32 accumulation)
    bool zero1 = false;                       // shard optimizer states over DP
    bool flash_attention = true;              // no s^2 score activations
    bool dropout_masks = true;                // 1-byte masks, as Korthikanti et al.
    double bytes_per_activation = 2.0;        // bf16 activations
    double bytes_per_logit = 4.0;             // fp32 logits the head writes and reads (time)
    double loss_bytes_per_logit = 6.0;        // held per logit at the loss's peak (memory)
    bool stash_stage_io = false;              // in-flight micro-batches' stage input, output kept
    bool clone_stage_input = false;           // the engine runs a stage on a copy of its input
    bool persistent_recv_buffers = false;     // receive buffers stay allocated (DeepSpeed, torch)
    bool recv_buffers_per_microbatch = false; // one per micro-batch and direction (torch)
    bool short_1f1b_as_gpipe = true;          // 1F1B with fewer micro-batches than stages: GPipe
    double optimizer_transient_bytes_per_param = 0.0;  // the optimizer step's intermediates
    bool unfused_fp32_copies = false;         // norms and rotary keep fp32 copies (HF-style)
    std::int64_t kept_last_buffers = 0;       // last stage's pipe buffers never freed (DeepSpeed: 2)
    double blas_workspace_mib = 0.0;          // cuBLAS workspace from the caching allocator
    double reserved_gb = 1.5;                 // CUDA context (and NCCL buffers, unless counted below)
    double nccl_gb_per_group = 0.0;           // NCCL buffers of each communicator a stage's GPU joins
    double memory_reserve_fraction = 0.05;    // allocator fragmentation
    double link_efficiency = 0.8;             // achieved fraction of link bandwidth
    double link_latency_s = 1e-5;             // per message
    double optimizer_step_bytes_per_param = 28.0;  // memory traffic of one Adam step
    double memory_bandwidth_efficiency = 0.8;
    // Spot plans (docs/cost-model.md, "Spot capacity"): the aggregate GB/s at which the model
    // and optimizer states are written to (and read back from) durable storage (0: free),
    // and a restart's hours besides new capacity and the read (processes, rendezvous).
    double checkpoint_gbs = 2.0;
    double restart_hours = 0.05;
};

// What the plan runs: batch shape, parallelism that is not per stage, the job.
struct Workload {
    std::int64_t seq_len = 0;
    std::int64_t micro_batch_size = 0;
    std::int64_t num_microbatches = 0;
    std::int64_t dp = 1;
    std::int64_t global_batch_size = 0;
    Schedule schedule = Schedule::OneFOneB;
    Recompute recompute = Recompute::None;
    Sharding sharding = Sharding::None;
    bool sequence_parallel = false;          // TP stages split norms and dropouts by sequence
    // The blocks' linear layers run their GEMMs in fp8 (Transformer Engine's recipes: inputs
    // cast to fp8 per GEMM, attention, norms and the LM head in bf16); GPUs without fp8
    // tensor cores (fp8_tflops 0) cannot run such a plan.
    bool fp8 = false;
    // Interleaved 1F1B: the stages are num_stages / v devices' v chunks each, stage s on device
    // s % (num_stages / v) (Megatron-LM's virtual pipeline stages). 1: plain schedules.
    std::int64_t virtual_stages = 1;
    double optimizer_bytes_per_param = 12.0;  // fp32 master + Adam m and v
    double iterations = 0;                    // optimizer steps of the job
    double deadline_hours = 0;
    // USD per GB sent between pipeline stages (0: none). Set for plans whose instances
    // span zones or regions; every stage boundary is charged (docs/catalog.md, "Scopes").
    double transfer_usd_per_gb = 0;
    // Spot plans (docs/cost-model.md, "Spot capacity"): the probability with which the
    // deadline must hold.
    double deadline_confidence = 0.9;
};

struct StageSpec {
    std::int64_t gpu = 0;          // index into the GPU list
    std::int64_t tp = 1;
    std::int64_t layer_begin = 0;  // half-open [begin, end) over transformer blocks
    std::int64_t layer_end = 0;
};

// Why a plan is infeasible; Python turns each into words.
enum class IssueKind : int {
    LayersNotCovered = 0,   // value: first layer not covered (or -1), limit: num_layers
    LayersOverlap = 1,      // stage starts before the previous one ends
    EmptyStage = 2,         // stage holds no transformer block
    OutOfMemory = 3,        // value: bytes needed, limit: bytes usable
    Availability = 4,       // gpu: type, value: GPUs used, limit: count
    TpExceedsNode = 5,      // value: tp, limit: gpus_per_node
    TpNotDivisor = 6,       // value: tp, limit: the dimension it must divide
    BatchMismatch = 7,      // value: dp*b*M, limit: global batch
};

struct Issue {
    IssueKind kind = IssueKind::LayersNotCovered;
    std::int64_t stage = -1;
    std::int64_t gpu = -1;
    double value = 0;
    double limit = 0;
    std::string what;  // for TpNotDivisor: the name of the dimension
};

struct StageEstimate {
    std::int64_t num_layers = 0;
    double params = 0;            // parameters held by the stage (all TP ranks)
    double fwd_flops = 0;         // forward FLOPs of one micro-batch (all TP ranks)
    double fwd_s = 0;             // per micro-batch
    double bwd_s = 0;             // per micro-batch, recomputation included
    double weights_bytes = 0;     // per GPU
    double grads_bytes = 0;
    double optimizer_bytes = 0;
    double activation_bytes = 0;  // stashed for the micro-batches in flight
    double transient_bytes = 0;   // recomputation working set, logits; the optimizer step's
                                  // excess over the activations (it runs once they are freed)
    double memory_bytes = 0;      // sum of the above
    double step_bytes = 0;        // the optimizer step's intermediates per GPU
    double persistent_bytes = 0;  // kept for the whole run (in activation_bytes): receive
                                  // buffers, kept pipe buffers, the BLAS workspace
    double capacity_bytes = 0;    // usable after head-room
    std::int64_t in_flight = 0;   // micro-batches whose activations are held
    double send_s = 0;            // activation transfer to the next stage (0 for last)
    bool send_intra_node = false;
    double dp_allreduce_s = 0;    // DP gradient (and parameter) traffic left exposed per step
    // The DP traffic itself, by what it may hide under (dp_allreduce_s is what of it a plain
    // pipeline leaves exposed; interleaved plans place it in their simulation): the
    // gradients' reduction under the last backward, the weights' gather under the next
    // step's first forward, and what runs after the pipeline in any case.
    double dp_under_backward_s = 0;
    double dp_under_forward_s = 0;
    double dp_exposed_s = 0;
    double optimizer_step_s = 0;
};

struct EstimateResult {
    std::vector<StageEstimate> stages;
    std::vector<std::int64_t> gpus_used;  // per GPU type
    std::vector<std::int64_t> instances;  // per GPU type: whole instances rented
    std::int64_t idle_gpus = 0;           // GPUs rented (whole instances) but unused
    double pipeline_s = 0;
    double dp_allreduce_s = 0;
    double optimizer_step_s = 0;
    double iteration_s = 0;
    double closed_form_s = 0;   // sum(f+b) + (M-1) max(f+b), a check
    double bubble_fraction = 0;
    std::int64_t bottleneck_stage = 0;
    double hourly_usd = 0;                 // whole instances
    double transfer_gb = 0;                // per iteration, charged at transfer_usd_per_gb
    double transfer_usd = 0;               // over the job
    double total_hours = 0;                // expected, interruptions included
    double total_usd = 0;
    // Spot (all equal to the plain figures, and 0, without spot instances): the hours of
    // work alone, the plan's interruption rate, the checkpoint interval and write time, a
    // restart's hours, the hours that hold at work.deadline_confidence and the
    // interruptions counted there (the quantile), and the expected interruptions.
    double work_hours = 0;
    double interruptions_per_hour = 0;
    double checkpoint_interval_hours = 0;
    double checkpoint_hours = 0;
    double restart_hours = 0;
    double hours_at_confidence = 0;
    double interruptions_expected = 0;
    std::int64_t interruptions_at_confidence = 0;
    double model_flops_per_iteration = 0;  // 6*N*T style count without recomputation
    bool feasible = true;
    bool meets_deadline = true;
    std::vector<Issue> issues;
};

// Per-block and per-model counts (exposed for tests and for the search's tables).
double kv_dim(const ModelDims& m);               // width of K (and of V)
double block_matmul_params(const ModelDims& m);  // parameters of a block's four projections
double block_params(const ModelDims& m);
double embedding_params(const ModelDims& m);    // token (+ position) table
double head_params(const ModelDims& m);         // output projection held by the last stage
double final_norm_params(const ModelDims& m);
double total_params(const ModelDims& m);        // the model's size (tied counted once)
double block_fwd_flops(const ModelDims& m, std::int64_t seq_len, std::int64_t micro_batch);
double head_fwd_flops(const ModelDims& m, std::int64_t seq_len, std::int64_t micro_batch);
// Bytes one block keeps for backward for one micro-batch on one GPU of a TP group (with
// sequence parallelism the norms' and dropouts' tensors are split over the group too).
// Bytes of the attention core's score-sized tensors (softmax output, dropout mask and output)
// of one block and micro-batch on one GPU of a TP group: 0 with flash attention. Selective
// recomputation does not keep them.
double attention_score_bytes(const ModelDims& m, const CostParams& p, std::int64_t seq_len,
                             std::int64_t micro_batch, std::int64_t tp);
double block_activation_bytes(const ModelDims& m, const CostParams& p, std::int64_t seq_len,
                              std::int64_t micro_batch, std::int64_t tp,
                              bool sequence_parallel = false);
// FLOPs of one block's forward that run on tensor cores at no more than peak * efficiency:
// the matmuls and the attention core (half of it under flash attention, which skips the
// causally masked blocks). Every block forward takes at least this over that rate, which
// keeps the search's rate bounds admissible.
double block_bound_flops(const ModelDims& m, const CostParams& p, std::int64_t seq_len,
                         std::int64_t micro_batch);
// The matmul efficiency a training step sustains on a GPU type: its measured matmul
// efficiency (else the cost model's default) times sustained_fraction.
double gemm_efficiency(const GpuSpec& g, const CostParams& p);
// The GPU has fp8 tensor cores (an fp8 peak above its bf16 one): an fp8 plan can use it.
bool has_fp8(const GpuSpec& g);
// The peak (TFLOP/s) a block's linear layers run at, before gemm_efficiency(): in an fp8
// plan on a GPU that has fp8, its dense fp8 peak times p.fp8_efficiency; else the bf16 one.
double linear_tflops(const GpuSpec& g, const Workload& w, const CostParams& p);

// Time of one block for one micro-batch on one GPU of a TP group of `tp` (block_time.cpp;
// docs/cost-model.md, "Compute"): matmuls by the roofline of each GEMM, the attention core, the memory-bound
// element-wise work, and the tensor-parallel collectives. A profile's factors apply.
struct BlockTimes {
    double fwd = 0;        // forward
    double bwd = 0;        // backward (no recomputation)
    double recompute = 0;  // what recomputation adds to the backward
    double tp_comm = 0;    // TP collectives of one forward (inside fwd; the backward has as much)
};
BlockTimes block_times(const ModelDims& m, const GpuSpec& g, const CostParams& p,
                       const Workload& w, std::int64_t tp);
// The head (final norm, output projection, loss) of one micro-batch on one GPU of a TP group.
BlockTimes head_times(const ModelDims& m, const GpuSpec& g, const CostParams& p,
                      const Workload& w, std::int64_t tp);
// Sharding: the divisor of weights, gradients and optimizer states over dp replicas.
struct StateShards {
    double weights = 1, grads = 1, optimizer = 1;
};
StateShards state_shards(Sharding s, std::int64_t dp);
constexpr double kGB = 1e9;  // bytes per GB (catalog units are decimal)

// Ring all-reduce time of `bytes` over `k` members at `gbs` GB/s per member.
double ring_allreduce_s(double bytes, std::int64_t k, double gbs, const CostParams& p);

// GB/s per GPU of the DP gradient all-reduce of a stage of `tp` GPUs of `g` with `dp`
// replicas: the intra-node link when all dp * tp GPUs fit in one node, else the network.
double dp_link_gbs(const GpuSpec& g, std::int64_t dp, std::int64_t tp);

// USD per hour of `gpus` GPUs of `g` rented as whole instances of gpus_per_node.
double billed_hourly(const GpuSpec& g, std::int64_t gpus);
// Whole instances that hold `gpus` GPUs of `g`.
std::int64_t instances_for(const GpuSpec& g, std::int64_t gpus);
// Spot plans: hours to write (and to read back) one checkpoint of the model and optimizer
// states (every parameter's weight and optimizer bytes) at p.checkpoint_gbs; 0 when free.
double checkpoint_hours(const ModelDims& m, const CostParams& p, const Workload& w);
// GB sent between the pipeline stages of one iteration (both directions, every replica).
double boundary_gb(const ModelDims& m, const CostParams& p, const Workload& w,
                   std::int64_t num_stages);

// The card's capacity in bytes (memory_bytes, else memory_gb GB).
double capacity_bytes(const GpuSpec& g);
// Usable memory of one GPU after the head-room (the most any stage on it has).
double usable_bytes(const GpuSpec& g, const CostParams& p);
// The NCCL communicators a GPU of a stage runs collectives in: its TP group (tp > 1), its DP
// group (dp > 1) and the pipeline (more than one stage).
std::int64_t nccl_groups(std::int64_t tp, std::int64_t dp, std::int64_t num_stages);
// Usable memory of one GPU of such a stage: usable_bytes() less its communicators' buffers
// (p.nccl_gb_per_group each).
double stage_capacity_bytes(const GpuSpec& g, const CostParams& p, std::int64_t tp,
                            std::int64_t dp, std::int64_t num_stages);
// Bytes one GPU sends across a pipeline boundary per micro-batch: the boundary's tensor, or
// with the scatter/gather optimisation (Narayanan et al. 2021, sec. 4.1) 1/tp of it, tp the
// narrower of the two stages' widths.
double p2p_bytes(const ModelDims& m, const CostParams& p, const Workload& w,
                 std::int64_t tp_from, std::int64_t tp_to);
// Blocking pipeline transfers (p2p_overlap off): every stage's operations also carry the
// transfers they receive and send, and no delay is left between stages.
void fold_transfers(std::vector<double>& fwd, std::vector<double>& bwd,
                    std::vector<double>& send_fwd, std::vector<double>& send_bwd);
// Time of one activation (or gradient) message between neighbouring stages.
double send_s(const GpuSpec& from, const GpuSpec& to, bool one_node, double bytes,
              const CostParams& p);
// Which pipeline boundaries run inside one instance, under the launch layout (espresso.launch):
// ranks go stage by stage, replica by replica; a stage whose dp * tp GPUs fit one instance
// goes whole to the first instance of its catalog row with room for all of them, otherwise
// each TP group to the first with room for it (instances in order). Boundary i is inside
// one instance when both stages rent the same row and both went whole into the same
// instance (so dp * (tp_i + tp_i+1) <= gpus_per_node: the bounds rely on it).
// `gpu[i]`, `tp[i]`: stage i's row and width (tp <= gpus_per_node).
std::vector<char> boundaries_in_instance(const std::vector<GpuSpec>& gpus,
                                         const std::vector<std::int64_t>& gpu,
                                         const std::vector<std::int64_t>& tp, std::int64_t dp);
// Whether a TP width splits the heads, the KV heads (or replicates them) and the MLP.
bool tp_divides(const ModelDims& m, std::int64_t tp);
// What one block stores per micro-batch on one GPU of a TP group under the workload's
// recomputation (`kept`, until its backward) and rebuilds one block at a time (`rebuilt`,
// transient): everything; each block's input and the whole block; or all but the attention
// scores, and those. Also the gradients a block's backward holds at once (`backward`) and the
// stage input or output the engine keeps per micro-batch in flight (`output`, 0 if it
// frees them).
struct BlockStash {
    double kept = 0, rebuilt = 0;
    double backward = 0;  // gradients a block's backward holds at once (incoming, MLP interior)
    double output = 0;    // a stage input or output per micro-batch, if the engine keeps them
    double hidden = 0;    // one boundary tensor (a stage's input or output) on one GPU
    bool input_in_buffer = false;  // a kept stage input is its receive buffer (counted there)
};
BlockStash block_stash(const ModelDims& model, const GpuSpec& g, const CostParams& params,
                       const Workload& work, std::int64_t tp);

// Memory of one GPU group under interleaved 1F1B from its stages' estimates (in chunk order):
// their model states, the largest transient set, and `peak_blocks` blocks' stashes (the most
// blocks' worth of one micro-batch its operation order holds: interleaved_peak_blocks).
struct DeviceMemory {
    double weights = 0, grads = 0, optimizer = 0, activations = 0, transient = 0, total = 0;
    // dp_allreduce_s: the DP traffic no schedule hides (the chunks' dp_exposed_s), a lower
    // bound of what the interleaved simulation leaves exposed.
    double dp_allreduce_s = 0, optimizer_step_s = 0;
    std::int64_t peak_blocks = 0;
};
DeviceMemory device_memory(const std::vector<StageEstimate>& chunks, const BlockStash& stash,
                           std::int64_t peak_blocks);

// Time and memory of stage `index` of `num_stages` holding `num_layers` blocks on `tp` GPUs
// of type `g` (everything but the transfer to the next stage). Inputs must be validated.
StageEstimate stage_cost(const ModelDims& model, const GpuSpec& g, const CostParams& params,
                         const Workload& work, std::int64_t tp, std::int64_t num_layers,
                         std::int64_t index, std::int64_t num_stages);
// Its memory alone (the fields up to capacity_bytes; times left 0): what stage_cost says of
// memory, without the block times.
StageEstimate stage_memory(const ModelDims& model, const GpuSpec& g, const CostParams& params,
                           const Workload& work, std::int64_t tp, std::int64_t num_layers,
                           std::int64_t index, std::int64_t num_stages);

void validate(const ModelDims& m);
void validate(const GpuSpec& g, std::size_t index);
void validate(const CostParams& p);
void validate(const Workload& w);

EstimateResult estimate(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                        const CostParams& params, const Workload& work,
                        const std::vector<StageSpec>& stages);
// The same, but an interleaved pipeline that cannot finish within `pipeline_limit_s` stops
// early with pipeline_s (and the times after it) +infinity: the placer's leaves.
EstimateResult estimate_within(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                               const CostParams& params, const Workload& work,
                               const std::vector<StageSpec>& stages, double pipeline_limit_s);

}  // namespace espresso
