// The admissible lower bounds of the cost tree (docs/search.md, "Bounds").
//
// Each is a pure function of a node and its combination's tables: no plan the node or its
// completions can yield has a smaller objective (or iteration time, for the time bounds), so
// cutting a node whose bound is above the incumbent never loses the optimum. Each
// definition in search_bounds.cpp carries its admissibility argument.
//   effective_rate, q_factor          the pipeline's fill: a rate no pipeline exceeds
//   bottleneck_bound, positioned_tau  whole blocks per stage within each stage's memory
//   own_bound                         the node's own allocation (rate, bottleneck, 1F1B,
//                                     round trips, synchronisation, spot, deadline)
//   ext_bound, type_bound             completions that add later types: FLOP/s and prices
//   ext_time_bound                    completions: their iteration time
//   node_sends, send_lb, round_trip_bound, sync_bound   transfers and DP synchronisation
//   spot_lb, deadline_lb              interruptions: expected hours and the deadline's
//                                     confidence
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "espresso/search_space.hpp"
#include "espresso/spot.hpp"

namespace espresso::search_detail {

class Bounds : public SearchSpace {
public:
    using SearchSpace::SearchSpace;

    // q with w_k >= q f_k on every stage (effective_rate() says why it matters): a backward
    // computes at least twice a forward (the head's too, so recomputation does not raise it to
    // 3 on the last stage), times the profiles' least backward/forward ratio; with tensor
    // parallelism both directions carry the same all-reduces, so only b >= f is sure.
    double q_factor(const Node& n) const {
        return 1.0 + (n.tensor_parallel ? std::min(1.0, 2.0 * bwd_fwd_ratio_)
                                        : 2.0 * bwd_fwd_ratio_);
    }

    double effective_rate(const Node& n, const Combo& c) const;

    double block_time(const Combo& c, std::int64_t type, std::int64_t tp) const;

    // A node's stages of one (type, width), as the bottleneck bounds see them: block time,
    // the most blocks one such stage holds (memory), how many stages, the LM head's time.
    struct Group {
        double t;
        std::int64_t cap, count;
        double head;
        double unit;  // unit_time() of the stage (Combo::unit_s)
    };

    // Blocks that `room` added stages take at best: (blocks a stage of a type takes, stages
    // of that type at most) pairs, the most blocks first, until all L are held.
    static std::int64_t best_added(std::vector<std::pair<std::int64_t, std::int64_t>>& vals,
                                   std::int64_t room, std::int64_t total, std::int64_t L);

    std::vector<Group> groups_of(const Node& n, const Combo& c) const;

    double bottleneck_bound(const Node& n, const Combo& c) const;
    // The least tau at which every group's stages take at least one block and together
    // all L, each at most min(floor(tau / t), its cap) blocks (kInf: never).
    double least_tau(const std::vector<Group>& gs) const;
    // The same by bisection over each group's values (the reference least_tau() falls back to).
    double least_tau_bisect(const std::vector<Group>& gs) const;
    // The least block work sum_i n_i t_i of a split of the L blocks over the groups' stages
    // (`by_t`: sorted by block time) in which every stage takes at least one block and at
    // most blocks_within(x, t, cap): no pipeline whose bottleneck is at most x works less per
    // micro-batch. Non-increasing in x; kInf when no split fits.
    double least_work(const std::vector<Group>& by_t, double x) const;
    double unit_time(const Combo& c, std::int64_t type, std::int64_t tp, double block_s) const;
    double unit_bound(std::vector<Group> gs) const;
    double coupled_bound(const Node& n, const Combo& c, const std::vector<Group>& gs,
                         double tau_lo, const std::function<double(double)>& pipe) const;
    double sync_opt(const Combo& c, double sum_hbm) const;
    double ext_unit_bound(const Node& n, const Combo& c, std::int64_t room) const;
    double ext_fill_bound(const Combo& c, const std::vector<Group>& own,
                          const std::vector<const Combo::Option*>& ext, std::int64_t room,
                          double a, double tau_lo, double tau_hi, double sync,
                          const std::function<double(double)>& rt_of, double target) const;

    double positioned_tau(const Node& n, const Combo& c) const;

    // The LM head's forward and backward on a stage of `tp` GPUs of `type`, at the type's
    // fastest rate (no TP all-reduce is charged for it: a lower bound).
    double head_time(const Combo& c, std::int64_t type, std::int64_t tp) const {
        const BlockTimes ht = head_times(model_, gpus_[static_cast<std::size_t>(type)], params_,
                                         c.work, tp);
        return ht.fwd + ht.bwd;
    }

    double own_bound(const Node& n, const Combo& c, double tau = -1.0,
                     double thr = kInf) const;

    double ext_bound(const Node& n, const Combo& c, double thr = kInf, bool full = true) const;

    // The node's stages' transfers on the network between instances (each stage's own
    // time; a transfer takes the larger of its two ends'): their sum, the least, and how
    // much in-instance links can take off at most. Two stages of a type share an instance
    // only when both sit whole in it (dp * tp <= its GPUs); the s such stages of a type lie
    // in at least m = ceil(their GPUs / instance) instances, so at most s - m boundaries of
    // the path run inside one, each saving at most that type's network-minus-link time.
    struct Sends {
        double sum = 0, least = kInf, saving = 0;
    };

    Sends node_sends(const Node& n, const Combo& c) const;

    // Whether two stages of `type` could share one of its instances in some completion.
    bool can_share(const Combo& c, std::int64_t type) const {
        const auto& ws = widths_[static_cast<std::size_t>(type)];
        return !ws.empty() && c.work.dp * 2 * ws.front() <= gpus_[static_cast<std::size_t>(type)].gpus_per_node;
    }

    double send_lb(const Combo& c, double bw) const;

    // The least sum of the P - 1 transfers of a pipeline whose P stages, on their own links,
    // send in the times `sum` (over all stages) and `least` (the smallest). A transfer runs at
    // the slower end's link, so it takes the larger of its two stages' times; any t stages
    // (t < P) touch at least t of the path's links, so the k-th largest transfer is at least
    // the k-th largest stage time: the sum is at least that of the P - 1 largest.
    static double boundary_sum(double sum, double least) { return sum - least; }

    // 1F1B's round trips (docs/search.md): stage 0 keeps at most min(P, M) micro-batches in
    // flight, and each one's forward and backward through every stage and link takes at least
    // `work` (the stages' work per micro-batch) plus twice the transfers (`sends`, their sum):
    // the iteration takes at least ceil(M / min(P, M)) such round trips. Pipelines on slow
    // links hit this bound.
    double round_trip_bound(const Combo& c, std::int64_t P, double work, double sends) const {
        if (c.work.schedule != Schedule::OneFOneB || P < 2) return 0.0;
        const std::int64_t M = c.work.num_microbatches;
        const std::int64_t nf = std::min(P, M);
        return d((M + nf - 1) / nf) * (work + 2.0 * sends);
    }

    double sync_bound(const Combo& c, double sum_bw, double sum_hbm) const;

    // The most stages a plan of `types` GPU types may have in combination c (depth by
    // variety; non-increasing in `types`, so a completion of a node of t types, which has
    // more, has at most depth_cap(c, t + 1) stages).
    std::int64_t depth_cap(const Combo& c, std::int64_t types) const {
        const auto& by = opt_.max_stages_by_types;
        if (by.empty() || types < 1) return c.max_stages;
        const auto i = static_cast<std::size_t>(std::min<std::int64_t>(types, static_cast<std::int64_t>(by.size())) - 1);
        return std::min(c.max_stages, by[i]);
    }

    // GB/s a stage of `tp` GPUs of `type` brings to the DP all-reduce bound (tp * its link).
    double stage_bw(const Combo& c, std::int64_t type, std::int64_t tp) const {
        return d(tp) * dp_link_gbs(gpus_[static_cast<std::size_t>(type)], c.work.dp, tp);
    }

    double ext_time_bound(const Node& n, const Combo& c, double target = kInf) const;

    double type_bound(const Node& n, const Combo& c, std::size_t p, bool must) const;
    double blocks_ratio(const Node& n, const Combo& c, std::size_t p, bool must) const;

    // The least expected hours per hour of work of a plan with `rate` interruptions per
    // hour or more (1 without spot instances).
    double spot_lb(double rate) const {
        return rate > 0 ? spot_factor(rate, checkpoint_h_, restart_min_h_) : 1.0;
    }

    // The least hours at the deadline's confidence of `work` hours of work with `rate`
    // interruptions per hour or more (the work itself without spot instances).
    double deadline_lb(double work, double rate) const {
        return rate > 0 ? hours_at_confidence_lb(work, rate, checkpoint_h_, restart_min_h_,
                                                 job_.deadline_confidence,
                                                 job_.deadline_hours * (1 + 2 * kSlack))
                        : work;
    }
};

}  // namespace espresso::search_detail
