// The stage placer: given the stage GPU groups of an allocation (GPU type and TP width of
// each stage) and the data-parallel degree, find the stage order and the contiguous layer
// split with the smallest iteration time, every stage fitting in memory at its position.
//
// Exact within the cost model: a depth-first branch and bound over (order, split) whose
// bound is a dynamic programme over the remaining groups and layers of the pipeline lower
// bound  max_k [ sum_{i<k} (f_i + b_i + 2 c_i) + M (f_k + b_k) ]  (valid for any schedule),
// plus the DP all-reduce and optimizer terms of the stages already placed. Leaves are
// evaluated with the same event simulation as estimate().
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "espresso/clock.hpp"
#include "espresso/cost_model.hpp"

namespace espresso {

struct StageGroup {
    std::int64_t gpu = 0;
    std::int64_t tp = 1;
};

struct PlaceOptions {
    // Only placements with iteration_s <= cutoff_s are of interest (prunes the rest).
    double cutoff_s = std::numeric_limits<double>::infinity();
    // A cutoff that tightens while the placer runs: the search's incumbent (objective units)
    // times `incumbent_scale` seconds per unit. Other threads lower it as they find plans.
    const std::atomic<double>* incumbent = nullptr;
    double incumbent_scale = 0;
    // A lower bound on the objective of every placement (the search's bound for the
    // allocation): once the incumbent falls below it, nothing here can win and the placer
    // stops (an exhaustive answer: no placement within the cutoff).
    double floor = 0;
    // Branch-and-bound nodes before giving up (the result is then not exhaustive).
    std::int64_t node_limit = 2000000;
    // Memoised bound states before falling back to a weaker bound.
    std::int64_t memo_limit = 4000000;
    // Compute-memory ordering of the groups tried first (memory-rich early).
    bool ratio_order = true;
    // Only the compute-memory order itself (no other stage order is tried): the paper's
    // placer, for the prototype baseline.
    bool fixed_order = false;
    // Wall-clock limit in seconds (0: none); the search sets `deadline` instead.
    double time_limit_s = 0;
    Clock::time_point deadline = Clock::time_point::max();
    Halt halt;  // stop when one of its flags turns true
    // Cells of the per-(group, position, layers) tables at most: beyond, the placer gives up
    // (not exhaustive) rather than allocate without bound.
    std::int64_t table_limit = 1 << 22;
    // Only the even split (the baseline of planners without a placer): every stage (GPU group)
    // holds L / P blocks, the first L % P one more; the order is still searched.
    bool even_split = false;
    // Megatron-LM's split: the stages between the first and the last hold the same number of
    // blocks (its --decoder-first/last-pipeline-num-layers set the two ends). place() tries
    // every middle count and keeps the best.
    bool middle_equal = false;
    // With middle_equal: the middle count of one try (0: place() tries them all).
    std::int64_t middle_layers = 0;
};

struct Placement {
    bool found = false;               // a placement within the cutoff exists
    std::vector<StageSpec> stages;    // its stages, in pipeline order
    double iteration_s = std::numeric_limits<double>::infinity();
    double lower_bound_s = 0;         // no placement of these groups is faster
    bool exhaustive = true;           // false: a limit (nodes, time, tables) stopped it
    bool timed_out = false;           // the time limit (or a cancel) stopped it
    std::int64_t nodes = 0;           // branch-and-bound nodes
    std::int64_t leaves = 0;          // placements simulated
};

// Inputs must be validated (estimate() validates; the search validates once).
Placement place(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                const CostParams& params, const Workload& work,
                const std::vector<StageGroup>& groups, const PlaceOptions& options);

}  // namespace espresso
