#include "espresso/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "espresso/pipeline_sim.hpp"
#include "espresso/spot.hpp"

namespace espresso {

namespace {


// Bounds that keep every product below 2^53 and every allocation small.
constexpr std::int64_t kMaxDim = 1 << 20;          // hidden, ffn, heads
constexpr std::int64_t kMaxVocab = 1 << 24;
constexpr std::int64_t kMaxLayers = 100000;
constexpr std::int64_t kMaxSeq = 1 << 24;
constexpr std::int64_t kMaxBatch = 1 << 24;
constexpr std::int64_t kMaxTp = 1024;
constexpr std::int64_t kMaxDp = 1 << 20;

[[noreturn]] void bad(const std::string& field, double value, const std::string& expected) {
    std::ostringstream os;
    os << field << " must be " << expected << ", got " << value;
    throw std::invalid_argument(os.str());
}

void check_int(const std::string& field, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi) {
        bad(field, static_cast<double>(v),
            "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
}

void check_nonneg(const std::string& field, double v) {
    if (!std::isfinite(v) || v < 0) bad(field, v, "a finite number >= 0");
}

// Bytes per element (weight, gradient, activation, logit, parameter): no number format or
// optimizer holds more than a few dozen; the bound keeps every memory term finite.
constexpr double kMaxBytesPerElement = 1024.0;

void check_bytes(const std::string& field, double v, bool allow_zero) {
    if (!std::isfinite(v) || v > kMaxBytesPerElement || v < 0 || (!allow_zero && v == 0)) {
        bad(field, v, allow_zero ? "in [0, 1024] bytes" : "in (0, 1024] bytes");
    }
}

// Rates and fractions have floors so that no time can overflow to infinity: with the
// bounds on the model and batch, the largest time stays below 1e40 s.
constexpr double kMinFraction = 1e-6;
constexpr double kMinRate = 1e-9;  // TFLOP/s or GB/s
constexpr double kMaxRate = 1e12;

void check_fraction(const std::string& field, double v, bool allow_zero) {
    const bool zero_ok = allow_zero && v == 0;
    if (!std::isfinite(v) || v > 1 || (!zero_ok && v < kMinFraction)) {
        bad(field, v, allow_zero ? "0 (default) or in [1e-6, 1]" : "in [1e-6, 1]");
    }
}

void check_rate(const std::string& field, double v) {
    if (!std::isfinite(v) || v < kMinRate || v > kMaxRate) bad(field, v, "in [1e-9, 1e12]");
}

double d(std::int64_t v) { return static_cast<double>(v); }

}  // namespace

double kv_dim(const ModelDims& m) {
    return d(m.num_kv_heads) * d(m.hidden_size) / d(m.num_heads);
}

double block_matmul_params(const ModelDims& m) {
    const double h = d(m.hidden_size), f = d(m.ffn_hidden_size);
    const double attn = h * (h + 2.0 * kv_dim(m)) + h * h;  // QKV + output projection
    const double mlp = (m.gated_mlp ? 3.0 : 2.0) * h * f;
    return attn + mlp;
}

double block_params(const ModelDims& m) {
    const double h = d(m.hidden_size), f = d(m.ffn_hidden_size);
    const double norms = (m.layernorm ? 4.0 : 2.0) * h;  // two norms, weight (+ bias)
    double bias = 0;
    if (m.linear_bias) {
        bias = (h + 2.0 * kv_dim(m)) + h + (m.gated_mlp ? 2.0 : 1.0) * f + h;
    }
    return block_matmul_params(m) + norms + bias;
}

double embedding_params(const ModelDims& m) {
    return d(m.vocab_size) * d(m.hidden_size) + d(m.position_embeddings) * d(m.hidden_size);
}

double head_params(const ModelDims& m) {
    // A tied head still needs the V x h matrix on the last stage when it is not stage 0.
    return d(m.vocab_size) * d(m.hidden_size);
}

double final_norm_params(const ModelDims& m) {
    return (m.layernorm ? 2.0 : 1.0) * d(m.hidden_size);
}

double total_params(const ModelDims& m) {
    return d(m.num_layers) * block_params(m) + embedding_params(m) +
           (m.tied_embeddings ? 0.0 : head_params(m)) + final_norm_params(m);
}

double block_fwd_flops(const ModelDims& m, std::int64_t seq_len, std::int64_t micro_batch) {
    const double tokens = d(seq_len) * d(micro_batch);
    return 2.0 * tokens * block_matmul_params(m) +
           4.0 * tokens * d(seq_len) * d(m.hidden_size);  // QK^T and attention over V
}

double head_fwd_flops(const ModelDims& m, std::int64_t seq_len, std::int64_t micro_batch) {
    return 2.0 * d(seq_len) * d(micro_batch) * d(m.hidden_size) * d(m.vocab_size);
}

double block_activation_bytes(const ModelDims& m, const CostParams& p, std::int64_t seq_len,
                              std::int64_t micro_batch, std::int64_t tp, bool sequence_parallel) {
    const double s = d(seq_len), b = d(micro_batch), h = d(m.hidden_size);
    const double f = d(m.ffn_hidden_size), a = d(m.num_heads), t = d(tp);
    const double sb = s * b, act = p.bytes_per_activation;
    // Held on every TP rank: inputs of the QKV and MLP projections and of the two norms.
    double replicated = 4.0 * sb * h * act;
    if (p.dropout_masks) replicated += 2.0 * sb * h;  // attention- and MLP-output masks
    // Split over TP ranks: Q, K, V, the output-projection input and the MLP interior.
    double split = (2.0 * sb * h + 2.0 * sb * kv_dim(m)) * act;
    split += (m.gated_mlp ? 4.0 : 2.0) * sb * f * act;
    if (p.flash_attention) {
        split += 4.0 * a * sb;  // fp32 log-sum-exp per head and row
    }
    if (p.unfused_fp32_copies) {
        // Unfused (HF-style) code: each RMSNorm keeps the fp32 copy of its input its square
        // is taken of, and a rotary embedding computed in fp32 keeps fp32 copies of Q and K.
        replicated += 2.0 * 4.0 * sb * h;
        if (m.position_embeddings == 0) split += 4.0 * sb * (h + kv_dim(m));
    }
    // The non-flash softmax output (+ dropout mask and dropout output): attention_score_bytes.
    return (sequence_parallel ? replicated / t : replicated) + split / t +
           attention_score_bytes(m, p, seq_len, micro_batch, tp);
}

double attention_score_bytes(const ModelDims& m, const CostParams& p, std::int64_t seq_len,
                             std::int64_t micro_batch, std::int64_t tp) {
    if (p.flash_attention) return 0.0;  // FlashAttention keeps no score matrix
    const double s = d(seq_len), sb = s * d(micro_batch), act = p.bytes_per_activation;
    return (p.dropout_masks ? (2.0 * act + 1.0) : act) * d(m.num_heads) * s * sb / d(tp);
}

StateShards state_shards(Sharding s, std::int64_t dp) {
    StateShards out;
    const double k = d(dp);
    if (s >= Sharding::Zero1) out.optimizer = k;
    if (s >= Sharding::Zero2) out.grads = k;
    if (s >= Sharding::Full) out.weights = k;
    return out;
}

double ring_allreduce_s(double bytes, std::int64_t k, double gbs, const CostParams& p) {
    if (k <= 1 || bytes <= 0) return 0.0;
    const double steps = 2.0 * d(k - 1);
    return steps * p.link_latency_s +
           2.0 * d(k - 1) / d(k) * bytes / (gbs * kGB * p.link_efficiency);
}

void validate(const ModelDims& m) {
    check_int("model.num_layers", m.num_layers, 1, kMaxLayers);
    check_int("model.hidden_size", m.hidden_size, 1, kMaxDim);
    check_int("model.num_heads", m.num_heads, 1, m.hidden_size);
    if (m.hidden_size % m.num_heads != 0) {
        bad("model.hidden_size", d(m.hidden_size),
            "divisible by num_heads (" + std::to_string(m.num_heads) + ")");
    }
    check_int("model.num_kv_heads", m.num_kv_heads, 1, m.num_heads);
    if (m.num_heads % m.num_kv_heads != 0) {
        bad("model.num_kv_heads", d(m.num_kv_heads),
            "a divisor of num_heads (" + std::to_string(m.num_heads) + ")");
    }
    check_int("model.ffn_hidden_size", m.ffn_hidden_size, 1, kMaxDim);
    check_int("model.vocab_size", m.vocab_size, 1, kMaxVocab);
    check_int("model.position_embeddings", m.position_embeddings, 0, kMaxSeq);
}

void validate(const GpuSpec& g, std::size_t index) {
    const std::string f = "gpus[" + std::to_string(index) + "].";
    if (!std::isfinite(g.memory_gb) || g.memory_gb <= 0 || g.memory_gb > 1e9) {
        bad(f + "memory_gb", g.memory_gb, "in (0, 1e9]");
    }
    if (!std::isfinite(g.memory_bytes) || g.memory_bytes < 0 || g.memory_bytes > 1e18) {
        bad(f + "memory_bytes", g.memory_bytes, "0 (memory_gb) or in (0, 1e18]");
    }
    check_rate(f + "bf16_tflops", g.tflops);
    if (!std::isfinite(g.fp8_tflops) || g.fp8_tflops < 0 || g.fp8_tflops > 1e9) {
        bad(f + "fp8_tflops", g.fp8_tflops, "0 (no fp8) or in (0, 1e9] TFLOP/s");
    }
    check_rate(f + "mem_bandwidth_gbs", g.mem_bandwidth_gbs);
    check_rate(f + "intra_node_gbs", g.intra_node_gbs);
    check_rate(f + "inter_node_gbs", g.inter_node_gbs);
    check_fraction(f + "efficiency", g.efficiency, true);
    if (!std::isfinite(g.price_per_hour) || g.price_per_hour < 0 || g.price_per_hour > 1e9) {
        bad(f + "price_per_hour", g.price_per_hour, "in [0, 1e9]");
    }
    check_int(f + "count", g.count, 0, std::int64_t{1} << 40);
    check_int(f + "gpus_per_node", g.gpus_per_node, 1, kMaxTp);
    check_int(f + "pool", g.pool, -1, std::int64_t{1} << 20);
    if (!std::isfinite(g.pool_units) || g.pool_units < 0 || g.pool_units > 1e9) {
        bad(f + "pool_units", g.pool_units, "in [0, 1e9] per instance");
    }
    if (!std::isfinite(g.interruptions_per_hour) || g.interruptions_per_hour < 0 ||
        g.interruptions_per_hour > 1e3) {
        bad(f + "interruptions_per_hour", g.interruptions_per_hour, "in [0, 1000] per instance-hour");
    }
    if (!std::isfinite(g.recovery_hours) || g.recovery_hours < 0 || g.recovery_hours > 1e4) {
        bad(f + "recovery_hours", g.recovery_hours, "in [0, 1e4]");
    }
    const std::pair<const char*, double> scales[] = {
        {"block_fwd_scale", g.block_fwd_scale}, {"block_bwd_scale", g.block_bwd_scale},
        {"head_fwd_scale", g.head_fwd_scale},   {"head_bwd_scale", g.head_bwd_scale},
        {"activation_scale", g.activation_scale}};
    for (const auto& [name, value] : scales) {
        if (!std::isfinite(value) || value < 1e-6 || value > 1e6) {
            bad(f + "profile." + name, value, "in [1e-6, 1e6]");
        }
    }
}

double profile_min_time_scale(const GpuSpec& g) {
    return std::min({g.block_fwd_scale, g.block_bwd_scale, g.head_fwd_scale, g.head_bwd_scale});
}

double profile_bwd_fwd_ratio(const GpuSpec& g) {
    return std::min({1.0, g.block_bwd_scale / g.block_fwd_scale,
                     g.head_bwd_scale / g.head_fwd_scale});
}

void validate(const CostParams& p) {
    check_fraction("cost_model.efficiency", p.efficiency, false);
    check_fraction("cost_model.attention_efficiency", p.attention_efficiency, false);
    check_fraction("cost_model.sustained_fraction", p.sustained_fraction, false);
    check_bytes("cost_model.bytes_per_weight", p.bytes_per_weight, false);
    check_bytes("cost_model.bytes_per_grad", p.bytes_per_grad, false);
    check_bytes("cost_model.bytes_per_activation", p.bytes_per_activation, false);
    check_bytes("cost_model.bytes_per_logit", p.bytes_per_logit, true);
    check_bytes("cost_model.loss_bytes_per_logit", p.loss_bytes_per_logit, true);
    check_bytes("cost_model.optimizer_transient_bytes_per_param",
                p.optimizer_transient_bytes_per_param, true);
    check_int("cost_model.kept_last_buffers", p.kept_last_buffers, 0, 1024);
    if (!std::isfinite(p.blas_workspace_mib) || p.blas_workspace_mib < 0 ||
        p.blas_workspace_mib > 1024) {
        bad("cost_model.blas_workspace_mib", p.blas_workspace_mib, "in [0, 1024] MiB");
    }
    check_nonneg("cost_model.reserved_gb", p.reserved_gb);
    check_nonneg("cost_model.nccl_gb_per_group", p.nccl_gb_per_group);
    if (!std::isfinite(p.memory_reserve_fraction) || p.memory_reserve_fraction < 0 ||
        p.memory_reserve_fraction >= 1) {
        bad("cost_model.memory_reserve_fraction", p.memory_reserve_fraction, "in [0, 1)");
    }
    check_fraction("cost_model.link_efficiency", p.link_efficiency, false);
    check_nonneg("cost_model.link_latency_s", p.link_latency_s);
    check_bytes("cost_model.optimizer_step_bytes_per_param", p.optimizer_step_bytes_per_param, true);
    check_fraction("cost_model.memory_bandwidth_efficiency", p.memory_bandwidth_efficiency, false);
    check_fraction("cost_model.fp8_efficiency", p.fp8_efficiency, false);
    if (!std::isfinite(p.checkpoint_gbs) || p.checkpoint_gbs < 0 || p.checkpoint_gbs > 1e9) {
        bad("cost_model.checkpoint_gbs", p.checkpoint_gbs, "in [0, 1e9] GB/s (0: checkpoints are free)");
    }
    if (!std::isfinite(p.restart_hours) || p.restart_hours < 0 || p.restart_hours > 1e4) {
        bad("cost_model.restart_hours", p.restart_hours, "in [0, 1e4] hours");
    }
}

void validate(const Workload& w) {
    check_int("seq_len", w.seq_len, 1, kMaxSeq);
    check_int("micro_batch_size", w.micro_batch_size, 1, kMaxBatch);
    check_int("num_microbatches", w.num_microbatches, 1, kMaxMicrobatches);
    check_int("dp", w.dp, 1, kMaxDp);
    check_int("global_batch_size", w.global_batch_size, 1, std::int64_t{1} << 40);
    if (w.schedule != Schedule::OneFOneB && w.schedule != Schedule::GPipe) {
        bad("schedule", static_cast<double>(static_cast<int>(w.schedule)), "1f1b or gpipe");
    }
    if (w.recompute != Recompute::None && w.recompute != Recompute::Full &&
        w.recompute != Recompute::Selective && w.recompute != Recompute::SelectiveOp) {
        bad("recompute", static_cast<double>(static_cast<int>(w.recompute)),
            "none, full, selective or selective-op");
    }
    if (w.sharding != Sharding::None && w.sharding != Sharding::Zero1 &&
        w.sharding != Sharding::Zero2 && w.sharding != Sharding::Full) {
        bad("sharding", static_cast<double>(static_cast<int>(w.sharding)),
            "none, zero1, zero2 or full");
    }
    check_int("virtual_stages", w.virtual_stages, 1, kMaxStages);
    if (w.virtual_stages > 1 && w.schedule != Schedule::OneFOneB) {
        bad("virtual_stages", d(w.virtual_stages), "1 unless the schedule is 1f1b (interleaved 1F1B)");
    }
    check_bytes("optimizer_state_bytes", w.optimizer_bytes_per_param, true);
    if (!std::isfinite(w.iterations) || w.iterations < 0 || w.iterations > 1e19) {
        bad("iterations", w.iterations, "in [0, 1e19]");
    }
    check_nonneg("deadline_hours", w.deadline_hours);
    if (!std::isfinite(w.transfer_usd_per_gb) || w.transfer_usd_per_gb < 0 ||
        w.transfer_usd_per_gb > 1e6) {
        bad("transfer_usd_per_gb", w.transfer_usd_per_gb, "in [0, 1e6]");
    }
    if (!std::isfinite(w.deadline_confidence) || w.deadline_confidence <= 0 ||
        w.deadline_confidence >= 1) {
        bad("deadline_confidence", w.deadline_confidence, "in (0, 1)");
    }
}

BlockStash block_stash(const ModelDims& model, const GpuSpec& g, const CostParams& params,
                       const Workload& work, std::int64_t tp) {
    const std::int64_t s = work.seq_len, b = work.micro_batch_size;
    const double blk_act = block_activation_bytes(model, params, s, b, tp, work.sequence_parallel) *
                           g.activation_scale;
    const double sb = d(s) * d(b), act = params.bytes_per_activation, t = d(tp);
    const double h = d(model.hidden_size), f = d(model.ffn_hidden_size);
    // One hidden state (a block's input or output) on one GPU: replicated over the TP ranks
    // unless sequence-parallel.
    const double hidden = work.sequence_parallel ? sb * h * act / t : sb * h * act;
    BlockStash out;
    if (work.recompute == Recompute::Full) {
        out.kept = hidden;
        out.rebuilt = blk_act;
    } else if (work.recompute == Recompute::Selective) {
        // The attention core's score-sized tensors are rebuilt in the backward, one block
        // at a time (Korthikanti et al. 2022, sec. 5).
        const double scores = attention_score_bytes(model, params, s, b, tp) * g.activation_scale;
        out.kept = blk_act - scores;
        out.rebuilt = scores;
    } else if (work.recompute == Recompute::SelectiveOp) {
        // torchtitan's per-op policy over its Llama block's matmuls in order (wq, wk, wv, wo,
        // then w1, w3, w2; without a gate w1, w2): the odd ones' outputs are saved (wq, wv,
        // w1 and, gated, w2), and the attention kernel's output and log-sum-exp; the block's
        // input is kept as the checkpoint's. Column-parallel outputs are split over TP ranks;
        // w2's (row-parallel, before its all-reduce) is whole on each.
        double kept = hidden + sb * (h + kv_dim(model) + f + h) * act / t +  // wq, wv, w1, out
                      4.0 * d(model.num_heads) * sb / t;                    // fp32 log-sum-exp
        if (model.gated_mlp) kept += sb * h * act;                           // w2
        kept *= g.activation_scale;
        out.kept = std::min(kept, blk_act);
        out.rebuilt = blk_act - out.kept;
    } else {
        out.kept = blk_act;
    }
    // The backward of a block holds, besides what it kept, the gradient arriving at its output
    // and the one leaving its input, and at most the sum of the MLP's working set (the
    // gradients of the up projection's output and of the activation's: two MLP-interior
    // tensors) and the attention's (the gradients of Q, K and V). Checked on the runner's
    // blocks on CPU, tests/test_memory_terms.py.
    out.backward = 2.0 * hidden + (2.0 * sb * f + sb * (h + 2.0 * kv_dim(model))) * act / t;
    out.output = params.stash_stage_io ? hidden : 0.0;
    out.hidden = hidden;
    out.input_in_buffer = params.persistent_recv_buffers && params.recv_buffers_per_microbatch;
    return out;
}

StageEstimate stage_memory(const ModelDims& model, const GpuSpec& g, const CostParams& params,
                           const Workload& work, std::int64_t tp, std::int64_t num_layers,
                           std::int64_t index, std::int64_t num_stages) {
    StageEstimate e;
    const std::int64_t s = work.seq_len, b = work.micro_batch_size;
    const double td = d(tp), L = d(num_layers);
    const bool first = index == 0, last = index == num_stages - 1;
    e.num_layers = num_layers;
    // The legacy switch `zero1` means at least ZeRO-1.
    const Sharding sharding = params.zero1 ? std::max(work.sharding, Sharding::Zero1)
                                           : work.sharding;
    const StateShards sh = state_shards(sharding, work.dp);

    // Parameters and model states.
    e.params = L * block_params(model) + (first ? embedding_params(model) : 0.0) +
               (last ? head_params(model) + final_norm_params(model) : 0.0);
    const double per_gpu = e.params / td;
    e.weights_bytes = per_gpu * params.bytes_per_weight / sh.weights;
    e.grads_bytes = per_gpu * params.bytes_per_grad / sh.grads;
    e.optimizer_bytes = per_gpu * work.optimizer_bytes_per_param / sh.optimizer;

    // Activations.
    // A 1F1B plan with fewer micro-batches than stages runs as GPipe on espresso's runner
    // (PyTorch's 1F1B needs a micro-batch per stage); Megatron-LM and DeepSpeed run it as
    // 1F1B.
    e.in_flight = in_flight(work.schedule, index, num_stages, work.num_microbatches,
                            params.short_1f1b_as_gpipe);
    const BlockStash st = block_stash(model, g, params, work, tp);
    // Per micro-batch in flight: its blocks' stash, and the stage's input and output where
    // the engine keeps them until the backward (the last stage's output is the loss). Under
    // full and per-op recomputation the input is the first block's checkpointed input,
    // already counted. The first stage's input is the token ids (int64), which the embedding
    // keeps for its backward.
    // An engine that runs the stage on a copy of the received input (DeepSpeed's pipeline
    // engine) holds both.
    // An engine whose receive buffers are one per micro-batch (torch's PipelineStage) runs
    // the stage on the buffer itself: the input is counted with the buffers, also where it
    // is the first block's checkpointed input.
    const bool checkpointed_input = !params.clone_stage_input &&
                                    (work.recompute == Recompute::Full ||
                                     work.recompute == Recompute::SelectiveOp);
    const bool input_kept = checkpointed_input || st.input_in_buffer;
    const double io = (first || input_kept ? 0.0 : 1.0) + (last ? 0.0 : 1.0);
    const double in_buffer = !first && num_layers > 0 && checkpointed_input && st.input_in_buffer
                                 ? std::min(st.hidden, st.kept)
                                 : 0.0;
    const double ids = first ? d(s) * d(b) * 8.0 : 0.0;
    // Receive buffers allocated once and kept for the run, through the optimizer step: one
    // for the activation (all but the first stage) and one for the gradient (all but the
    // last) in DeepSpeed's pipeline engine (pipe_recv_buf, grad_layer); one per micro-batch
    // and direction in torch.distributed.pipelining's PipelineStage (_setup_forward_recv_info,
    // _create_grad_recv_info). Megatron-LM allocates each received tensor per message.
    const double directions = (first ? 0.0 : 1.0) + (last ? 0.0 : 1.0);
    const double buffers = params.recv_buffers_per_microbatch ? d(work.num_microbatches) : 1.0;
    e.persistent_bytes = params.persistent_recv_buffers ? directions * buffers * st.hidden : 0.0;
    // DeepSpeed's pipeline engine never frees the last stage's pipe buffers: its
    // _exec_backward_pass returns before releasing them there, so each of its buffers
    // (TrainSchedule: max(2, min(P - i, M)), 2 on the last stage) keeps the last micro-batch
    // it ran: the bf16 logits and three hidden-state tensors (the input's copy and what the
    // output dict carries; the prototype's traces, docs/cost-model.md). Held through the
    // optimizer step and the next forward.
    if (last && params.kept_last_buffers > 0) {
        const double kept = d(std::min<std::int64_t>(params.kept_last_buffers,
                                                      work.num_microbatches));
        e.persistent_bytes += kept * (d(s) * d(b) * d(model.vocab_size) / td *
                                           params.bytes_per_activation +
                                       3.0 * st.hidden);
    }
    // The cuBLAS workspace PyTorch takes from its caching allocator on the first matmul of a
    // stream and keeps (it counts in max_memory_allocated).
    e.persistent_bytes += params.blas_workspace_mib * 1048576.0;
    e.activation_bytes =
        d(e.in_flight) * (L * st.kept + io * st.output + ids - in_buffer) + e.persistent_bytes;
    // One thing works at a time in the backward: the loss over the logits (last stage), then
    // each block, rebuilt under recomputation, with its gradients.
    // The loss's working set: the logits' bytes at its peak, and the inputs the final norm
    // and the head's matmul keep.
    const double loss = last ? d(s) * d(b) * d(model.vocab_size) * params.loss_bytes_per_logit / td +
                                   2.0 * d(s) * d(b) * d(model.hidden_size) *
                                       params.bytes_per_activation
                             : 0.0;
    e.transient_bytes = std::max(loss, num_layers > 0 ? st.rebuilt + st.backward : 0.0);
    const double blk_w = block_params(model) / td;  // one block's parameters per GPU
    // With one replica every sharding is none: nothing to gather or reduce-scatter.
    if (sharding >= Sharding::Full && num_layers > 0 && work.dp > 1) {
        // Gathered for compute: the block at work and the next one, prefetched (two blocks'
        // worth on every stage, so memory stays affine in the blocks a stage holds).
        e.transient_bytes += 2.0 * blk_w * params.bytes_per_weight;
    }
    if (sharding >= Sharding::Zero2 && num_layers > 0 && work.dp > 1) {
        e.transient_bytes += blk_w * params.bytes_per_grad;  // one block's, before reduce-scatter
    }
    // The optimizer step runs after the last backward, when the activations are freed: its
    // intermediates (PyTorch's foreach Adam: about the parameters' size) count where they
    // exceed them.
    e.step_bytes = per_gpu * params.optimizer_transient_bytes_per_param / sh.optimizer;
    e.transient_bytes =
        std::max(e.transient_bytes, e.step_bytes - (e.activation_bytes - e.persistent_bytes));
    e.memory_bytes = e.weights_bytes + e.grads_bytes + e.optimizer_bytes + e.activation_bytes +
                     e.transient_bytes;
    e.capacity_bytes = stage_capacity_bytes(g, params, tp, work.dp, num_stages);
    return e;
}

StageEstimate stage_cost(const ModelDims& model, const GpuSpec& g, const CostParams& params,
                         const Workload& work, std::int64_t tp, std::int64_t num_layers,
                         std::int64_t index, std::int64_t num_stages) {
    StageEstimate e = stage_memory(model, g, params, work, tp, num_layers, index, num_stages);
    const std::int64_t s = work.seq_len, b = work.micro_batch_size;
    const double L = d(num_layers);
    const bool last = index == num_stages - 1;
    const Sharding sharding = params.zero1 ? std::max(work.sharding, Sharding::Zero1)
                                           : work.sharding;
    const StateShards sh = state_shards(sharding, work.dp);
    const double per_gpu = e.params / d(tp);

    // Compute time per micro-batch.
    const double head_flops = last ? head_fwd_flops(model, s, b) : 0.0;
    e.fwd_flops = L * block_fwd_flops(model, s, b) + head_flops;
    const BlockTimes blk = block_times(model, g, params, work, tp);
    const BlockTimes head = last ? head_times(model, g, params, work, tp) : BlockTimes{};
    e.fwd_s = L * blk.fwd + head.fwd;
    e.bwd_s = L * (blk.bwd + blk.recompute) + head.bwd;

    // Data parallelism: ring collectives over the replicas of this stage's TP rank.
    const double link = dp_link_gbs(g, work.dp, tp);
    const double grads_full = per_gpu * params.bytes_per_grad;
    const double weights_full = per_gpu * params.bytes_per_weight;
    const double reduce = ring_allreduce_s(grads_full, work.dp, link, params);  // all-reduce
    const double scatter = 0.5 * reduce;                                        // reduce-scatter
    const double gather = 0.5 * ring_allreduce_s(weights_full, work.dp, link, params);
    // Gradients are reduced as the backward of the last micro-batch produces them (DDP's
    // buckets, Megatron's overlap_grad_reduce): only what outlasts that backward is exposed.
    double& under_b = params.overlap_grad_reduce ? e.dp_under_backward_s : e.dp_exposed_s;
    switch (sharding) {
        case Sharding::None:
            under_b += reduce;
            break;
        case Sharding::Zero1:
            // Reduce-scatter the gradients, step on the shard, all-gather the weights; with
            // overlap_param_gather (Megatron-LM's --overlap-param-gather, NeMo's
            // overlap_param_sync) the gather runs under the next step's first forward.
            under_b += scatter;
            (params.overlap_param_gather ? e.dp_under_forward_s : e.dp_exposed_s) += gather;
            break;
        case Sharding::Zero2:
            // Every micro-batch's gradients are reduce-scattered during its backward.
            e.bwd_s = std::max(e.bwd_s, scatter);
            e.dp_exposed_s = gather;
            break;
        case Sharding::Full:
            // Weights gathered block by block in the forward and again in the backward,
            // prefetched under the previous block's compute; the first block's gather is
            // exposed. Gradients reduce-scattered as in ZeRO-2.
            if (num_layers > 0) {
                e.fwd_s = std::max(e.fwd_s, gather) + gather / L;
                e.bwd_s = std::max(e.bwd_s, gather + scatter) + gather / L;
            }
            break;
    }
    // A plain pipeline: the reduction hides under the last micro-batch's backward, the
    // gather under the first one's forward; interleaved plans place them in their simulation.
    e.dp_allreduce_s = std::max(0.0, e.dp_under_backward_s - e.bwd_s) +
                       std::max(0.0, e.dp_under_forward_s - e.fwd_s) + e.dp_exposed_s;
    e.optimizer_step_s = per_gpu / sh.optimizer * params.optimizer_step_bytes_per_param /
                         (g.mem_bandwidth_gbs * kGB * params.memory_bandwidth_efficiency);
    return e;
}

double dp_link_gbs(const GpuSpec& g, std::int64_t dp, std::int64_t tp) {
    return dp * tp <= g.gpus_per_node ? g.intra_node_gbs : g.inter_node_gbs;
}

std::int64_t instances_for(const GpuSpec& g, std::int64_t gpus) {
    return gpus <= 0 ? 0 : (gpus + g.gpus_per_node - 1) / g.gpus_per_node;
}

double billed_hourly(const GpuSpec& g, std::int64_t gpus) {
    return d(instances_for(g, gpus)) * d(g.gpus_per_node) * g.price_per_hour;
}

double checkpoint_hours(const ModelDims& m, const CostParams& p, const Workload& w) {
    if (!(p.checkpoint_gbs > 0)) return 0.0;
    const double bytes = total_params(m) * (p.bytes_per_weight + w.optimizer_bytes_per_param);
    return bytes / (p.checkpoint_gbs * kGB) / 3600.0;
}

double boundary_gb(const ModelDims& m, const CostParams& p, const Workload& w,
                   std::int64_t num_stages) {
    const double msg = d(w.seq_len) * d(w.micro_batch_size) * d(m.hidden_size) *
                       p.bytes_per_activation;
    return d(std::max<std::int64_t>(0, num_stages - 1)) * 2.0 * msg * d(w.num_microbatches) *
           d(w.dp) / kGB;
}

double capacity_bytes(const GpuSpec& g) {
    return g.memory_bytes > 0 ? g.memory_bytes : g.memory_gb * kGB;
}

double usable_bytes(const GpuSpec& g, const CostParams& params) {
    return capacity_bytes(g) * (1.0 - params.memory_reserve_fraction) - params.reserved_gb * kGB;
}

std::int64_t nccl_groups(std::int64_t tp, std::int64_t dp, std::int64_t num_stages) {
    return (tp > 1 ? 1 : 0) + (dp > 1 ? 1 : 0) + (num_stages > 1 ? 1 : 0);
}

double stage_capacity_bytes(const GpuSpec& g, const CostParams& p, std::int64_t tp,
                            std::int64_t dp, std::int64_t num_stages) {
    return usable_bytes(g, p) - d(nccl_groups(tp, dp, num_stages)) * p.nccl_gb_per_group * kGB;
}

double send_s(const GpuSpec& from, const GpuSpec& to, bool one_node, double bytes,
              const CostParams& params) {
    const double bw = one_node ? from.intra_node_gbs : std::min(from.inter_node_gbs,
                                                                 to.inter_node_gbs);
    return params.link_latency_s + bytes / (bw * kGB * params.link_efficiency);
}

double p2p_bytes(const ModelDims& m, const CostParams& p, const Workload& w,
                 std::int64_t tp_from, std::int64_t tp_to) {
    const double msg = d(w.seq_len) * d(w.micro_batch_size) * d(m.hidden_size) *
                       p.bytes_per_activation;
    return p.p2p_scatter_gather ? msg / d(std::max<std::int64_t>(1, std::min(tp_from, tp_to)))
                                : msg;
}

void fold_transfers(std::vector<double>& fwd, std::vector<double>& bwd,
                    std::vector<double>& send_fwd, std::vector<double>& send_bwd) {
    for (std::size_t i = 0; i + 1 < fwd.size() && i < send_fwd.size(); ++i) {
        fwd[i] += send_fwd[i];      // sends its activation
        fwd[i + 1] += send_fwd[i];  // receives it
        bwd[i + 1] += send_bwd[i];  // sends the gradient back
        bwd[i] += send_bwd[i];      // receives it
        send_fwd[i] = 0.0;
        send_bwd[i] = 0.0;
    }
}

std::vector<char> boundaries_in_instance(const std::vector<GpuSpec>& gpus,
                                         const std::vector<std::int64_t>& gpu,
                                         const std::vector<std::int64_t>& tp, std::int64_t dp) {
    const std::size_t P = gpu.size();
    std::vector<char> out(P > 0 ? P - 1 : 0, 0);
    // Per row: its instances that still have room (id, free GPUs), in id order, and the
    // next id. With power-of-two widths few are ever open at once.
    struct Open {
        std::int64_t id, free;
    };
    std::vector<std::vector<Open>> open(gpus.size());
    std::vector<std::int64_t> next(gpus.size(), 0);
    std::int64_t prev_whole = -1;  // the instance holding the previous stage whole, or -1
    for (std::size_t s = 0; s < P; ++s) {
        const auto row = static_cast<std::size_t>(gpu[s]);
        const std::int64_t n = gpus[row].gpus_per_node;
        auto& op = open[row];
        // First fit of `size` GPUs: the first open instance with room, else a new one.
        auto take = [&](std::int64_t size) {
            for (std::size_t k = 0; k < op.size(); ++k) {
                if (op[k].free >= size) {
                    const std::int64_t id = op[k].id;
                    op[k].free -= size;
                    if (op[k].free == 0) op.erase(op.begin() + static_cast<std::ptrdiff_t>(k));
                    return id;
                }
            }
            const std::int64_t id = next[row]++;
            if (n - size > 0) op.push_back({id, n - size});
            return id;
        };
        std::int64_t whole = -1;
        if (dp * tp[s] <= n) {
            // The stage's replicas fit one instance: they go there together (its DP
            // all-reduce then runs on the in-instance link, as stage_cost() charges it).
            whole = take(dp * tp[s]);
        } else {
            for (std::int64_t r = 0; r < dp; ++r) take(tp[s]);
        }
        // Only stages that sit whole in one instance share it with a neighbour: TP groups
        // spread over instances (dp * tp > n) are charged the network even where a group
        // happened to land beside its neighbour's.
        if (s > 0 && gpu[s] == gpu[s - 1] && whole >= 0 && whole == prev_whole) out[s - 1] = 1;
        prev_whole = whole;
    }
    return out;
}

namespace {

// Interleaved 1F1B: each device holds the model states of all its chunks and, at its peak,
// the activations its operation order leaves (interleaved_peak); only one chunk works at a
// time (transient memory: the largest). Every chunk entry reports its device's memory. The
// device's DP traffic and optimizer step cover all its chunks.
void interleave_devices(EstimateResult& r, const ModelDims& model, const std::vector<GpuSpec>& gpus,
                        const CostParams& params, const Workload& work,
                        const std::vector<StageSpec>& stages, std::int64_t D) {
    const std::int64_t P = static_cast<std::int64_t>(r.stages.size());
    for (std::int64_t dev = 0; dev < D; ++dev) {
        std::vector<std::int64_t> blocks;
        std::vector<StageEstimate> chunks;
        for (std::int64_t i = dev; i < P; i += D) {
            blocks.push_back(r.stages[static_cast<std::size_t>(i)].num_layers);
            chunks.push_back(r.stages[static_cast<std::size_t>(i)]);
        }
        const StageSpec& st = stages[static_cast<std::size_t>(dev)];
        const DeviceMemory mem = device_memory(
            chunks, block_stash(model, gpus[static_cast<std::size_t>(st.gpu)], params, work, st.tp),
            interleaved_peak_blocks(blocks, D, dev, work.num_microbatches));
        const StageEstimate& head = r.stages[static_cast<std::size_t>(dev)];
        if (mem.total > head.capacity_bytes) {
            r.issues.push_back({IssueKind::OutOfMemory, dev, st.gpu, mem.total, head.capacity_bytes, ""});
        }
        std::int64_t all_blocks = 0;
        for (const std::int64_t n : blocks) all_blocks += n;
        for (std::int64_t i = dev; i < P; i += D) {
            StageEstimate& e = r.stages[static_cast<std::size_t>(i)];
            e.weights_bytes = mem.weights;
            e.grads_bytes = mem.grads;
            e.optimizer_bytes = mem.optimizer;
            e.activation_bytes = mem.activations;
            e.transient_bytes = mem.transient;
            e.memory_bytes = mem.total;
            // Whole micro-batches' worth of the group's blocks at its peak, rounded up.
            e.in_flight = all_blocks > 0 ? (mem.peak_blocks + all_blocks - 1) / all_blocks : 0;
            e.dp_allreduce_s = mem.dp_allreduce_s;
            e.optimizer_step_s = mem.optimizer_step_s;
        }
        r.dp_allreduce_s = std::max(r.dp_allreduce_s, mem.dp_allreduce_s);
        r.optimizer_step_s = std::max(r.optimizer_step_s, mem.optimizer_step_s);
    }
}

}  // namespace

DeviceMemory device_memory(const std::vector<StageEstimate>& chunks, const BlockStash& stash,
                           std::int64_t peak_blocks) {
    DeviceMemory m;
    std::int64_t smallest = 0;  // the fewest blocks of a chunk that has any
    double step = 0;            // one optimizer step updates every chunk's parameters
    double buffers = 0;         // every chunk's receive buffers, kept through the step
    for (const StageEstimate& e : chunks) {
        m.weights += e.weights_bytes;
        m.grads += e.grads_bytes;
        m.optimizer += e.optimizer_bytes;
        m.transient = std::max(m.transient, e.transient_bytes);
        m.dp_allreduce_s += e.dp_exposed_s;  // what no schedule hides
        m.optimizer_step_s += e.optimizer_step_s;
        if (e.num_layers > 0 && (smallest == 0 || e.num_layers < smallest)) smallest = e.num_layers;
        step += e.step_bytes;
        buffers += e.persistent_bytes;
    }
    m.peak_blocks = peak_blocks;
    // Each (chunk, micro-batch) in flight holds at least the smallest chunk's blocks, so at
    // most ceil(peak_blocks / smallest) stage inputs and outputs are kept with them.
    const double outputs = smallest > 0 ? d((peak_blocks + smallest - 1) / smallest) : 0.0;
    // (An input kept in its receive buffer is counted twice: an upper bound, which also
    // covers the first stage's token ids.)
    m.activations = d(peak_blocks) * stash.kept + 2.0 * outputs * stash.output + buffers;
    // The step runs after the activations are freed (the receive buffers stay).
    m.transient = std::max(m.transient, step - (m.activations - buffers));
    m.total = m.weights + m.grads + m.optimizer + m.activations + m.transient;
    return m;
}

bool tp_divides(const ModelDims& model, std::int64_t tp) {
    return model.num_heads % tp == 0 &&
           (model.num_kv_heads % tp == 0 || tp % model.num_kv_heads == 0) &&
           model.ffn_hidden_size % tp == 0;
}

EstimateResult estimate(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                        const CostParams& params, const Workload& work,
                        const std::vector<StageSpec>& stages) {
    return estimate_within(model, gpus, params, work, stages,
                           std::numeric_limits<double>::infinity());
}

EstimateResult estimate_within(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                               const CostParams& params, const Workload& work,
                               const std::vector<StageSpec>& stages, double pipeline_limit_s) {
    validate(model);
    validate(params);
    validate(work);
    for (std::size_t g = 0; g < gpus.size(); ++g) validate(gpus[g], g);
    const std::int64_t P = static_cast<std::int64_t>(stages.size());
    if (P < 1 || P > kMaxStages) {
        bad("number of stages", d(P), "in [1, " + std::to_string(kMaxStages) + "]");
    }
    if (P * work.num_microbatches > kMaxStageMicrobatchProduct) {
        bad("stages * num_microbatches", d(P * work.num_microbatches),
            "<= " + std::to_string(kMaxStageMicrobatchProduct));
    }
    for (std::int64_t i = 0; i < P; ++i) {
        const StageSpec& st = stages[static_cast<std::size_t>(i)];
        const std::string f = "stages[" + std::to_string(i) + "].";
        check_int(f + "gpu", st.gpu, 0, static_cast<std::int64_t>(gpus.size()) - 1);
        check_int(f + "tp", st.tp, 1, kMaxTp);
        check_int(f + "layers[0]", st.layer_begin, 0, kMaxLayers);
        check_int(f + "layers[1]", st.layer_end, 0, kMaxLayers);
    }

    EstimateResult r;
    const std::int64_t M = work.num_microbatches;
    // Interleaving: D devices hold v stages each, stage i on device i % D.
    const std::int64_t v = work.virtual_stages;
    if (P % v != 0 || (v > 1 && P / v < 2)) {
        bad("number of stages", d(P), "a multiple of virtual_stages " + std::to_string(v) +
                                          " over at least 2 devices");
    }
    const std::int64_t D = P / v;
    if (v > 1 && M % D != 0) {
        bad("num_microbatches", d(M), "a multiple of the " + std::to_string(D) +
                                          " pipeline devices (interleaved 1F1B)");
    }
    for (std::int64_t i = D; i < P; ++i) {
        const StageSpec& st = stages[static_cast<std::size_t>(i)];
        const StageSpec& dev = stages[static_cast<std::size_t>(i % D)];
        if (st.gpu != dev.gpu || st.tp != dev.tp) {
            bad("stages[" + std::to_string(i) + "]", d(i),
                "the GPU type and tp of stage " + std::to_string(i % D) +
                    ", which runs on the same devices (interleaved 1F1B)");
        }
    }

    // Coverage of the layer ranges.
    std::int64_t expect = 0;
    for (std::int64_t i = 0; i < P; ++i) {
        const StageSpec& st = stages[static_cast<std::size_t>(i)];
        if (st.layer_end <= st.layer_begin) {
            r.issues.push_back({IssueKind::EmptyStage, i, st.gpu, d(st.layer_begin),
                                d(st.layer_end), ""});
        }
        if (st.layer_begin > expect) {
            r.issues.push_back({IssueKind::LayersNotCovered, i, -1, d(expect),
                                d(st.layer_begin), ""});
        } else if (st.layer_begin < expect) {
            r.issues.push_back({IssueKind::LayersOverlap, i, -1, d(st.layer_begin), d(expect),
                                ""});
        }
        expect = std::max(expect, st.layer_end);
    }
    if (expect != model.num_layers) {
        r.issues.push_back({IssueKind::LayersNotCovered, P - 1, -1, d(expect),
                            d(model.num_layers), ""});
    }
    // In double: dp * b * M can exceed 2^63 within the validated ranges.
    const double batch = d(work.dp) * d(work.micro_batch_size) * d(work.num_microbatches);
    if (batch != d(work.global_batch_size)) {
        r.issues.push_back({IssueKind::BatchMismatch, -1, -1, batch, d(work.global_batch_size), ""});
    }

    // Placement (the launch layout, boundaries_in_instance): a stage's TP group lives in one
    // instance, its DP replicas share one when dp * tp fits, and pipeline neighbours use the
    // in-instance link when every replica's two TP groups share an instance.
    std::vector<char> inside;
    {
        std::vector<std::int64_t> gv, tv;
        bool widths_fit = true;
        for (std::int64_t i = 0; i < D; ++i) {
            const StageSpec& st = stages[static_cast<std::size_t>(i)];
            gv.push_back(st.gpu);
            tv.push_back(st.tp);
            widths_fit = widths_fit && st.tp <= gpus[static_cast<std::size_t>(st.gpu)].gpus_per_node;
        }
        inside = widths_fit ? boundaries_in_instance(gpus, gv, tv, work.dp)
                            : std::vector<char>(static_cast<std::size_t>(D - 1), 0);
        // Between chunks, the last device sends to the first: counted as leaving the
        // instance (the layout packs devices in pipeline order, so they rarely share one).
        inside.push_back(0);
    }

    r.gpus_used.assign(gpus.size(), 0);
    r.stages.resize(static_cast<std::size_t>(P));
    std::vector<double> fwd(static_cast<std::size_t>(P)), bwd(static_cast<std::size_t>(P));
    std::vector<double> send_f(static_cast<std::size_t>(P - 1)), send_b(static_cast<std::size_t>(P - 1));
    double flops_iter = 0;

    for (std::int64_t i = 0; i < P; ++i) {
        const auto si = static_cast<std::size_t>(i);
        const StageSpec& st = stages[si];
        const GpuSpec& g = gpus[static_cast<std::size_t>(st.gpu)];
        StageEstimate& e = r.stages[si];
        const std::int64_t t = st.tp;
        const double td = d(t);
        const bool last = i == P - 1;
        e.num_layers = std::max<std::int64_t>(0, st.layer_end - st.layer_begin);
        if (i < D) r.gpus_used[static_cast<std::size_t>(st.gpu)] += t * work.dp;

        if (t > g.gpus_per_node) {
            r.issues.push_back({IssueKind::TpExceedsNode, i, st.gpu, td, d(g.gpus_per_node), ""});
        }
        if (model.num_heads % t != 0) {
            r.issues.push_back({IssueKind::TpNotDivisor, i, st.gpu, td, d(model.num_heads),
                                "num_heads"});
        } else if (model.num_kv_heads % t != 0 && t % model.num_kv_heads != 0) {
            r.issues.push_back({IssueKind::TpNotDivisor, i, st.gpu, td, d(model.num_kv_heads),
                                "num_kv_heads"});
        }
        if (model.ffn_hidden_size % t != 0) {
            r.issues.push_back({IssueKind::TpNotDivisor, i, st.gpu, td,
                                d(model.ffn_hidden_size), "ffn_hidden_size"});
        }

        e = stage_cost(model, g, params, work, t, e.num_layers, i, P);
        if (v == 1 && e.memory_bytes > e.capacity_bytes) {
            r.issues.push_back({IssueKind::OutOfMemory, i, st.gpu, e.memory_bytes,
                                e.capacity_bytes, ""});
        }
        fwd[si] = e.fwd_s;
        bwd[si] = e.bwd_s;
        flops_iter += 3.0 * e.fwd_flops * d(M) * d(work.dp);

        // Transfer to the next stage.
        if (!last) {
            const GpuSpec& gn = gpus[static_cast<std::size_t>(stages[si + 1].gpu)];
            e.send_intra_node = inside[static_cast<std::size_t>(i % D)] != 0;
            e.send_s = send_s(g, gn, e.send_intra_node,
                              p2p_bytes(model, params, work, t, stages[si + 1].tp), params);
            send_f[si] = e.send_s;
            send_b[si] = e.send_s;
        }
        if (v == 1) {
            r.dp_allreduce_s = std::max(r.dp_allreduce_s, e.dp_allreduce_s);
            r.optimizer_step_s = std::max(r.optimizer_step_s, e.optimizer_step_s);
        }
    }
    if (v > 1) interleave_devices(r, model, gpus, params, work, stages, D);

    r.instances.assign(gpus.size(), 0);
    for (std::size_t g = 0; g < gpus.size(); ++g) {
        if (r.gpus_used[g] > gpus[g].count) {
            r.issues.push_back({IssueKind::Availability, -1, static_cast<std::int64_t>(g),
                                d(r.gpus_used[g]), d(gpus[g].count), ""});
        }
        // Whole instances: the GPUs a plan leaves idle in them are paid for.
        r.instances[g] = instances_for(gpus[g], r.gpus_used[g]);
        r.idle_gpus += r.instances[g] * gpus[g].gpus_per_node - r.gpus_used[g];
        r.hourly_usd += billed_hourly(gpus[g], r.gpus_used[g]);
    }

    if (!params.p2p_overlap) fold_transfers(fwd, bwd, send_f, send_b);
    if (v == 1) {
        const PipelineResult pipe = simulate_pipeline(fwd, bwd, send_f, send_b, M, work.schedule);
        r.pipeline_s = pipe.makespan_s;
        r.bubble_fraction = pipe.bubble_fraction;
        r.closed_form_s = closed_form_s(fwd, bwd, M);
    } else {
        // The DP collectives run in the simulation: gathers ahead of first forwards,
        // each chunk's reduction from its last backward on (docs/cost-model.md).
        DpTraffic dp;
        for (const StageEstimate& e : r.stages) {
            dp.under_backward.push_back(e.dp_under_backward_s);
            dp.under_forward.push_back(e.dp_under_forward_s);
            dp.exposed.push_back(e.dp_exposed_s);
        }
        const InterleavedRun run =
            interleaved_run(fwd, bwd, send_f, send_b, D, M, &dp, pipeline_limit_s);
        r.pipeline_s = run.makespan_s;
        if (!run.tail_s.empty()) {  // empty: the simulation stopped at pipeline_limit_s
            r.dp_allreduce_s = 0.0;
            for (std::int64_t i = 0; i < P; ++i) {
                const double tail = run.tail_s[static_cast<std::size_t>(i % D)];
                r.stages[static_cast<std::size_t>(i)].dp_allreduce_s = tail;
                r.dp_allreduce_s = std::max(r.dp_allreduce_s, tail);
            }
        }
        // Busy time per device, and the uniform closed form M w + (sum w - w) / v with w
        // the busiest device's work per micro-batch.
        double busy = 0, most = 0;
        for (std::int64_t dev = 0; dev < D; ++dev) {
            double w = 0;
            for (std::int64_t i = dev; i < P; i += D) {
                w += fwd[static_cast<std::size_t>(i)] + bwd[static_cast<std::size_t>(i)];
            }
            busy += d(M) * w;
            most = std::max(most, w);
        }
        r.bubble_fraction = r.pipeline_s > 0 ? 1.0 - busy / (d(D) * r.pipeline_s) : 0.0;
        r.closed_form_s = d(M) * most + (busy / d(M) - most) / d(v);
    }
    double worst = -1;
    for (std::int64_t i = 0; i < P; ++i) {
        const double fb = fwd[static_cast<std::size_t>(i)] + bwd[static_cast<std::size_t>(i)];
        if (fb > worst) {
            worst = fb;
            r.bottleneck_stage = i;
        }
    }
    r.iteration_s = r.pipeline_s + r.dp_allreduce_s + r.optimizer_step_s;
    r.model_flops_per_iteration = flops_iter;
    r.total_hours = work.iterations * r.iteration_s / 3600.0;
    r.transfer_gb = boundary_gb(model, params, work, P);
    r.transfer_usd = work.transfer_usd_per_gb > 0
                         ? work.iterations * r.transfer_gb * work.transfer_usd_per_gb
                         : 0.0;
    r.work_hours = r.total_hours;
    r.hours_at_confidence = r.total_hours;
    // Spot instances: interruptions, checkpoints and restarts (docs/cost-model.md, "Spot
    // capacity"). A restart waits for the slowest replacement among the plan's spot offers.
    double recovery = 0;
    for (std::size_t g = 0; g < gpus.size(); ++g) {
        if (r.instances[g] > 0 && gpus[g].interruptions_per_hour > 0) {
            r.interruptions_per_hour += d(r.instances[g]) * gpus[g].interruptions_per_hour;
            recovery = std::max(recovery, gpus[g].recovery_hours);
        }
    }
    if (r.interruptions_per_hour > 0) {
        r.checkpoint_hours = checkpoint_hours(model, params, work);
        r.restart_hours = recovery + params.restart_hours + r.checkpoint_hours;
        const SpotOutcome o = spot_outcome(r.work_hours, r.interruptions_per_hour,
                                           r.checkpoint_hours, r.restart_hours,
                                           work.deadline_confidence);
        r.checkpoint_interval_hours = o.interval_hours;
        r.total_hours = o.expected_hours;
        r.hours_at_confidence = o.hours_at_confidence;
        r.interruptions_expected = o.interruptions_expected;
        r.interruptions_at_confidence = o.interruptions_at_confidence;
    }
    r.total_usd = r.hourly_usd * r.total_hours + r.transfer_usd;
    r.feasible = r.issues.empty();
    r.meets_deadline = r.hours_at_confidence <= work.deadline_hours;
    return r;
}

}  // namespace espresso
