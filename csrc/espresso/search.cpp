// The allocator's driver (search.hpp): options checked, the passes over depth, one exact
// search per pass. The search's parts live in their own files: the nodes and prepared tables
// (search_space.hpp), the bounds (search_bounds.{hpp,cpp}), the tree's preparation and
// expansion (search_tree.hpp, search_prepare.cpp, search_expand.cpp), and the parallel
// best-first engine (best_first.hpp).
#include "espresso/search.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "espresso/best_first.hpp"
#include "espresso/pipeline_sim.hpp"
#include "espresso/search_tree.hpp"

namespace espresso {

namespace {

using search_detail::BestFirst;
using search_detail::FitCache;
using search_detail::key_of;
using search_detail::kInf;
using search_detail::Node;
using search_detail::Tree;

void check_options(const SearchOptions& o) {
    if (o.micro_batch_sizes.empty()) throw std::invalid_argument("micro_batch_sizes must not be empty");
    for (const std::int64_t b : o.micro_batch_sizes) {
        if (b < 1 || b > (1 << 24)) throw std::invalid_argument("micro_batch_sizes: each must be in [1, 2^24]");
    }
    if (o.recompute.empty()) throw std::invalid_argument("recompute options must not be empty");
    for (const Recompute r : o.recompute) {
        if (r != Recompute::None && r != Recompute::Full && r != Recompute::Selective &&
            r != Recompute::SelectiveOp) {
            throw std::invalid_argument(
                "recompute options must be none, full, selective or selective-op");
        }
    }
    if (o.virtual_stages.empty()) {
        throw std::invalid_argument("virtual_stages options must not be empty");
    }
    for (const std::int64_t v : o.virtual_stages) {
        if (v < 1 || v > 64) throw std::invalid_argument("virtual_stages options must be in [1, 64]");
    }
    if (o.sharding.empty()) throw std::invalid_argument("sharding options must not be empty");
    for (const Sharding sh : o.sharding) {
        if (sh != Sharding::None && sh != Sharding::Zero1 && sh != Sharding::Zero2 &&
            sh != Sharding::Full) {
            throw std::invalid_argument("sharding options must be none, zero1, zero2 or full");
        }
    }
    if (o.max_stages < 1 || o.max_stages > kMaxStages) {
        throw std::invalid_argument("max_stages must be in [1, " + std::to_string(kMaxStages) + "]");
    }
    if (o.covered_depth < 0) throw std::invalid_argument("covered_depth must be >= 0");
    if (o.max_stages_by_types.size() > 1024) {
        throw std::invalid_argument("max_stages_by_types: at most 1024 entries");
    }
    for (std::size_t i = 0; i < o.max_stages_by_types.size(); ++i) {
        const std::int64_t v = o.max_stages_by_types[i];
        if (v < 1 || v > kMaxStages) {
            throw std::invalid_argument("max_stages_by_types: each must be in [1, " +
                                        std::to_string(kMaxStages) + "]");
        }
        if (i > 0 && v > o.max_stages_by_types[i - 1]) {
            throw std::invalid_argument("max_stages_by_types must not increase (entry " +
                                        std::to_string(i) + ")");
        }
    }
    if (o.max_tp < 1 || o.max_tp > 1024) throw std::invalid_argument("max_tp must be in [1, 1024]");
    if (o.min_tp < 1 || o.min_tp > o.max_tp) throw std::invalid_argument("min_tp must be in [1, max_tp]");
    if (o.max_dp < 1) throw std::invalid_argument("max_dp must be >= 1");
    if (o.top_k < 1 || o.top_k > 1000) throw std::invalid_argument("top_k must be in [1, 1000]");
    if (o.threads < 1 || o.threads > 1024) throw std::invalid_argument("threads must be in [1, 1024]");
    if (!(o.time_limit_s >= 0) || !std::isfinite(o.time_limit_s)) {
        throw std::invalid_argument("time_limit_s must be a finite number >= 0");
    }
    if (!(o.budget_usd > 0)) throw std::invalid_argument("budget_usd must be > 0");
    if (o.max_frontier < 1) throw std::invalid_argument("max_frontier must be >= 1");
    if (std::isnan(o.incumbent)) throw std::invalid_argument("incumbent must be a number");
    if (!(o.gap >= 0 && o.gap < 1)) throw std::invalid_argument("gap must be in [0, 1)");
    if (o.max_gpu_types < 1) throw std::invalid_argument("max_gpu_types must be >= 1");
    if (o.pools.size() > (std::size_t{1} << 20)) throw std::invalid_argument("pools: at most 2^20");
    for (const double cap : o.pools) {
        if (!std::isfinite(cap) || cap < 0 || cap > 1e12) {
            throw std::invalid_argument("pools: each capacity must be in [0, 1e12]");
        }
    }
    if (o.placer.node_limit < 1 || o.placer.memo_limit < 0) {
        throw std::invalid_argument("placer limits must be positive");
    }
}

// One exact search of the space `opt` describes: the tree prepared, then run best-first.
SearchResult run_search(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                        const CostParams& params, const Workload& job, const SearchOptions& opt,
                        FitCache& fits) {
    const auto t_start = std::chrono::steady_clock::now();
    const Clock::time_point deadline = Stopwatch::after(opt.time_limit_s);
    const std::atomic<bool>* cancel = opt.monitor ? &opt.monitor->cancel : nullptr;
    const Halt halt = opt.crew ? opt.crew->halt(cancel) : Halt{cancel};
    Stopwatch sw(deadline, halt);
    Tree tree(model, gpus, params, job, opt);
    BestFirst<Tree> engine(opt, tree);
    engine.start(deadline, halt);
    tree.limits(deadline, halt, engine.incumbent());
    tree.prepare_types();
    tree.share_fits(&fits);
    if (tree.prepare_combos(sw)) {
        engine.stats().combos = static_cast<std::int64_t>(tree.combos().size());
    }
    if (sw.check_now()) {
        engine.give_up();  // out of time while building the tables
    } else {
        for (Node& root : tree.roots()) engine.push(std::move(root));
    }
    return engine.run(t_start);
}

}  // namespace

SearchResult search(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                    const CostParams& params, const Workload& job, const SearchOptions& options) {
    // Helpers waiting to join go home however the search ends (an error included).
    struct Finish {
        Crew* crew;
        ~Finish() {
            if (crew != nullptr) crew->finish();
        }
    } finish{options.crew.get()};
    if (options.crew) {
        options.crew->arm(options.shared.get(),
                          std::min(options.incumbent, options.shared ? options.shared->value.load() : kInf));
    }
    validate(model);
    validate(params);
    for (std::size_t g = 0; g < gpus.size(); ++g) {
        validate(gpus[g], g);
        if (gpus[g].pool >= static_cast<std::int64_t>(options.pools.size())) {
            throw std::invalid_argument("gpus[" + std::to_string(g) + "].pool: " +
                                        std::to_string(gpus[g].pool) + " is not a pool index "
                                        "(options.pools has " + std::to_string(options.pools.size()) + ")");
        }
    }
    if (gpus.empty()) throw std::invalid_argument("the catalog has no GPU types");
    Workload w = job;
    w.dp = 1;
    w.micro_batch_size = 1;
    w.num_microbatches = 1;
    validate(w);
    if (!(job.iterations >= 1)) throw std::invalid_argument("iterations must be >= 1");
    if (!(job.deadline_hours > 0)) throw std::invalid_argument("deadline_hours must be > 0");
    check_options(options);
    // Passes (docs/search.md, "Depth" and "Passes"), each an exact search of part of the
    // space, sharing the time limit; every pass takes the best plans so far as its incumbent
    // and the plans of all are merged.
    //   0. a seed: plans of at most two GPU types and the shallow depth, with at most a tenth
    //      of the time (its space lies inside pass 1's; any plan it finds prunes pass 1,
    //      which otherwise meets a good plan early or late by the threads' timing);
    //   1. the shallow space: every plan at most the last depth entry deep, any types;
    //   2. depth by variety: only the allocations deeper than that (covered_depth), when
    //      plans of few types may be deeper than the rest.
    const auto& by = options.max_stages_by_types;
    const std::int64_t shallow = by.empty() ? options.max_stages : std::min(options.max_stages, by.back());
    const std::int64_t deepest = by.empty() ? options.max_stages : std::min(options.max_stages, by.front());
    // (Over four types or fewer, no seed: pass 1 is small there, and the seed's preparation
    // was a sixth of the prototype's instance.)
    const bool seed = options.max_gpu_types > 2 && gpus.size() > 4;
    FitCache fits;  // what memory allows each stage, shared by the passes
    if (deepest <= shallow && !seed) return run_search(model, gpus, params, job, options, fits);
    const auto t0 = std::chrono::steady_clock::now();
    auto since_t0 = [&] {  // seconds
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    auto left = [&](double share) {  // seconds for a pass: `share` of the limit, within what is left
        if (options.time_limit_s <= 0) return 0.0;
        const double used = since_t0();
        return std::max(1e-3, std::min(share * options.time_limit_s, options.time_limit_s - used));
    };
    std::vector<SearchPlan> plans;
    auto incumbent = [&](double given) {
        if (static_cast<std::int64_t>(plans.size()) < options.top_k) return given;
        return std::min(given, plans[static_cast<std::size_t>(options.top_k - 1)].objective);
    };
    auto merge = [&](std::vector<SearchPlan>&& more) {
        for (SearchPlan& p : more) plans.push_back(std::move(p));
        std::stable_sort(plans.begin(), plans.end(), [](const SearchPlan& x, const SearchPlan& y) {
            return key_of(x) < key_of(y);
        });
        std::vector<SearchPlan> kept;
        for (SearchPlan& p : plans) {
            if (!kept.empty() && key_of(kept.back()) == key_of(p)) continue;
            if (static_cast<std::int64_t>(kept.size()) >= options.top_k) break;
            kept.push_back(std::move(p));
        }
        plans = std::move(kept);
    };
    SearchStats st;
    double first = kInf;  // from t0 to the first plan of any pass
    // A pass's statistics, added to the call's; `at`: when the pass began (seconds from t0).
    auto add = [&](const SearchStats& f, double at) {
        if (f.first_plan_s >= 0) first = std::min(first, at + f.first_plan_s);
        st.nodes_expanded += f.nodes_expanded;
        st.nodes_generated += f.nodes_generated;
        st.pruned_cost += f.pruned_cost;
        st.pruned_deadline += f.pruned_deadline;
        st.pruned_memory += f.pruned_memory;
        st.pruned_availability += f.pruned_availability;
        st.pruned_dominance += f.pruned_dominance;
        st.leaves_placed += f.leaves_placed;
        st.placer_nodes += f.placer_nodes;
        st.placer_leaves += f.placer_leaves;
        st.frontier_peak = std::max(st.frontier_peak, f.frontier_peak);
        st.dives += f.dives;
        st.timed_out = st.timed_out || f.timed_out;
        st.threads = std::max(st.threads, f.threads);
        st.combos = std::max(st.combos, f.combos);
    };
    double lower = kInf;  // the smallest bound the covering passes leave open
    bool complete = true;
    if (seed) {
        SearchOptions o = options;
        o.max_stages = shallow;
        o.max_stages_by_types.clear();
        o.max_gpu_types = 2;
        if (options.time_limit_s > 0) o.time_limit_s = left(0.1);
        const double at = since_t0();
        SearchResult r = run_search(model, gpus, params, job, o, fits);
        add(r.stats, at);
        merge(std::move(r.plans));
    }
    {
        SearchOptions o = options;
        o.max_stages = shallow;
        o.max_stages_by_types.clear();
        o.incumbent = incumbent(options.incumbent);
        if (options.time_limit_s > 0) o.time_limit_s = left(deepest > shallow ? 0.75 : 1.0);
        const double at = since_t0();
        SearchResult r = run_search(model, gpus, params, job, o, fits);
        add(r.stats, at);
        complete = complete && r.stats.complete;
        lower = std::min(lower, r.stats.lower_bound);
        merge(std::move(r.plans));
    }
    if (deepest > shallow) {
        SearchOptions o = options;
        o.covered_depth = shallow;
        o.incumbent = incumbent(options.incumbent);
        if (options.time_limit_s > 0) o.time_limit_s = left(1.0);
        const double at = since_t0();
        SearchResult r = run_search(model, gpus, params, job, o, fits);
        add(r.stats, at);
        complete = complete && r.stats.complete;
        lower = std::min(lower, r.stats.lower_bound);
        merge(std::move(r.plans));
    }
    SearchResult out;
    out.plans = std::move(plans);
    st.seconds = since_t0();
    st.complete = complete;
    st.first_plan_s = first < kInf ? first : -1.0;
    const double best = out.plans.empty() ? kInf : out.plans.front().objective;
    st.lower_bound = complete ? best : std::min(best, lower);
    // Nodes within the gap of an incumbent were cut: what is proven is that much less.
    if (options.gap > 0) st.lower_bound = std::min(st.lower_bound, best * (1 - options.gap));
    out.stats = st;
    return out;
}

}  // namespace espresso
