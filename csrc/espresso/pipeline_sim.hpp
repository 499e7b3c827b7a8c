// Exact event simulation of a synchronous pipeline schedule (1F1B or GPipe) over
// P stages and M micro-batches, with per-boundary transfer delays.
#pragma once

#include <cstdint>
#include <vector>

#include "espresso/cost_model.hpp"

namespace espresso {

// Limits that keep the simulation's memory bounded (P*M doubles, twice).
constexpr std::int64_t kMaxStages = 1024;
constexpr std::int64_t kMaxMicrobatches = 1 << 20;
constexpr std::int64_t kMaxStageMicrobatchProduct = 1 << 22;
// Longest operation accepted: sums of 2^23 of them stay finite.
constexpr double kMaxTime = 1e100;

struct PipelineResult {
    double makespan_s = 0;
    std::vector<double> busy_s;  // compute time of each stage
    double bubble_fraction = 0;  // 1 - sum(busy) / (P * makespan)
};

// fwd_s/bwd_s: per-micro-batch time of each stage; send_fwd_s[i]/send_bwd_s[i]: the
// delay of an activation (gradient) crossing the boundary between stages i and i+1.
// Transfers overlap compute; each stage runs its operations in schedule order.
PipelineResult simulate_pipeline(const std::vector<double>& fwd_s,
                                 const std::vector<double>& bwd_s,
                                 const std::vector<double>& send_fwd_s,
                                 const std::vector<double>& send_bwd_s,
                                 std::int64_t num_microbatches, Schedule schedule);

// The makespan alone, for the placer's leaves: stops early, returning +infinity, once some
// stage cannot finish by `abort_above` (where it is now plus the work it still has to do:
// the makespan can only be larger). Inputs as above, already checked.
double pipeline_makespan(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                         const std::vector<double>& send_fwd_s,
                         const std::vector<double>& send_bwd_s, std::int64_t num_microbatches,
                         Schedule schedule, double abort_above);

// The closed form sum(f+b) + (M-1) * max(f+b): equal to the simulation for uniform
// stages and free transfers, and a lower bound of GPipe's makespan.
double closed_form_s(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                     std::int64_t num_microbatches);

// The schedule a plan runs: 1F1B with fewer micro-batches than stages (but more than one)
// runs as GPipe, as PyTorch's runner does (Schedule1F1B needs one per stage); with one
// micro-batch the two are the same.
Schedule schedule_as_run(Schedule schedule, std::int64_t num_stages, std::int64_t num_microbatches);

// Micro-batches whose activations stage `stage` of `num_stages` holds at its peak.
std::int64_t in_flight(Schedule schedule, std::int64_t stage, std::int64_t num_stages,
                       std::int64_t num_microbatches);

}  // namespace espresso
