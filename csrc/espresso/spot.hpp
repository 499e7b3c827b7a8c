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

// The whole outcome of `work_hours` of work. The work is cut into m equal segments, m the
// least count whose segments are no longer than optimal_interval_hours() (interval_hours:
// the work / m). hours_at_confidence is the `confidence` quantile of the process's own
// distribution (docs/cost-model.md, "Spot capacity"): the wall-clock time is the base
// W + m C plus, for each interruption, what it cut short, a restart, and the restarts that
// are themselves cut short; its distribution is computed by Panjer's recursion on a grid
// that rounds every loss up to its cell, and the least of that grid's quantile and
// Chernoff's bound is reported, so P[T <= hours_at_confidence] >= confidence holds exactly
// and the answer exceeds the true quantile by at most a cell per interruption (about 1-2%
// of the time lost). Bounded time and memory on any input (a few milliseconds at most).
// interruptions_at_confidence is the same quantile of the number of interruptions.
SpotOutcome spot_outcome(double work_hours, double rate, double checkpoint, double restart,
                         double confidence);

// A lower bound on spot_outcome().hours_at_confidence for any plan with at least this work,
// rate, checkpoint time and restart, whatever its interval: every plan writes at least one
// checkpoint, and the interruptions in the first W hours of work and checkpoint writes are
// a Poisson count of mean rate W, each followed by at least a whole restart, so the time is
// at least W + C + R k, k that count's quantile. Grows with every argument (the search's
// deadline bound). `cap` is kept for callers that stop once the bound passes it.
double hours_at_confidence_lb(double work_hours, double rate, double checkpoint,
                              double restart, double confidence,
                              double cap = std::numeric_limits<double>::infinity());

}  // namespace espresso
