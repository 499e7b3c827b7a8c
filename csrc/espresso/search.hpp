// The allocator: an exact cost-tree search over heterogeneous GPU allocations.
//
// A node is a partial allocation: for the GPU types taken so far (in order of price per
// effective FLOP/s), how many pipeline stages of each tensor-parallel width. Its children add
// stages of one later type. Nodes are expanded best-first by an admissible lower bound on the
// cost of any completion; every node that holds at least one stage is also a complete
// allocation, whose stage order and layer split the placer finds exactly. Pruning rules:
// cost (bound above the k-th best), deadline (even the fastest completion is too slow),
// memory (no completion can hold the model states), availability (options beyond a type's
// count are never generated) and dominance (a type no better than an earlier one that still
// has room for all of its stages). The outer dimensions (recomputation, micro-batch size,
// data-parallel degree) are the first level of the tree.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "espresso/clock.hpp"
#include "espresso/cost_model.hpp"
#include "espresso/crew.hpp"
#include "espresso/placer.hpp"

namespace espresso {

enum class Objective : int { Cost = 0, Time = 1 };

struct SearchOptions {
    std::vector<std::int64_t> micro_batch_sizes{1, 2, 4, 8};
    std::vector<Recompute> recompute{Recompute::None, Recompute::Full};
    std::vector<Sharding> sharding{Sharding::None};  // levels to try (dp 1: None only)
    // Stages per GPU group to try: 1 (plain pipelines) and, for interleaved 1F1B, v >= 2.
    std::vector<std::int64_t> virtual_stages{1};
    Schedule schedule = Schedule::OneFOneB;
    std::int64_t max_stages = 8;        // pipeline depth at most
    // Depth by variety: entry i is the depth allowed to plans of i + 1 GPU types (the last
    // entry holds for more types; non-increasing; each capped by max_stages). Empty: max_stages
    // for every plan. A search whose deeper tiers exceed the last entry first searches that
    // shallow space for an incumbent (docs/search.md, "Depth").
    std::vector<std::int64_t> max_stages_by_types;
    // Allocations of at most this many stages are another search's (the shallow first pass):
    // not placed, and subtrees holding only such are not generated. 0: none.
    std::int64_t covered_depth = 0;
    std::int64_t max_tp = 8;            // tensor-parallel width at most (powers of two)
    std::int64_t min_tp = 1;            // and at least (a baseline's single width: min = max)
    std::int64_t max_dp = 1 << 20;
    Objective objective = Objective::Cost;
    double budget_usd = std::numeric_limits<double>::infinity();  // Time objective
    bool enforce_deadline = true;
    double time_limit_s = 0;            // wall clock, checked everywhere time is spent; 0: none
    std::int64_t max_gpu_types = 1 << 20;  // distinct GPU types in one plan at most
    // Limits shared by several GPU types (GpuSpec::pool indexes this): the units (vCPUs,
    // GPUs, instances) their instances may use together.
    std::vector<double> pools;
    // Plans worse than this (objective units) are of no interest: the caller holds top_k
    // plans at least this good (e.g. from another domain). Prunes from the first node.
    double incumbent = std::numeric_limits<double>::infinity();
    // Relative gap at which the search stops (as MIP solvers'): nodes whose bound is within
    // this fraction of the incumbent are cut, so the best plan is proven within it. 0: exact.
    double gap = 0.0;
    // Shared with other searches (top_k = 1): read as an incumbent, lowered by this one's plans.
    std::shared_ptr<SharedIncumbent> shared;
    bool share_plans = true;  // false: read `shared` only (its plans are not the caller's)
    // Read by the caller while the search runs (progress), and its cancel flag stops it.
    std::shared_ptr<SearchMonitor> monitor;
    // Threads of the caller that may join this search while it runs, and its yield flag
    // (stops this search alone, as its time limit would). Null: none.
    std::shared_ptr<Crew> crew;
    std::int64_t threads = 1;
    std::int64_t top_k = 1;
    std::int64_t max_frontier = 200000;   // best-first nodes held; beyond, subtrees go depth-first
    PlaceOptions placer;
    // Pruning rules (tests switch them off one at a time; the optimum must not change).
    bool prune_cost = true;
    bool prune_deadline = true;
    bool prune_memory = true;
    bool prune_dominance = true;
};

struct SearchStats {
    std::int64_t nodes_expanded = 0;
    std::int64_t nodes_generated = 0;
    std::int64_t pruned_cost = 0;
    std::int64_t pruned_deadline = 0;
    std::int64_t pruned_memory = 0;
    std::int64_t pruned_availability = 0;
    std::int64_t pruned_dominance = 0;
    std::int64_t leaves_placed = 0;
    std::int64_t placer_nodes = 0;
    std::int64_t placer_leaves = 0;
    std::int64_t frontier_peak = 0;
    std::int64_t dives = 0;             // subtrees finished depth-first (frontier full)
    std::int64_t combos = 0;            // (recompute, micro-batch, dp) combinations
    double seconds = 0;
    double first_plan_s = -1;           // from the search's start to its first plan (-1: none)
    double lower_bound = 0;             // no plan is better than this (objective units)
    bool complete = true;               // the search space was exhausted (gap is exact)
    bool timed_out = false;
    std::int64_t threads = 1;
};

struct SearchPlan {
    Workload work;                      // dp, micro-batch, micro-batches, recompute, schedule
    std::vector<StageSpec> stages;
    EstimateResult estimate;
    double objective = 0;               // total USD (Cost) or total hours (Time)
};

struct SearchResult {
    std::vector<SearchPlan> plans;      // best first, at most top_k
    SearchStats stats;
};

// `job` carries seq_len, global_batch_size, optimizer bytes, iterations and deadline;
// its dp, micro-batch and recomputation fields are ignored (the search chooses them).
SearchResult search(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                    const CostParams& params, const Workload& job, const SearchOptions& options);

}  // namespace espresso
