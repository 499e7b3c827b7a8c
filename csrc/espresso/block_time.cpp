// The time model of one transformer block and of the LM head (docs/cost-model.md,
// "Compute"): matmuls by their roofline at the GPU's sustained matmul efficiency, the
// attention core, memory-bound element-wise work and tensor-parallel collectives. Pure C++;
// declared in cost_model.hpp, whose stage_cost() charges these per block.
#include <algorithm>
#include <cstdint>

#include "espresso/cost_model.hpp"

namespace espresso {

namespace {

double d(std::int64_t v) { return static_cast<double>(v); }

}  // namespace

double block_bound_flops(const ModelDims& m, const CostParams& p, std::int64_t seq_len,
                         std::int64_t micro_batch) {
    const double tokens = d(seq_len) * d(micro_batch);
    const double attn = 4.0 * tokens * d(seq_len) * d(m.hidden_size);
    return 2.0 * tokens * block_matmul_params(m) + (p.flash_attention ? 0.5 : 1.0) * attn;
}

double gemm_efficiency(const GpuSpec& g, const CostParams& p) {
    return (g.efficiency > 0 ? g.efficiency : p.efficiency) * p.sustained_fraction;
}

bool has_fp8(const GpuSpec& g) { return g.fp8_tflops > g.tflops; }

double linear_tflops(const GpuSpec& g, const Workload& w, const CostParams& p) {
    return w.fp8 && has_fp8(g) ? g.fp8_tflops * p.fp8_efficiency : g.tflops;
}

namespace {

// Roofline time of `batch` GEMMs of (m x k) by (k x n) in `bytes` per element: the larger of
// the tensor-core time at the GPU's matmul efficiency (of its `tflops` peak) and the time to
// move the three matrices at the achieved memory bandwidth.
double gemm_s(double m, double n, double k, double batch, double bytes, const GpuSpec& g,
              const CostParams& p, double tflops) {
    const double flops = 2.0 * m * n * k * batch;
    const double moved = (m * k + k * n + m * n) * bytes * batch;
    return std::max(flops / (tflops * 1e12 * gemm_efficiency(g, p)),
                    moved / (g.mem_bandwidth_gbs * kGB * p.memory_bandwidth_efficiency));
}

double gemm_s(double m, double n, double k, double batch, double bytes, const GpuSpec& g,
              const CostParams& p) {
    return gemm_s(m, n, k, batch, bytes, g, p, g.tflops);
}

double memory_s(double bytes, const GpuSpec& g, const CostParams& p) {
    return bytes / (g.mem_bandwidth_gbs * kGB * p.memory_bandwidth_efficiency);
}

}  // namespace

BlockTimes block_times(const ModelDims& m, const GpuSpec& g, const CostParams& p,
                       const Workload& w, std::int64_t tp) {
    const double s = d(w.seq_len), b = d(w.micro_batch_size), tokens = s * b;
    const double h = d(m.hidden_size), f = d(m.ffn_hidden_size), kv = kv_dim(m);
    const double a = d(m.num_heads), t = d(tp), act = p.bytes_per_activation;
    // The linear layers' GEMMs run at the fp8 rate in an fp8 plan (linear_tflops).
    const double lin = linear_tflops(g, w, p);
    const double up = (m.gated_mlp ? 2.0 : 1.0) * f;  // the MLP's up projection(s)
    // Matmuls of one forward on one TP rank (the backward runs two of each shape).
    double gemm = gemm_s(tokens, (h + 2.0 * kv) / t, h, 1, act, g, p, lin) +   // QKV
                  gemm_s(tokens, h, h / t, 1, act, g, p, lin) +  // output projection
                  gemm_s(tokens, up / t, h, 1, act, g, p, lin) +
                  gemm_s(tokens, h, f / t, 1, act, g, p, lin);   // MLP down
    // The attention core: QK^T and attention over V, per head.
    const double heads = b * a / t, dh = h / a;
    double attn_f = 0, attn_b = 0, attn_traffic = 0;
    if (p.flash_attention) {
        // One fused kernel: half the score blocks are causally masked and skipped; its
        // backward runs 5 of the forward's 2 matmuls again (Dao 2023).
        const double exec = 0.5 * 4.0 * tokens * s * h / t;
        const double rate = g.tflops * 1e12 *
                            std::min(p.attention_efficiency * p.sustained_fraction,
                                     gemm_efficiency(g, p));
        attn_f = exec / rate;
        attn_b = 2.5 * attn_f;
    } else {
        attn_f = gemm_s(s, s, dh, heads, act, g, p) + gemm_s(s, dh, s, heads, act, g, p);
        attn_b = 2.0 * attn_f;
        // Scale-mask-softmax reads and writes the scores; dropout reads them, writes them and
        // a 1-byte mask.
        attn_traffic = tokens * (a / t) * s * (2.0 * act + (p.dropout_masks ? 2.0 * act + 1.0 : 0.0));
    }
    // Memory-bound element-wise work of one forward: each norm reads and writes its input,
    // each residual add (with bias and dropout) reads two tensors and writes one (+ a mask);
    // the MLP activation reads its inputs and writes its output.
    double replicated = 10.0 * h * act + (p.dropout_masks ? 2.0 * h : 0.0);
    if (w.sequence_parallel) replicated /= t;
    const double split = (m.gated_mlp ? 3.0 : 2.0) * f * act / t;
    const double traffic = tokens * (replicated + split) + attn_traffic;
    const double elem = memory_s(traffic, g, p);
    const double attn_elem = memory_s(attn_traffic, g, p);
    // An fp8 plan casts every GEMM input to fp8 with its transpose (Transformer Engine's
    // cast-transpose: read 2 bytes, write 1 + 1 per element): in the forward the inputs of
    // QKV and of the MLP (whole, or split by sequence), of the output projection and of the
    // MLP's down projection; in the backward the gradients arriving at the four outputs.
    double cast_f = 0, cast_b = 0;
    if (w.fp8 && has_fp8(g)) {
        const double whole = w.sequence_parallel ? h / t : h;
        cast_f = memory_s(tokens * 4.0 * (2.0 * whole + h / t + f / t), g, p);
        cast_b = memory_s(tokens * 4.0 * ((h + 2.0 * kv) / t + up / t + 2.0 * whole), g, p);
    }

    const double msg = tokens * h * act;
    BlockTimes out;
    out.tp_comm = 2.0 * ring_allreduce_s(msg, tp, g.intra_node_gbs, p);
    const double fwd = gemm + attn_f + elem + cast_f;
    const double bwd = 2.0 * gemm + attn_b + 2.0 * elem + cast_b;
    out.fwd = fwd * g.block_fwd_scale + out.tp_comm;
    out.bwd = bwd * g.block_bwd_scale + out.tp_comm;
    if (w.recompute == Recompute::Full) {
        out.recompute = fwd * g.block_fwd_scale + out.tp_comm;
    } else if (w.recompute == Recompute::Selective) {
        out.recompute = (attn_f + attn_elem) * g.block_fwd_scale;
    } else if (w.recompute == Recompute::SelectiveOp) {
        // The matmuls whose outputs were not saved (wk, wo, and w3 or, without a gate, w2)
        // and every element-wise op; the attention kernel's output was saved.
        const double redo = gemm_s(tokens, kv / t, h, 1, act, g, p, lin) +
                            gemm_s(tokens, h, h / t, 1, act, g, p, lin) +
                            (m.gated_mlp ? gemm_s(tokens, f / t, h, 1, act, g, p, lin)
                                         : gemm_s(tokens, h, f / t, 1, act, g, p, lin));
        out.recompute = (redo + elem + cast_f) * g.block_fwd_scale + out.tp_comm;
    }
    return out;
}

BlockTimes head_times(const ModelDims& m, const GpuSpec& g, const CostParams& p,
                      const Workload& w, std::int64_t tp) {
    const double tokens = d(w.seq_len) * d(w.micro_batch_size);
    const double h = d(m.hidden_size), V = d(m.vocab_size), t = d(tp);
    const double gemm = gemm_s(tokens, V / t, h, 1, p.bytes_per_activation, g, p);
    // The final norm, and the loss over the logits: written, then read by the softmax.
    const double traffic = tokens * (2.0 * h * p.bytes_per_activation +
                                     2.0 * V / t * p.bytes_per_logit);
    BlockTimes out;
    out.fwd = (gemm + memory_s(traffic, g, p)) * g.head_fwd_scale;
    out.bwd = (2.0 * gemm + memory_s(traffic, g, p)) * g.head_bwd_scale;
    return out;
}

}  // namespace espresso
