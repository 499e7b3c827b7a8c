// Preparing the cost tree: the types' order and dominators, and the tables of every
// combination (search_tree.hpp).
#include "espresso/search_tree.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "espresso/pipeline_sim.hpp"
#include "espresso/spot.hpp"

namespace espresso::search_detail {

void Tree::prepare_types() {
    const std::int64_t n = static_cast<std::int64_t>(gpus_.size());
    rate_.resize(gpus_.size());
    cap_.resize(gpus_.size());
    widths_.resize(gpus_.size());
    for (std::int64_t t = 0; t < n; ++t) {
        const GpuSpec& g = gpus_[static_cast<std::size_t>(t)];
        const double eff = gemm_efficiency(g, params_);
        // With a profile, the fastest of its parts: no FLOP runs faster, so the bounds
        // built on rate_ stay admissible.
        // An fp8 plan's linear layers run at the fp8 rate: the larger rate bounds them all.
        rate_[static_cast<std::size_t>(t)] = std::max(g.tflops, linear_tflops(g, job_, params_)) *
                                             1e12 * eff / profile_min_time_scale(g);
        bwd_fwd_ratio_ = std::min(bwd_fwd_ratio_, profile_bwd_fwd_ratio(g));
        min_act_scale_ = std::min(min_act_scale_, g.activation_scale);
        cap_[static_cast<std::size_t>(t)] = std::max(0.0, usable_bytes(g, params_));
        for (std::int64_t w = 1; w <= std::min(g.gpus_per_node, opt_.max_tp); w *= 2) {
            if (w < opt_.min_tp) continue;
            if (tp_divides(model_, w)) widths_[static_cast<std::size_t>(t)].push_back(w);
        }
        // An fp8 plan needs fp8 tensor cores on every stage.
        const bool runs = !job_.fp8 || has_fp8(g);
        if (runs && g.count > 0 && !widths_[static_cast<std::size_t>(t)].empty() && cap_[static_cast<std::size_t>(t)] > 0) {
            order_.push_back(t);
        }
    }
    // Cheapest effective FLOP/s first; dominating types before the ones they dominate.
    // For the fastest plan without a budget, prices do not matter: fastest first.
    time_only_ = opt_.objective == Objective::Time && !std::isfinite(opt_.budget_usd);
    std::stable_sort(order_.begin(), order_.end(), [&](std::int64_t a, std::int64_t b) {
        const double ra = time_only_ ? 0.0 : gpus_[static_cast<std::size_t>(a)].price_per_hour / rate_[static_cast<std::size_t>(a)];
        const double rb = time_only_ ? 0.0 : gpus_[static_cast<std::size_t>(b)].price_per_hour / rate_[static_cast<std::size_t>(b)];
        if (ra != rb) return ra < rb;
        if (rate_[static_cast<std::size_t>(a)] != rate_[static_cast<std::size_t>(b)]) return rate_[static_cast<std::size_t>(a)] > rate_[static_cast<std::size_t>(b)];
        if (cap_[static_cast<std::size_t>(a)] != cap_[static_cast<std::size_t>(b)]) return cap_[static_cast<std::size_t>(a)] > cap_[static_cast<std::size_t>(b)];
        // Among equals, the better connected and larger instance first (so it can
        // dominate the others, which only a type earlier in the order may).
        const GpuSpec& ga = gpus_[static_cast<std::size_t>(a)];
        const GpuSpec& gb = gpus_[static_cast<std::size_t>(b)];
        if (ga.inter_node_gbs != gb.inter_node_gbs) return ga.inter_node_gbs > gb.inter_node_gbs;
        if (ga.intra_node_gbs != gb.intra_node_gbs) return ga.intra_node_gbs > gb.intra_node_gbs;
        return ga.gpus_per_node > gb.gpus_per_node;
    });
    // Spot rows: a node's expected hours are at least its hours of work times
    // spot_factor() at its own interruption rate, the checkpoint time and the least
    // restart any spot row allows (docs/search.md, "Spot").
    checkpoint_h_ = checkpoint_hours(model_, params_, job_);
    restart_min_h_ = kInf;
    for (const GpuSpec& g : gpus_) {
        if (g.interruptions_per_hour > 0) restart_min_h_ = std::min(restart_min_h_, g.recovery_hours);
    }
    restart_min_h_ = std::isfinite(restart_min_h_) ? restart_min_h_ + params_.restart_hours + checkpoint_h_ : 0.0;
    suffix_min_rate_.assign(order_.size() + 1, kInf);
    suffix_min_price_.assign(order_.size() + 1, kInf);
    for (std::size_t p = order_.size(); p-- > 0;) {
        suffix_min_rate_[p] = std::min(suffix_min_rate_[p + 1], rate_[static_cast<std::size_t>(order_[p])]);
        suffix_min_price_[p] = std::min(suffix_min_price_[p + 1],
                                        gpus_[static_cast<std::size_t>(order_[p])].price_per_hour);
    }
    dominators_.assign(gpus_.size(), {});
    for (std::size_t pj = 0; pj < order_.size(); ++pj) {
        for (std::size_t pi = 0; pi < pj; ++pi) {
            if (dominates(order_[pi], order_[pj])) {
                dominators_[static_cast<std::size_t>(order_[pj])].push_back(order_[pi]);
            }
        }
    }
}

bool Tree::dominates(std::int64_t i, std::int64_t j) const {
    const GpuSpec& a = gpus_[static_cast<std::size_t>(i)];
    const GpuSpec& b = gpus_[static_cast<std::size_t>(j)];
    // Profiles: every part at least as fast, and no more activation memory.
    const double ra = rate_[static_cast<std::size_t>(i)] * profile_min_time_scale(a);
    const double rb = rate_[static_cast<std::size_t>(j)] * profile_min_time_scale(b);
    const bool parts = ra / a.block_fwd_scale >= rb / b.block_fwd_scale &&
                       ra / a.block_bwd_scale >= rb / b.block_bwd_scale &&
                       ra / a.head_fwd_scale >= rb / b.head_fwd_scale &&
                       ra / a.head_bwd_scale >= rb / b.head_bwd_scale &&
                       a.activation_scale <= b.activation_scale;
    return parts && rate_[static_cast<std::size_t>(i)] >= rate_[static_cast<std::size_t>(j)] &&
           cap_[static_cast<std::size_t>(i)] >= cap_[static_cast<std::size_t>(j)] &&
           a.mem_bandwidth_gbs >= b.mem_bandwidth_gbs && a.intra_node_gbs >= b.intra_node_gbs &&
           a.inter_node_gbs >= b.inter_node_gbs && a.intra_node_gbs >= b.inter_node_gbs &&
           a.gpus_per_node >= b.gpus_per_node &&
           // Spot: no more interruptions per instance (a holds b's GPUs in no more
           // instances) and no slower recovery, unless a is on-demand.
           (a.interruptions_per_hour == 0 ||
            (a.interruptions_per_hour <= b.interruptions_per_hour &&
             a.recovery_hours <= b.recovery_hours));
    // Prices are compared where a node adds b (make_child): whole instances make the
    // cost of moving b's GPUs onto a depend on how many a already has.
}

bool Tree::prepare_combos(Stopwatch& sw) {
    const std::int64_t B = job_.global_batch_size;
    const double L = d(model_.num_layers);
    for (const Recompute rc : opt_.recompute) {
        for (const std::int64_t b : opt_.micro_batch_sizes) {
            if (b < 1 || B % b != 0) continue;
            for (std::int64_t dp = 1; dp <= std::min(B / b, opt_.max_dp); ++dp) {
                if ((B / b) % dp != 0) continue;
                // Sharding levels, each once: with one replica they are all the same,
                // and the legacy zero1 switch makes None and Zero1 the same.
                std::vector<Sharding> levels;
                for (const Sharding want : opt_.sharding) {
                    Sharding sh = dp == 1 ? Sharding::None : want;
                    if (params_.zero1 && dp > 1) sh = std::max(sh, Sharding::Zero1);
                    if (std::find(levels.begin(), levels.end(), sh) == levels.end()) {
                        levels.push_back(sh);
                    }
                }
                for (const Sharding sh : levels) {
                  for (const std::int64_t v : opt_.virtual_stages) {
                    if (sw.expired(1)) return false;
                    // Interleaving: 1F1B, and at least two groups with M a multiple of
                    // their number.
                    if (v > 1 && (opt_.schedule != Schedule::OneFOneB || B / b / dp < 2)) continue;
                    Combo c;
                    c.work = job_;
                    c.work.virtual_stages = v;
                    c.work.micro_batch_size = b;
                    c.work.dp = dp;
                    c.work.num_microbatches = B / b / dp;
                    c.work.recompute = rc;
                    c.work.schedule = opt_.schedule;
                    c.work.sharding = sh;
                    if (c.work.num_microbatches > kMaxMicrobatches) continue;
                    // The FLOPs every block's forward runs at no more than peak x
                    // efficiency (a selective recomputation adds at least nothing).
                    const double blk = block_bound_flops(model_, params_, job_.seq_len, b);
                    const double head = head_fwd_flops(model_, job_.seq_len, b);
                    c.flops_mb = L * blk * (rc == Recompute::Full ? 4.0 : 3.0) + 3.0 * head;
                    c.block_flops = blk * (rc == Recompute::Full ? 4.0 : 3.0);
                    c.head_flops = 3.0 * head;
                    const double iter_flops = d(c.work.num_microbatches) * c.flops_mb;
                    c.c0 = job_.iterations / 3600.0 * d(dp) * iter_flops;
                    c.t0 = job_.iterations / 3600.0 * iter_flops;
                    c.rate_min = opt_.enforce_deadline && opt_.prune_deadline
                                     ? job_.iterations * iter_flops / (3600.0 * job_.deadline_hours)
                                     : 0.0;
                    const double iter_blocks = d(c.work.num_microbatches) * L * c.block_flops;
                    c.c0_blocks = job_.iterations / 3600.0 * d(dp) * iter_blocks;
                    c.t0_blocks = job_.iterations / 3600.0 * iter_blocks;
                    c.block_rate_min = opt_.enforce_deadline && opt_.prune_deadline
                                           ? job_.iterations * iter_blocks / (3600.0 * job_.deadline_hours)
                                           : 0.0;
                    const StateShards shards = state_shards(sh, dp);
                    const double states = params_.bytes_per_weight / shards.weights +
                                          params_.bytes_per_grad / shards.grads +
                                          job_.optimizer_bytes_per_param / shards.optimizer;
                    const double bp = block_params(model_);
                    if (dp > 1) {
                        // What of the cost model's DP traffic is surely exposed, for one
                        // block over a 1 GB/s link, split into its latency and its per-GB/s
                        // part: the gradients' all-reduce (or reduce-scatter) unless it
                        // overlaps the backward, and ZeRO's all-gather of the weights after
                        // the step. FSDP's traffic can hide entirely under compute.
                        const double lat = 2.0 * d(dp - 1) * params_.link_latency_s;
                        const double grads = ring_allreduce_s(bp * params_.bytes_per_grad, dp, 1.0, params_) - lat;
                        const double weights = ring_allreduce_s(bp * params_.bytes_per_weight, dp, 1.0, params_) - lat;
                        const bool hidden = params_.overlap_grad_reduce;
                        switch (sh) {
                            case Sharding::None:
                                if (!hidden) c.k_ar = grads, c.lat_ar = lat;
                                c.k_all = grads;
                                break;
                            case Sharding::Zero1: {
                                // The weights' all-gather hides under the next step's first
                                // forward with overlap_param_gather, as the reduce-scatter
                                // under the last backward: together at most one busy time.
                                const bool gather_hidden = params_.overlap_param_gather;
                                c.k_ar = (gather_hidden ? 0.0 : 0.5 * weights) +
                                         (hidden ? 0.0 : 0.5 * grads);
                                c.lat_ar = (gather_hidden ? 0.0 : 0.5 * lat) +
                                           (hidden ? 0.0 : 0.5 * lat);
                                c.k_all = 0.5 * weights + 0.5 * grads;
                                break;
                            }
                            case Sharding::Zero2:
                                c.k_ar = 0.5 * weights, c.lat_ar = 0.5 * lat;
                                break;
                            case Sharding::Full:
                                break;
                        }
                        c.hidden = sh <= Sharding::Zero1 &&
                                   (hidden || (sh == Sharding::Zero1 &&
                                               params_.overlap_param_gather));
                        // Interleaved plans hide the reductions under the backwards of
                        // the chunks after them and the gathers under the first forwards
                        // (the schedule's simulation): only k_ar is surely exposed.
                        if (c.work.virtual_stages > 1) c.hidden = false;
                        if (!c.hidden) c.k_all = c.k_ar;
                    }
                    c.k_opt = bp / shards.optimizer *
                              params_.optimizer_step_bytes_per_param /
                              (kGB * params_.memory_bandwidth_efficiency);
                    // Activations: at least each block's input (split over the widest TP
                    // group under sequence parallelism).
                    const double input_split = job_.sequence_parallel ? d(opt_.max_tp) : 1.0;
                    c.need_bytes = total_params(model_) * states +
                                   L * d(job_.seq_len) * d(b) * d(model_.hidden_size) *
                                       params_.bytes_per_activation * min_act_scale_ / input_split;
                    c.suffix_rate.assign(order_.size() + 1, 0.0);
                    c.suffix_cap.assign(order_.size() + 1, 0.0);
                    for (std::size_t p = order_.size(); p-- > 0;) {
                        const auto t = static_cast<std::size_t>(order_[p]);
                        const double per_replica = d(gpus_[t].count / dp);
                        c.suffix_rate[p] = c.suffix_rate[p + 1] + per_replica * rate_[t];
                        c.suffix_cap[p] = c.suffix_cap[p + 1] + per_replica * cap_[t];
                    }
                    c.max_layers.resize(gpus_.size());
                    c.max_layers_k.resize(gpus_.size());
                    c.block_s.resize(gpus_.size());
                    c.head_s.resize(gpus_.size());
                    c.unit_s.resize(gpus_.size());
                    c.max_stages = std::min(opt_.max_stages, model_.num_layers);
                    if (c.work.schedule == Schedule::OneFOneB && c.work.num_microbatches > 1) {
                        c.max_stages = std::min(c.max_stages, c.work.num_microbatches);
                    }
                    // Each GPU group of an interleaved plan holds at least v blocks.
                    c.max_stages = std::min(c.max_stages, model_.num_layers / v);
                    // A pass over the deeper allocations only (covered_depth): a combination
                    // that cannot go deeper than what is covered has nothing to add (its root
                    // would have no completion and no allocation of its own), so its tables
                    // are not built. (The prototype's instance: 22 of 116 are left.)
                    if (opt_.covered_depth > 0 && c.max_stages <= opt_.covered_depth) continue;
                    c.kin = c.work.schedule == Schedule::GPipe
                                ? 1
                                : std::max<std::int64_t>(1, std::min(std::min(opt_.max_stages, model_.num_layers),
                                                                    c.work.num_microbatches));
                    for (const std::int64_t t : order_) {
                        if (sw.expired(16)) return false;
                        const auto st = static_cast<std::size_t>(t);
                        const std::size_t nw = widths_[st].size();
                        c.max_layers[st].reserve(nw);
                        c.max_layers_k[st].reserve(nw);
                        c.block_s[st].reserve(nw);
                        c.head_s[st].reserve(nw);
                        c.unit_s[st].reserve(nw);
                        for (const std::int64_t w : widths_[st]) {
                            const FitKey key{static_cast<int>(rc), b, dp, static_cast<int>(sh), v, st, w};
                            const StageFit f = fit_of(key, c, st, w);
                            c.max_layers[st].push_back(f.most);
                            c.max_layers_k[st].push_back(layers_in_flight(c, f));
                            c.block_s[st].push_back(f.block_s);
                            c.head_s[st].push_back(f.head_s);
                            c.unit_s[st].push_back(f.unit_s);
                        }
                    }
                    prepare_options(c);
                    combos_.push_back(std::move(c));
                  }
                }
            }
        }
    }
    return true;
}

// Blocks a middle stage of `tp` GPUs of type st can hold with one micro-batch in flight (the
// most that fit, by bisection, against the capacity of a plan of one stage, which has no
// pipeline communicator: the most a stage of this width can have), and the slopes of its
// memory in blocks and micro-batches in flight (layers_in_flight).
StageFit Tree::stage_fit(const Combo& c, std::size_t st, std::int64_t tp) const {
    StageFit f;
    const GpuSpec& g = gpus_[st];
    const std::int64_t L = model_.num_layers;
    // (A stage of one-stage plans has no pipeline communicator: the most it can have.)
    const double room = stage_capacity_bytes(g, params_, tp, c.work.dp, 1);
    f.usable = room;
    // A middle stage's memory is states + k activations per block, plus k stage outputs and
    // a transient: n (S + k A) + k O + T. Without the optimizer step's intermediates (a max
    // over the activations, not affine): memory only lower, so the counts stay upper bounds.
    CostParams affine = params_;
    affine.optimizer_transient_bytes_per_param = 0.0;
    auto mem = [&](std::int64_t n, std::int64_t k) {
        Workload w = c.work;
        w.schedule = Schedule::GPipe;
        w.num_microbatches = k;
        return stage_memory(model_, g, affine, w, tp, n, 1, 3).memory_bytes;
    };
    const std::int64_t k0 = c.work.schedule == Schedule::GPipe ? c.work.num_microbatches : 1;
    f.m1 = mem(1, k0);
    f.per_block = mem(2, k0) - f.m1;  // S + k0 A
    if (k0 == 1) {
        // 1F1B only: A from the second micro-batch's slope, O from its intercept.
        const double m1k2 = mem(1, 2);
        f.act = (mem(2, 2) - m1k2) - f.per_block;
        f.stash_out = std::max(0.0, m1k2 - f.m1 - f.act);
    }

    // The most blocks that fit with one micro-batch in flight (the exact memory, GPipe with
    // one micro-batch: the most a stage of this width can hold), by bisection: memory grows
    // with the blocks held. With one micro-batch the affine memory above is the same but for
    // the optimizer's intermediates, so it is never more: the count where it reaches the room
    // is where the search starts (checked, so the answer stays the bisection's even if
    // memory were not affine).
    Workload lenient = c.work;
    lenient.schedule = Schedule::GPipe;
    lenient.num_microbatches = 1;
    auto fits = [&](std::int64_t n) {
        return stage_memory(model_, g, params_, lenient, tp, n, 1, 3).memory_bytes <= room;
    };
    std::int64_t lo = 0, hi = L;  // fits(lo) (or lo = 0), and nothing above hi fits
    const double q = (room - f.m1) / f.per_block;
    if (k0 == 1 && f.per_block > 0 && std::isfinite(q)) {
        const std::int64_t guess = q < 0 ? 0 : std::min(L, static_cast<std::int64_t>(std::floor(q)) + 1);
        if (guess < L && fits(guess + 1)) {
            lo = guess + 1;  // the guess was low (memory not affine): search above it
        } else {
            hi = guess;
            if (guess > 0 && fits(guess)) lo = guess;
        }
    }
    while (lo < hi) {
        const std::int64_t mid = lo + (hi - lo + 1) / 2;
        if (fits(mid)) lo = mid;
        else hi = mid - 1;
    }
    f.most = lo;
    const auto type = static_cast<std::int64_t>(st);
    f.block_s = block_time(c, type, tp);
    f.head_s = head_time(c, type, tp);
    f.unit_s = unit_time(c, type, tp, f.block_s);
    return f;
}

StageFit Tree::fit_of(const FitKey& key, const Combo& c, std::size_t st, std::int64_t tp) const {
    if (fits_ == nullptr) return stage_fit(c, st, tp);
    const auto hit = fits_->find(key);
    if (hit != fits_->end()) return hit->second;
    return fits_->emplace(key, stage_fit(c, st, tp)).first->second;
}

// Blocks such a stage can hold with k = 1..c.kin micro-batches in flight (GPipe: M): the
// most blocks are (U - T - k O) / (S + k A), the quotient rounded up (an upper bound), and
// never above the exact count with one micro-batch in flight.
std::vector<std::int64_t> Tree::layers_in_flight(const Combo& c, const StageFit& f) const {
    std::vector<std::int64_t> out;
    const std::int64_t lenient = f.most;
    for (std::int64_t k = 1; k <= c.kin; ++k) {
        const double base = f.m1 - f.per_block + d(k - 1) * f.stash_out;  // T + k O
        const double slope = f.per_block + d(k - 1) * f.act;
        std::int64_t n = lenient;
        if (slope > 0 && std::isfinite(slope)) {
            const double q = (f.usable - base) / slope * (1 + 1e-9);
            n = q < 0 ? 0 : static_cast<std::int64_t>(std::min(d(lenient), std::floor(q)));
        }
        out.push_back(std::min(n, lenient));
    }
    return out;
}

void Tree::prepare_options(Combo& c) const {
    const std::int64_t L = model_.num_layers;
    c.options.resize(gpus_.size());
    prepare_block_rates(c);
    for (const std::int64_t t : order_) {
        const auto st = static_cast<std::size_t>(t);
        Combo::Option& o = c.options[st];
        o.avail = gpus_[st].count / c.work.dp;
        if (o.avail < 1) continue;
        double bw_gpu = 0;
        for (std::size_t wi = 0; wi < widths_[st].size(); ++wi) {
            const std::int64_t w = widths_[st][wi];
            if (w > o.avail) break;
            const std::int64_t cap = opt_.prune_memory ? c.max_layers[st][wi] : L;
            if (cap < 1) continue;
            const double bt = c.block_s[st][wi];
            o.widths.emplace_back(bt, cap);
            o.head.push_back(c.head_s[st][wi]);
            o.unit.push_back(c.unit_s[st][wi]);
            o.t_min = std::min(o.t_min, bt);
            o.t_max = std::max(o.t_max, bt);
            if (w > 1) o.tp = true;
            o.bw_slot = std::max(o.bw_slot, stage_bw(c, t, w));
            bw_gpu = std::max(bw_gpu, stage_bw(c, t, w) / d(w));
            o.hbm_slot = std::max(o.hbm_slot, d(w) * gpus_[st].mem_bandwidth_gbs);
        }
        o.bw_all = d(o.avail) * bw_gpu;
        o.hbm_all = d(o.avail) * gpus_[st].mem_bandwidth_gbs;
    }
}

// The unit rate each type can bring to a completion, for blocks_ratio(): every width
// the enumeration may give a stage of the type counts (a superset of the options, so the
// most per GPU is an upper bound and the least per stage a lower one).
void Tree::prepare_block_rates(Combo& c) const {
    const std::size_t n = gpus_.size();
    c.blk_gpu.assign(n, 0.0);
    c.blk_stage_min.assign(n, kInf);
    for (const std::int64_t t : order_) {
        const auto st = static_cast<std::size_t>(t);
        for (std::size_t wi = 0; wi < widths_[st].size(); ++wi) {
            const double u = c.unit_s[st][wi];
            // A unit time of 0 (never from valid specs) gives an unbounded rate: the
            // bound then falls to 0, which is admissible.
            const double stage = u > 0 ? d(c.work.num_microbatches) * c.block_flops / u : kInf;
            c.blk_gpu[st] = std::max(c.blk_gpu[st], stage / d(widths_[st][wi]));
            c.blk_stage_min[st] = std::min(c.blk_stage_min[st], stage);
        }
    }
    c.blk_order.clear();
    for (std::size_t p = 0; p < order_.size(); ++p) c.blk_order.push_back(p);
    auto per_block = [&](std::size_t p) {
        const auto st = static_cast<std::size_t>(order_[p]);
        return c.blk_gpu[st] > 0 ? gpus_[st].price_per_hour / c.blk_gpu[st] : kInf;
    };
    std::stable_sort(c.blk_order.begin(), c.blk_order.end(),
                     [&](std::size_t a, std::size_t b) { return per_block(a) < per_block(b); });
    c.blk_suffix_rate.assign(order_.size() + 1, 0.0);
    c.blk_suffix_stage_min.assign(order_.size() + 1, kInf);
    for (std::size_t p = order_.size(); p-- > 0;) {
        const auto st = static_cast<std::size_t>(order_[p]);
        const std::int64_t per_replica = gpus_[st].count / c.work.dp;
        c.blk_suffix_rate[p] = c.blk_suffix_rate[p + 1] + d(per_replica) * c.blk_gpu[st];
        c.blk_suffix_stage_min[p] = c.blk_suffix_stage_min[p + 1];
        if (per_replica >= 1) {
            c.blk_suffix_stage_min[p] = std::min(c.blk_suffix_stage_min[p], c.blk_stage_min[st]);
        }
    }
}

std::vector<Node> Tree::roots() const {
    std::vector<Node> out;
    for (std::size_t c = 0; c < combos_.size(); ++c) {
        Node root;
        root.combo = static_cast<std::int32_t>(c);
        root.ext_lb = ext_bound(root, combos_[c]);
        root.full = true;
        root.lb = std::min(own_bound(root, combos_[c]), root.ext_lb);
        if (std::isfinite(root.lb)) out.push_back(std::move(root));
    }
    return out;
}

}  // namespace espresso::search_detail
