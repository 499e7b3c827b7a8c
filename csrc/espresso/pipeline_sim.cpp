#include "espresso/pipeline_sim.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <stdexcept>
#include <string>

namespace espresso {

namespace {

struct Op {
    bool backward;
    std::int64_t mb;
};

// The fixed operation order of one stage.
std::vector<Op> stage_ops(Schedule schedule, std::int64_t stage, std::int64_t P, std::int64_t M) {
    std::vector<Op> ops;
    ops.reserve(static_cast<std::size_t>(2 * M));
    if (schedule == Schedule::GPipe) {
        for (std::int64_t j = 0; j < M; ++j) ops.push_back({false, j});
        for (std::int64_t j = 0; j < M; ++j) ops.push_back({true, j});
        return ops;
    }
    // 1F1B (PipeDream-flush): warm-up forwards, steady one-forward-one-backward, cool-down.
    const std::int64_t warmup = std::min(P - stage - 1, M);
    for (std::int64_t j = 0; j < warmup; ++j) ops.push_back({false, j});
    for (std::int64_t j = 0; j < M - warmup; ++j) {
        ops.push_back({false, warmup + j});
        ops.push_back({true, j});
    }
    for (std::int64_t j = M - warmup; j < M; ++j) ops.push_back({true, j});
    return ops;
}

void check_times(const std::vector<double>& v, const char* name) {
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (!std::isfinite(v[i]) || v[i] < 0 || v[i] > kMaxTime) {
            throw std::invalid_argument(std::string(name) + "[" + std::to_string(i) +
                                        "] must be a time in [0, 1e100] s, got " +
                                        std::to_string(v[i]));
        }
    }
}

}  // namespace

std::int64_t in_flight(Schedule schedule, std::int64_t stage, std::int64_t num_stages,
                       std::int64_t num_microbatches) {
    if (schedule == Schedule::GPipe) return num_microbatches;
    return std::min(num_stages - stage, num_microbatches);
}

double closed_form_s(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                     std::int64_t num_microbatches) {
    double sum = 0, worst = 0;
    for (std::size_t i = 0; i < fwd_s.size() && i < bwd_s.size(); ++i) {
        sum += fwd_s[i] + bwd_s[i];
        worst = std::max(worst, fwd_s[i] + bwd_s[i]);
    }
    return sum + static_cast<double>(num_microbatches - 1) * worst;
}

PipelineResult simulate_pipeline(const std::vector<double>& fwd_s,
                                 const std::vector<double>& bwd_s,
                                 const std::vector<double>& send_fwd_s,
                                 const std::vector<double>& send_bwd_s,
                                 std::int64_t num_microbatches, Schedule schedule) {
    const std::int64_t P = static_cast<std::int64_t>(fwd_s.size());
    const std::int64_t M = num_microbatches;
    if (P < 1 || P > kMaxStages) {
        throw std::invalid_argument("number of stages must be in [1, " +
                                    std::to_string(kMaxStages) + "], got " + std::to_string(P));
    }
    if (M < 1 || M > kMaxMicrobatches || P * M > kMaxStageMicrobatchProduct) {
        throw std::invalid_argument(
            "num_microbatches must be in [1, " + std::to_string(kMaxMicrobatches) +
            "] with stages * microbatches <= " + std::to_string(kMaxStageMicrobatchProduct) +
            ", got " + std::to_string(M) + " micro-batches over " + std::to_string(P) + " stages");
    }
    if (bwd_s.size() != fwd_s.size() || send_fwd_s.size() + 1 != fwd_s.size() ||
        send_bwd_s.size() + 1 != fwd_s.size()) {
        throw std::invalid_argument(
            "simulate_pipeline: expected P forward and backward times and P-1 transfer times");
    }
    if (schedule != Schedule::OneFOneB && schedule != Schedule::GPipe) {
        throw std::invalid_argument("unknown schedule");
    }
    check_times(fwd_s, "fwd_s");
    check_times(bwd_s, "bwd_s");
    check_times(send_fwd_s, "send_fwd_s");
    check_times(send_bwd_s, "send_bwd_s");

    const auto idx = [M](std::int64_t i, std::int64_t j) {
        return static_cast<std::size_t>(i * M + j);
    };
    const std::size_t cells = static_cast<std::size_t>(P * M);
    std::vector<double> end_f(cells, -1.0), end_b(cells, -1.0);
    std::vector<std::vector<Op>> ops(static_cast<std::size_t>(P));
    for (std::int64_t i = 0; i < P; ++i) ops[static_cast<std::size_t>(i)] = stage_ops(schedule, i, P, M);
    std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
    std::vector<double> free_at(static_cast<std::size_t>(P), 0.0);

    // Work list of stages that may be able to advance; a stage that advances wakes its
    // neighbours, so every operation is scheduled exactly once.
    std::deque<std::int64_t> work;
    std::vector<char> queued(static_cast<std::size_t>(P), 1);
    for (std::int64_t i = 0; i < P; ++i) work.push_back(i);
    std::int64_t done = 0;
    const std::int64_t total = 2 * P * M;
    while (!work.empty()) {
        const std::int64_t i = work.front();
        work.pop_front();
        const auto si = static_cast<std::size_t>(i);
        queued[si] = 0;
        bool advanced = false;
        while (next[si] < ops[si].size()) {
            const Op op = ops[si][next[si]];
            double ready;
            if (!op.backward) {
                if (i == 0) {
                    ready = 0.0;
                } else {
                    const double prev = end_f[idx(i - 1, op.mb)];
                    if (prev < 0) break;
                    ready = prev + send_fwd_s[si - 1];
                }
            } else if (i == P - 1) {
                const double own = end_f[idx(i, op.mb)];
                if (own < 0) break;  // cannot happen with the orders above
                ready = own;
            } else {
                const double after = end_b[idx(i + 1, op.mb)];
                if (after < 0) break;
                ready = after + send_bwd_s[si];
            }
            const double start = std::max(free_at[si], ready);
            const double end = start + (op.backward ? bwd_s[si] : fwd_s[si]);
            (op.backward ? end_b : end_f)[idx(i, op.mb)] = end;
            free_at[si] = end;
            ++next[si];
            ++done;
            advanced = true;
        }
        if (advanced) {
            for (const std::int64_t n : {i - 1, i + 1}) {
                if (n >= 0 && n < P && !queued[static_cast<std::size_t>(n)]) {
                    queued[static_cast<std::size_t>(n)] = 1;
                    work.push_back(n);
                }
            }
        }
    }
    if (done != total) {
        throw std::logic_error("pipeline simulation deadlocked (internal error)");
    }

    PipelineResult r;
    r.busy_s.resize(static_cast<std::size_t>(P));
    double busy_total = 0;
    for (std::int64_t i = 0; i < P; ++i) {
        const auto si = static_cast<std::size_t>(i);
        r.makespan_s = std::max(r.makespan_s, free_at[si]);
        r.busy_s[si] = static_cast<double>(M) * (fwd_s[si] + bwd_s[si]);
        busy_total += r.busy_s[si];
    }
    // Clamped: rounding can push an idle-free pipeline a hair below zero.
    r.bubble_fraction = r.makespan_s > 0
                            ? std::max(0.0, 1.0 - busy_total / (static_cast<double>(P) * r.makespan_s))
                            : 0.0;
    return r;
}

}  // namespace espresso
