// Exact event simulation of a synchronous pipeline schedule (1F1B or GPipe) over
// P stages and M micro-batches, with per-boundary transfer delays.
#pragma once

#include <cstdint>
#include <limits>
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

// One operation of the schedule as simulated: for timelines (Gantt charts).
struct TimelineOp {
    std::int64_t stage = 0;
    std::int64_t microbatch = 0;
    bool backward = false;
    double start_s = 0;
    double end_s = 0;
};

// fwd_s/bwd_s: per-micro-batch time of each stage; send_fwd_s[i]/send_bwd_s[i]: the
// delay of an activation (gradient) crossing the boundary between stages i and i+1.
// Transfers overlap compute; each stage runs its operations in schedule order.
PipelineResult simulate_pipeline(const std::vector<double>& fwd_s,
                                 const std::vector<double>& bwd_s,
                                 const std::vector<double>& send_fwd_s,
                                 const std::vector<double>& send_bwd_s,
                                 std::int64_t num_microbatches, Schedule schedule);

// Every operation's start and end in the same simulation (stage by stage, in each stage's
// order); limits and checks as simulate_pipeline, so at most 2 * kMaxStageMicrobatchProduct.
std::vector<TimelineOp> pipeline_timeline(const std::vector<double>& fwd_s,
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

// Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2; Megatron-LM's order): `num_devices`
// devices each run `v` model chunks; virtual stage s = c * num_devices + d is chunk c on
// device d, and fwd_s/bwd_s hold the times of the num_devices * v virtual stages in that
// order, send_*_s[s] the transfer between virtual stages s and s + 1 (the last device to the
// first between chunks). Device d runs min(2 (P - d - 1) + (v - 1) P, M v) warm-up forwards,
// then one forward and one backward alternately, then the remaining backwards; forward k is
// micro-batch (k / (P v)) P + k % P of chunk (k / P) % v, backward k the same micro-batch of
// chunk v - 1 - (k / P) % v. Needs v >= 2 and M a multiple of P (as Megatron-LM does).
// Plans with virtual_stages > 1 are estimated with it. `abort_above`: return +infinity as
// soon as some device cannot finish by then (the placer's leaves).
double interleaved_makespan(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                            const std::vector<double>& send_fwd_s,
                            const std::vector<double>& send_bwd_s, std::int64_t num_devices,
                            std::int64_t num_microbatches,
                            double abort_above = std::numeric_limits<double>::infinity());

// Data-parallel traffic of each virtual stage (seconds of one GPU's collectives), for
// interleaved_run(): `under_backward` is the gradients' reduction, launched as the stage's
// last backward (of micro-batch M - 1) starts, Megatron-LM's overlap_grad_reduce;
// `under_forward` the weights' all-gather of --overlap-param-gather, launched at the step's
// start and needed by the end of the stage's first forward; `exposed` runs after the
// pipeline. Each device runs its collectives one at a time on one stream, in the order they
// are launched (the gathers in chunk order first); empty vectors: none.
struct DpTraffic {
    std::vector<double> under_backward, under_forward, exposed;
};

struct InterleavedRun {
    double makespan_s = 0;        // the last device's last operation, gather stalls included
    std::vector<double> tail_s;   // per device: how long its collectives run past its own
                                  // last operation (the exposed ones all do)
};

// The simulation of interleaved_makespan() with each device's DP collectives (`dp`, null:
// none), which stall a first forward whose weights have not arrived and run past the
// device's last backward when they outlast the work behind them. `abort_above` bounds the
// makespan as there (the collectives' tails are not counted in it). As for a plain pipeline,
// the iteration is then the makespan plus the longest tail (estimate()).
InterleavedRun interleaved_run(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                               const std::vector<double>& send_fwd_s,
                               const std::vector<double>& send_bwd_s, std::int64_t num_devices,
                               std::int64_t num_microbatches, const DpTraffic* dp,
                               double abort_above = std::numeric_limits<double>::infinity());

// Operation k (0 <= k < 2 M v) of device d in interleaved 1F1B: a forward or a backward of
// micro-batch `mb` through the device's chunk `chunk` (virtual stage chunk * P + d).
struct InterleavedOp {
    bool backward;
    std::int64_t chunk;
    std::int64_t mb;
};
InterleavedOp interleaved_op(std::int64_t num_devices, std::int64_t v,
                             std::int64_t num_microbatches, std::int64_t device, std::int64_t k);

// The most activation memory device `device` holds at once under interleaved 1F1B, given
// what one micro-batch leaves in each of its chunks (per_chunk[c]), walking its operations.
double interleaved_peak(const std::vector<double>& per_chunk, std::int64_t num_devices,
                        std::int64_t device, std::int64_t num_microbatches);
// Blocks of the v chunks of a GPU group holding n blocks under interleaving: as equal as
// possible, the larger first (espresso.interleave.split_layers does the same).
std::vector<std::int64_t> chunk_blocks(std::int64_t n, std::int64_t v);

// The same in blocks: the most blocks' worth of one micro-batch's activations the device
// holds, its chunks holding blocks[c] blocks each (exact, in integers).
std::int64_t interleaved_peak_blocks(const std::vector<std::int64_t>& blocks,
                                     std::int64_t num_devices, std::int64_t device,
                                     std::int64_t num_microbatches);

// The closed form sum(f+b) + (M-1) * max(f+b): equal to the simulation for uniform
// stages and free transfers, and a lower bound of GPipe's makespan.
double closed_form_s(const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
                     std::int64_t num_microbatches);

// The schedule a plan runs: 1F1B with fewer micro-batches than stages (but more than one)
// runs as GPipe, as PyTorch's runner does (Schedule1F1B needs one per stage); with one
// micro-batch the two are the same.
Schedule schedule_as_run(Schedule schedule, std::int64_t num_stages, std::int64_t num_microbatches);

// Micro-batches whose activations stage `stage` of `num_stages` holds at its peak: as run
// (`short_as_gpipe`: a short 1F1B as GPipe, schedule_as_run), or as 1F1B itself holds them
// (Megatron-LM and DeepSpeed run it: min(P - i, M)).
std::int64_t in_flight(Schedule schedule, std::int64_t stage, std::int64_t num_stages,
                       std::int64_t num_microbatches, bool short_as_gpipe = true);

}  // namespace espresso
