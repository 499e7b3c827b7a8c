// Expanding a node of the cost tree: its own allocation placed, its children generated
// (search_tree.hpp).
#include "espresso/search_tree.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "espresso/pipeline_sim.hpp"
#include "espresso/placer.hpp"

namespace espresso::search_detail {

double Tree::pool_used(const Node& n, const Combo& c, std::int64_t pool) const {
    double used = 0;
    for (std::size_t k = 0; k < n.choices.size(); ++k) {
        const std::int32_t t = n.choices[k].type;
        const GpuSpec& g = gpus_[static_cast<std::size_t>(t)];
        if (g.pool != pool) continue;
        // A type's choices are adjacent (a node adds one type at a time): its GPUs in all.
        if (k > 0 && n.choices[k - 1].type == t) continue;
        std::int64_t gpus = 0;
        for (std::size_t j = k; j < n.choices.size() && n.choices[j].type == t; ++j) {
            gpus += std::int64_t{n.choices[j].tp} * n.choices[j].count;
        }
        used += d(instances_for(g, c.work.dp * gpus)) * g.pool_units;
    }
    return used;
}

std::int64_t Tree::room_per_replica(const Node& n, const Combo& c, std::int64_t t) const {
    const GpuSpec& g = gpus_[static_cast<std::size_t>(t)];
    std::int64_t gpus = g.count;
    if (g.pool >= 0 && g.pool_units > 0) {
        const double left = opt_.pools[static_cast<std::size_t>(g.pool)] - pool_used(n, c, g.pool);
        // ceil(dp x used / node) instances x units <= left
        const double inst = std::floor(left / g.pool_units * (1 + 1e-12));
        const double most = std::max(0.0, inst) * d(g.gpus_per_node);
        if (most < d(gpus)) gpus = static_cast<std::int64_t>(most);
    }
    return gpus / c.work.dp;
}

void Tree::process(const Node& node, double thr, std::vector<Node>& children, Local& local) {
    const Combo& c = combos_[static_cast<std::size_t>(node.combo)];
    // 1. The node's own allocation.
    const double own = node.own;  // computed when the node was made
    if (node.stages >= 1 && node.stages > opt_.covered_depth) {
        if (!std::isfinite(own)) {
            const bool memory = node.cap < c.need_bytes ||
                                node.max_layers < model_.num_layers ||
                                !std::isfinite(bottleneck_bound(node, c));
            if (memory && opt_.prune_memory) ++local.s.pruned_memory;
            else if (opt_.objective == Objective::Time) ++local.s.pruned_cost;  // budget
            else ++local.s.pruned_deadline;
        } else if (beyond(own, thr)) {
            ++local.s.pruned_cost;
        } else {
            // The bottleneck with every stage's memory at its position: dearer than the
            // other bounds, so only for allocations that would go to the placer.
            // (Memory by position is 1F1B's; an interleaved group holds at least one
            // micro-batch of all its blocks, as the lenient caps assume.)
            const double tau = c.work.virtual_stages > 1 ? bottleneck_bound(node, c)
                                                         : positioned_tau(node, c);
            const double own2 = std::isfinite(tau) ? own_bound(node, c, tau) : kInf;
            if (!std::isfinite(tau)) {
                ++local.s.pruned_memory;
            } else if (!std::isfinite(own2)) {
                ++(opt_.objective == Objective::Time ? local.s.pruned_cost
                                                     : local.s.pruned_deadline);
            } else if (beyond(own2, thr)) {
                ++local.s.pruned_cost;
            } else {
                place_allocation(node, c, own2, thr, local);
            }
        }
    }
    // 2. Children: stages of one more type, at any later order position.
    const double ext = node.full ? node.ext_lb : ext_bound(node, c, thr, true);
    if (!std::isfinite(ext) || beyond(ext, thr)) return;
    if (local.sw.check_now()) {
        // Out of time: what lies below this node stays open, bounded by its bound.
        local.incomplete = true;
        local.open_lb = std::min(local.open_lb, node.lb);
        return;
    }
    const std::int64_t cap = depth_cap(c, node.types + 1);
    if (cap <= opt_.covered_depth) return;  // every allocation below is covered elsewhere
    const std::int64_t room = cap - node.stages;
    for (std::size_t p = static_cast<std::size_t>(node.next); p < order_.size(); ++p) {
        // Completions from position p on cost at least this, a bound that only grows with
        // p (fewer types to add): beyond the incumbent, no later type is worth adding.
        if (beyond(type_bound(node, c, p, false), thr)) {
            local.s.pruned_cost += static_cast<std::int64_t>(order_.size() - p);
            break;
        }
        // Those that add this type (and perhaps later ones).
        if (beyond(type_bound(node, c, p, true), thr)) {
            ++local.s.pruned_cost;
            continue;
        }
        const std::int64_t t = order_[p];
        const std::vector<std::int64_t>& ws = widths_[static_cast<std::size_t>(t)];
        const std::int64_t per_replica = room_per_replica(node, c, t);
        std::vector<std::int64_t> counts(ws.size(), 0);
        enumerate(node, c, p, ws, per_replica, room, 0, 0, 0, counts, thr, children, local);
    }
}

// Every option (stages per TP width) of the type at order position p.
void Tree::enumerate(const Node& node, const Combo& c, std::size_t p,
               const std::vector<std::int64_t>& ws, std::int64_t per_replica,
               std::int64_t room, std::size_t wi, std::int64_t used_gpus,
               std::int64_t used_stages, std::vector<std::int64_t>& counts, double thr,
               std::vector<Node>& children, Local& local) {
    if (wi == ws.size()) {
        if (used_stages == 0) return;
        if (local.sw.expired() || children.size() >= kMaxChildren) {
            if (!local.incomplete) {
                local.incomplete = true;
                local.open_lb = std::min(local.open_lb, node.lb);
            }
            return;
        }
        make_child(node, c, p, ws, counts, used_gpus, used_stages, thr, children, local);
        return;
    }
    for (std::int64_t k = 0;; ++k) {
        if (used_stages + k > room) break;
        if (used_gpus + k * ws[wi] > per_replica) {
            ++local.s.pruned_availability;
            break;
        }
        counts[wi] = k;
        enumerate(node, c, p, ws, per_replica, room, wi + 1, used_gpus + k * ws[wi],
                  used_stages + k, counts, thr, children, local);
    }
    counts[wi] = 0;
}

void Tree::make_child(const Node& node, const Combo& c, std::size_t p,
                const std::vector<std::int64_t>& ws, const std::vector<std::int64_t>& counts,
                std::int64_t gpus_per_replica, std::int64_t stages, double thr,
                std::vector<Node>& children, Local& local) {
    const std::int64_t t = order_[p];
    const auto st = static_cast<std::size_t>(t);
    if (opt_.prune_dominance && opt_.top_k == 1) {
        for (const std::int64_t i : dominators_[st]) {
            std::int64_t used_i = 0;
            for (const Choice& ch : node.choices) {
                if (ch.type == i) used_i += ch.tp * ch.count;
            }
            const GpuSpec& gi = gpus_[static_cast<std::size_t>(i)];
            // A dominator under a shared limit might leave too little of it to the types
            // a completion adds later: no dominance then (exact, only less pruning).
            if (gi.pool >= 0) continue;
            const std::int64_t have = c.work.dp * used_i, add = c.work.dp * gpus_per_replica;
            if (gi.count - have < add) continue;
            // Moving these GPUs onto i costs no more than renting them as t (whole
            // instances of each, given what i already rents).
            if (time_only_ ||
                billed_hourly(gi, have + add) - billed_hourly(gi, have) <=
                    billed_hourly(gpus_[st], add)) {
                ++local.s.pruned_dominance;
                return;
            }
        }
    }
    Node ch;
    ch.combo = node.combo;
    ch.next = static_cast<std::int32_t>(p + 1);
    ch.stages = node.stages + static_cast<std::int32_t>(stages);
    ch.types = node.types + 1;
    // The type's count is final below this node: its whole instances are exact.
    ch.price = node.price +
               billed_hourly(gpus_[st], c.work.dp * gpus_per_replica) / d(c.work.dp);
    ch.spot_rate = node.spot_rate +
                   d(instances_for(gpus_[st], c.work.dp * gpus_per_replica)) *
                       gpus_[st].interruptions_per_hour;
    ch.rate = node.rate + d(gpus_per_replica) * rate_[st];
    ch.cap = node.cap + d(gpus_per_replica) * cap_[st];
    ch.block_rate = node.block_rate;
    ch.unit_rate = node.unit_rate;
    const double M = d(c.work.num_microbatches);
    for (std::size_t wi = 0; wi < ws.size(); ++wi) {
        if (counts[wi] > 0) {
            ch.block_rate += d(counts[wi]) * c.block_flops / c.block_s[st][wi];
            ch.unit_rate += d(counts[wi]) * M * c.block_flops / c.unit_s[st][wi];
        }
    }
    ch.max_layers = node.max_layers;
    for (std::size_t wi = 0; wi < ws.size(); ++wi) {
        ch.max_layers += counts[wi] * c.max_layers[st][wi];
    }
    ch.min_stage_rate = node.stages > 0 ? node.min_stage_rate : kInf;
    ch.tensor_parallel = node.tensor_parallel;
    ch.sum_bw = node.sum_bw;
    ch.sum_hbm = node.sum_hbm;
    for (std::size_t wi = 0; wi < ws.size(); ++wi) {
        if (counts[wi] > 0 && ws[wi] > 1) ch.tensor_parallel = true;
        ch.sum_bw += d(counts[wi]) * stage_bw(c, t, ws[wi]);
        ch.sum_hbm += d(counts[wi]) * d(ws[wi]) * gpus_[st].mem_bandwidth_gbs;
    }
    for (std::size_t wi = 0; wi < ws.size(); ++wi) {
        if (counts[wi] > 0) ch.min_stage_rate = std::min(ch.min_stage_rate, d(ws[wi]) * rate_[st]);
    }
    ch.choices = node.choices;
    for (std::size_t wi = 0; wi < ws.size(); ++wi) {
        if (counts[wi] > 0) {
            ch.choices.push_back({static_cast<std::int32_t>(t), static_cast<std::int32_t>(ws[wi]),
                                  static_cast<std::int32_t>(counts[wi])});
        }
    }
    ++local.s.nodes_generated;
    ch.own = own_bound(ch, c, -1.0, thr);
    // The completion time bound waits until the node is taken from the frontier (most
    // children are cut by the incumbent before that); the FLOP/s bound orders it till then.
    ch.ext_lb = ext_bound(ch, c, thr, false);
    ch.lb = std::min(ch.own, ch.ext_lb);
    if (!std::isfinite(ch.lb)) {
        // Classify why nothing below this node can work.
        const auto q = static_cast<std::size_t>(ch.next);
        const double xmax = q < order_.size() ? c.suffix_rate[q] : 0.0;
        const double cmax = q < order_.size() ? c.suffix_cap[q] : 0.0;
        if (ch.rate + xmax < c.rate_min) ++local.s.pruned_deadline;
        else if (ch.cap + cmax < c.need_bytes) ++local.s.pruned_memory;
        else ++local.s.pruned_cost;  // budget (time objective) or stage limit
        return;
    }
    if (beyond(ch.lb, thr)) {
        ++local.s.pruned_cost;
        return;
    }
    children.push_back(std::move(ch));
}

void Tree::place_allocation(const Node& node, const Combo& c, double own, double thr,
                            Local& local) {
    ++local.s.leaves_placed;
    // Only the GPU types of this allocation travel to the placer and the estimator.
    std::vector<std::int64_t> types;
    for (const Choice& ch : node.choices) {
        if (std::find(types.begin(), types.end(), ch.type) == types.end()) types.push_back(ch.type);
    }
    std::vector<GpuSpec> specs;
    for (const std::int64_t t : types) specs.push_back(gpus_[static_cast<std::size_t>(t)]);
    std::vector<StageGroup> groups;
    for (const Choice& ch : node.choices) {
        const auto local_t = static_cast<std::int64_t>(
            std::find(types.begin(), types.end(), ch.type) - types.begin());
        for (std::int32_t k = 0; k < ch.count; ++k) groups.push_back({local_t, ch.tp});
    }
    const double hourly = d(c.work.dp) * node.price;
    // Expected hours are the hours of work times at least `spot` (exactly the factor of
    // the placement's own checkpoint interval, which estimate() applies).
    const double spot = spot_lb(node.spot_rate);
    const double iters = job_.iterations * spot;
    PlaceOptions po = opt_.placer;
    double cutoff = kInf;
    if (opt_.enforce_deadline) cutoff = job_.deadline_hours * 3600.0 / job_.iterations;
    if (opt_.objective == Objective::Cost) {
        if (hourly > 0) cutoff = std::min(cutoff, thr * 3600.0 / (hourly * iters));
    } else {
        cutoff = std::min(cutoff, thr * 3600.0 / iters);
        if (hourly > 0) cutoff = std::min(cutoff, opt_.budget_usd * 3600.0 / (hourly * iters));
    }
    po.cutoff_s = cutoff * (1 + kSlack);
    // Plans found by other threads while this one places tighten its cutoff.
    po.incumbent = incumbent_;
    po.incumbent_scale = opt_.objective == Objective::Cost
                             ? (hourly > 0 ? 3600.0 / (hourly * iters) : kInf)
                             : 3600.0 / iters;
    po.floor = own;
    po.deadline = deadline_;
    po.halt = halt_;
    Placement pl;
    if (static_cast<std::int64_t>(groups.size()) * c.work.num_microbatches > kMaxStageMicrobatchProduct) {
        return;
    }
    pl = place(model_, specs, params_, c.work, groups, po);
    local.s.placer_nodes += pl.nodes;
    local.s.placer_leaves += pl.leaves;
    if (!pl.exhaustive) {
        local.incomplete = true;
        const double lb_obj = opt_.objective == Objective::Cost
                                  ? hourly * iters * pl.lower_bound_s / 3600.0
                                  : iters * pl.lower_bound_s / 3600.0;
        // The node's own bound holds for every placement of this allocation too.
        local.open_lb = std::min(local.open_lb, std::max(lb_obj, own));
    }
    if (!pl.found) return;
    EstimateResult est = estimate(model_, specs, params_, c.work, pl.stages);
    if (!est.feasible) return;  // cannot happen: the placer checks what estimate checks
    if (opt_.enforce_deadline && !est.meets_deadline) return;
    if (opt_.objective == Objective::Time && est.total_usd > opt_.budget_usd) return;
    SearchPlan plan;
    plan.work = c.work;
    plan.stages = pl.stages;
    for (StageSpec& s : plan.stages) s.gpu = types[static_cast<std::size_t>(s.gpu)];
    std::vector<std::int64_t> used(gpus_.size(), 0);
    for (std::size_t i = 0; i < types.size(); ++i) used[static_cast<std::size_t>(types[i])] = est.gpus_used[i];
    est.gpus_used = used;
    for (Issue& is : est.issues) {
        if (is.gpu >= 0) is.gpu = types[static_cast<std::size_t>(is.gpu)];
    }
    plan.objective = opt_.objective == Objective::Cost ? est.total_usd : est.total_hours;
    if (!std::isfinite(plan.objective)) return;  // interruptions without end (spot)
    plan.estimate = std::move(est);
    local.plans.push_back(std::move(plan));
}

}  // namespace espresso::search_detail
