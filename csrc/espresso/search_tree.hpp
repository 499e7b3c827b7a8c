// The cost tree: how it is prepared (search_prepare.cpp) and how a node expands
// (search_expand.cpp), the Problem the best-first engine (best_first.hpp) runs.
//
// The tree's first level is the combinations; below, each node adds stages of one later GPU
// type. Every node holding at least one stage is also a complete allocation, whose stage
// order and layer split the placer finds exactly. Children are generated within every
// type's availability and cut by the bounds (cost, deadline, memory) and by dominance (a type
// no better than an earlier one that still has room for all of its stages).
#pragma once

#include <functional>
#include <tuple>
#include <unordered_map>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "espresso/best_first.hpp"
#include "espresso/clock.hpp"
#include "espresso/search_bounds.hpp"

namespace espresso::search_detail {

// What memory allows a stage of one GPU type and width under one combination (its workload:
// recomputation, micro-batch, dp, sharding, interleaving): the most blocks with one
// micro-batch in flight, and the slopes the bound on them with k in flight comes from. The
// passes of one search (search.cpp) prepare the same combinations over the same types, so
// they share these (the cost model's memory, evaluated a dozen times each, was most of the
// time of small searches), and the tabled times.
struct StageFit {
    std::int64_t most = 0;
    double m1 = 0, per_block = 0, act = 0, stash_out = 0, usable = 0;
    // The stage's tabled times (Bounds::block_time, head_time, unit_time).
    double block_s = 0, head_s = 0, unit_s = 0;
};
// (recompute, micro-batch, dp, sharding, virtual stages, type, width)
using FitKey = std::tuple<int, std::int64_t, std::int64_t, int, std::int64_t, std::size_t, std::int64_t>;
// A hash of the key's fields (boost's combine): a lookup per stage fit, thousands per search.
struct FitKeyHash {
    std::size_t operator()(const FitKey& k) const {
        std::size_t h = 0;
        std::apply([&h](auto... f) {
            ((h ^= std::hash<std::uint64_t>{}(static_cast<std::uint64_t>(f)) +
                   0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)), ...);
        }, k);
        return h;
    }
};
using FitCache = std::unordered_map<FitKey, StageFit, FitKeyHash>;

class Tree : public Bounds {
public:
    using Node = search_detail::Node;
    using Order = NodeOrder;
    using Bounds::Bounds;

    // ---------------------------------------------------------------- preparation
    // The types in the search's order, their rates, widths and dominators.
    void prepare_types();
    // One Combo per combination; false when the time ran out first.
    bool prepare_combos(Stopwatch& sw);
    // Fits computed by an earlier pass over the same catalog and job, and kept for the next.
    void share_fits(FitCache* fits) { fits_ = fits; }
    // The first level: each combination whose bound is finite.
    std::vector<Node> roots() const;

    // The limits an expansion keeps (the placer's included): the deadline, the stop flags,
    // and the engine's incumbent.
    void limits(Clock::time_point deadline, Halt halt, const std::atomic<double>* incumbent) {
        deadline_ = deadline;
        halt_ = halt;
        incumbent_ = incumbent;
    }

    // ---------------------------------------------------------------- the engine's Problem
    static PlanKey key(const SearchPlan& p) { return key_of(p); }
    // A child's completion bound waits until it leaves the frontier (most are cut first).
    bool lazy(const Node& n) const { return !n.full; }
    double tighten(Node& n, double thr) const {
        const Combo& c = combos_[static_cast<std::size_t>(n.combo)];
        n.ext_lb = ext_bound(n, c, thr, true);
        n.full = true;
        return std::min(n.own, n.ext_lb);
    }
    void expand(const Node& node, double thr, std::vector<Node>& children, Local& local) {
        process(node, thr, children, local);
    }

private:
    bool dominates(std::int64_t i, std::int64_t j) const;

    // Units of shared limit `pool` the node's instances use (GpuSpec::pool_units each).
    double pool_used(const Node& n, const Combo& c, std::int64_t pool) const;
    // GPUs per replica type t may add to node n: its own count, and what its pool has left.
    std::int64_t room_per_replica(const Node& n, const Combo& c, std::int64_t t) const;

    StageFit stage_fit(const Combo& c, std::size_t st, std::int64_t tp) const;
    // stage_fit, from the passes' cache where an earlier pass computed it.
    StageFit fit_of(const FitKey& key, const Combo& c, std::size_t st, std::int64_t tp) const;
    std::vector<std::int64_t> layers_in_flight(const Combo& c, const StageFit& f) const;

    void prepare_options(Combo& c) const;
    void prepare_block_rates(Combo& c) const;

    void process(const Node& node, double thr, std::vector<Node>& children, Local& local);

    void enumerate(const Node& node, const Combo& c, std::size_t p,
                   const std::vector<std::int64_t>& ws, std::int64_t per_replica,
                   std::int64_t room, std::size_t wi, std::int64_t used_gpus,
                   std::int64_t used_stages, std::vector<std::int64_t>& counts, double thr,
                   std::vector<Node>& children, Local& local);

    void make_child(const Node& node, const Combo& c, std::size_t p,
                    const std::vector<std::int64_t>& ws, const std::vector<std::int64_t>& counts,
                    std::int64_t gpus_per_replica, std::int64_t stages, double thr,
                    std::vector<Node>& children, Local& local);

    void place_allocation(const Node& node, const Combo& c, double own, double thr, Local& local);

    Clock::time_point deadline_ = Clock::time_point::max();
    Halt halt_;
    const std::atomic<double>* incumbent_ = nullptr;
    FitCache* fits_ = nullptr;
};

}  // namespace espresso::search_detail
