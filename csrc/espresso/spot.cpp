#include "espresso/spot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace espresso {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Beyond these the answer is "no finite time": exp() overflows near 709, and a Poisson
// quantile over more than this many expected interruptions is not a plan anyone runs.
constexpr double kMaxExponent = 700.0;
constexpr double kMaxInterruptions = 1e7;

// Smallest k with P[Poisson(mu) <= k] >= confidence (summed in log space: e^-mu underflows
// for large mu while the terms near the mode do not). -1 when mu is beyond reach.
std::int64_t poisson_quantile(double mu, double confidence) {
    if (!(mu > 0) || !(confidence > 0)) return 0;
    if (!(mu <= kMaxInterruptions) || !(confidence < 1)) return -1;
    // Below mu - 40 sqrt(mu) - 40 the whole lower tail is under e^-800: start there.
    const auto first = static_cast<std::int64_t>(std::max(0.0, mu - 40.0 * std::sqrt(mu) - 40.0));
    const auto last = static_cast<std::int64_t>(mu + 60.0 * std::sqrt(mu) + 200.0);
    double log_p = static_cast<double>(first) * std::log(mu) - mu - std::lgamma(static_cast<double>(first) + 1.0);
    double cdf = 0.0;
    for (std::int64_t k = first; k <= last; ++k) {
        if (k > first) log_p += std::log(mu / static_cast<double>(k));
        cdf += std::exp(log_p);
        if (cdf >= confidence) return k;
    }
    return last;  // the tail beyond is below e^-700
}

}  // namespace

double optimal_interval_hours(double rate, double checkpoint) {
    if (!(rate > 0) || !(checkpoint > 0)) return 0.0;
    // d/dtau of (e^(rate (tau + C)) - 1) / tau = 0  <=>  (1 - a) e^a = e^-b, a = rate tau,
    // b = rate C; the left side falls from 1 to 0 over (0, 1): bisection, in the log form
    // log(1 - a) + a + b = 0, which keeps its digits for small a.
    const double b = rate * checkpoint;
    double lo = 0.0, hi = 1.0;
    for (int i = 0; i < 200 && hi - lo > 1e-15 * hi; ++i) {
        const double a = 0.5 * (lo + hi);
        if (std::log1p(-a) + a + b > 0) lo = a;
        else hi = a;
    }
    return 0.5 * (lo + hi) / rate;
}

double spot_factor_at(double rate, double checkpoint, double restart, double interval) {
    if (!(rate > 0)) return 1.0;
    if (!std::isfinite(rate)) return kInf;
    const double r = std::max(0.0, restart), c = std::max(0.0, checkpoint);
    if (!(interval > 0)) {
        // Checkpoints without end make no progress; without a cost, continuous checkpoints
        // lose nothing and only the restarts remain.
        return c > 0 ? kInf : (rate * r > kMaxExponent ? kInf : std::exp(rate * r));
    }
    const double x = rate * (interval + c);
    if (x + rate * r > kMaxExponent) return kInf;
    return std::exp(rate * r) * std::expm1(x) / (rate * interval);
}

double spot_factor(double rate, double checkpoint, double restart) {
    return spot_factor_at(rate, checkpoint, restart, optimal_interval_hours(rate, checkpoint));
}

SpotOutcome spot_outcome(double work_hours, double rate, double checkpoint, double restart,
                         double confidence) {
    SpotOutcome out;
    const double w = std::isnan(work_hours) ? 0.0 : std::max(0.0, work_hours);
    out.expected_hours = w;
    out.hours_at_confidence = w;
    if (!(rate > 0) || w == 0) return out;
    const double c = std::max(0.0, checkpoint), r = std::max(0.0, restart);
    const double tau = std::min(optimal_interval_hours(rate, c), w);
    out.interval_hours = c > 0 ? tau : 0.0;
    out.expected_hours = w * spot_factor_at(rate, c, r, c > 0 ? tau : 0.0);
    out.interruptions_expected = rate * out.expected_hours;
    // The work, its checkpoints, and k interruptions, each wasting at most what it cuts
    // short (an interval and its write, or a restart) and a restart; k the quantile over
    // that very time (a fixed point: k only grows). If the job is not done by that time,
    // more than k interruptions fell in it, which has probability at most 1 - confidence.
    const double base = w + (tau > 0 ? w / tau * c : 0.0);
    const double per = r + std::max(tau + c, r);
    // Each interruption adds `per` hours and so rate * per interruptions on average: at 1 or
    // more there is no fixed point (no time holds at any confidence). Near 1 the iteration
    // below is slow; after 10,000 rounds the answer is "no finite time" as well.
    if (!(rate * per < 1)) {
        out.bounded = false;
        out.hours_at_confidence = kInf;
        out.interruptions_at_confidence = -1;
        return out;
    }
    std::int64_t k = 0;
    for (int it = 0; it < 10000; ++it) {
        const double t = base + static_cast<double>(k) * per;
        const std::int64_t q = poisson_quantile(rate * t, confidence);
        if (q < 0 || !std::isfinite(t)) {
            out.bounded = false;
            out.hours_at_confidence = kInf;
            out.interruptions_at_confidence = -1;
            return out;
        }
        if (q <= k) {
            out.hours_at_confidence = t;
            out.interruptions_at_confidence = k;
            return out;
        }
        k = q;
    }
    out.bounded = false;
    out.hours_at_confidence = kInf;
    out.interruptions_at_confidence = -1;
    return out;
}

double hours_at_confidence_lb(double work_hours, double rate, double checkpoint,
                              double restart, double confidence, double cap) {
    const double w = std::isnan(work_hours) ? 0.0 : std::max(0.0, work_hours);
    if (!(rate > 0) || w == 0) return w;
    const double c = std::max(0.0, checkpoint), r = std::max(0.0, restart);
    // Iterating up from k = 0 stays below the least fixed point: stopping anywhere (too many
    // rounds, or a quantile beyond reach) still leaves a lower bound.
    std::int64_t k = 0;
    double t = w;
    for (int it = 0; it < 10000; ++it) {
        const double kd = static_cast<double>(k);
        t = w + kd * r + 2.0 * std::sqrt(w * c * kd);
        if (t > cap) return t;
        const std::int64_t q = poisson_quantile(rate * t, confidence);
        if (q <= k) return t;
        k = q;
    }
    return t;
}

}  // namespace espresso
