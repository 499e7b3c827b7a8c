// Spot interruptions: expected job time with checkpoints, the checkpoint interval, and the
// time that holds at a given confidence. Pure C++ (no pybind11). Model and assumptions:
// docs/cost-model.md, "Spot capacity".
//
// A plan with spot instances stops whenever one of them is reclaimed: interruptions arrive
// as a Poisson process of rate `rate` per hour (the sum over its spot instances). The job
// writes a checkpoint every `interval` hours of work, each write taking `checkpoint` hours;
// an interruption loses the work since the last completed checkpoint and costs `restart`
// hours (new capacity, process start, reading the checkpoint) before work resumes.
// Interruptions may also strike during writes and restarts (Daly 2006).
#pragma once

#include <cstdint>
#include <limits>

namespace espresso {

struct SpotOutcome {
    double interval_hours = 0;       // work between checkpoints (0: none needed)
    double expected_hours = 0;       // E[wall-clock time], work included
    double hours_at_confidence = 0;  // wall-clock time that holds with the confidence
    double interruptions_expected = 0;
    std::int64_t interruptions_at_confidence = 0;  // the quantile used for hours_at_confidence
    bool bounded = true;             // false: no finite time holds at that confidence
};

// The checkpoint interval (hours of work) that minimises the expected time per hour of work
// under Daly's model: Young's sqrt(2 checkpoint / rate) to first order. 0 when rate is 0.
double optimal_interval_hours(double rate, double checkpoint);

// Expected wall-clock hours per hour of work at the interval `interval` (Daly 2006):
//   e^(rate restart) (e^(rate (interval + checkpoint)) - 1) / (rate interval).
// 1 when rate is 0. Increasing in rate, checkpoint and restart.
double spot_factor_at(double rate, double checkpoint, double restart, double interval);

// The least of spot_factor_at over every interval (at optimal_interval_hours()): a lower
// bound on the expected time per hour of work of any plan with at least this rate,
// checkpoint and restart time.
double spot_factor(double rate, double checkpoint, double restart);

// The whole outcome of `work_hours` of work. The interval is optimal_interval_hours(),
// at most the work itself. hours_at_confidence counts k interruptions, k the `confidence`
// quantile of a Poisson count over that time, each wasting at most a whole interval and
// checkpoint (or a restart it cuts short) and costing a restart: a bound on its cost.
SpotOutcome spot_outcome(double work_hours, double rate, double checkpoint, double restart,
                         double confidence);

// A lower bound on spot_outcome().hours_at_confidence for any plan with at least this work,
// rate, checkpoint time and restart, whatever its interval: with k interruptions the time is
// at least W + k R + 2 sqrt(W C k) (the checkpoints W C / tau and the lost intervals k tau
// together, at their least over tau), k the least fixed point of that map's Poisson
// quantile. Grows with every argument (the search's deadline bound). The iteration stops
// once the bound passes `cap` (the answer is then only known to be above it).
double hours_at_confidence_lb(double work_hours, double rate, double checkpoint,
                              double restart, double confidence,
                              double cap = std::numeric_limits<double>::infinity());

}  // namespace espresso
