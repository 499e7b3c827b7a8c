// The bounds of the cost tree, each with its admissibility argument (search_bounds.hpp).
#include "espresso/search_bounds.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "espresso/pipeline_sim.hpp"
#include "espresso/spot.hpp"

namespace espresso::search_detail {

namespace {

// Whole blocks of time t each that fit in tau, at most cap (the relative slack keeps a
// tau computed as k t from rounding down to k - 1).
std::int64_t blocks_within(double tau, double t, std::int64_t cap) {
    if (tau <= 0) return 0;
    return std::min<std::int64_t>(
        cap, static_cast<std::int64_t>(std::min(1e18, std::floor(tau / t * (1 + 1e-12)))));
}

}  // namespace

// The most work per second a pipeline of the node's stages can do: no plan of the node runs
// faster than this rate (own_bound() and the completion bounds build on it).
// The pipeline cannot use all of its rate: with P stages and M micro-batches, the fill
// term of the last stage, sum_{i<P-1} w_i + M w_{P-1} <= T together with M w_i <= T,
// lets a pipeline of total rate R do at most T/M (R - (P-1) R_last / M) work, R_last
// being at least the smallest stage rate (docs/search.md).
//
// Under 1F1B a second bound holds: T >= sum_i w_i + (M-1) w_k - (nf_k-1) f_k for every
// stage k, with nf_k <= P forwards before its first backward and f_k <= w_k / q (q = 3, or
// 4 with recomputation, since a backward computes at least twice a forward; q = 2 when a
// stage is tensor-parallel, as both directions carry the same all-reduces). Maximising the
// work a pipeline of total rate R can do under it gives T >= W (M + (P-1)(1-1/q)) / R.
double Bounds::effective_rate(const Node& n, const Combo& c) const {
    // Interleaving fills its pipeline in 1/v of the time: only the average rate holds.
    if (n.stages <= 1 || c.work.virtual_stages > 1) return n.rate;
    const double M = d(c.work.num_microbatches), P = d(n.stages);
    double rate = n.rate - (P - 1) * n.min_stage_rate / M;
    if (c.work.schedule == Schedule::OneFOneB) {
        const double q = q_factor(n);
        rate = std::min(rate, n.rate * M / (M + (P - 1) * (1 - 1 / q)));
    }
    return rate;
}

// Time of one block for one micro-batch on a stage of `tp` GPUs of `type` (tabled per
// combo in block_s: the bounds read the table).
double Bounds::block_time(const Combo& c, std::int64_t type, std::int64_t tp) const {
    // Exactly the cost model's per-block time (stage_cost() charges L of these, then the
    // head, transfers and sharding traffic can only add).
    const GpuSpec& g = gpus_[static_cast<std::size_t>(type)];
    const BlockTimes bt = block_times(model_, g, params_, c.work, tp);
    const double fwd = bt.fwd, bwd = bt.bwd + bt.recompute;
    const std::int64_t dp = c.work.dp;
    if (c.work.sharding < Sharding::Zero2 || dp < 2) return fwd + bwd;
    // Sharded gradients (and weights) move per micro-batch, under the compute: the
    // stage's traffic is at least its blocks' share (one collective's latency aside).
    const double bp = block_params(model_) / d(tp);
    const double per_byte = 2.0 * d(dp - 1) / d(dp) /
                            (dp_link_gbs(g, dp, tp) * kGB * params_.link_efficiency);
    const double scatter = 0.5 * per_byte * bp * params_.bytes_per_grad;
    if (c.work.sharding == Sharding::Zero2) return fwd + std::max(bwd, scatter);
    const double gather = 0.5 * per_byte * bp * params_.bytes_per_weight;
    return std::max(fwd, gather) + std::max(bwd, gather + scatter);
}

// The node's stage groups with their tabled times and memory limits (no memory limit when
// memory pruning is off).
std::vector<Bounds::Group> Bounds::groups_of(const Node& n, const Combo& c) const {
    std::vector<Group> gs;
    gs.reserve(n.choices.size());
    for (const Choice& ch : n.choices) {
        const auto st = static_cast<std::size_t>(ch.type);
        const auto& ws = widths_[st];
        const auto wi = static_cast<std::size_t>(std::find(ws.begin(), ws.end(), ch.tp) - ws.begin());
        gs.push_back({c.block_s[st][wi], opt_.prune_memory ? c.max_layers[st][wi] : model_.num_layers,
                      ch.count, c.head_s[st][wi], c.unit_s[st][wi]});
    }
    return gs;
}

// Whole blocks: some stage holds at least its share, rounded up. The smallest possible
// bottleneck tau (per micro-batch) is the least tau at which every stage can take at
// least one block and together they take all L, each at most min(tau / t_i, its memory
// limit) blocks, t_i = block_time (the head and transfers only add).
double Bounds::bottleneck_bound(const Node& n, const Combo& c) const {
    return least_tau(groups_of(n, c));
}

double Bounds::least_work(const std::vector<Group>& by_t, double x) const {
    std::int64_t left = model_.num_layers;
    double work = 0;
    for (const Group& g : by_t) {  // one block on every stage
        if (blocks_within(x, g.t, g.cap) < 1) return kInf;
        work += d(g.count) * g.t;
        left -= g.count;
    }
    if (left < 0) return kInf;
    for (const Group& g : by_t) {  // the rest on the fastest stages first
        if (left == 0) break;
        const std::int64_t fit = std::min(blocks_within(x, g.t, g.cap), model_.num_layers);
        const std::int64_t more = std::min(left, g.count * (fit - 1));
        work += d(more) * g.t;
        left -= more;
    }
    return left > 0 ? kInf : work;
}

double Bounds::least_tau(const std::vector<Group>& gs) const {
    const std::int64_t L = model_.num_layers;
    // The answer is the least value k t_g (some group g, 1 <= k <= its cap) at which every
    // group fits a block and together they hold L (feasibility only grows with tau). Below
    // it lies the continuous answer: the least tau with sum_g c_g min(cap_g, tau / t_g) >= L
    // (water-filling: groups saturate at cap_g t_g), and the slowest group's one block. From
    // a little below the larger of the two, walk the values k t_g upwards: each step adds one
    // block to some group, and the floors lose less than one block per stage, so the walk
    // is short (at most the stages' number of steps, as a rule).
    if (gs.empty()) return kInf;
    double t_max = 0, total = 0;
    for (const Group& g : gs) {
        const std::int64_t top = std::min(g.cap, L);
        if (top < 1 || !(g.t > 0) || !std::isfinite(g.t)) return least_tau_bisect(gs);
        t_max = std::max(t_max, g.t);
        total += d(g.count) * d(top);
    }
    if (total < d(L)) return kInf;  // not even every group at its cap holds the model
    // Water-filling as a fixed point: the groups saturated below the current value hold
    // their caps, the others take tau / t_g; each round's value stays at most the answer
    // (only groups saturated at the answer are capped) and grows until no group saturates
    // anew (at most one round per group).
    double cont = 0;
    for (std::size_t round = 0; round <= gs.size(); ++round) {
        double fixed = 0, rate = 0;
        for (const Group& g : gs) {
            const double top = d(std::min(g.cap, L));
            if (top * g.t < cont) fixed += d(g.count) * top;
            else rate += d(g.count) / g.t;
        }
        if (!(rate > 0)) break;  // every group saturated below cont: cont is the answer
        const double next = (d(L) - fixed) / rate;
        if (!(next > cont)) break;
        cont = next;
    }
    double tau = std::max(t_max, cont) * (1 - 1e-9);
    for (std::size_t step = 0; step < 4 * static_cast<std::size_t>(L) * gs.size() + 64; ++step) {
        // The least value k t_g above tau, over the groups with room left.
        double next = kInf;
        for (const Group& g : gs) {
            auto k = static_cast<std::int64_t>(std::min(1e18, std::floor(tau / g.t))) + 1;
            if (k > 1 && d(k - 1) * g.t > tau) --k;
            while (d(k) * g.t <= tau) ++k;
            if (k <= std::min(g.cap, L)) next = std::min(next, d(k) * g.t);
        }
        if (!std::isfinite(next)) return kInf;
        std::int64_t held = 0;
        bool each = true;
        for (const Group& g : gs) {
            const std::int64_t f = blocks_within(next, g.t, g.cap);
            each = each && f >= 1;
            held += f * g.count;
        }
        if (each && held >= L) return next * (1 - 1e-12);
        tau = next;
    }
    return least_tau_bisect(gs);  // not reached in practice: the exhaustive answer
}

double Bounds::least_tau_bisect(const std::vector<Group>& gs) const {
    const std::int64_t L = model_.num_layers;
    auto feasible = [&](double tau) {
        std::int64_t total = 0;
        for (const Group& g : gs) {
            const std::int64_t fit = blocks_within(tau, g.t, g.cap);
            if (fit < 1) return false;
            total += fit * g.count;
        }
        return total >= L;
    };
    // The answer is k * t_g for some group g and 1 <= k <= its cap, and feasibility only
    // grows with tau: bisect each group's sequence, keep the least feasible value.
    double best = kInf;
    for (const Group& g : gs) {
        std::int64_t lo = 1, hi = std::min(g.cap, L);
        if (hi < 1 || !feasible(d(hi) * g.t)) continue;
        while (lo < hi) {
            const std::int64_t mid = lo + (hi - lo) / 2;
            if (feasible(d(mid) * g.t)) hi = mid;
            else lo = mid + 1;
        }
        best = std::min(best, d(lo) * g.t);
    }
    return best * (1 - 1e-12);
}

// Iteration seconds per block of a stage of `tp` GPUs of `type` (block time `block_s`):
// the iteration is the pipeline, the slowest DP synchronisation and the slowest optimizer
// step, and the pipeline is at least M times each stage's busy time (n blocks of at least
// block_s each). A stage of n blocks holds n/tp blocks' parameters per GPU, so its DP
// traffic is n k / (tp link) (k_ar exposed after the pipeline; with overlap_grad_reduce,
// k_all exposed but for the last backward, which is at most one micro-batch's busy time)
// and its optimizer step n k_opt / (tp memory GB/s). So T >= n unit_time for every stage:
// unlike sync_bound() this sees which stage holds the blocks (a slow-linked stage that
// memory forces to hold most of the model).
double Bounds::unit_time(const Combo& c, std::int64_t type, std::int64_t tp, double block_s) const {
    const GpuSpec& g = gpus_[static_cast<std::size_t>(type)];
    const double M = d(c.work.num_microbatches);
    const double bw = stage_bw(c, type, tp);
    const double hbm = d(tp) * g.mem_bandwidth_gbs;
    const double ar = bw > 0 ? c.k_ar / bw : 0.0;
    const double all = bw > 0 ? c.k_all / bw : 0.0;
    double u = std::max(M * block_s + ar, (c.hidden ? M - 1 : M) * block_s + all);
    if (hbm > 0) u += c.k_opt / hbm;
    return std::isfinite(u) ? u : 0.0;
}

// The node's stages (`gs`, groups_of()): T >= n_i unit_i for each, the n_i (at most the
// stage's memory limit) summing to L: the least such T (kInf: the blocks do not fit).
double Bounds::unit_bound(std::vector<Group> gs) const {
    for (Group& g : gs) {
        if (!(g.unit > 0)) return 0.0;
        g.t = g.unit;
    }
    return least_tau(gs);
}

std::int64_t Bounds::best_added(std::vector<std::pair<std::int64_t, std::int64_t>>& vals,
                                std::int64_t room, std::int64_t total, std::int64_t L) {
    std::sort(vals.begin(), vals.end(), std::greater<>());
    std::int64_t left = room;
    for (const auto& [v, k] : vals) {
        const std::int64_t take = std::min(left, k);
        total += take * v;
        left -= take;
        if (total >= L || left == 0) break;
    }
    return total;
}

// The same over completions of the node that add 1 to `room` stages of the types at order
// positions >= n.next (each type at most its per-replica GPUs many stages, each taking what
// its best width allows): the least T at which the node's stages and the best added ones
// hold all L blocks. 0 when it cannot tell.
double Bounds::ext_unit_bound(const Node& n, const Combo& c, std::int64_t room) const {
    const std::int64_t L = model_.num_layers;
    const std::vector<Group> own = groups_of(n, c);
    double hi = 0;
    for (const Group& g : own) {
        if (!(g.unit > 0)) return 0.0;
        hi = std::max(hi, g.unit);
    }
    std::vector<const Combo::Option*> ext;
    for (std::size_t p = static_cast<std::size_t>(n.next); p < order_.size(); ++p) {
        const Combo::Option& o = c.options[static_cast<std::size_t>(order_[p])];
        if (o.widths.empty()) continue;
        for (const double u : o.unit) {
            if (!(u > 0)) return 0.0;
            hi = std::max(hi, u);
        }
        ext.push_back(&o);
    }
    if (ext.empty() || room < 1) return kInf;
    std::vector<std::pair<std::int64_t, std::int64_t>> vals;
    auto feasible = [&](double T) {
        std::int64_t total = 0;
        for (const Group& g : own) {
            const std::int64_t f = blocks_within(T, g.unit, g.cap);
            if (f < 1) return false;
            total += f * g.count;
        }
        vals.clear();
        for (const Combo::Option* o : ext) {
            std::int64_t v = 0;
            for (std::size_t wi = 0; wi < o->widths.size(); ++wi) {
                v = std::max(v, blocks_within(T, o->unit[wi], o->widths[wi].second));
            }
            if (v >= 1) vals.emplace_back(v, std::min(o->avail, room));
        }
        return !vals.empty() && best_added(vals, room, total, L) >= L;
    };
    hi *= d(L);
    if (!feasible(hi)) return 0.0;  // memory: ext_time_bound() says so
    double lo = 0;
    for (int it = 0; it < 64 && hi - lo > 1e-3 * hi; ++it) {
        const double mid = 0.5 * (lo + hi);
        if (feasible(mid)) hi = mid;
        else lo = mid;
    }
    return lo;  // infeasible: below the least feasible T
}

// The bottleneck bound with each stage's memory limit at its position: position i holds
// k_i = min(P - i, M) micro-batches in flight under 1F1B (M under GPipe), where a stage
// holds at most max_layers_k blocks. The least tau at which some assignment of the
// stages to positions lets each take at least one block and together all L, a stage of
// block time t taking at most min(tau / t, its limit there): bisection over the values
// m t (feasibility only grows with tau), each test a dynamic programme over the positions
// and the multiset of stages used. +inf when no assignment holds the model at all.
// Never below bottleneck_bound() (a lower bound too), which it is when the multiset is
// too large for the programme.
double Bounds::positioned_tau(const Node& n, const Combo& c) const {
    const double start = bottleneck_bound(n, c);  // lenient limits: below the answer
    if (n.stages < 1 || !std::isfinite(start)) return start;
    const std::size_t k = n.choices.size();
    std::vector<std::int64_t> stride(k);
    std::int64_t states = 1;
    for (std::size_t j = 0; j < k; ++j) {
        stride[j] = states;
        states *= n.choices[j].count + 1;
        if (states > 4096) return start;
    }
    const std::int64_t P = n.stages, M = c.work.num_microbatches, L = model_.num_layers;
    const auto sP = static_cast<std::size_t>(P);
    std::vector<std::int64_t> cap(k * sP);
    std::vector<double> t(k);
    for (std::size_t j = 0; j < k; ++j) {
        const Choice& ch = n.choices[j];
        const auto st = static_cast<std::size_t>(ch.type);
        const auto& ws = widths_[st];
        const auto wi = static_cast<std::size_t>(std::find(ws.begin(), ws.end(), ch.tp) - ws.begin());
        const auto& caps = c.max_layers_k[st][wi];
        t[j] = c.block_s[st][wi];
        for (std::int64_t i = 0; i < P; ++i) {
            const std::int64_t fl = c.work.schedule == Schedule::GPipe ? 1 : std::min(P - i, M);
            cap[j * sP + static_cast<std::size_t>(i)] =
                !opt_.prune_memory ? L : fl <= c.kin ? caps[static_cast<std::size_t>(fl - 1)] : 0;
        }
    }
    std::vector<std::int64_t> best(static_cast<std::size_t>(states));
    std::vector<std::int64_t> digit(k);
    std::vector<std::int64_t> fit(k);  // blocks a stage takes at the tested tau
    auto feasible = [&](double tau) {
        // Sure answers first: the limits at the busiest position (0) are the tightest and
        // at the last the loosest, for every stage.
        std::int64_t tight = 0, loose = 0;
        bool each = true, some = true;
        for (std::size_t j = 0; j < k; ++j) {
            fit[j] = std::isfinite(tau)
                ? static_cast<std::int64_t>(std::min(1e18, std::floor(tau / t[j] * (1 + 1e-12))))
                : L;
            const std::int64_t lo_cap = std::min(fit[j], cap[j * sP]);
            const std::int64_t hi_cap = std::min(fit[j], cap[j * sP + sP - 1]);
            each = each && lo_cap >= 1;
            some = some && hi_cap >= 1;
            tight += n.choices[j].count * lo_cap;
            loose += n.choices[j].count * hi_cap;
        }
        if (each && tight >= L) return true;
        if (!some || loose < L) return false;
        std::fill(best.begin(), best.end(), -1);
        std::fill(digit.begin(), digit.end(), 0);
        best[0] = 0;
        std::int64_t pos = 0;  // stages placed in state sidx: the sum of its digits
        for (std::int64_t sidx = 0; sidx < states; ++sidx) {
            if (sidx > 0) {  // the mixed-radix successor of the previous state
                for (std::size_t j = 0; j < k; ++j) {
                    if (digit[j] < n.choices[j].count) {
                        ++digit[j];
                        ++pos;
                        break;
                    }
                    pos -= digit[j];
                    digit[j] = 0;
                }
            }
            const std::int64_t have = best[static_cast<std::size_t>(sidx)];
            if (have < 0 || pos >= P) continue;
            for (std::size_t j = 0; j < k; ++j) {
                if (digit[j] == n.choices[j].count) continue;
                const std::int64_t v = std::min(fit[j], cap[j * sP + static_cast<std::size_t>(pos)]);
                if (v < 1) continue;
                auto& nb = best[static_cast<std::size_t>(sidx + stride[j])];
                nb = std::max(nb, std::min(L, have + v));
            }
        }
        return best[static_cast<std::size_t>(states - 1)] >= L;
    };
    if (!feasible(kInf)) return kInf;
    if (feasible(start)) return start;
    // The answer is m t_j for some stage group j and m blocks: binary search over those
    // values, merged and sorted.
    std::vector<double> cand;
    for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t lo = std::max<std::int64_t>(1, static_cast<std::int64_t>(start / t[j]));
        for (std::int64_t m = lo; m <= L; ++m) cand.push_back(d(m) * t[j]);
    }
    std::sort(cand.begin(), cand.end());
    std::size_t lo = 0, hi = cand.size();  // the least feasible index, hi: none found
    while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (feasible(cand[mid])) hi = mid;
        else lo = mid + 1;
    }
    return lo < cand.size() ? std::max(start, cand[lo] * (1 - 1e-12)) : kInf;
}

// Lower bound on the objective of the node's own allocation (kInf: it cannot work): the
// iteration takes at least the work at the effective rate, M times the bottleneck, under
// 1F1B the second pipeline bound and the round trips, plus the synchronisation; spot
// instances and the deadline's confidence as spot_lb() and deadline_lb() say.
// `tau`: the bottleneck when already known (positioned_tau()), else negative: the
// lenient bottleneck_bound() is used.
// `thr`: when the cheap rate bounds already put the allocation beyond it, their value
// is returned (a weaker but sufficient bound) and the dearer ones are skipped.
double Bounds::own_bound(const Node& n, const Combo& c, double tau,
                 double thr) const {
    const bool placing = tau >= 0;  // the dearer bounds, for allocations about to be placed
    if (n.stages < 1 || n.stages > model_.num_layers) return kInf;
    if (c.work.virtual_stages > 1 &&
        (n.stages < 2 || c.work.num_microbatches % n.stages != 0 ||
         n.stages * c.work.virtual_stages > model_.num_layers)) {
        return kInf;  // not an interleaved plan (its children may be)
    }
    const double rate = effective_rate(n, c);
    if (rate < c.rate_min) return kInf;
    // positioned_tau() is checked only for nodes worth placing (process()): most are cut
    // by their cost first, and it is the dearest of these tests.
    if (opt_.prune_memory && (n.cap < c.need_bytes || n.max_layers < model_.num_layers)) {
        return kInf;
    }
    // Iteration time at least: the average-rate bound, or M times the bottleneck.
    const double M = d(c.work.num_microbatches);
    const double sync = sync_bound(c, n.sum_bw, n.sum_hbm);
    const double spot = spot_lb(n.spot_rate);
    auto objective = [&](double t_iter) {
        const double work = job_.iterations * t_iter / 3600.0;
        if (opt_.enforce_deadline && opt_.prune_deadline &&
            deadline_lb(work, n.spot_rate) > job_.deadline_hours * (1 + kSlack)) {
            return kInf;
        }
        const double hours = work * spot;  // expected, interruptions included
        const double usd = hours * d(c.work.dp) * n.price;
        if (opt_.objective == Objective::Cost) return usd;
        if (usd > opt_.budget_usd * (1 + kSlack)) return kInf;
        return hours;
    };
    const double by_rate = std::max(M * c.flops_mb / rate,
                                    M * d(model_.num_layers) * c.block_flops / n.block_rate);
    if (std::isfinite(thr)) {
        const double quick = objective(by_rate + sync);
        if (!std::isfinite(quick) || beyond(quick, thr)) return quick;
    }
    const std::vector<Group> gs = groups_of(n, c);
    if (tau < 0) tau = least_tau(gs);  // bottleneck_bound()
    if (!std::isfinite(tau)) return kInf;
    // The pipeline's time when its bottleneck (the slowest stage's work per micro-batch)
    // is x >= tau. Under 1F1B two terms need the stages' total work per micro-batch, which
    // is at least the least block work of a split whose every stage works at most x
    // (least_work(); at least L blocks at the fastest block time).
    const bool fills = c.work.schedule == Schedule::OneFOneB && c.work.virtual_stages == 1 &&
                       n.stages > 1;
    double slope = 0, head_min = 0, sends = 0;  // the second 1F1B bound: work + slope x
    std::vector<Group> by_t;
    if (fills) {
        head_min = kInf;  // the least LM head
        for (const Group& g : gs) head_min = std::min(head_min, g.head);
        // The second pipeline bound with k the bottleneck stage (w_k = x) (docs/search.md).
        const double a = M - 1 - d(n.stages - 1) / q_factor(n);
        if (a > 0) slope = a;
        const Sends sd = node_sends(n, c);
        sends = boundary_sum(sd.sum, sd.least) - sd.saving;
        by_t = gs;
        std::sort(by_t.begin(), by_t.end(), [](const Group& x, const Group& y) { return x.t < y.t; });
    }
    // A pipeline's time at bottleneck x given its least work W at that bottleneck.
    auto pipe_with = [&](double x, double W) {
        double t = std::max(by_rate, M * x);
        if (fills) {
            t = std::max(t, round_trip_bound(c, n.stages, W + head_min, sends));  // round trips
            if (slope > 0) t = std::max(t, W + slope * x);
        }
        return t;
    };
    // Evaluated a hair above x: least_work() only falls with x, so this errs low.
    auto pipe = [&](double x) {
        return pipe_with(x, fills ? least_work(by_t, x * (1 + 1e-9)) : 0.0);
    };
    // The least over every bottleneck x >= tau. The work only changes where some stage's
    // floor(x / t) does: walk those values upwards until the terms that grow with x, at
    // the least work any bottleneck allows, reach the best found.
    double t_pipe = pipe(tau);
    const double w_floor = fills ? least_work(by_t, kInf) : 0.0;
    // At the least work any bottleneck allows: a bound at every one.
    const double low = fills ? pipe_with(tau, w_floor) : t_pipe;
    if (t_pipe > low) {
        // Whether an iteration time cuts the node (when placing, none: the least is wanted).
        auto cuts = [&](double t) {
            if (placing) return false;
            const double v = objective(t + sync);
            return !std::isfinite(v) || beyond(v, thr);
        };
        // Most nodes are not cut even at tau (an upper end of the least) and take `low`;
        // only those that would be cut walk, to confirm, and stop as soon as one bottleneck
        // does not cut.
        if (!placing && !cuts(t_pipe)) {
            t_pipe = low;
        } else {
            const std::int64_t L = model_.num_layers;
            double x = tau;
            for (std::size_t step = 0; step < 4 * static_cast<std::size_t>(L) * by_t.size() + 64; ++step) {
                double next = kInf;
                for (const Group& g : by_t) {
                    const std::int64_t fit = blocks_within(x * (1 + 1e-9), g.t, g.cap);
                    if (fit < std::min(g.cap, L)) next = std::min(next, d(fit + 1) * g.t);
                }
                if (!std::isfinite(next)) break;
                const double rest = pipe_with(next, w_floor);  // every bottleneck from next on
                if (rest >= t_pipe || cuts(rest)) {
                    t_pipe = std::min(t_pipe, rest);
                    break;
                }
                x = next;
                t_pipe = std::min(t_pipe, pipe(x));
                if (!placing && !cuts(t_pipe)) {
                    t_pipe = low;
                    break;
                }
            }
        }
    }
    double t_iter = std::max(t_pipe + sync, unit_bound(gs));
    if (placing) t_iter = std::max(t_iter, coupled_bound(n, c, gs, tau, pipe) + sync_opt(c, n.sum_hbm));
    return objective(t_iter);
}

// The optimizer step's part of sync_bound().
double Bounds::sync_opt(const Combo& c, double sum_hbm) const {
    return sum_hbm > 0 ? c.k_opt * d(model_.num_layers) / sum_hbm : 0.0;
}

// For an allocation about to be placed: the pipeline and the DP synchronisation together.
// The iteration is at least pipe(tau) + max_i dp_i, pipe(tau) being the pipeline's bounds
// at a bottleneck tau (the slowest stage's busy time per micro-batch, at least `tau_lo`),
// where a stage of n_i blocks has n_i t_i <= tau and dp_i >= n_i k_ar / bw_i + lat_ar, and
// with overlap_grad_reduce also dp_i >= n_i k_all / bw_i - tau (only its last backward, at
// most tau, hides traffic). For each tau the least max_i n_i a_i over the block splits that
// fit (least_tau() with the caps min(cap_i, tau / t_i)) is sigma(tau); the bound is the
// least over tau of the larger of pipe(tau) + sigma_ar(tau) + lat_ar and
// pipe(tau) - tau + sigma_all(tau). sigma only changes where some stage's tau / t_i does,
// so only the values k t_i are tried, upwards from tau_lo, until (M - 1) tau, a bound on
// both at every larger tau, reaches the best found.
double Bounds::coupled_bound(const Node& n, const Combo& c, const std::vector<Group>& gs,
                             double tau_lo, const std::function<double(double)>& pipe) const {
    if (c.k_ar <= 0 && c.k_all <= 0) return 0.0;
    const std::int64_t L = model_.num_layers;
    const double M = d(c.work.num_microbatches);
    std::vector<double> a_ar(gs.size()), a_all(gs.size());
    for (std::size_t j = 0; j < gs.size(); ++j) {
        const Choice& ch = n.choices[j];
        const double bw = stage_bw(c, ch.type, ch.tp);
        if (!(bw > 0) || !(gs[j].t > 0)) return 0.0;
        a_ar[j] = c.k_ar / bw;
        a_all[j] = c.k_all / bw;
    }
    std::vector<double> cand;
    for (const Group& g : gs) {
        const std::int64_t top = std::min(g.cap, L);
        const auto k0 = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(tau_lo / g.t)));
        for (std::int64_t k = k0; k <= top; ++k) cand.push_back(d(k) * g.t);
    }
    std::sort(cand.begin(), cand.end());
    std::vector<Group> sg = gs;
    auto sigma = [&](double tau, const std::vector<double>& a) {
        for (std::size_t j = 0; j < gs.size(); ++j) {
            sg[j].cap = blocks_within(tau, gs[j].t, gs[j].cap);
            sg[j].t = a[j];
        }
        return least_tau(sg);
    };
    double best = kInf;
    const double lo = std::max(tau_lo, 0.0);
    for (const double tau0 : cand) {
        const double tau = std::max(lo, tau0 * (1 - 1e-12));
        if ((M - 1) * tau >= best) break;
        const double s_all = sigma(tau0, a_all);
        if (!std::isfinite(s_all)) continue;  // the blocks do not fit at this tau
        const double p = pipe(tau);
        double t = p - (c.hidden ? tau : 0.0) + s_all;
        if (c.k_ar > 0) t = std::max(t, p + sigma(tau0, a_ar) + c.lat_ar);
        best = std::min(best, t);
    }
    return std::isfinite(best) ? best : 0.0;
}

// Lower bound over completions that add stages of types at order positions >= next.
// `thr`: the incumbent; when the FLOP/s bound alone is beyond it, the node's completions
// are cut whatever the rest says, so the costlier time bound is skipped.
double Bounds::ext_bound(const Node& n, const Combo& c, double thr, bool full) const {
    const auto p = static_cast<std::size_t>(n.next);
    const std::int64_t cap = depth_cap(c, n.types + 1);
    if (p >= order_.size() || n.stages >= cap || cap <= opt_.covered_depth) return kInf;
    if (n.types >= opt_.max_gpu_types) return kInf;
    if (opt_.prune_memory && n.cap + c.suffix_cap[p] < c.need_bytes) return kInf;
    const double by_rate = type_bound(n, c, p, false);
    if (!std::isfinite(by_rate)) return kInf;
    if (!full || beyond(by_rate, thr)) return by_rate;
    // The iteration time of any completion, from whole blocks, the bottleneck and the
    // synchronisation terms (docs/search.md, "Completions").
    // The iteration time at which the checks below cut the node (a little beyond, so
    // that a bound stopped there is cut whatever the rounding).
    const double price = d(c.work.dp) * (n.price + suffix_min_price_[p]);
    // Completions only add instances: their expected hours per hour of work are at least
    // the node's spot factor. The deadline holds for the work alone at least.
    const double spot = spot_lb(n.spot_rate);
    double cut_hours = kInf;  // expected hours
    if (opt_.objective == Objective::Cost) {
        if (opt_.prune_cost && price > 0) cut_hours = std::min(cut_hours, thr / price);
    } else {
        if (opt_.prune_cost) cut_hours = std::min(cut_hours, thr);
        if (price > 0) cut_hours = std::min(cut_hours, opt_.budget_usd / price);
    }
    double cut_work = cut_hours / spot;
    if (opt_.enforce_deadline && opt_.prune_deadline) cut_work = std::min(cut_work, job_.deadline_hours);
    const double target = cut_work * (1 + 2 * kSlack) * 3600.0 / job_.iterations;
    const double t_iter = ext_time_bound(n, c, std::isfinite(target) ? target : kInf);
    if (!std::isfinite(t_iter)) return kInf;
    const double work = job_.iterations * t_iter / 3600.0;
    if (opt_.enforce_deadline && opt_.prune_deadline &&
        deadline_lb(work, n.spot_rate) > job_.deadline_hours * (1 + kSlack)) {
        return kInf;
    }
    const double hours = work * spot;
    // A completion pays at least the node's GPUs and the cheapest later one for `hours`.
    const double usd = hours * price;
    if (opt_.objective == Objective::Cost) return std::max(by_rate, usd);
    if (usd > opt_.budget_usd * (1 + kSlack)) return kInf;
    return std::max(by_rate, hours);
}

Bounds::Sends Bounds::node_sends(const Node& n, const Combo& c) const {
    struct Whole {
        std::int64_t type, stages, gpus;
    };
    Sends out;
    std::vector<Whole> whole;  // per type, its stages that fit one instance whole
    for (const Choice& ch : n.choices) {
        const GpuSpec& g = gpus_[static_cast<std::size_t>(ch.type)];
        const double x = send_lb(c, g.inter_node_gbs);
        out.sum += d(ch.count) * x;
        out.least = std::min(out.least, x);
        if (c.work.dp * ch.tp > g.gpus_per_node) continue;
        auto it = std::find_if(whole.begin(), whole.end(),
                               [&](const Whole& w) { return w.type == ch.type; });
        if (it == whole.end()) it = whole.insert(whole.end(), Whole{ch.type, 0, 0});
        it->stages += ch.count;
        it->gpus += std::int64_t{ch.count} * ch.tp * c.work.dp;
    }
    for (const Whole& w : whole) {
        const GpuSpec& g = gpus_[static_cast<std::size_t>(w.type)];
        const std::int64_t m = (w.gpus + g.gpus_per_node - 1) / g.gpus_per_node;
        const double save = send_lb(c, g.inter_node_gbs) -
                            send_lb(c, std::max(g.inter_node_gbs, g.intra_node_gbs));
        out.saving += d(std::max<std::int64_t>(0, w.stages - m)) * std::max(0.0, save) *
                      (1 + 1e-12);
    }
    return out;
}

// The least time of one activation (or gradient) transfer between pipeline neighbours
// over a link of at most `bw` GB/s, as the cost model's send_s charges it.
double Bounds::send_lb(const Combo& c, double bw) const {
    if (!(bw > 0)) return 0.0;
    // Scatter/gather sends 1/tp of the tensor: at most the widest TP group's share.
    const double msg = p2p_bytes(model_, params_, c.work, opt_.max_tp, opt_.max_tp);
    return (params_.link_latency_s + msg / (bw * kGB * params_.link_efficiency)) *
           (1 - 1e-12);
}

// The data-parallel synchronisation after the pipeline: what of the gradients' all-reduce is
// surely exposed (Combo::k_ar, lat_ar) and the optimizer step (k_opt). A stage of n_i blocks
// on tp_i GPUs of link b_i takes at least k_ar n_i / (tp_i b_i); as the n_i sum to L, the
// largest is at least k_ar L / sum_i(tp_i b_i) (a maximum of ratios is at least the ratio of
// the sums), and the step likewise at the stages' memory bandwidth.
double Bounds::sync_bound(const Combo& c, double sum_bw, double sum_hbm) const {
    const double L = d(model_.num_layers);
    double t = 0;
    if (c.k_ar > 0 && sum_bw > 0) t += c.k_ar * L / sum_bw + c.lat_ar;
    if (sum_hbm > 0) t += c.k_opt * L / sum_hbm;
    return t;
}

// Lower bound on the iteration time of any completion of `n` that adds 1 to `room`
// stages of types at order positions >= n.next. With r added stages the bottleneck is at
// least tau_r, the least tau at which the node's stages (each at least one block, at most
// min(tau / t, its memory limit) blocks) and the r best added stages (type t: at most
// its per-replica GPUs many, each holding what its widest allowed width could) hold all
// L blocks; then T >= M tau_r and, under 1F1B, T >= L t_min + (M - 1 - (P + r - 1)/q)
// tau_r. Both only fall as r grows, so r = room bounds every completion. The DP
// all-reduce and the optimizer step add their own bounds.
// `target`: an iteration time at which the caller cuts the node (kInf: none); once the
// bound is known to reach it, it is returned without refining further.
double Bounds::ext_time_bound(const Node& n, const Combo& c, double target) const {
    const auto p0 = static_cast<std::size_t>(n.next);
    const std::int64_t room = depth_cap(c, n.types + 1) - n.stages;
    if (room < 1 || p0 >= order_.size()) return kInf;
    if (order_.size() - p0 > kExtTypesMax) return 0.0;
    const std::int64_t L = model_.num_layers;
    const double M = d(c.work.num_microbatches);
    const std::vector<Group> own = groups_of(n, c);
    double t_min = kInf, t_max = 0, head_max = 0;
    for (const Group& g : own) {
        t_min = std::min(t_min, g.t);
        t_max = std::max(t_max, g.t);
        head_max = std::max(head_max, g.head);
    }
    std::vector<const Combo::Option*> ext;
    bool ext_tp = false;
    double bw_slot = 0, bw_all = 0, hbm_slot = 0, hbm_all = 0;
    for (std::size_t p = p0; p < order_.size(); ++p) {
        const Combo::Option& o = c.options[static_cast<std::size_t>(order_[p])];
        if (o.widths.empty()) continue;
        ext.push_back(&o);
        t_min = std::min(t_min, o.t_min);
        t_max = std::max(t_max, o.t_max);
        ext_tp = ext_tp || o.tp;
        bw_slot = std::max(bw_slot, o.bw_slot);
        hbm_slot = std::max(hbm_slot, o.hbm_slot);
        bw_all += o.bw_all;
        hbm_all += o.hbm_all;
        for (const double h : o.head) head_max = std::max(head_max, h);
    }
    if (ext.empty()) return kInf;
    std::vector<std::pair<std::int64_t, std::int64_t>> vals;  // (blocks, stages)
    // As in the node's own bound, one stage also runs the LM head; which one is free in
    // this relaxation, so the blocks fall by the least loss over every candidate stage.
    auto feasible = [&](double tau, bool head) {
        std::int64_t total = 0, loss = head ? std::numeric_limits<std::int64_t>::max() : 0;
        for (const Group& g : own) {
            const std::int64_t fit = blocks_within(tau, g.t, g.cap);
            if (fit < 1) return false;
            total += fit * g.count;
            if (head) {
                const std::int64_t fit_h = blocks_within(tau - g.head, g.t, g.cap);
                if (fit_h >= 1) loss = std::min(loss, fit - fit_h);
            }
        }
        vals.clear();
        for (const Combo::Option* o : ext) {
            std::int64_t v = 0, v_h = 0;
            for (std::size_t wi = 0; wi < o->widths.size(); ++wi) {
                const auto& [bt, cap] = o->widths[wi];
                v = std::max(v, blocks_within(tau, bt, cap));
                if (head) v_h = std::max(v_h, blocks_within(tau - o->head[wi], bt, cap));
            }
            if (v >= 1) vals.emplace_back(v, std::min(o->avail, room));
            if (head && v_h >= 1) loss = std::min(loss, v - v_h);
        }
        if (loss == std::numeric_limits<std::int64_t>::max()) return false;
        total -= loss;
        if (vals.empty()) return false;  // a completion adds a stage, which needs a block
        return best_added(vals, room, total, L) >= L;
    };
    if (!feasible(kInf, false)) return kInf;  // the stages' memory cannot hold the blocks
    // The terms that do not depend on the bottleneck tau: round trips and synchronisation.
    double rt = 0;
    Sends sd;
    std::function<double(double)> rt_of;  // round trips, given the stages' least work
    if (c.work.schedule == Schedule::OneFOneB && c.work.virtual_stages == 1) {
        // Round trips, for each number of stages a completion can have: the node's stages
        // as node_sends() says, an added stage at best on the fastest later link
        // (in-instance links included: added stages of one type may share instances).
        double link = 0, head_min = kInf;
        sd = node_sends(n, c);
        for (const Group& g : own) head_min = std::min(head_min, g.head);
        for (std::size_t p = p0; p < order_.size(); ++p) {
            const GpuSpec& g = gpus_[static_cast<std::size_t>(order_[p])];
            link = std::max(link, can_share(c, order_[p]) ? std::max(g.inter_node_gbs, g.intra_node_gbs)
                                                          : g.inter_node_gbs);
            for (const double h : c.options[static_cast<std::size_t>(order_[p])].head) {
                head_min = std::min(head_min, h);
            }
        }
        const double send = send_lb(c, link);
        const double head = std::isfinite(head_min) ? head_min : 0.0;
        rt_of = [&c, &n, &sd, room, send, head, this](double work) {
            double best = kInf;
            for (std::int64_t r = 1; r <= room; ++r) {
                best = std::min(best, round_trip_bound(c, n.stages + r, work + head,
                                                       boundary_sum(sd.sum + d(r) * send,
                                                                    std::min(sd.least, send)) -
                                                           sd.saving));
            }
            return best;
        };
        rt = rt_of(d(L) * t_min);
    }
    const double bw = n.sum_bw + std::min(bw_all, d(room) * bw_slot);
    const double hbm = n.sum_hbm + std::min(hbm_all, d(room) * hbm_slot);
    const double sync = sync_bound(c, bw, hbm);
    double a = 0;  // the 1F1B second bound's slope in tau
    if (c.work.schedule == Schedule::OneFOneB && c.work.virtual_stages == 1) {
        const double q = ext_tp || n.tensor_parallel ? 1.0 + std::min(1.0, 2.0 * bwd_fwd_ratio_)
                                                     : 1.0 + 2.0 * bwd_fwd_ratio_;
        a = std::max(0.0, M - 1 - d(n.stages + room - 1) / q);
    }
    auto iteration = [&](double tau) {
        double t = std::max(M * tau, rt);
        if (a > 0) t = std::max(t, d(L) * t_min + a * tau);
        return t + sync;
    };
    if (iteration(0.0) >= target) return iteration(0.0);  // cut whatever tau is
    double lo = 0, hi = d(L) * t_max + head_max;
    const bool head = feasible(hi, true);  // always, unless rounding says otherwise
    if (std::isfinite(target)) {
        // The least tau at which the bound reaches the caller's cut: when the blocks do
        // not fit even there, the bound is at least that, and one test settles it.
        const double need = target - sync;
        double cut = need / M;
        if (a > 0) cut = std::min(cut, (need - d(L) * t_min) / a);
        if (cut > lo && cut < hi) {
            if (!feasible(cut, head)) return iteration(cut);
            hi = cut;
        }
    }
    // Bisection to 0.1%: lo stays infeasible, so it is a lower bound at any precision.
    for (int it = 0; it < 64 && hi - lo > 1e-3 * hi; ++it) {
        const double mid = 0.5 * (lo + hi);
        if (feasible(mid, head)) hi = mid;
        else lo = mid;
    }
    double bound = iteration(lo);  // lo: below the least feasible tau
    if (rt_of && std::isfinite(target) && bound < target) {
        bound = std::max(bound, ext_fill_bound(c, own, ext, room, a, lo, hi, sync, rt_of, target));
    }
    return std::max(bound, ext_unit_bound(n, c, room));
}

// ext_time_bound()'s pipeline terms with the stages' total work per micro-batch at its least
// for each bottleneck tau (instead of L blocks at the fastest block time), the least over
// every tau >= tau_lo (tau_lo below the least feasible tau, tau_hi at or above it). At a
// bottleneck tau a completion's stages hold: the node's, each one block at least and at most
// min(tau / t, cap); the added ones (at least one, at most `room`, of each later type at
// most its per-replica stages), each at most what its best width holds at tau, every block
// at the type's fastest block time. The least work fills the fastest blocks first. It only
// falls as tau grows, and changes where some floor(tau / t) does: the values k t are walked
// upwards from tau_hi (below it, the work at tau_hi is a lower bound) until the terms that
// grow with tau, at the least work any tau allows, reach the best found. Gives up (0) as
// soon as the bound falls below `target`: the caller only needs to know whether it cuts.
double Bounds::ext_fill_bound(const Combo& c, const std::vector<Group>& own,
                              const std::vector<const Combo::Option*>& ext, std::int64_t room,
                              double a, double tau_lo, double tau_hi, double sync,
                              const std::function<double(double)>& rt_of, double target) const {
    const std::int64_t L = model_.num_layers;
    const double M = d(c.work.num_microbatches);
    auto iteration = [&](double tau, double work) {
        double t = std::max(M * tau, rt_of(work));
        if (a > 0) t = std::max(t, work + a * tau);
        return t + sync;
    };
    // The least work at tau_hi is at most that of a split that fits there, every stage
    // working at most tau_hi: when even that does not reach the target, nothing here will.
    double stages = d(room);
    for (const Group& g : own) stages += d(g.count);
    if (iteration(tau_lo, stages * tau_hi * (1 + 1e-9)) < target) return 0.0;
    // Block-time classes, fastest first: a node group (index >= 0) or a later type (~index).
    std::vector<std::pair<double, std::int64_t>> cls;
    cls.reserve(own.size() + ext.size());
    for (std::size_t j = 0; j < own.size(); ++j) cls.emplace_back(own[j].t, static_cast<std::int64_t>(j));
    for (std::size_t j = 0; j < ext.size(); ++j) cls.emplace_back(ext[j]->t_min, ~static_cast<std::int64_t>(j));
    std::sort(cls.begin(), cls.end());
    auto added_fit = [&](const Combo::Option* o, double tau) {
        std::int64_t v = 0;
        for (const auto& [bt, cap] : o->widths) v = std::max(v, blocks_within(tau, bt, cap));
        return std::min(v, L);
    };
    auto work_at = [&](double tau) {
        double w = 0, t_add = kInf;
        std::int64_t left = L;
        for (const Group& g : own) {  // one block on each of the node's stages
            if (blocks_within(tau, g.t, g.cap) < 1) return kInf;
            w += d(g.count) * g.t;
            left -= g.count;
        }
        for (const Combo::Option* o : ext) {  // and on one added stage
            if (added_fit(o, tau) >= 1) t_add = std::min(t_add, o->t_min);
        }
        if (!std::isfinite(t_add) || left < 1) return kInf;
        w += t_add;
        left -= 1;
        for (const auto& [t, j] : cls) {  // the rest, fastest first
            if (left == 0) break;
            std::int64_t more;
            if (j >= 0) {
                const Group& g = own[static_cast<std::size_t>(j)];
                more = g.count * (std::min(blocks_within(tau, g.t, g.cap), L) - 1);
            } else {
                const Combo::Option* o = ext[static_cast<std::size_t>(~j)];
                more = std::min(o->avail, room) * added_fit(o, tau);
            }
            more = std::min(left, std::max<std::int64_t>(more, 0));
            w += d(more) * t;
            left -= more;
        }
        return left > 0 ? kInf : w;
    };
    const double floor = work_at(kInf);
    if (!std::isfinite(floor)) return kInf;
    // Evaluated a hair above tau: the work only falls with tau, so this errs low.
    double best = iteration(tau_lo, work_at(tau_hi * (1 + 1e-9)));
    double x = tau_hi;
    for (std::size_t step = 0; best >= target && step < 4 * static_cast<std::size_t>(L) * cls.size() + 64; ++step) {
        double next = kInf;
        for (const Group& g : own) {
            const std::int64_t fit = blocks_within(x * (1 + 1e-9), g.t, g.cap);
            if (fit < std::min(g.cap, L)) next = std::min(next, d(fit + 1) * g.t);
        }
        for (const Combo::Option* o : ext) {
            for (const auto& [bt, cap] : o->widths) {
                const std::int64_t fit = blocks_within(x * (1 + 1e-9), bt, cap);
                if (fit < std::min(cap, L)) next = std::min(next, d(fit + 1) * bt);
            }
        }
        if (!std::isfinite(next) || iteration(next, floor) >= best) break;
        x = next;
        best = std::min(best, iteration(x, work_at(x * (1 + 1e-9))));
    }
    return best >= target ? best : 0.0;
}

// Lower bound over completions that add stages of types at order positions >= p; with
// `must`, completions that add stages of the type at p (and perhaps later ones).
// Two bounds on the node's cost per unit of work, the larger counts: over all FLOPs at
// peak-times-efficiency rates, every added GPU at the best price per FLOP/s of the types
// from p on (order_ is sorted by it) up to their total rate; and over the blocks' FLOPs at
// the rates the cost model gives them (blocks_ratio()).
double Bounds::type_bound(const Node& n, const Combo& c, std::size_t p, bool must) const {
    if (p >= order_.size()) return kInf;
    const double xmax = c.suffix_rate[p];
    if (xmax <= 0 || n.rate + xmax < c.rate_min) return kInf;
    const auto t = static_cast<std::size_t>(order_[p]);
    const double xmin = must ? rate_[t] : suffix_min_rate_[p];
    const double rho = gpus_[t].price_per_hour / rate_[t];
    const double xlo = std::min(xmax, std::max(xmin, c.rate_min - n.rate));
    auto ratio = [&](double x) {
        return n.rate + x > 0 ? (n.price + rho * x) / (n.rate + x) : rho;
    };
    const double raw = std::min(ratio(xlo > 0 ? xlo : 1e-300), ratio(xmax));
    const double blocks = blocks_ratio(n, c, p, must);
    if (!std::isfinite(raw) || !std::isfinite(blocks)) return kInf;
    const double usd = std::max(c.c0 * raw, c.c0_blocks * blocks);
    if (opt_.objective == Objective::Cost) return usd;
    if (usd > opt_.budget_usd * (1 + kSlack)) return kInf;
    return std::max(c.t0 / (n.rate + xmax), c.t0_blocks / (n.unit_rate + c.blk_suffix_rate[p]));
}

// The least price per unit rate, (P0 + sum_t price_t x_t) / (R0 + sum_t b_t x_t), of any
// completion that adds x_t GPUs (at most the type's per-replica count) of the types at order
// positions >= p. A stage's unit rate is M block_flops / unit_s: as every stage of n_i
// blocks has T >= n_i unit_s_i (unit_time()) and the n_i sum to L, the iteration takes
// T >= M L block_flops / (the stages' unit rates). P0 and R0 are the node's price per replica
// and unit rate (Node::unit_rate), b_t the most one GPU of t brings at any width
// (Combo::blk_gpu; a stage of w GPUs brings at most w b_t). The completion adds at least one
// stage: the added rate is at least the least stage's (with `must`, one stage of the type at
// p), and at least what the deadline needs (block_rate_min). kInf when no completion can
// meet those. A fractional knapsack in order of price per unit rate (Dinkelbach's argument:
// a type priced below the running ratio lowers it and is taken whole; the first one at or
// above it, once the needs are met, ends the walk: every later one is dearer). The cost is
// at least c0_blocks times this ratio.
double Bounds::blocks_ratio(const Node& n, const Combo& c, std::size_t p, bool must) const {
    double price = n.price, rate = n.unit_rate;
    double need = std::max(c.block_rate_min - rate, 0.0);
    std::size_t forced = order_.size();  // none
    double forced_y = 0;
    if (must) {
        const auto st = static_cast<std::size_t>(order_[p]);
        forced = p;
        forced_y = c.blk_stage_min[st];
        if (gpus_[st].count / c.work.dp < 1 || !(forced_y > 0)) return kInf;
        if (!std::isfinite(forced_y)) return 0.0;
        price += gpus_[st].price_per_hour * forced_y / c.blk_gpu[st];
        rate += forced_y;
        need = std::max(need - forced_y, 0.0);
    } else {
        const double least = c.blk_suffix_stage_min[p];
        if (!std::isfinite(least)) return least > 0 ? 0.0 : kInf;  // +inf: unbounded rates
        need = std::max(need, least);
    }
    if (!std::isfinite(c.blk_suffix_rate[p])) return 0.0;
    if (rate + c.blk_suffix_rate[p] + 1e-9 * rate < c.block_rate_min) return kInf;
    for (const std::size_t q : c.blk_order) {
        if (q < p) continue;
        const auto st = static_cast<std::size_t>(order_[q]);
        const double b = c.blk_gpu[st];
        if (!(b > 0)) continue;
        double avail = d(gpus_[st].count / c.work.dp) * b;
        if (q == forced) avail = std::max(0.0, avail - forced_y);
        if (avail <= 0) continue;
        const double r = gpus_[st].price_per_hour / b;
        const bool lowers = rate > 0 && r * rate < price;
        if (need <= 0 && !lowers && rate > 0) break;
        const double take = lowers || rate <= 0 ? avail : std::min(avail, need);
        price += r * take;
        rate += take;
        need -= take;
    }
    if (need > kSlack * std::max(rate, c.block_rate_min)) return kInf;
    return rate > 0 ? price / rate : kInf;
}

}  // namespace espresso::search_detail
