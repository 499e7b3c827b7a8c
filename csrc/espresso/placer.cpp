#include "espresso/placer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "espresso/pipeline_sim.hpp"

namespace espresso {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Bounds and simulations sum in different orders; a bound may exceed the simulated value
// of the same placement by a few ulps. Prune only beyond this relative slack.
constexpr double kSlack = 1e-9;

// Smallest possible maxima over the remaining stages of the second bound's stage term, the
// DP all-reduce and the optimizer step (each minimised on its own: a valid lower bound).
struct Neck {
    double g, ar, opt;
};

struct Candidate {
    double bound;
    std::int64_t rank;  // the group's place in compute-memory order
    std::int64_t group;
    std::int64_t layers;
    double pre, lb, ar, opt, g;
    double x;  // where the stage's first forward can start (see round_trip)
};

class Placer {
public:
    Placer(const ModelDims& model, const std::vector<GpuSpec>& gpus, const CostParams& params,
           const Workload& work, const std::vector<StageGroup>& groups, const PlaceOptions& opt)
        : model_(model), gpus_(gpus), params_(params), work_(work), opt_(opt),
          sw_(std::min(opt.deadline, Stopwatch::after(opt.time_limit_s)), opt.halt) {
        P_ = static_cast<std::int64_t>(groups.size());
        L_ = model.num_layers;
        M_ = work.num_microbatches;
        // Distinct groups and their multiplicities, in a canonical order.
        for (const StageGroup& g : groups) {
            auto it = std::find_if(distinct_.begin(), distinct_.end(), [&](const StageGroup& x) {
                return x.gpu == g.gpu && x.tp == g.tp;
            });
            if (it == distinct_.end()) {
                distinct_.push_back(g);
                count_.push_back(1);
            } else {
                ++count_[static_cast<std::size_t>(it - distinct_.begin())];
            }
        }
        k_ = static_cast<std::int64_t>(distinct_.size());
        // Interleaved 1F1B: each group runs V_ stages of near-equal blocks, so it holds at
        // least V_ blocks (docs/search.md, "Interleaving").
        V_ = std::max<std::int64_t>(1, work.virtual_stages);
        minl_ = V_;
        span_ = L_ - (P_ - 1) * minl_;
    }

    Placement run() {
        Placement out;
        if (P_ < 1 || P_ * minl_ > L_ || (V_ > 1 && (P_ < 2 || M_ % P_ != 0))) {
            out.lower_bound_s = kInf;  // no plan: too few blocks, or not interleavable
            return out;
        }
        if (static_cast<double>(k_) * static_cast<double>(P_) * static_cast<double>(span_ + 1) >
            static_cast<double>(opt_.table_limit)) {
            out.exhaustive = false;  // too large to place exactly within bounded memory
            return out;
        }
        try {
            search(out);
        } catch (const TimeUp&) {
            out.exhaustive = false;
            out.timed_out = true;
        }
        out.nodes = nodes_;
        out.leaves = leaves_;
        if (best_iter_ < kInf) {
            out.found = true;
            out.iteration_s = best_iter_;
            out.stages.clear();
            out.stages = expand(best_group_, best_layers_);
        }
        return out;
    }

private:
    void search(Placement& out) {
        build_tables();
        build_ranks();
        // Memo of the completion bounds over (remaining multiset, first layer).
        std::int64_t states = 1;
        stride_.assign(static_cast<std::size_t>(k_), 0);
        for (std::int64_t j = 0; j < k_; ++j) {
            stride_[static_cast<std::size_t>(j)] = states;
            states *= count_[static_cast<std::size_t>(j)] + 1;
            if (states > opt_.memo_limit) break;
        }
        // The completion bounds are memoised over (remaining multiset, first block) only: the
        // transfer into each remaining stage is taken at its least over every possible
        // predecessor, which keeps them lower bounds and the tables k+1 times smaller.
        const double memo_cells = static_cast<double>(states) * static_cast<double>(L_ + 1);
        use_memo_ = memo_cells <= static_cast<double>(opt_.memo_limit);
        if (use_memo_) {
            memo_.assign(static_cast<std::size_t>(memo_cells), -1.0);
            memo_sum_.assign(static_cast<std::size_t>(memo_cells), -1.0);
            memo_neck_.assign(static_cast<std::size_t>(states * (L_ + 1)), Neck{-1.0, -1.0, -1.0});
        }

        remaining_ = count_;
        std::int64_t idx = 0;
        for (std::int64_t j = 0; j < k_; ++j) idx += count_[static_cast<std::size_t>(j)] * stride_[static_cast<std::size_t>(j)];
        root_index_ = idx;
        if (use_memo_) {
            // The fill-and-bottleneck bound first: alone it often shows that nothing here
            // beats the cutoff, and the other two tables are then not needed.
            const double first = bound_rest(P_, 0, k_, root_index_);
            if (prune(first)) {
                out.lower_bound_s = first;
                return;
            }
            const Neck nk = neck_rest(P_, 0, root_index_);
            const double sum = sum_rest(P_, 0, k_, root_index_);
            out.lower_bound_s = std::max({first, sum + nk.g, rt_factor(0) * sum}) + nk.ar +
                                nk.opt;
        } else {
            out.lower_bound_s = 0.0;
        }
        if (!std::isfinite(out.lower_bound_s)) {
            return;  // no split fits in memory
        }
        seq_x_.assign(static_cast<std::size_t>(P_), 0.0);
        seq_cell_.assign(static_cast<std::size_t>(P_), 0);
        drain_ = V_ == 1 && schedule_as_run(work_.schedule, P_, M_) == Schedule::OneFOneB;
        seq_group_.assign(static_cast<std::size_t>(P_), 0);
        seq_layers_.assign(static_cast<std::size_t>(P_), 0);
        dfs(0, 0, k_, 0.0, 0.0, 0.0, 0.0, 0.0, root_index_);
        out.exhaustive = exhaustive_;
        out.timed_out = timed_out_;
    }

    std::size_t cell(std::int64_t j, std::int64_t pos, std::int64_t n) const {
        return static_cast<std::size_t>((j * P_ + pos) * (span_ + 1) + n);
    }

    // The stages of a placement (group and blocks of each GPU group, in pipeline order): one
    // per group, or under interleaving V_ per group in model order, stage c * P + i holding
    // chunk c of group i (chunk_blocks()).
    std::vector<StageSpec> expand(const std::vector<std::int64_t>& group,
                                  const std::vector<std::int64_t>& layers) const {
        std::vector<StageSpec> out;
        std::int64_t begin = 0;
        for (std::int64_t c = 0; c < V_; ++c) {
            for (std::int64_t i = 0; i < P_; ++i) {
                const auto si = static_cast<std::size_t>(i);
                const StageGroup& g = distinct_[static_cast<std::size_t>(group[si])];
                const std::int64_t n = chunk_blocks(layers[si], V_)[static_cast<std::size_t>(c)];
                out.push_back({g.gpu, g.tp, begin, begin + n});
                begin += n;
            }
        }
        return out;
    }

    // Blocks of the most blocks' worth of one micro-batch group `pos` holds under
    // interleaving with n blocks in its chunks (memoised: it walks the group's operations).
    std::int64_t peak_blocks(std::int64_t pos, std::int64_t n) {
        const auto key = static_cast<std::size_t>(pos * (L_ + 1) + n);
        if (peak_memo_[key] < 0) {
            peak_memo_[key] = interleaved_peak_blocks(chunk_blocks(n, V_), P_, pos, M_);
        }
        return peak_memo_[key];
    }

    // One cell of the interleaved tables: group j at position pos with n blocks in V_ chunks,
    // each timed and sized by stage_cost() as estimate() does, the memory by device_memory().
    void interleaved_cell(std::int64_t j, std::int64_t pos, std::int64_t n, std::size_t c) {
        const StageGroup& g = distinct_[static_cast<std::size_t>(j)];
        const GpuSpec& spec = gpus_[static_cast<std::size_t>(g.gpu)];
        const std::vector<std::int64_t> sizes = chunk_blocks(n, V_);
        std::vector<StageEstimate> chunks;
        double f = 0, b = 0;
        for (std::int64_t k = 0; k < V_; ++k) {
            chunks.push_back(stage_cost(model_, spec, params_, work_, g.tp,
                                        sizes[static_cast<std::size_t>(k)], k * P_ + pos, P_ * V_));
            f += chunks.back().fwd_s;
            b += chunks.back().bwd_s;
        }
        const DeviceMemory mem = device_memory(chunks, block_stash(model_, spec, params_, work_, g.tp),
                                               peak_blocks(pos, n));
        if (mem.total > chunks.front().capacity_bytes) return;
        f_[c] = f;
        b_[c] = b;
        first_[c] = chunks.front().fwd_s + chunks.front().bwd_s;
        g_[c] = 0.0;  // the second bound is 1F1B's, not interleaving's
        ar_[c] = mem.dp_allreduce_s;
        opt_step_[c] = mem.optimizer_step_s;
        ok_[c] = 1;
    }

    void build_tables() {
        const std::size_t size = static_cast<std::size_t>(k_ * P_ * (span_ + 1));
        f_.assign(size, kInf);
        b_.assign(size, kInf);
        first_.assign(size, kInf);
        if (V_ > 1) peak_memo_.assign(static_cast<std::size_t>(P_ * (L_ + 1)), -1);
        ar_.assign(size, kInf);
        g_.assign(size, kInf);
        opt_step_.assign(size, kInf);
        ok_.assign(size, 0);
        for (std::int64_t j = 0; j < k_; ++j) {
            const StageGroup& g = distinct_[static_cast<std::size_t>(j)];
            const GpuSpec& spec = gpus_[static_cast<std::size_t>(g.gpu)];
            for (std::int64_t pos = 0; pos < P_; ++pos) {
                if (sw_.expired(1)) throw TimeUp{};
                for (std::int64_t n = minl_; n <= span_; ++n) {
                    if (V_ > 1) {
                        const std::size_t c = cell(j, pos, n);
                        interleaved_cell(j, pos, n, c);
                        if (!ok_[c]) break;  // memory grows with n
                        continue;
                    }
                    const StageEstimate e = stage_cost(model_, spec, params_, work_, g.tp, n, pos, P_);
                    if (e.memory_bytes > e.capacity_bytes) break;  // memory grows with n
                    const std::size_t c = cell(j, pos, n);
                    f_[c] = e.fwd_s;
                    b_[c] = e.bwd_s;
                    first_[c] = e.fwd_s + e.bwd_s;
                    // Stage-local term of the second bound: (M-1) w - (nf-1) f, nf being the
                    // forwards the stage may run before its first backward.
                    const std::int64_t nf =
                        schedule_as_run(work_.schedule, P_, M_) == Schedule::GPipe
                            ? M_
                            : std::min(P_ - pos, M_);
                    g_[c] = static_cast<double>(M_ - 1) * (e.fwd_s + e.bwd_s) -
                            static_cast<double>(nf - 1) * e.fwd_s;
                    ar_[c] = e.dp_allreduce_s;
                    opt_step_[c] = e.optimizer_step_s;
                    ok_[c] = 1;
                }
            }
        }
        // The least work per block of any stage, from every cell that fits: w(n) / n and
        // w(n + 1) - w(n); then a stage of n blocks works at least n times it (w(1) >= it and
        // each block adds at least it), so k blocks left take at least k times it.
        per_block_ = kInf;
        for (std::int64_t j = 0; j < k_; ++j) {
            for (std::int64_t pos = 0; pos < P_; ++pos) {
                for (std::int64_t n = minl_; n <= span_; ++n) {
                    const std::size_t c = cell(j, pos, n);
                    if (!ok_[c]) break;
                    const double w = f_[c] + b_[c];
                    per_block_ = std::min(per_block_, w / static_cast<double>(n));
                    if (n < span_ && ok_[c + 1]) per_block_ = std::min(per_block_, f_[c + 1] + b_[c + 1] - w);
                }
            }
        }
        if (!(per_block_ > 0) || !std::isfinite(per_block_)) per_block_ = 0.0;
        // Transfers between groups: over the network, or (neighbours of one type) possibly
        // inside an instance, which the layout of the whole sequence decides. The bounds take
        // the least; leaves compute the exact ones (leaf()).
        send_.assign(static_cast<std::size_t>(k_ * k_), 0.0);
        inter_.assign(static_cast<std::size_t>(k_ * k_), 0.0);
        intra_.assign(static_cast<std::size_t>(k_ * k_), 0.0);
        share_.assign(static_cast<std::size_t>(k_ * k_), 0);
        min_in_.assign(static_cast<std::size_t>(k_), kInf);
        for (std::int64_t a = 0; a < k_; ++a) {
            for (std::int64_t c = 0; c < k_; ++c) {
                const auto ac = static_cast<std::size_t>(a * k_ + c);
                const GpuSpec& ga = gpus_[static_cast<std::size_t>(distinct_[static_cast<std::size_t>(a)].gpu)];
                const GpuSpec& gc = gpus_[static_cast<std::size_t>(distinct_[static_cast<std::size_t>(c)].gpu)];
                const double bytes = p2p_bytes(model_, params_, work_,
                                               distinct_[static_cast<std::size_t>(a)].tp,
                                               distinct_[static_cast<std::size_t>(c)].tp);
                inter_[ac] = send_s(ga, gc, false, bytes, params_);
                intra_[ac] = send_s(ga, gc, true, bytes, params_);
                // One instance holds both only when each stage sits whole in it.
                const StageGroup& sa = distinct_[static_cast<std::size_t>(a)];
                const StageGroup& sc = distinct_[static_cast<std::size_t>(c)];
                const bool same = sa.gpu == sc.gpu && work_.dp * (sa.tp + sc.tp) <= ga.gpus_per_node;
                share_[ac] = same ? 1 : 0;
                send_[ac] = same ? std::min(inter_[ac], intra_[ac]) : inter_[ac];
                min_in_[static_cast<std::size_t>(c)] = std::min(min_in_[static_cast<std::size_t>(c)], send_[ac]);
            }
        }
    }

    // Memory-rich groups (low compute per byte) first: early 1F1B stages hold more
    // micro-batches in flight.
    void build_ranks() {
        std::vector<std::int64_t> order(static_cast<std::size_t>(k_));
        for (std::int64_t j = 0; j < k_; ++j) order[static_cast<std::size_t>(j)] = j;
        auto ratio = [&](std::int64_t j) {
            const StageGroup& g = distinct_[static_cast<std::size_t>(j)];
            const GpuSpec& s = gpus_[static_cast<std::size_t>(g.gpu)];
            const double eff = gemm_efficiency(s, params_);
            return s.tflops * eff / (s.block_fwd_scale + 2 * s.block_bwd_scale) / s.memory_gb;
        };
        std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t c) {
            return opt_.ratio_order ? ratio(a) < ratio(c) : a < c;
        });
        rank_.assign(static_cast<std::size_t>(k_), 0);
        for (std::int64_t r = 0; r < k_; ++r) rank_[static_cast<std::size_t>(order[static_cast<std::size_t>(r)])] = r;
    }

    double send(std::int64_t from, std::int64_t to) const {
        if (from >= k_) return 0.0;  // no previous stage
        return send_[static_cast<std::size_t>(from * k_ + to)];
    }

    // The least transfer into a stage of group `to` from any group (0 for the first stage).
    double send_in(std::int64_t from, std::int64_t to) const {
        if (from >= k_) return 0.0;
        return min_in_[static_cast<std::size_t>(to)];
    }

    // Lower bound on max_k [prefix_k + M w_k] over the stages from `pos` on, measured from the
    // end of stage pos-1, with the multiset `idx` of groups left to place. `prev` (k_: none)
    // only tells whether a transfer comes in: its least over every predecessor is charged.
    double bound_rest(std::int64_t left, std::int64_t l, std::int64_t prev, std::int64_t idx) {
        const std::size_t key = static_cast<std::size_t>(idx * (L_ + 1) + l);
        if (memo_[key] >= 0) return memo_[key];
        if (sw_.expired()) throw TimeUp{};
        const std::int64_t pos = P_ - left;
        double best = kInf;
        for (std::int64_t j = 0; j < k_; ++j) {
            const auto sj = static_cast<std::size_t>(j);
            if (remaining_[sj] == 0) continue;
            const double c2 = 2.0 * send_in(prev, j);
            --remaining_[sj];
            const std::int64_t rest_idx = idx - stride_[sj];
            if (left == 1) {
                const std::int64_t n = L_ - l;
                if (n >= minl_ && n <= span_ && ok_[cell(j, pos, n)]) {
                    const std::size_t c = cell(j, pos, n);
                    best = std::min(best, c2 + static_cast<double>(M_) * (f_[c] + b_[c]));
                }
            } else {
                for (std::int64_t n = minl_; n <= span_ && l + n <= L_ - (left - 1) * minl_; ++n) {
                    const std::size_t c = cell(j, pos, n);
                    if (!ok_[c]) break;
                    const double w = f_[c] + b_[c];
                    if (c2 + static_cast<double>(M_) * w >= best) break;  // grows with n
                    const double tail = bound_rest(left - 1, l + n, j, rest_idx);
                    if (!std::isfinite(tail)) continue;
                    // Later groups wait for this one's first stage (all of it unless interleaved).
                    best = std::min(best, c2 + std::max(static_cast<double>(M_) * w, first_[c] + tail));
                }
            }
            ++remaining_[sj];
        }
        memo_[key] = best;
        return best;
    }

    // Smallest sum over the remaining stages of (w + 2 c), c the transfer into each.
    double sum_rest(std::int64_t left, std::int64_t l, std::int64_t prev, std::int64_t idx) {
        const std::size_t key = static_cast<std::size_t>(idx * (L_ + 1) + l);
        if (memo_sum_[key] >= 0) return memo_sum_[key];
        if (sw_.expired()) throw TimeUp{};
        const std::int64_t pos = P_ - left;
        double best = kInf;
        for (std::int64_t j = 0; j < k_; ++j) {
            const auto sj = static_cast<std::size_t>(j);
            if (remaining_[sj] == 0) continue;
            const double c2 = 2.0 * send_in(prev, j);
            --remaining_[sj];
            if (left == 1) {
                const std::int64_t n = L_ - l;
                if (n >= minl_ && n <= span_ && ok_[cell(j, pos, n)]) {
                    const std::size_t c = cell(j, pos, n);
                    best = std::min(best, c2 + f_[c] + b_[c]);
                }
            } else {
                for (std::int64_t n = minl_; n <= span_ && l + n <= L_ - (left - 1) * minl_; ++n) {
                    const std::size_t c = cell(j, pos, n);
                    if (!ok_[c]) break;
                    // The rest works at least per_block_ a block, and this stage gains at
                    // least that much a block: no larger n does better once this reaches best.
                    if (c2 + f_[c] + b_[c] + static_cast<double>(L_ - l - n) * per_block_ >= best) break;
                    const double tail = sum_rest(left - 1, l + n, j, idx - stride_[sj]);
                    if (std::isfinite(tail)) best = std::min(best, c2 + f_[c] + b_[c] + tail);
                }
            }
            ++remaining_[sj];
        }
        memo_sum_[key] = best;
        return best;
    }

    Neck neck_rest(std::int64_t left, std::int64_t l, std::int64_t idx) {
        const std::size_t key = static_cast<std::size_t>(idx * (L_ + 1) + l);
        if (memo_neck_[key].g >= 0) return memo_neck_[key];
        if (sw_.expired()) throw TimeUp{};
        const std::int64_t pos = P_ - left;
        Neck best{kInf, kInf, kInf};
        for (std::int64_t j = 0; j < k_; ++j) {
            const auto sj = static_cast<std::size_t>(j);
            if (remaining_[sj] == 0) continue;
            --remaining_[sj];
            const std::int64_t lo = left == 1 ? L_ - l : minl_;
            const std::int64_t hi = left == 1 ? L_ - l : std::min(span_, L_ - l - (left - 1) * minl_);
            for (std::int64_t n = std::max<std::int64_t>(lo, minl_); n <= hi && n <= span_; ++n) {
                const std::size_t c = cell(j, pos, n);
                if (!ok_[c]) break;
                // The three terms grow with n (more blocks: more work, gradients, states):
                // once this stage alone reaches every best so far, larger n cannot help.
                if (g_[c] >= best.g && ar_[c] >= best.ar && opt_step_[c] >= best.opt) break;
                Neck rest{0.0, 0.0, 0.0};
                if (left > 1) {
                    rest = neck_rest(left - 1, l + n, idx - stride_[sj]);
                    if (!std::isfinite(rest.g)) continue;
                }
                best.g = std::min(best.g, std::max(g_[c], rest.g));
                best.ar = std::min(best.ar, std::max(ar_[c], rest.ar));
                best.opt = std::min(best.opt, std::max(opt_step_[c], rest.opt));
            }
            ++remaining_[sj];
        }
        memo_neck_[key] = best;
        return best;
    }

    Neck tail_neck(std::int64_t left, std::int64_t l, std::int64_t idx) {
        if (left == 0 || !use_memo_) return Neck{0.0, 0.0, 0.0};
        return neck_rest(left, l, idx);
    }

    double tail_bound(std::int64_t left, std::int64_t l, std::int64_t prev, std::int64_t idx) {
        if (left == 0) return 0.0;
        return use_memo_ ? bound_rest(left, l, prev, idx) : 0.0;
    }

    double tail_sum(std::int64_t left, std::int64_t l, std::int64_t prev, std::int64_t idx) {
        if (left == 0) return 0.0;
        return use_memo_ ? sum_rest(left, l, prev, idx) : 0.0;
    }

    // 1F1B's round trips. Stage s holds nf_s = min(P - s, M) micro-batches: its forward of
    // micro-batch m + nf_s follows its backward of m, which ends at least R_s after that
    // micro-batch's forward began there, R_s = the work and transfers of stages s.. and back.
    // So stage s starts ceil(M / nf_s) rounds of R_s one after another, the first no earlier
    // than x_s (the work and transfers into s), and the last one's gradient still has to
    // return through the stages before s: T >= x_s + ceil(M / nf_s) (S - x_s), S the sum of
    // (w + 2c) over all stages (x_s + R_s = S). Pipelines bound by slow links hit this one.
    double rt_factor(std::int64_t s) const {
        if (work_.schedule != Schedule::OneFOneB || V_ > 1) return 1.0;
        const std::int64_t nf = std::min(P_ - s, M_);
        return static_cast<double>((M_ + nf - 1) / nf);
    }

    // The largest round-trip bound over the stages placed so far (0..pos), S >= `sum`, and
    // (plain 1F1B) the warm-up/cool-down bound below, in one pass over them.
    double round_trip(std::int64_t pos, double sum) const {
        double best = 0.0;
        for (std::int64_t s = 0; s <= pos; ++s) {
            const double x = seq_x_[static_cast<std::size_t>(s)];
            best = std::max(best, x + rt_factor(s) * (sum - x));
            if (drain_) best = std::max(best, drain(s, sum) * (1 - 1e-12));
        }
        return best;
    }

    // 1F1B's warm-up and cool-down idle (a stronger form of the second bound). Stage s
    // runs nf_s = min(P - s, M) forwards before its first backward, which waits for the
    // round trip D_s through the later stages (their work and transfers, both ways); in
    // the cool-down its last backward waits for D_s after its last forward, with nf_s - 1
    // backwards to fill that wait. So it idles at least max(0, D_s - (nf_s - 1) f_s) and,
    // in a second window when M > nf_s (else the two overlap and the larger counts),
    // max(0, D_s - (nf_s - 1) b_s):
    //   T >= x_s + M w_s + idle_s, x_s the fill and return through the stages before s.
    // D_s >= S - x_s - w_s, S >= `sum`. Exact for equal stages ((M + P - 1) w); checked
    // against the simulation in tests/test_pipeline_sim.py.
    double drain(std::int64_t s, double sum) const {
        const std::size_t c = seq_cell_[static_cast<std::size_t>(s)];
        const double x = seq_x_[static_cast<std::size_t>(s)], f = f_[c], b = b_[c];
        const double D = sum - x - f - b;
        const std::int64_t nf = std::min(P_ - s, M_);
        const double iw = std::max(0.0, D - static_cast<double>(nf - 1) * f);
        const double ic = std::max(0.0, D - static_cast<double>(nf - 1) * b);
        const double idle = M_ > nf ? iw + ic : std::max(iw, ic);
        return x + static_cast<double>(M_) * (f + b) + idle;
    }

    // 1F1B's steady state: for stages s..t (t = pos, the stage just placed), the operations
    // B_t(a) -> B_s(a) -> F_s(a + nf_s) -> F_t(a + nf_s) -> B_t(a + t - s + 1) form a cycle
    // of length L = (X_t + w_t) - X_s (the window's work and the transfers inside it, both
    // ways; X the fill before each stage), advancing t - s + 1 micro-batches, as long as
    // a + nf_s <= M - 1. A chain of n = floor((M - 1 - nf_s) / (t - s + 1)) + 1 such cycles
    // from B_t(0) (which starts after X_t's forward half and f_t), then b_t and the return:
    //   T >= X_t + w_t + n L.
    // The simulation's steady period is the largest window mean L / (t - s + 1) (checked in
    // tests/test_pipeline_sim.py, with the chain bound itself).
    double chain(std::int64_t pos) const {
        if (!drain_) return 0.0;
        const auto st = static_cast<std::size_t>(pos);
        const double end = seq_x_[st] + f_[seq_cell_[st]] + b_[seq_cell_[st]];
        double best = 0.0;
        for (std::int64_t s = 0; s <= pos; ++s) {
            const std::int64_t nf = std::min(P_ - s, M_);
            if (M_ - 1 < nf) continue;
            const std::int64_t k = pos - s + 1;
            const double L = end - seq_x_[static_cast<std::size_t>(s)];
            const auto n = static_cast<double>((M_ - 1 - nf) / k + 1);
            best = std::max(best, end + n * L);
        }
        return best * (1 - 1e-12);
    }

    double cutoff() const {
        if (opt_.incumbent == nullptr) return opt_.cutoff_s;
        const double inc = opt_.incumbent->load(std::memory_order_relaxed) * opt_.incumbent_scale;
        return std::isnan(inc) ? opt_.cutoff_s : std::min(opt_.cutoff_s, inc);
    }

    bool prune(double bound) const {
        return bound > cutoff() * (1.0 + kSlack) || bound >= best_iter_ * (1.0 + kSlack);
    }

    void dfs(std::int64_t pos, std::int64_t l, std::int64_t prev, double pre, double lbmax,
             double armax, double optmax, double gmax, std::int64_t idx) {
        if (nodes_ >= opt_.node_limit) {
            exhaustive_ = false;
            return;
        }
        if (sw_.expired(64)) {
            exhaustive_ = false;
            timed_out_ = true;
            return;
        }
        ++nodes_;
        if (opt_.incumbent != nullptr &&
            opt_.floor > opt_.incumbent->load(std::memory_order_relaxed) * (1.0 + kSlack)) {
            return;  // another thread's plan beats every placement of this allocation
        }
        const std::int64_t left = P_ - pos;
        std::vector<Candidate> cands;
        std::int64_t first_left = -1;  // the remaining group first in compute-memory order
        for (std::int64_t j = 0; j < k_; ++j) {
            const auto sj = static_cast<std::size_t>(j);
            if (remaining_[sj] > 0 && (first_left < 0 || rank_[sj] < rank_[static_cast<std::size_t>(first_left)])) {
                first_left = j;
            }
        }
        for (std::int64_t j = 0; j < k_; ++j) {
            const auto sj = static_cast<std::size_t>(j);
            if (remaining_[sj] == 0) continue;
            if (opt_.fixed_order && j != first_left) continue;
            const double c2 = 2.0 * send(prev, j);
            std::int64_t lo = left == 1 ? L_ - l : minl_;
            std::int64_t hi = left == 1 ? L_ - l : std::min(span_, L_ - l - (left - 1) * minl_);
            if (opt_.even_split) {
                const std::int64_t share = L_ / P_ + (pos < L_ % P_ ? 1 : 0);
                lo = std::max(lo, share);
                hi = std::min(hi, share);
                if (lo > hi) continue;
            }
            if (opt_.middle_layers > 0 && pos > 0 && pos < P_ - 1) {
                lo = std::max(lo, opt_.middle_layers);
                hi = std::min(hi, opt_.middle_layers);
                if (lo > hi) continue;
            }
            if (lo < minl_ || hi > span_) continue;
            --remaining_[sj];
            for (std::int64_t n = lo; n <= hi; ++n) {
                const std::size_t c = cell(j, pos, n);
                if (!ok_[c]) break;
                const double w = f_[c] + b_[c];
                const double pre_i = pre + c2;
                seq_x_[static_cast<std::size_t>(pos)] = pre_i;
                seq_cell_[static_cast<std::size_t>(pos)] = c;
                // Placed stages' own terms (each a bound on the makespan by itself).
                const double lb = std::max({lbmax, pre_i + static_cast<double>(M_) * w, chain(pos)});
                const double npre = pre_i + first_[c];
                const double ar = std::max(armax, ar_[c]);
                const double op = std::max(optmax, opt_step_[c]);
                const double g = std::max(gmax, g_[c]);
                const double tail = tail_bound(left - 1, l + n, j, idx - stride_[sj]);
                if (!std::isfinite(tail)) continue;
                // Two lower bounds on the pipeline makespan of any completion:
                //   max_k [sum_{i<k} (w_i + 2c_i) + M w_k]                 (fill + bottleneck)
                //   sum_i (w_i + 2c_i) + max_k [(M-1) w_k - (nf_k-1) f_k]  (first backward's wait)
                const Neck nk = tail_neck(left - 1, l + n, idx - stride_[sj]);
                if (!std::isfinite(nk.g)) continue;
                const double first = std::max(lb, npre + tail);
                const double sum = npre + tail_sum(left - 1, l + n, j, idx - stride_[sj]);
                const double second = sum + std::max(g, nk.g);
                const double third = round_trip(pos, sum);
                const double bound = std::max({first, second, third}) + std::max(ar, nk.ar) +
                                     std::max(op, nk.opt);
                if (prune(bound)) continue;
                cands.push_back({bound, rank_[sj], j, n, npre, lb, ar, op, g, pre_i});
            }
            ++remaining_[sj];
        }
        std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& c) {
            if (a.bound != c.bound) return a.bound < c.bound;
            if (a.rank != c.rank) return a.rank < c.rank;
            return a.layers < c.layers;
        });
        for (const Candidate& cd : cands) {
            if (prune(cd.bound)) continue;
            const auto sj = static_cast<std::size_t>(cd.group);
            seq_group_[static_cast<std::size_t>(pos)] = cd.group;
            seq_layers_[static_cast<std::size_t>(pos)] = cd.layers;
            seq_x_[static_cast<std::size_t>(pos)] = cd.x;
            seq_cell_[static_cast<std::size_t>(pos)] = cell(cd.group, pos, cd.layers);
            --remaining_[sj];
            if (left == 1) {
                leaf(cd.ar, cd.opt);
            } else {
                dfs(pos + 1, l + cd.layers, cd.group, cd.pre, cd.lb, cd.ar, cd.opt, cd.g,
                    idx - stride_[sj]);
            }
            ++remaining_[sj];
            if (!exhaustive_) return;
        }
    }

    void leaf(double armax, double optmax) {
        ++leaves_;
        if (V_ > 1) {
            // Interleaved: exactly what estimate() says of the expanded stages, its simulation
            // stopped once the pipeline cannot beat the best so far (or the cutoff).
            const double cut = cutoff() * (1.0 + kSlack);
            const double limit = std::min(cut, best_iter_) - armax - optmax;
            const EstimateResult est = estimate_within(model_, gpus_, params_, work_,
                                                       expand(seq_group_, seq_layers_),
                                                       limit + 1e-9 * std::abs(limit) + 1e-300);
            if (est.feasible && est.iteration_s <= cut && est.iteration_s < best_iter_) {
                best_iter_ = est.iteration_s;
                best_group_ = seq_group_;
                best_layers_ = seq_layers_;
            }
            return;
        }
        std::vector<double> f(static_cast<std::size_t>(P_)), b(static_cast<std::size_t>(P_));
        std::vector<double> c(static_cast<std::size_t>(P_ - 1));
        // Which neighbours share an instance: the layout of the whole sequence decides, and
        // only pairs that could (share_) need it worked out.
        std::vector<char> inside(static_cast<std::size_t>(P_ - 1), 0);
        bool any = false;
        for (std::int64_t i = 1; i < P_ && !any; ++i) {
            any = share_[static_cast<std::size_t>(seq_group_[static_cast<std::size_t>(i - 1)] * k_ +
                                                  seq_group_[static_cast<std::size_t>(i)])] != 0;
        }
        if (any) {
            std::vector<std::int64_t> gv(static_cast<std::size_t>(P_)), tv(static_cast<std::size_t>(P_));
            for (std::int64_t i = 0; i < P_; ++i) {
                const StageGroup& g = distinct_[static_cast<std::size_t>(seq_group_[static_cast<std::size_t>(i)])];
                gv[static_cast<std::size_t>(i)] = g.gpu;
                tv[static_cast<std::size_t>(i)] = g.tp;
            }
            inside = boundaries_in_instance(gpus_, gv, tv, work_.dp);
        }
        for (std::int64_t i = 0; i < P_; ++i) {
            const auto si = static_cast<std::size_t>(i);
            const std::size_t cl = cell(seq_group_[si], i, seq_layers_[si]);
            f[si] = f_[cl];
            b[si] = b_[cl];
            if (i > 0) {
                const auto ac = static_cast<std::size_t>(seq_group_[si - 1] * k_ + seq_group_[si]);
                c[si - 1] = inside[si - 1] ? intra_[ac] : inter_[ac];
            }
        }
        // Leaves beyond the best so far (or the cutoff) stop simulating early; the slack keeps
        // every leaf within rounding of the limit exact.
        const double cut = cutoff() * (1.0 + kSlack);
        const double limit = std::min(cut, best_iter_) - armax - optmax;
        std::vector<double> c_b = c;
        // Blocking transfers run inside the stages' operations (the bounds, which treat them
        // as delays, stay below: folding only lengthens operations).
        if (!params_.p2p_overlap) fold_transfers(f, b, c, c_b);
        const double makespan = pipeline_makespan(f, b, c, c_b, M_, work_.schedule,
                                                  limit + 1e-9 * std::abs(limit) + 1e-300);
        const double iter = makespan + armax + optmax;
        if (iter <= cut && iter < best_iter_) {
            best_iter_ = iter;
            best_group_ = seq_group_;
            best_layers_ = seq_layers_;
        }
    }

    const ModelDims& model_;
    const std::vector<GpuSpec>& gpus_;
    const CostParams& params_;
    const Workload& work_;
    const PlaceOptions& opt_;
    std::int64_t P_ = 0, L_ = 0, M_ = 0, k_ = 0, span_ = 0, V_ = 1, minl_ = 1;
    std::vector<double> first_;            // f + b of a group's first stage (all of it unless interleaved)
    std::vector<std::int64_t> peak_memo_;  // peak_blocks() by (position, blocks)
    std::vector<StageGroup> distinct_;
    std::vector<std::int64_t> count_, remaining_, stride_, rank_;
    std::vector<double> f_, b_, g_, ar_, opt_step_, send_, inter_, intra_, min_in_, memo_, memo_sum_;
    double per_block_ = 0.0;  // a stage of n blocks works at least n times this (build_tables)
    std::vector<Neck> memo_neck_;
    std::vector<char> ok_, share_;  // share_: two groups that could sit in one instance
    Stopwatch sw_;
    bool use_memo_ = false, exhaustive_ = true, timed_out_ = false;
    std::int64_t root_index_ = 0, nodes_ = 0, leaves_ = 0;
    std::vector<std::int64_t> seq_group_, seq_layers_, best_group_, best_layers_;
    std::vector<double> seq_x_;
    std::vector<std::size_t> seq_cell_;  // per placed position: its (group, position, blocks) cell
    bool drain_ = false;  // plain 1F1B as run: the warm-up/cool-down bound applies
    double best_iter_ = kInf;
};

}  // namespace

Placement place(const ModelDims& model, const std::vector<GpuSpec>& gpus,
                const CostParams& params, const Workload& work,
                const std::vector<StageGroup>& groups, const PlaceOptions& options) {
    if (groups.empty() || static_cast<std::int64_t>(groups.size()) > kMaxStages) {
        throw std::invalid_argument("place: expected 1 to " + std::to_string(kMaxStages) +
                                    " stage groups, got " + std::to_string(groups.size()));
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
        if (groups[i].gpu < 0 || groups[i].gpu >= static_cast<std::int64_t>(gpus.size())) {
            throw std::invalid_argument("place: groups[" + std::to_string(i) +
                                        "].gpu is not an index into the GPU list");
        }
        if (groups[i].tp < 1 || groups[i].tp > gpus[static_cast<std::size_t>(groups[i].gpu)].gpus_per_node) {
            throw std::invalid_argument("place: groups[" + std::to_string(i) +
                                        "].tp must be in [1, gpus_per_node]");
        }
    }
    if (static_cast<std::int64_t>(groups.size()) * work.num_microbatches > kMaxStageMicrobatchProduct) {
        throw std::invalid_argument("place: stages * num_microbatches exceeds the simulation limit");
    }
    const std::int64_t P = static_cast<std::int64_t>(groups.size());
    if (!options.middle_equal || options.middle_layers > 0 || P <= 2) {
        Placer placer(model, gpus, params, work, groups, options);
        return placer.run();
    }
    // Megatron's split: each middle count m in turn (the first and last stages take the
    // rest, at least one block each). The best over all m; no placement beats the smallest
    // lower bound of the tries (each bounds its own m), and the first found tightens the
    // cutoff of the next.
    Placement best;
    best.lower_bound_s = std::numeric_limits<double>::infinity();
    PlaceOptions o = options;
    for (std::int64_t m = 1; (P - 2) * m <= model.num_layers - 2; ++m) {
        o.middle_layers = m;
        Placer placer(model, gpus, params, work, groups, o);
        Placement p = placer.run();
        best.nodes += p.nodes;
        best.leaves += p.leaves;
        best.exhaustive = best.exhaustive && p.exhaustive;
        best.timed_out = best.timed_out || p.timed_out;
        best.lower_bound_s = std::min(best.lower_bound_s, p.lower_bound_s);
        if (p.found && p.iteration_s < best.iteration_s) {
            best.found = true;
            best.stages = std::move(p.stages);
            best.iteration_s = p.iteration_s;
            o.cutoff_s = std::min(o.cutoff_s, p.iteration_s);
        }
        if (p.timed_out) break;
    }
    if (!std::isfinite(best.lower_bound_s)) best.lower_bound_s = 0;
    return best;
}

}  // namespace espresso
