#include "espresso/pipeline_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>

namespace espresso {

namespace {

struct Op {
    bool backward;
    std::int64_t mb;
};

struct Scratch {
    std::vector<double> end_f, end_b, free_at, left;
    std::vector<std::int64_t> next, work;
    std::vector<char> queued;
    // Every stage's operation order for the last (P, M, schedule) seen: the placer simulates
    // many leaves of one shape in a row.
    std::vector<Op> ops;
    std::int64_t ops_p = -1, ops_m = -1;
    int ops_schedule = -1;
};

// Scratch reused across calls on this thread (no allocation per simulation).
thread_local Scratch tls_scratch;

// Operation k of stage `stage` in its fixed order. GPipe: all forwards, then all backwards.
// 1F1B (PipeDream-flush): warm-up forwards, one forward one backward, cool-down backwards.
inline Op stage_op(Schedule schedule, std::int64_t stage, std::int64_t P, std::int64_t M,
                   std::int64_t k) {
    if (schedule == Schedule::GPipe) return k < M ? Op{false, k} : Op{true, k - M};
    const std::int64_t warmup = std::min(P - stage - 1, M);
    if (k < warmup) return {false, k};
    if (k < 2 * M - warmup) {
        const std::int64_t j = (k - warmup) / 2;
        return (k - warmup) % 2 == 0 ? Op{false, warmup + j} : Op{true, j};
    }
    return {true, k - M};
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

void check_all_times(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                     const std::vector<double>& send_fwd_s, const std::vector<double>& send_bwd_s) {
    check_times(fwd_s, "fwd_s");
    check_times(bwd_s, "bwd_s");
    check_times(send_fwd_s, "send_fwd_s");
    check_times(send_bwd_s, "send_bwd_s");
}

// A stage (or device) that advanced may let a neighbour advance: queue it unless queued.
void wake(std::int64_t n, std::vector<char>& queued, std::vector<std::int64_t>& work) {
    if (!queued[static_cast<std::size_t>(n)]) {
        queued[static_cast<std::size_t>(n)] = 1;
        work.push_back(n);
    }
}

}  // namespace

Schedule schedule_as_run(Schedule schedule, std::int64_t num_stages,
                         std::int64_t num_microbatches) {
    return schedule == Schedule::OneFOneB && num_microbatches > 1 && num_microbatches < num_stages
               ? Schedule::GPipe
               : schedule;
}

std::int64_t in_flight(Schedule schedule, std::int64_t stage, std::int64_t num_stages,
                       std::int64_t num_microbatches, bool short_as_gpipe) {
    if ((short_as_gpipe ? schedule_as_run(schedule, num_stages, num_microbatches) : schedule) ==
        Schedule::GPipe) {
        return num_microbatches;
    }
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

namespace {

void check_pipeline(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                    const std::vector<double>& send_fwd_s, const std::vector<double>& send_bwd_s,
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
    check_all_times(fwd_s, bwd_s, send_fwd_s, send_bwd_s);
}

}  // namespace

PipelineResult simulate_pipeline(const std::vector<double>& fwd_s,
                                 const std::vector<double>& bwd_s,
                                 const std::vector<double>& send_fwd_s,
                                 const std::vector<double>& send_bwd_s,
                                 std::int64_t num_microbatches, Schedule schedule) {
    check_pipeline(fwd_s, bwd_s, send_fwd_s, send_bwd_s, num_microbatches, schedule);
    const std::int64_t P = static_cast<std::int64_t>(fwd_s.size());
    const std::int64_t M = num_microbatches;
    PipelineResult r;
    r.makespan_s = pipeline_makespan(fwd_s, bwd_s, send_fwd_s, send_bwd_s, M, schedule,
                                     std::numeric_limits<double>::infinity());
    r.busy_s.resize(static_cast<std::size_t>(P));
    double busy_total = 0;
    for (std::int64_t i = 0; i < P; ++i) {
        const auto si = static_cast<std::size_t>(i);
        r.busy_s[si] = static_cast<double>(M) * (fwd_s[si] + bwd_s[si]);
        busy_total += r.busy_s[si];
    }
    // Clamped: rounding can push an idle-free pipeline a hair below zero.
    r.bubble_fraction = r.makespan_s > 0
                            ? std::max(0.0, 1.0 - busy_total / (static_cast<double>(P) * r.makespan_s))
                            : 0.0;
    return r;
}

std::vector<TimelineOp> pipeline_timeline(const std::vector<double>& fwd_s,
                                          const std::vector<double>& bwd_s,
                                          const std::vector<double>& send_fwd_s,
                                          const std::vector<double>& send_bwd_s,
                                          std::int64_t num_microbatches, Schedule schedule) {
    check_pipeline(fwd_s, bwd_s, send_fwd_s, send_bwd_s, num_microbatches, schedule);
    const std::int64_t P = static_cast<std::int64_t>(fwd_s.size());
    const std::int64_t M = num_microbatches;
    pipeline_makespan(fwd_s, bwd_s, send_fwd_s, send_bwd_s, M, schedule,
                      std::numeric_limits<double>::infinity());
    // The end times the simulation left in this thread's scratch.
    const Scratch& sc = tls_scratch;
    std::vector<TimelineOp> out;
    out.reserve(static_cast<std::size_t>(2 * P * M));
    for (std::int64_t i = 0; i < P; ++i) {
        const auto si = static_cast<std::size_t>(i);
        for (std::int64_t j = 0; j < M; ++j) {
            const auto c = static_cast<std::size_t>(i * M + j);
            out.push_back({i, j, false, sc.end_f[c] - fwd_s[si], sc.end_f[c]});
            out.push_back({i, j, true, sc.end_b[c] - bwd_s[si], sc.end_b[c]});
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const TimelineOp& a, const TimelineOp& b) {
        return std::tie(a.stage, a.start_s) < std::tie(b.stage, b.start_s);
    });
    return out;
}

double pipeline_makespan(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                         const std::vector<double>& send_fwd_s,
                         const std::vector<double>& send_bwd_s, std::int64_t num_microbatches,
                         Schedule schedule, double abort_above) {
    const std::int64_t P = static_cast<std::int64_t>(fwd_s.size());
    const std::int64_t M = num_microbatches;
    schedule = schedule_as_run(schedule, P, M);
    const auto idx = [M](std::int64_t i, std::int64_t j) {
        return static_cast<std::size_t>(i * M + j);
    };
    const std::size_t cells = static_cast<std::size_t>(P * M);
    const auto sP = static_cast<std::size_t>(P);
    Scratch& sc = tls_scratch;  // one thread-local lookup, not one per access
    std::vector<double>& end_f = sc.end_f;
    std::vector<double>& end_b = sc.end_b;
    std::vector<double>& free_at = sc.free_at;
    std::vector<double>& left = sc.left;  // work each stage has still to do
    std::vector<std::int64_t>& next = sc.next;
    std::vector<std::int64_t>& work = sc.work;
    std::vector<char>& queued = sc.queued;
    end_f.assign(cells, -1.0);
    end_b.assign(cells, -1.0);
    free_at.assign(sP, 0.0);
    if (sc.ops_p != P || sc.ops_m != M || sc.ops_schedule != static_cast<int>(schedule)) {
        sc.ops.resize(static_cast<std::size_t>(P * 2 * M));
        for (std::int64_t i = 0; i < P; ++i) {
            for (std::int64_t k = 0; k < 2 * M; ++k) {
                sc.ops[static_cast<std::size_t>(i * 2 * M + k)] = stage_op(schedule, i, P, M, k);
            }
        }
        sc.ops_p = P;
        sc.ops_m = M;
        sc.ops_schedule = static_cast<int>(schedule);
    }
    const Op* ops = sc.ops.data();
    const bool can_abort = abort_above < std::numeric_limits<double>::infinity();
    if (can_abort) {
        left.resize(sP);
        for (std::size_t i = 0; i < sP; ++i) left[i] = static_cast<double>(M) * (fwd_s[i] + bwd_s[i]);
    }
    next.assign(sP, 0);
    queued.assign(sP, 1);
    work.clear();
    // Work list of stages that may be able to advance; a stage that advances wakes its
    // neighbours, so every operation is scheduled exactly once (in each stage's fixed order,
    // so the times do not depend on the order stages are visited).
    for (std::int64_t i = P; i-- > 0;) work.push_back(i);
    std::int64_t done = 0;
    const std::int64_t total = 2 * P * M;
    const std::int64_t ops_per_stage = 2 * M;
    while (!work.empty()) {
        const std::int64_t i = work.back();
        work.pop_back();
        const auto si = static_cast<std::size_t>(i);
        queued[si] = 0;
        bool advanced = false;
        while (next[si] < ops_per_stage) {
            const Op op = ops[static_cast<std::size_t>(i * ops_per_stage + next[si])];
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
            if (can_abort) {
                // The stage still runs its remaining operations one after another.
                left[si] -= op.backward ? bwd_s[si] : fwd_s[si];
                if (end + left[si] > abort_above) return std::numeric_limits<double>::infinity();
            }
            ++next[si];
            ++done;
            advanced = true;
        }
        if (advanced) {
            if (i > 0) wake(i - 1, queued, work);
            if (i + 1 < P) wake(i + 1, queued, work);
        }
    }
    if (done != total) {
        throw std::logic_error("pipeline simulation deadlocked (internal error)");
    }
    double makespan = 0;
    for (const double f : free_at) makespan = std::max(makespan, f);
    return makespan;
}

InterleavedOp interleaved_op(std::int64_t P, std::int64_t v, std::int64_t M, std::int64_t d,
                             std::int64_t k) {
    const std::int64_t nf_total = M * v;
    const std::int64_t warm = std::min(2 * (P - d - 1) + (v - 1) * P, nf_total);
    std::int64_t fi = -1, bi = -1;
    if (k < warm) {
        fi = k;
    } else if (k < 2 * nf_total - warm) {
        const std::int64_t j = k - warm;
        if (j % 2 == 0) fi = warm + j / 2;
        else bi = j / 2;
    } else {
        bi = k - nf_total;
    }
    const std::int64_t x = fi >= 0 ? fi : bi;
    const std::int64_t group = x / P;
    const std::int64_t chunk = fi >= 0 ? group % v : v - 1 - group % v;
    return {bi >= 0, chunk, (x / (P * v)) * P + x % P};
}

namespace {

// The most `held` reaches over device `device`'s operation order: each forward of chunk c
// adds per_chunk[c], each backward takes it off again.
template <typename T>
T peak_walk(const std::vector<T>& per_chunk, std::int64_t P, std::int64_t device, std::int64_t M) {
    const std::int64_t v = static_cast<std::int64_t>(per_chunk.size());
    if (P < 1 || P > kMaxStages || v < 1 || device < 0 || device >= P || M < 1 ||
        M > kMaxMicrobatches || P * v * M > kMaxStageMicrobatchProduct) {
        throw std::invalid_argument("interleaved_peak: devices, chunks or micro-batches out of range");
    }
    T held = 0, peak = 0;
    for (std::int64_t k = 0; k < 2 * M * v; ++k) {
        const InterleavedOp op = interleaved_op(P, v, M, device, k);
        const T a = per_chunk[static_cast<std::size_t>(op.chunk)];
        held = op.backward ? held - a : held + a;
        peak = std::max(peak, held);
    }
    return peak;
}

}  // namespace

std::vector<std::int64_t> chunk_blocks(std::int64_t n, std::int64_t v) {
    const std::int64_t k = std::max<std::int64_t>(v, 1);
    std::vector<std::int64_t> out(static_cast<std::size_t>(k));
    for (std::int64_t c = 0; c < k; ++c) out[static_cast<std::size_t>(c)] = n / k + (c < n % k ? 1 : 0);
    return out;
}

double interleaved_peak(const std::vector<double>& per_chunk, std::int64_t num_devices,
                        std::int64_t device, std::int64_t num_microbatches) {
    for (const double a : per_chunk) {
        if (!std::isfinite(a) || a < 0 || a > kMaxTime) {
            throw std::invalid_argument("interleaved_peak: chunk sizes must be in [0, 1e100]");
        }
    }
    return peak_walk(per_chunk, num_devices, device, num_microbatches);
}

std::int64_t interleaved_peak_blocks(const std::vector<std::int64_t>& blocks,
                                     std::int64_t num_devices, std::int64_t device,
                                     std::int64_t num_microbatches) {
    for (const std::int64_t n : blocks) {
        if (n < 0 || n > (std::int64_t{1} << 20)) {
            throw std::invalid_argument("interleaved_peak_blocks: chunk blocks must be in [0, 2^20]");
        }
    }
    return peak_walk(blocks, num_devices, device, num_microbatches);
}

double interleaved_makespan(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                            const std::vector<double>& send_fwd_s,
                            const std::vector<double>& send_bwd_s, std::int64_t num_devices,
                            std::int64_t num_microbatches, double abort_above) {
    return interleaved_run(fwd_s, bwd_s, send_fwd_s, send_bwd_s, num_devices, num_microbatches,
                           nullptr, abort_above)
        .makespan_s;
}

InterleavedRun interleaved_run(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                               const std::vector<double>& send_fwd_s,
                               const std::vector<double>& send_bwd_s, std::int64_t num_devices,
                               std::int64_t num_microbatches, const DpTraffic* dp,
                               double abort_above) {
    const std::int64_t P = num_devices, M = num_microbatches;
    const std::int64_t S = static_cast<std::int64_t>(fwd_s.size());
    if (P < 1 || P > kMaxStages || S % P != 0 || S / P < 2) {
        throw std::invalid_argument(
            "interleaved_makespan: expected num_devices in [1, 1024] and num_devices * v "
            "virtual stages with v >= 2, got " + std::to_string(S) + " over " +
            std::to_string(P) + " devices");
    }
    const std::int64_t v = S / P;
    if (M < P || M % P != 0 || M > kMaxMicrobatches || S * M > kMaxStageMicrobatchProduct) {
        throw std::invalid_argument(
            "interleaved_makespan: num_microbatches must be a multiple of the devices (" +
            std::to_string(P) + ") with virtual stages * microbatches <= " +
            std::to_string(kMaxStageMicrobatchProduct) + ", got " + std::to_string(M));
    }
    if (bwd_s.size() != fwd_s.size() || send_fwd_s.size() + 1 != fwd_s.size() ||
        send_bwd_s.size() + 1 != fwd_s.size()) {
        throw std::invalid_argument(
            "interleaved_makespan: expected P*v forward and backward times and P*v-1 transfers");
    }
    check_all_times(fwd_s, bwd_s, send_fwd_s, send_bwd_s);
    // The DP traffic: each vector empty or one time per virtual stage, each finite and >= 0.
    const auto traffic = [&](const std::vector<double>& t, const char* name) {
        if (!t.empty() && t.size() != fwd_s.size()) {
            throw std::invalid_argument(std::string("interleaved_run: expected ") + name +
                                        " empty or one time per virtual stage");
        }
        for (const double x : t) {
            if (!(x >= 0.0 && x <= kMaxTime)) {
                throw std::invalid_argument(std::string("interleaved_run: ") + name +
                                            " must be finite and >= 0");
            }
        }
        return !t.empty();
    };
    const bool under_b = dp != nullptr && traffic(dp->under_backward, "under_backward");
    const bool under_f = dp != nullptr && traffic(dp->under_forward, "under_forward");
    const bool exposed = dp != nullptr && traffic(dp->exposed, "exposed");
    // Each device's collective stream: the gathers from the step's start, in chunk order;
    // `arrived[s]` is when virtual stage s's weights are all there.
    std::vector<double> comm_free(static_cast<std::size_t>(P), 0.0);
    std::vector<double> arrived(static_cast<std::size_t>(S), 0.0);
    if (under_f) {
        for (std::int64_t s = 0; s < S; ++s) {
            double& f = comm_free[static_cast<std::size_t>(s % P)];
            f += dp->under_forward[static_cast<std::size_t>(s)];
            arrived[static_cast<std::size_t>(s)] = f;
        }
    }

    const std::int64_t per_device = 2 * M * v;
    auto op_of = [&](std::int64_t d, std::int64_t k) {
        const InterleavedOp op = interleaved_op(P, v, M, d, k);
        return std::tuple<bool, std::int64_t, std::int64_t>{op.backward, op.chunk * P + d, op.mb};
    };
    const auto cells = static_cast<std::size_t>(S * M);
    std::vector<double> end_f(cells, -1.0), end_b(cells, -1.0);
    std::vector<double> free_at(static_cast<std::size_t>(P), 0.0);
    // Work each device has left: once where it is plus that passes abort_above, the makespan
    // can only be larger.
    std::vector<double> left(static_cast<std::size_t>(P), 0.0);
    for (std::int64_t s = 0; s < S; ++s) {
        left[static_cast<std::size_t>(s % P)] +=
            static_cast<double>(M) * (fwd_s[static_cast<std::size_t>(s)] + bwd_s[static_cast<std::size_t>(s)]);
    }
    std::vector<std::int64_t> next(static_cast<std::size_t>(P), 0), work;
    std::vector<char> queued(static_cast<std::size_t>(P), 1);
    for (std::int64_t d = P; d-- > 0;) work.push_back(d);
    auto at = [M](std::int64_t s, std::int64_t mb) { return static_cast<std::size_t>(s * M + mb); };
    std::int64_t done = 0;
    while (!work.empty()) {
        const std::int64_t d = work.back();
        work.pop_back();
        const auto sd = static_cast<std::size_t>(d);
        queued[sd] = 0;
        bool advanced = false;
        while (next[sd] < per_device) {
            const auto [backward, s, mb] = op_of(d, next[sd]);
            const auto ss = static_cast<std::size_t>(s);
            double ready = 0.0;
            if (!backward) {
                if (s > 0) {
                    const double prev = end_f[at(s - 1, mb)];
                    if (prev < 0) break;
                    ready = prev + send_fwd_s[ss - 1];
                }
            } else if (s == S - 1) {
                const double own = end_f[at(s, mb)];
                if (own < 0) break;
                ready = own;
            } else {
                const double after = end_b[at(s + 1, mb)];
                if (after < 0) break;
                ready = after + send_bwd_s[ss];
            }
            const double start = std::max(free_at[sd], ready);
            const double took = backward ? bwd_s[ss] : fwd_s[ss];
            double end = start + took;
            // A first forward ends no earlier than its weights' gather.
            if (!backward && mb == 0) end = std::max(end, arrived[ss]);
            // The last backward launches the stage's gradient reduction.
            if (backward && mb == M - 1 && under_b) {
                comm_free[sd] = std::max(comm_free[sd], start) + dp->under_backward[ss];
            }
            left[sd] -= took;
            if (start + std::max(left[sd] + took, 0.0) > abort_above) {
                InterleavedRun cut;
                cut.makespan_s = std::numeric_limits<double>::infinity();
                return cut;
            }
            (backward ? end_b : end_f)[at(s, mb)] = end;
            free_at[sd] = end;
            ++next[sd];
            ++done;
            advanced = true;
        }
        if (advanced) {  // chunks wrap from the last device to the first
            wake((d + P - 1) % P, queued, work);
            wake((d + 1) % P, queued, work);
        }
    }
    if (done != P * per_device) {
        throw std::logic_error("interleaved pipeline simulation deadlocked (internal error)");
    }
    InterleavedRun run;
    run.tail_s.resize(static_cast<std::size_t>(P));
    for (std::int64_t d = 0; d < P; ++d) {
        const auto sd = static_cast<std::size_t>(d);
        double tail = 0.0;
        if (exposed) {
            for (std::int64_t s = d; s < S; s += P) tail += dp->exposed[static_cast<std::size_t>(s)];
        }
        run.makespan_s = std::max(run.makespan_s, free_at[sd]);
        run.tail_s[sd] = std::max(0.0, comm_free[sd] - free_at[sd]) + tail;
    }
    return run;
}

}  // namespace espresso
