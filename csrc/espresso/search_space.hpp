// The cost tree's nodes and the tables the search prepares for them (docs/search.md).
//
// A node is a partial allocation for one combination (recomputation, micro-batch size,
// data-parallel degree, sharding, interleaving): for the GPU types taken so far, in order of
// price per effective FLOP/s, how many pipeline stages of each tensor-parallel width.
// SearchSpace holds what every part of the search reads and nothing changes after
// preparation: the catalog's types in the search's order, their rates, memory and widths,
// and one Combo of tables per combination. The bounds (search_bounds.hpp) and the tree
// (search_tree.hpp: preparation and expansion) build on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "espresso/best_first.hpp"
#include "espresso/cost_model.hpp"
#include "espresso/search.hpp"

namespace espresso::search_detail {

// The completion bound over added stages looks at each later type; beyond this many it is
// skipped (the other bounds still hold), so a node's bound stays cheap on huge catalogs.
constexpr std::size_t kExtTypesMax = 256;
// Children one node may generate at most (deep pipelines over many widths can have billions):
// beyond, the rest of that node stays open under its bound (the search reports a gap), so
// memory stays bounded even without a time limit.
constexpr std::size_t kMaxChildren = std::size_t{1} << 18;

inline double d(std::int64_t v) { return static_cast<double>(v); }

struct Choice {
    std::int32_t type;   // catalog index
    std::int32_t tp;
    std::int32_t count;  // stages of this (type, tp)
};

struct Node {
    double lb = 0;
    double own = std::numeric_limits<double>::infinity();  // own_bound, computed once
    std::int64_t seq = 0;
    std::int32_t combo = 0;
    std::int32_t next = 0;   // first order position still open
    std::int32_t stages = 0;
    std::int32_t types = 0;  // distinct GPU types among the choices
    double price = 0;        // USD per hour of the node's whole instances / dp
    double rate = 0;         // per replica, effective FLOP/s
    double cap = 0;          // per replica, usable bytes
    double min_stage_rate = 0;  // smallest tp * rate over the node's stages
    double block_rate = 0;   // per replica: block FLOPs per second, TP all-reduces included
    double unit_rate = 0;    // per replica: sum over stages of M block_flops / unit_s
    std::int64_t max_layers = 0;  // blocks the stages could hold at most, memory-wise
    bool tensor_parallel = false;  // some stage has tp > 1 (its forward carries TP all-reduces)
    double sum_bw = 0;       // per replica: sum over stages of tp * DP link GB/s
    double sum_hbm = 0;      // per replica: sum over stages of tp * memory GB/s
    double spot_rate = 0;    // interruptions per hour of the node's spot instances (all replicas)
    double ext_lb = kInf;    // ext_bound, computed once
    bool full = false;       // ext_lb includes the completion time bound (else FLOP/s only)
    std::vector<Choice> choices;
};

struct NodeOrder {
    bool operator()(const Node& a, const Node& b) const {
        // Smallest bound first; bounds equal to 7 digits count as ties (combinations whose
        // bounds differ only by rounding must not be ordered by that noise).
        const float la = static_cast<float>(a.lb), lb = static_cast<float>(b.lb);
        if (la != lb) return la > lb;
        // Among equal bounds, small allocations first: they are complete plans with the least
        // pipeline overhead, so a good incumbent appears early and prunes the larger ones.
        if (a.stages != b.stages) return a.stages > b.stages;
        if (a.rate != b.rate) return a.rate > b.rate;
        return a.seq > b.seq;
    }
};

struct Combo {
    Workload work;
    double flops_mb = 0;     // FLOPs of one micro-batch through the whole model, fwd + bwd
    double head_flops = 0;   // FLOPs of the LM head for one micro-batch, fwd + bwd
    double block_flops = 0;  // FLOPs of one block for one micro-batch, fwd + bwd (+ recompute)
    double c0_blocks = 0, t0_blocks = 0, block_rate_min = 0;  // the same, blocks only
    double c0 = 0;           // cost = c0 * price / rate at best (cost objective)
    double t0 = 0;           // hours = t0 / rate at best (time objective)
    double rate_min = 0;     // per-replica FLOP/s the deadline needs
    // DP all-reduce and optimizer step: the largest over stages is at least
    // k_ar * L / sum(tp * link GB/s) + lat_ar and k_opt * L / sum(tp * memory GB/s).
    double k_ar = 0, lat_ar = 0, k_opt = 0;
    // With the gradients' reduction overlapping the last backward (overlap_grad_reduce):
    // the whole DP traffic per block over 1 GB/s (k_all), exposed but for that backward.
    double k_all = 0;
    bool hidden = false;
    double need_bytes = 0;   // per-replica memory any plan needs
    std::vector<double> suffix_rate, suffix_cap;  // by order position
    // Most blocks one stage of (type, width index) can hold: a middle stage with a single
    // micro-batch in flight, the most lenient position (an upper bound for every position).
    std::vector<std::vector<std::int64_t>> max_layers;
    // The same with k micro-batches in flight, k = 1..kin (more blocks than this never fit
    // a stage holding k micro-batches' activations, at any position): by type, width, k-1.
    std::vector<std::vector<std::vector<std::int64_t>>> max_layers_k;
    std::int64_t kin = 1;
    // Most stages of a plan: 1F1B with more than one micro-batch needs one per stage (with
    // fewer it would run as GPipe, which the bounds of this schedule do not cover).
    std::int64_t max_stages = 1;
    // Per type, for the completion bound: (block time, memory limit) of each width the
    // type's per-replica GPUs allow, the largest tp * DP link GB/s and tp * memory GB/s of
    // one stage, and of all its GPUs.
    struct Option {
        std::vector<std::pair<double, std::int64_t>> widths;
        std::vector<double> head;  // the LM head's time on a stage of that width
        std::vector<double> unit;  // unit_s of that width
        std::int64_t avail = 0;
        bool tp = false;
        double bw_slot = 0, bw_all = 0, hbm_slot = 0, hbm_all = 0, t_min = kInf, t_max = 0;
    };
    std::vector<Option> options;
    std::vector<std::vector<double>> block_s;  // block_time() by type and width index
    std::vector<std::vector<double>> head_s;   // head_time() by type and width index
    // Iteration seconds per block a stage of (type, width index) adds at least: its M
    // micro-batches' compute, its DP traffic and its optimizer step (Bounds::unit_time).
    std::vector<std::vector<double>> unit_s;
    // The blocks' rate the types bring (Bounds::blocks_ratio), each stage's at its unit
    // time (M block_flops / unit_s): by type, the most one GPU brings at any width and the
    // least one stage brings; the order positions by price per unit of that rate; by order
    // position, the sums over the later types' per-replica GPUs and the least stage.
    std::vector<double> blk_gpu, blk_stage_min;
    std::vector<std::size_t> blk_order;
    std::vector<double> blk_suffix_rate, blk_suffix_stage_min;
};

// A total order on plans with equal objective, so the answer never depends on timing.
using PlanKey = std::tuple<double, std::int64_t, double, std::int64_t, std::int64_t, int,
                           std::vector<std::int64_t>>;

inline PlanKey key_of(const SearchPlan& p) {
    std::int64_t gpus = 0;
    std::vector<std::int64_t> st;
    const std::size_t groups = p.stages.size() / static_cast<std::size_t>(std::max<std::int64_t>(1, p.work.virtual_stages));
    for (std::size_t i = 0; i < p.stages.size(); ++i) {
        const StageSpec& s = p.stages[i];
        if (i < groups) gpus += s.tp * p.work.dp;
        st.insert(st.end(), {s.gpu, s.tp, s.layer_begin, s.layer_end});
    }
    // (The stages list every stage, so an interleaved plan differs from a plain one.)
    return {p.objective, gpus, p.estimate.iteration_s, p.work.dp, p.work.micro_batch_size,
            static_cast<int>(p.work.recompute) * 4 + static_cast<int>(p.work.sharding) +
                16 * static_cast<int>(p.work.virtual_stages),
            st};
}

class SearchSpace {
public:
    SearchSpace(const ModelDims& model, const std::vector<GpuSpec>& gpus, const CostParams& params,
                const Workload& job, const SearchOptions& opt)
        : model_(model), gpus_(gpus), params_(params), job_(job), opt_(opt) {}

    const std::vector<Combo>& combos() const { return combos_; }

protected:
    // A bound above the threshold cuts (when cost pruning is on).
    bool beyond(double lb, double thr) const {
        return opt_.prune_cost && lb > thr * (1 - opt_.gap) * (1 + kSlack);
    }

    const ModelDims& model_;
    const std::vector<GpuSpec>& gpus_;
    const CostParams& params_;
    const Workload& job_;
    const SearchOptions& opt_;
    std::vector<double> rate_, cap_, suffix_min_rate_, suffix_min_price_;
    double checkpoint_h_ = 0;   // hours to write one checkpoint (spot plans)
    double restart_min_h_ = 0;  // the least restart of any spot row (its recovery, the restart, the read)
    bool time_only_ = false;       // time objective without a budget: prices play no part
    double bwd_fwd_ratio_ = 1.0;   // least profile backward/forward ratio (1: analytic)
    double min_act_scale_ = 1.0;   // least profile activation factor, at most 1
    std::vector<std::vector<std::int64_t>> widths_, dominators_;
    std::vector<std::int64_t> order_;
    std::vector<Combo> combos_;
};

}  // namespace espresso::search_detail
