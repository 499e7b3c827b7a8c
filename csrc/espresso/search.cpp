#include "espresso/search.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <queue>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>

#include "espresso/pipeline_sim.hpp"
#include "espresso/spot.hpp"

namespace espresso {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSlack = 1e-9;  // relative: bounds never prune plans within rounding of a tie
// The completion bound over added stages looks at each later type; beyond this many it is
// skipped (the other bounds still hold), so a node's bound stays cheap on huge catalogs.
constexpr std::size_t kExtTypesMax = 256;
// Children one node may generate at most (deep pipelines over many widths can have billions):
// beyond, the rest of that node stays open under its bound (the search reports a gap), so
// memory stays bounded even without a time limit.
constexpr std::size_t kMaxChildren = std::size_t{1} << 18;

double d(std::int64_t v) { return static_cast<double>(v); }

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
        std::int64_t avail = 0;
        bool tp = false;
        double bw_slot = 0, bw_all = 0, hbm_slot = 0, hbm_all = 0, t_min = kInf, t_max = 0;
    };
    std::vector<Option> options;
    std::vector<std::vector<double>> block_s;  // block_time() by type and width index
    std::vector<std::vector<double>> head_s;   // head_time() by type and width index
};

// A total order on plans with equal objective, so the answer never depends on timing.
using PlanKey = std::tuple<double, std::int64_t, double, std::int64_t, std::int64_t, int,
                           std::vector<std::int64_t>>;

PlanKey key_of(const SearchPlan& p) {
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

class Search {
public:
    Search(const ModelDims& model, const std::vector<GpuSpec>& gpus, const CostParams& params,
           const Workload& job, const SearchOptions& opt)
        : model_(model), gpus_(gpus), params_(params), job_(job), opt_(opt) {}

    SearchResult run() {
        const auto t_start = std::chrono::steady_clock::now();
        deadline_ = Stopwatch::after(opt_.time_limit_s);
        cancel_ = opt_.monitor ? &opt_.monitor->cancel : nullptr;
        Stopwatch sw(deadline_, cancel_);
        threshold_.store(std::min(opt_.incumbent, shared_value()));
        prepare_types();
        prepare_combos(sw);
        if (sw.check_now()) {
            // Out of time while building the tables: nothing is known about the rest.
            stop_ = true;
            stats_.timed_out = true;
            open_lb_ = 0.0;
        }
        for (std::size_t c = 0; c < combos_.size() && !stop_; ++c) {
            Node root;
            root.combo = static_cast<std::int32_t>(c);
            root.ext_lb = ext_bound(root, combos_[c]);
            root.full = true;
            root.lb = std::min(own_bound(root, combos_[c]), root.ext_lb);
            if (std::isfinite(root.lb)) push(std::move(root));
        }
        const std::int64_t nthreads = std::max<std::int64_t>(1, opt_.threads);
        // This thread is one worker; the others are started here. When the system cannot
        // start one (a memory or process limit), the search goes on with those it has:
        // stats_.threads says how many ran.
        std::vector<std::thread> pool;
        pool.reserve(static_cast<std::size_t>(nthreads - 1));
        for (std::int64_t i = 1; i < nthreads; ++i) {
            try {
                pool.emplace_back([this] { worker(); });
            } catch (const std::system_error&) {
                break;
            }
        }
        stats_.threads = static_cast<std::int64_t>(pool.size()) + 1;
        worker();
        for (auto& th : pool) th.join();
        SearchResult out;
        out.plans = best_;
        stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        if (stop_) {
            stats_.complete = false;
            if (!queue_.empty()) open_lb_ = std::min(open_lb_, queue_.top().lb);
        }
        const double best = best_.empty() ? kInf : best_.front().objective;
        stats_.lower_bound = stats_.complete ? best : std::min(best, open_lb_);
        publish(best, stats_.lower_bound);
        out.stats = stats_;
        return out;
    }

private:
    // ------------------------------------------------------------------ set-up
    void prepare_types() {
        const std::int64_t n = static_cast<std::int64_t>(gpus_.size());
        rate_.resize(gpus_.size());
        cap_.resize(gpus_.size());
        widths_.resize(gpus_.size());
        for (std::int64_t t = 0; t < n; ++t) {
            const GpuSpec& g = gpus_[static_cast<std::size_t>(t)];
            const double eff = gemm_efficiency(g, params_);
            // With a profile, the fastest of its parts: no FLOP runs faster, so the bounds
            // built on rate_ stay admissible.
            rate_[static_cast<std::size_t>(t)] = g.tflops * 1e12 * eff / profile_min_time_scale(g);
            bwd_fwd_ratio_ = std::min(bwd_fwd_ratio_, profile_bwd_fwd_ratio(g));
            min_act_scale_ = std::min(min_act_scale_, g.activation_scale);
            cap_[static_cast<std::size_t>(t)] = std::max(0.0, usable_bytes(g, params_));
            for (std::int64_t w = 1; w <= std::min(g.gpus_per_node, opt_.max_tp); w *= 2) {
                if (w < opt_.min_tp) continue;
                if (tp_divides(model_, w)) widths_[static_cast<std::size_t>(t)].push_back(w);
            }
            if (g.count > 0 && !widths_[static_cast<std::size_t>(t)].empty() && cap_[static_cast<std::size_t>(t)] > 0) {
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

    bool dominates(std::int64_t i, std::int64_t j) const {
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

    void prepare_combos(Stopwatch& sw) {
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
                        if (sw.expired(1)) return;
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
                                    break;
                                case Sharding::Zero1:
                                    c.k_ar = 0.5 * weights + (hidden ? 0.0 : 0.5 * grads);
                                    c.lat_ar = hidden ? 0.5 * lat : lat;
                                    break;
                                case Sharding::Zero2:
                                    c.k_ar = 0.5 * weights, c.lat_ar = 0.5 * lat;
                                    break;
                                case Sharding::Full:
                                    break;
                            }
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
                        c.max_stages = std::min(opt_.max_stages, model_.num_layers);
                        if (c.work.schedule == Schedule::OneFOneB && c.work.num_microbatches > 1) {
                            c.max_stages = std::min(c.max_stages, c.work.num_microbatches);
                        }
                        // Each GPU group of an interleaved plan holds at least v blocks.
                        c.max_stages = std::min(c.max_stages, model_.num_layers / v);
                        c.kin = c.work.schedule == Schedule::GPipe
                                    ? 1
                                    : std::max<std::int64_t>(1, std::min(std::min(opt_.max_stages, model_.num_layers),
                                                                        c.work.num_microbatches));
                        Workload lenient = c.work;
                        lenient.schedule = Schedule::GPipe;
                        lenient.num_microbatches = 1;
                        for (const std::int64_t t : order_) {
                            if (sw.expired(16)) return;
                            const auto st = static_cast<std::size_t>(t);
                            for (const std::int64_t w : widths_[st]) {
                                // Memory grows with the blocks held: the most that fit, by bisection.
                                auto fits = [&](std::int64_t n) {
                                    const StageEstimate e = stage_cost(model_, gpus_[st], params_, lenient,
                                                                       w, n, 1, 3);
                                    return e.memory_bytes <= e.capacity_bytes;
                                };
                                std::int64_t lo = 0, hi = model_.num_layers;  // fits(lo) (or lo = 0)
                                while (lo < hi) {
                                    const std::int64_t mid = lo + (hi - lo + 1) / 2;
                                    if (fits(mid)) lo = mid;
                                    else hi = mid - 1;
                                }
                                c.max_layers[st].push_back(lo);
                                c.max_layers_k[st].push_back(layers_in_flight(c, st, w, lo));
                            }
                        }
                        prepare_options(c);
                        combos_.push_back(std::move(c));
                      }
                    }
                }
            }
        }
        stats_.combos = static_cast<std::int64_t>(combos_.size());
    }

    // Blocks a middle stage of `tp` GPUs of type st can hold with k = 1..c.kin micro-batches
    // in flight (GPipe: M). A middle stage's memory is states + k activations per block, plus
    // a transient: n (S + k A) + T, so the most blocks are (U - T) / (S + k A); the slopes come
    // from the cost model itself, the quotient is rounded up (an upper bound), and never above
    // `lenient` (the exact count with one micro-batch in flight).
    std::vector<std::int64_t> layers_in_flight(const Combo& c, std::size_t st, std::int64_t tp,
                                               std::int64_t lenient) const {
        std::vector<std::int64_t> out;
        const GpuSpec& g = gpus_[st];
        auto mem = [&](std::int64_t n, std::int64_t k) {
            Workload w = c.work;
            w.schedule = Schedule::GPipe;
            w.num_microbatches = k;
            return stage_cost(model_, g, params_, w, tp, n, 1, 3).memory_bytes;
        };
        const std::int64_t k0 = c.work.schedule == Schedule::GPipe ? c.work.num_microbatches : 1;
        const double m1 = mem(1, k0), m2 = mem(2, k0);
        const double per_block = m2 - m1;                          // S + k0 A
        const double act = k0 == 1 ? mem(1, 2) - m1 : 0.0;         // A (1F1B only)
        const double base = m1 - per_block;                         // T
        const double usable = usable_bytes(g, params_);
        for (std::int64_t k = 1; k <= c.kin; ++k) {
            const double slope = per_block + d(k - 1) * act;
            std::int64_t n = lenient;
            if (slope > 0 && std::isfinite(slope)) {
                const double q = (usable - base) / slope * (1 + 1e-9);
                n = q < 0 ? 0 : static_cast<std::int64_t>(std::min(d(lenient), std::floor(q)));
            }
            out.push_back(std::min(n, lenient));
        }
        return out;
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
    double positioned_tau(const Node& n, const Combo& c) const {
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

    void prepare_options(Combo& c) const {
        const std::int64_t L = model_.num_layers;
        c.options.resize(gpus_.size());
        c.block_s.resize(gpus_.size());
        c.head_s.resize(gpus_.size());
        for (const std::int64_t t : order_) {
            for (const std::int64_t w : widths_[static_cast<std::size_t>(t)]) {
                c.block_s[static_cast<std::size_t>(t)].push_back(block_time(c, t, w));
                c.head_s[static_cast<std::size_t>(t)].push_back(head_time(c, t, w));
            }
        }
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

    // ------------------------------------------------------------------ bounds
    // Lower bound on the objective of the node's own allocation (kInf: cannot work).
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
    // q with w_k >= q f_k on every stage: a backward computes at least twice a forward (the
    // head's too, so recomputation does not raise it to 3 on the last stage), times the
    // profiles' least backward/forward ratio; with tensor parallelism both directions carry
    // the same all-reduces, so only b >= f is sure.
    double q_factor(const Node& n) const {
        return 1.0 + (n.tensor_parallel ? std::min(1.0, 2.0 * bwd_fwd_ratio_)
                                        : 2.0 * bwd_fwd_ratio_);
    }

    double effective_rate(const Node& n, const Combo& c) const {
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

    // Whole blocks: some stage holds at least its share, rounded up. The smallest possible
    // bottleneck tau (per micro-batch) is the least tau at which every stage can take at
    // least one block and together they take all L, each at most min(tau / t_i, its memory
    // limit) blocks, t_i = block_time (the head and transfers only add).
    // Time of one block for one micro-batch on a stage of `tp` GPUs of `type` (tabled per
    // combo in block_s: the bounds read the table).
    double block_time(const Combo& c, std::int64_t type, std::int64_t tp) const {
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

    // A node's stages of one (type, width), as the bottleneck bounds see them: block time,
    // the most blocks one such stage holds (memory), how many stages, the LM head's time.
    struct Group {
        double t;
        std::int64_t cap, count;
        double head;
    };

    std::vector<Group> groups_of(const Node& n, const Combo& c) const {
        std::vector<Group> gs;
        gs.reserve(n.choices.size());
        for (const Choice& ch : n.choices) {
            const auto st = static_cast<std::size_t>(ch.type);
            const auto& ws = widths_[st];
            const auto wi = static_cast<std::size_t>(std::find(ws.begin(), ws.end(), ch.tp) - ws.begin());
            gs.push_back({c.block_s[st][wi], opt_.prune_memory ? c.max_layers[st][wi] : model_.num_layers,
                          ch.count, c.head_s[st][wi]});
        }
        return gs;
    }

    double bottleneck_bound(const Node& n, const Combo& c) const {
        const std::vector<Group> gs = groups_of(n, c);
        const std::int64_t L = model_.num_layers;
        auto feasible = [&](double tau) {
            std::int64_t total = 0;
            for (const Group& g : gs) {
                const auto fit = std::min<std::int64_t>(
                    g.cap, static_cast<std::int64_t>(std::floor(tau / g.t * (1 + 1e-12))));
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

    // The LM head's forward and backward on a stage of `tp` GPUs of `type`, at the type's
    // fastest rate (no TP all-reduce is charged for it: a lower bound).
    double head_time(const Combo& c, std::int64_t type, std::int64_t tp) const {
        const BlockTimes ht = head_times(model_, gpus_[static_cast<std::size_t>(type)], params_,
                                         c.work, tp);
        return ht.fwd + ht.bwd;
    }

    // `tau`: the bottleneck when already known (positioned_tau()), else negative: the
    // lenient bottleneck_bound() is used.
    // `thr`: when the cheap rate bounds already put the allocation beyond it, their value
    // is returned (a weaker but sufficient bound) and the dearer ones are skipped.
    double own_bound(const Node& n, const Combo& c, double tau = -1.0,
                     double thr = kInf) const {
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
        if (tau < 0) tau = bottleneck_bound(n, c);
        if (!std::isfinite(tau)) return kInf;
        double t_iter = std::max(by_rate, M * tau);
        if (c.work.schedule == Schedule::OneFOneB && c.work.virtual_stages == 1 && n.stages > 1) {
            double t_min = kInf, head_min = kInf;  // the fastest block and LM head
            for (const Choice& ch : n.choices) {
                const auto st = static_cast<std::size_t>(ch.type);
                const auto& ws = widths_[st];
                const auto wi = static_cast<std::size_t>(std::find(ws.begin(), ws.end(), ch.tp) - ws.begin());
                t_min = std::min(t_min, c.block_s[st][wi]);
                head_min = std::min(head_min, c.head_s[st][wi]);
            }
            // The second pipeline bound with k the bottleneck stage (w_k >= tau) and
            // sum_i w_i >= L blocks at the fastest per-block time (docs/search.md).
            const double a = M - 1 - d(n.stages - 1) / q_factor(n);
            if (a > 0) t_iter = std::max(t_iter, d(model_.num_layers) * t_min + a * tau);
            // 1F1B's round trips.
            const Sends sd = node_sends(n, c);
            t_iter = std::max(t_iter, round_trip_bound(c, n.stages,
                                                       d(model_.num_layers) * t_min + head_min,
                                                       boundary_sum(sd.sum, sd.least) - sd.saving));
        }
        return objective(t_iter + sync);
    }

    // Lower bound over completions that add stages of types at order positions >= next.
    // `thr`: the incumbent; when the FLOP/s bound alone is beyond it, the node's completions
    // are cut whatever the rest says, so the costlier time bound is skipped.
    double ext_bound(const Node& n, const Combo& c, double thr = kInf, bool full = true) const {
        const auto p = static_cast<std::size_t>(n.next);
        const std::int64_t cap = depth_cap(c, n.types + 1);
        if (p >= order_.size() || n.stages >= cap || cap <= opt_.covered_depth) return kInf;
        if (n.types >= opt_.max_gpu_types) return kInf;
        if (opt_.prune_memory && n.cap + c.suffix_cap[p] < c.need_bytes) return kInf;
        const double by_rate = type_bound(n, c, p, suffix_min_rate_[p]);
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

    // The node's stages' transfers on the network between instances (each stage's own
    // time; a transfer takes the larger of its two ends'): their sum, the least, and how
    // much in-instance links can take off at most. Two stages of a type share an instance
    // only when both sit whole in it (dp * tp <= its GPUs); the s such stages of a type lie
    // in at least m = ceil(their GPUs / instance) instances, so at most s - m boundaries of
    // the path run inside one, each saving at most that type's network-minus-link time.
    struct Sends {
        double sum = 0, least = kInf, saving = 0;
    };
    Sends node_sends(const Node& n, const Combo& c) const {
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

    // Whether two stages of `type` could share one of its instances in some completion.
    bool can_share(const Combo& c, std::int64_t type) const {
        const auto& ws = widths_[static_cast<std::size_t>(type)];
        return !ws.empty() && c.work.dp * 2 * ws.front() <= gpus_[static_cast<std::size_t>(type)].gpus_per_node;
    }

    // The least time of one activation (or gradient) transfer between pipeline neighbours
    // over a link of at most `bw` GB/s, as the cost model's send_s charges it.
    double send_lb(const Combo& c, double bw) const {
        if (!(bw > 0)) return 0.0;
        // Scatter/gather sends 1/tp of the tensor: at most the widest TP group's share.
        const double msg = p2p_bytes(model_, params_, c.work, opt_.max_tp, opt_.max_tp);
        return (params_.link_latency_s + msg / (bw * kGB * params_.link_efficiency)) *
               (1 - 1e-12);
    }

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

    double sync_bound(const Combo& c, double sum_bw, double sum_hbm) const {
        const double L = d(model_.num_layers);
        double t = 0;
        if (c.k_ar > 0 && sum_bw > 0) t += c.k_ar * L / sum_bw + c.lat_ar;
        if (sum_hbm > 0) t += c.k_opt * L / sum_hbm;
        return t;
    }

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
    double ext_time_bound(const Node& n, const Combo& c, double target = kInf) const {
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
        auto fits = [](double tau, double t, std::int64_t cap) -> std::int64_t {
            if (tau <= 0) return 0;
            return std::min<std::int64_t>(
                cap, static_cast<std::int64_t>(std::min(1e18, std::floor(tau / t * (1 + 1e-12)))));
        };
        // As in the node's own bound, one stage also runs the LM head; which one is free in
        // this relaxation, so the blocks fall by the least loss over every candidate stage.
        auto feasible = [&](double tau, bool head) {
            std::int64_t total = 0, loss = head ? std::numeric_limits<std::int64_t>::max() : 0;
            for (const Group& g : own) {
                const std::int64_t fit = fits(tau, g.t, g.cap);
                if (fit < 1) return false;
                total += fit * g.count;
                if (head) {
                    const std::int64_t fit_h = fits(tau - g.head, g.t, g.cap);
                    if (fit_h >= 1) loss = std::min(loss, fit - fit_h);
                }
            }
            vals.clear();
            for (const Combo::Option* o : ext) {
                std::int64_t v = 0, v_h = 0;
                for (std::size_t wi = 0; wi < o->widths.size(); ++wi) {
                    const auto& [bt, cap] = o->widths[wi];
                    v = std::max(v, fits(tau, bt, cap));
                    if (head) v_h = std::max(v_h, fits(tau - o->head[wi], bt, cap));
                }
                if (v >= 1) vals.emplace_back(v, std::min(o->avail, room));
                if (head && v_h >= 1) loss = std::min(loss, v - v_h);
            }
            if (loss == std::numeric_limits<std::int64_t>::max()) return false;
            total -= loss;
            if (vals.empty()) return false;  // a completion adds a stage, which needs a block
            std::sort(vals.begin(), vals.end(), std::greater<>());
            std::int64_t left = room;
            for (const auto& [v, k] : vals) {
                const std::int64_t take = std::min(left, k);
                total += take * v;
                left -= take;
                if (total >= L || left == 0) break;
            }
            return total >= L;
        };
        if (!feasible(kInf, false)) return kInf;  // the stages' memory cannot hold the blocks
        // The terms that do not depend on the bottleneck tau: round trips and synchronisation.
        double rt = 0;
        if (c.work.schedule == Schedule::OneFOneB && c.work.virtual_stages == 1) {
            // Round trips, for each number of stages a completion can have: the node's stages
            // as node_sends() says, an added stage at best on the fastest later link
            // (in-instance links included: added stages of one type may share instances).
            double link = 0, head_min = kInf;
            const Sends sd = node_sends(n, c);
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
            const double work = d(L) * t_min + (std::isfinite(head_min) ? head_min : 0.0);
            rt = kInf;
            for (std::int64_t r = 1; r <= room; ++r) {
                rt = std::min(rt, round_trip_bound(c, n.stages + r, work,
                                                   boundary_sum(sd.sum + d(r) * send,
                                                                std::min(sd.least, send)) -
                                                       sd.saving));
            }
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
        return iteration(lo);  // lo: below the least feasible tau
    }

    // Lower bound over completions that add stages of the type at order position p and
    // possibly of later types (same shape as ext_bound, from position p).
    // `xmin`: the least rate one added GPU brings.
    double type_bound(const Node& n, const Combo& c, std::size_t p, double xmin) const {
        const double xmax = c.suffix_rate[p];
        if (xmax <= 0 || n.rate + xmax < c.rate_min) return kInf;
        const auto t = static_cast<std::size_t>(order_[p]);
        const double rho = gpus_[t].price_per_hour / rate_[t];
        // The same bound twice: over all FLOPs at peak-times-efficiency rates, and over the
        // blocks' FLOPs at the chosen stages' block rates (which include their TP
        // all-reduces); added GPUs never exceed their raw rate in either.
        auto best_ratio = [&](double rate, double rate_min) {
            if (rate + xmax < rate_min) return kInf;
            const double xlo = std::min(xmax, std::max(xmin, rate_min - rate));
            auto ratio = [&](double x) {
                return rate + x > 0 ? (n.price + rho * x) / (rate + x) : rho;
            };
            return std::min(ratio(xlo > 0 ? xlo : 1e-300), ratio(xmax));
        };
        const double raw = best_ratio(n.rate, c.rate_min);
        const double blocks = best_ratio(n.block_rate, c.block_rate_min);
        if (!std::isfinite(raw) || !std::isfinite(blocks)) return kInf;
        const double usd = std::max(c.c0 * raw, c.c0_blocks * blocks);
        if (opt_.objective == Objective::Cost) return usd;
        if (usd > opt_.budget_usd * (1 + kSlack)) return kInf;
        return std::max(c.t0 / (n.rate + xmax), c.t0_blocks / (n.block_rate + xmax));
    }

    double threshold() const {  // the k-th best objective so far (under the lock)
        const double given = std::min(opt_.incumbent, shared_value());
        if (static_cast<std::int64_t>(best_.size()) < opt_.top_k) return given;
        return std::min(given, best_.back().objective);
    }

    // What searches running beside this one have found (top_k = 1 only).
    double shared_value() const {
        return opt_.shared && opt_.top_k == 1 ? opt_.shared->value.load() : kInf;
    }

    bool beyond(double lb, double thr) const {
        return opt_.prune_cost && lb > thr * (1 + kSlack);
    }

    // ------------------------------------------------------------------ workers
    void push(Node&& n) {
        n.seq = seq_++;
        queue_.push(std::move(n));
        stats_.frontier_peak = std::max(stats_.frontier_peak, static_cast<std::int64_t>(queue_.size()));
    }

    bool out_of_time() const {
        if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) return true;
        return deadline_ != Clock::time_point::max() && Clock::now() >= deadline_;
    }

    // The smallest bound still open (under the lock): the frontier, the nodes being
    // processed, and what incomplete placements left. Shown as progress.
    void report_progress() {
        if (!opt_.monitor) return;
        double lb = open_lb_;
        if (!queue_.empty()) lb = std::min(lb, queue_.top().lb);
        if (!inflight_.empty()) lb = std::min(lb, *inflight_.begin());
        const double best = best_.empty() ? kInf : best_.front().objective;
        publish(best, std::isfinite(lb) ? std::min(lb, best) : best);
    }

    void publish(double best, double lower_bound) const {
        if (!opt_.monitor) return;
        SearchMonitor& m = *opt_.monitor;
        m.best.store(best, std::memory_order_relaxed);
        m.lower_bound.store(lower_bound, std::memory_order_relaxed);
        m.nodes_expanded.store(stats_.nodes_expanded, std::memory_order_relaxed);
        m.leaves_placed.store(stats_.leaves_placed, std::memory_order_relaxed);
    }

    // The bounds of nodes being worked on count in the progress figure; kept only when
    // someone watches (a monitor), off the search's own path otherwise.
    std::multiset<double>::iterator track(double lb) {
        return opt_.monitor ? inflight_.insert(lb) : inflight_.end();
    }
    void untrack(std::multiset<double>::iterator it) {
        if (it != inflight_.end()) inflight_.erase(it);
    }

    // Depth-first branch and bound below `node` (children in bound order), used when the
    // best-first frontier is full: memory stays bounded and the search stays exact.
    void dive(const Node& node, std::unique_lock<std::mutex>& lock) {
        const double thr = std::min(threshold_.load(), shared_value());
        if (beyond(node.lb, thr)) {
            ++stats_.pruned_cost;
            return;
        }
        if (stop_ || out_of_time()) {
            if (!stop_) stats_.timed_out = true;
            stop_ = true;
            open_lb_ = std::min(open_lb_, node.lb);
            return;
        }
        ++stats_.nodes_expanded;
        std::vector<Node> children;
        Local local(deadline_, cancel_);
        const auto mark = track(node.lb);
        report_progress();
        lock.unlock();
        process(node, thr, children, local);
        lock.lock();
        untrack(mark);
        merge(local);
        std::sort(children.begin(), children.end(),
                  [](const Node& a, const Node& b) { return NodeOrder()(b, a); });
        for (const Node& ch : children) dive(ch, lock);
    }

    void worker() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || !queue_.empty() || busy_ == 0; });
            if (stop_ || (queue_.empty() && busy_ == 0)) break;
            if (out_of_time()) {
                stop_ = true;
                stats_.timed_out = true;
                break;
            }
            Node node = queue_.top();
            queue_.pop();
            const double thr = threshold();
            if (thr < threshold_.load()) threshold_.store(thr);  // another search's plan
            if (beyond(node.lb, thr)) {
                ++stats_.pruned_cost;
                continue;
            }
            if (!node.full) {
                // Tighten the bound now; if it rose, the node goes back to the frontier.
                ++busy_;
                const auto mark = track(node.lb);
                lock.unlock();
                const Combo& c = combos_[static_cast<std::size_t>(node.combo)];
                node.ext_lb = ext_bound(node, c, thr, true);
                node.full = true;
                const double lb = std::min(node.own, node.ext_lb);
                lock.lock();
                untrack(mark);
                --busy_;
                if (!std::isfinite(lb)) {
                    ++stats_.pruned_deadline;  // no completion can meet the deadline or budget
                    cv_.notify_all();
                    continue;
                }
                if (lb > node.lb * (1 + 1e-9)) {
                    node.lb = lb;
                    if (beyond(node.lb, threshold())) ++stats_.pruned_cost;
                    else push(std::move(node));
                    cv_.notify_all();
                    continue;
                }
                node.lb = std::max(node.lb, lb);
            }
            if (static_cast<std::int64_t>(queue_.size()) >= opt_.max_frontier) {
                // Frontier full: finish this subtree depth-first instead of growing it.
                ++busy_;
                ++stats_.dives;
                dive(node, lock);
                --busy_;
                cv_.notify_all();
                continue;
            }
            ++busy_;
            ++stats_.nodes_expanded;
            const auto mark = track(node.lb);
            report_progress();
            lock.unlock();
            std::vector<Node> children;
            Local local(deadline_, cancel_);
            process(node, thr, children, local);
            lock.lock();
            untrack(mark);
            merge(local);
            for (Node& ch : children) {
                if (beyond(ch.lb, threshold())) {
                    ++stats_.pruned_cost;
                    continue;
                }
                push(std::move(ch));
            }
            --busy_;
            cv_.notify_all();
        }
        cv_.notify_all();
    }

    struct Local {
        Local(Clock::time_point deadline, const std::atomic<bool>* cancel) : sw(deadline, cancel) {}
        SearchStats s;
        std::vector<SearchPlan> plans;
        double open_lb = kInf;
        bool incomplete = false;
        Stopwatch sw;  // this thread's view of the limit
    };

    void merge(const Local& l) {
        stats_.nodes_generated += l.s.nodes_generated;
        stats_.pruned_cost += l.s.pruned_cost;
        stats_.pruned_deadline += l.s.pruned_deadline;
        stats_.pruned_memory += l.s.pruned_memory;
        stats_.pruned_availability += l.s.pruned_availability;
        stats_.pruned_dominance += l.s.pruned_dominance;
        stats_.leaves_placed += l.s.leaves_placed;
        stats_.placer_nodes += l.s.placer_nodes;
        stats_.placer_leaves += l.s.placer_leaves;
        open_lb_ = std::min(open_lb_, l.open_lb);
        if (l.incomplete) stats_.complete = false;
        if (!stop_ && out_of_time()) {
            stop_ = true;
            stats_.timed_out = true;
        }
        for (const SearchPlan& p : l.plans) offer(p);
        report_progress();
    }

    void offer(const SearchPlan& p) {
        const PlanKey k = key_of(p);
        auto pos = std::find_if(best_.begin(), best_.end(),
                                [&](const SearchPlan& q) { return k < key_of(q); });
        best_.insert(pos, p);
        if (static_cast<std::int64_t>(best_.size()) > opt_.top_k) best_.pop_back();
        threshold_.store(threshold());
        if (opt_.shared && opt_.share_plans && opt_.top_k == 1) {
            opt_.shared->offer(best_.front().objective);
        }
    }

    // ------------------------------------------------------------------ one node
    void process(const Node& node, double thr, std::vector<Node>& children, Local& local) {
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
                    place_allocation(node, c, thr, local);
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
            // Adding a type at position p (and perhaps later ones, all with a price per
            // FLOP/s at least this type's) costs at least this; the bound only grows with p.
            if (beyond(type_bound(node, c, p, rate_[static_cast<std::size_t>(order_[p])]), thr)) {
                local.s.pruned_cost += static_cast<std::int64_t>(order_.size() - p);
                break;
            }
            const std::int64_t t = order_[p];
            const GpuSpec& g = gpus_[static_cast<std::size_t>(t)];
            const std::vector<std::int64_t>& ws = widths_[static_cast<std::size_t>(t)];
            const std::int64_t per_replica = g.count / c.work.dp;
            std::vector<std::int64_t> counts(ws.size(), 0);
            enumerate(node, c, p, ws, per_replica, room, 0, 0, 0, counts, thr, children, local);
        }
    }

    // Every option (stages per TP width) of the type at order position p.
    void enumerate(const Node& node, const Combo& c, std::size_t p,
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

    void make_child(const Node& node, const Combo& c, std::size_t p,
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
        for (std::size_t wi = 0; wi < ws.size(); ++wi) {
            if (counts[wi] > 0) ch.block_rate += d(counts[wi]) * c.block_flops / c.block_s[st][wi];
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

    void place_allocation(const Node& node, const Combo& c, double thr, Local& local) {
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
        po.incumbent = &threshold_;
        po.incumbent_scale = opt_.objective == Objective::Cost
                                 ? (hourly > 0 ? 3600.0 / (hourly * iters) : kInf)
                                 : 3600.0 / iters;
        po.floor = node.own;
        po.deadline = deadline_;
        po.cancel = cancel_;
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
            local.open_lb = std::min(local.open_lb, std::max(lb_obj, node.own));
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

    const ModelDims& model_;
    const std::vector<GpuSpec>& gpus_;
    const CostParams& params_;
    const Workload& job_;
    const SearchOptions& opt_;
    std::vector<double> rate_, cap_, suffix_min_rate_, suffix_min_price_;
    double checkpoint_h_ = 0;   // hours to write one checkpoint (spot plans)
    double restart_min_h_ = 0;  // the least restart of any spot row (its recovery, the restart, the read)
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
    bool time_only_ = false;       // time objective without a budget: prices play no part
    double bwd_fwd_ratio_ = 1.0;   // least profile backward/forward ratio (1: analytic)
    double min_act_scale_ = 1.0;   // least profile activation factor, at most 1
    std::vector<std::vector<std::int64_t>> widths_, dominators_;
    std::vector<std::int64_t> order_;
    std::vector<Combo> combos_;
    std::priority_queue<Node, std::vector<Node>, NodeOrder> queue_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::int64_t busy_ = 0, seq_ = 0;
    bool stop_ = false;
    double open_lb_ = kInf;
    std::atomic<double> threshold_{kInf};  // set from opt_.incumbent in run()
    std::vector<SearchPlan> best_;
    SearchStats stats_;
    Clock::time_point deadline_ = Clock::time_point::max();
    const std::atomic<bool>* cancel_ = nullptr;
    std::multiset<double> inflight_;  // bounds of the nodes being processed
};

void check_options(const SearchOptions& o) {
    if (o.micro_batch_sizes.empty()) throw std::invalid_argument("micro_batch_sizes must not be empty");
    for (const std::int64_t b : o.micro_batch_sizes) {
        if (b < 1 || b > (1 << 24)) throw std::invalid_argument("micro_batch_sizes: each must be in [1, 2^24]");
    }
    if (o.recompute.empty()) throw std::invalid_argument("recompute options must not be empty");
    for (const Recompute r : o.recompute) {
        if (r != Recompute::None && r != Recompute::Full && r != Recompute::Selective) {
            throw std::invalid_argument("recompute options must be none, full or selective");
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
    if (o.max_gpu_types < 1) throw std::invalid_argument("max_gpu_types must be >= 1");
    if (o.placer.node_limit < 1 || o.placer.memo_limit < 0) {
        throw std::invalid_argument("placer limits must be positive");
    }
}

}  // namespace

SearchResult search(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                    const CostParams& params, const Workload& job, const SearchOptions& options) {
    validate(model);
    validate(params);
    for (std::size_t g = 0; g < gpus.size(); ++g) validate(gpus[g], g);
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
    const bool seed = options.max_gpu_types > 2 && gpus.size() > 2;
    if (deepest <= shallow && !seed) {
        Search s(model, gpus, params, job, options);
        return s.run();
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto left = [&](double share) {  // seconds for a pass: `share` of the limit, within what is left
        if (options.time_limit_s <= 0) return 0.0;
        const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    auto add = [&](const SearchStats& f) {
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
        SearchResult r = Search(model, gpus, params, job, o).run();
        add(r.stats);
        merge(std::move(r.plans));
    }
    {
        SearchOptions o = options;
        o.max_stages = shallow;
        o.max_stages_by_types.clear();
        o.incumbent = incumbent(options.incumbent);
        if (options.time_limit_s > 0) o.time_limit_s = left(deepest > shallow ? 0.75 : 1.0);
        SearchResult r = Search(model, gpus, params, job, o).run();
        add(r.stats);
        complete = complete && r.stats.complete;
        lower = std::min(lower, r.stats.lower_bound);
        merge(std::move(r.plans));
    }
    if (deepest > shallow) {
        SearchOptions o = options;
        o.covered_depth = shallow;
        o.incumbent = incumbent(options.incumbent);
        if (options.time_limit_s > 0) o.time_limit_s = left(1.0);
        SearchResult r = Search(model, gpus, params, job, o).run();
        add(r.stats);
        complete = complete && r.stats.complete;
        lower = std::min(lower, r.stats.lower_bound);
        merge(std::move(r.plans));
    }
    SearchResult out;
    out.plans = std::move(plans);
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.complete = complete;
    const double best = out.plans.empty() ? kInf : out.plans.front().objective;
    st.lower_bound = complete ? best : std::min(best, lower);
    out.stats = st;
    return out;
}

}  // namespace espresso
