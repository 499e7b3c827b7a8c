#include "espresso/spot.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace espresso {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Beyond these the answer is "no finite time": exp() overflows near 709, and a distribution
// over more than this many expected interruptions is not a plan anyone runs.
constexpr double kMaxExponent = 700.0;
constexpr double kMaxInterruptions = 1e7;
// Grid sizes of the distribution of the time lost to interruptions: a coarse pass over a
// range known to hold the quantile (when Chernoff's bound does not give a close one), then a
// finer one over the range found.
// The finer grid has about kCellsPerInterruption cells for each interruption at the
// quantile, so the rounding (at most a cell per interruption) is about 1/kCellsPerInterruption
// of the loss; memory and time stay bounded by kMaxCells.
constexpr std::size_t kCoarseCells = 1024;
constexpr std::size_t kMinCells = 128;
constexpr std::size_t kMaxCells = std::size_t{1} << 15;
constexpr double kCellsPerInterruption = 64.0;
// One interruption's loss keeps at most this many cells (what lies beyond counts as beyond
// the grid): the recursion's time is bounded by kMaxCells times this.
constexpr std::size_t kMaxLossCells = 4096;
// Multiply-adds a pass may take (the coarse one, the fine one, the count of interruptions;
// together a few milliseconds at most): past it a grid is made coarser.
constexpr double kCoarseBudget = 2.5e5;
constexpr double kFineBudget = 1e6;
constexpr double kCountBudget = 2.5e5;
// Probability mass below this at the end of a severity's support is dropped by default (and
// so counted as an infinite loss: the quantile only grows).
constexpr double kTail = 1e-15;

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

// A count N of Panjer's (a, b, 0) class: P[N = n] = (a + b / n) P[N = n - 1]. Poisson(mu):
// a = 0, b = mu. The failures before the m-th success of trials that succeed with
// probability q (negative binomial): a = 1 - q, b = (m - 1)(1 - q).
struct Count {
    double m = 0, q = 1, mu = 0;  // the negative binomial's m and q, or Poisson's mu
    bool poisson = false;

    double a() const { return poisson ? 0.0 : 1.0 - q; }
    double b() const { return poisson ? mu : (m - 1.0) * (1.0 - q); }

    // log E[x^N], x in [0, 1]: log P[N = 0] of the compound whose severity is 0 with
    // probability x.
    double log_pgf(double x) const {
        if (poisson) return mu * (x - 1.0);
        return m * (std::log(q) - std::log1p(-(1.0 - q) * x));
    }
    double mean() const { return poisson ? mu : m * (1.0 - q) / q; }
};

Count poisson_count(double mu) {
    Count c;
    c.poisson = true;
    c.mu = mu;
    return c;
}

Count failures_count(double m, double q) {
    Count c;
    c.m = m;
    c.q = q;
    return c;
}

// The distribution of S = X_1 + ... + X_N on the cells 0 .. cells - 1, X_i independent with
// P[X = j] = f[j] (f may hold less than the whole mass: what it lacks is a loss beyond the
// grid), by Panjer's recursion (Panjer 1981, "Recursive evaluation of a family of compound
// distributions", ASTIN Bulletin 12): g_k = sum_j (a + b j / k) f_j g_{k-j} / (1 - a f_0).
// The values are kept scaled (g_0 = 1 at the start, rescaled before they overflow), and the
// scale's log returned in `log_scale`: P[S = k] = g[k] e^log_scale.
std::vector<double> compound(const Count& n, const std::vector<double>& f, std::size_t cells,
                             double& log_scale) {
    std::vector<double> g(cells, 0.0);
    const double f0 = f.empty() ? 0.0 : f[0];
    log_scale = n.log_pgf(f0);
    g[0] = 1.0;
    const double a = n.a(), b = n.b();
    const double norm = 1.0 / (1.0 - a * f0);
    constexpr double kBig = 1e250;
    const double log_big = std::log(kBig);
    for (std::size_t k = 1; k < cells; ++k) {
        const std::size_t top = std::min(k, f.size() - 1);
        double s = 0.0;
        const double bk = b / static_cast<double>(k);
        for (std::size_t j = 1; j <= top; ++j) {
            s += (a + bk * static_cast<double>(j)) * f[j] * g[k - j];
        }
        g[k] = s * norm;
        if (g[k] > kBig) {
            for (std::size_t i = 0; i <= k; ++i) g[i] /= kBig;
            log_scale += log_big;
        }
    }
    return g;
}

// The first cell whose cumulative probability reaches `confidence`, or `cells` when none does.
std::size_t quantile_cell(const std::vector<double>& g, double log_scale, double confidence) {
    // Compared on the scaled values: cum >= e^target, with target the confidence's log in
    // the scale's units. The scaled values stay below about 1e255 (e^590), so a target past
    // e^700 is out of reach; below e^-700 the threshold would underflow and the logs compare.
    const double target = std::log(confidence) - log_scale;
    if (target > 700.0) return g.size();
    const bool in_logs = target < -700.0;
    const double threshold = in_logs ? 0.0 : std::exp(target);
    double cum = 0.0;
    for (std::size_t k = 0; k < g.size(); ++k) {
        cum += g[k];
        if (in_logs ? (cum > 0 && std::log(cum) >= target) : cum >= threshold) return k;
    }
    return g.size();
}

// P[X in ((j - 1) h, j h]] for X exponential of rate `rate` conditioned on X < len, j >= 1
// (f[0] = 0): the time an interruption wastes of a phase of `len` hours it cuts short,
// rounded up to cells of h hours.
std::vector<double> cut_short(double rate, double len, double h, std::size_t limit) {
    // Cells beyond the grid are left out (their mass counts as a loss beyond it).
    const auto cells = static_cast<std::size_t>(std::min(std::ceil(len / h), static_cast<double>(limit)));
    std::vector<double> f(cells + 1, 0.0);
    const double all = -std::expm1(-rate * len);
    double prev = 0.0;  // P[X <= (j - 1) h] before conditioning
    for (std::size_t j = 1; j <= cells; ++j) {
        const double x = std::min(len, static_cast<double>(j) * h);
        const double cdf = -std::expm1(-rate * x);
        f[j] = std::max(0.0, cdf - prev) / all;
        prev = cdf;
    }
    return f;
}

// Drops the end of f once what remains is below `tail` (it then counts as beyond the grid).
void trim(std::vector<double>& f, double tail = kTail) {
    double dropped = 0.0;
    std::size_t n = f.size();
    while (n > 1 && dropped + f[n - 1] < tail) dropped += f[--n];
    f.resize(n);
}

// The chain of restarts after an interruption: n restarts cut short in a row have
// probability (1 - ok)^n, below `tail` past this many (the chain's cells stop there and the
// rest counts as a loss beyond the grid).
double chain_runs(double rate, double restart, double tail) {
    const double fail = -std::expm1(-rate * restart);
    return fail > 0 ? std::ceil(std::log(tail) / std::log(fail)) + 1.0 : 1.0;
}

// Multiply-adds the grid below needs with cells of h hours (an estimate from above).
double grid_work(double seg, double rate, double restart, double h, std::size_t cells,
                 double tail) {
    const double n = static_cast<double>(cells);
    const double lost = std::min(n, std::ceil(seg / h) + 1.0);
    const double r = std::ceil(restart / h);
    const double chain = restart > 0 ? std::min(n, chain_runs(rate, restart, tail) * (r + 1.0) + 1.0) : 1.0;
    const double one = std::min({n, static_cast<double>(kMaxLossCells), lost + chain + r});
    return chain * std::min(chain, r + 1.0) + lost * chain + n * one;
}

// The process on a grid of `cells` cells of h hours: the hours lost beyond the base (the
// lost work, the restarts, the restarts cut short), each rounded up to whole cells. Returns
// the cell at the confidence, or `cells` when the grid does not reach it.
std::size_t loss_quantile_cell(const Count& failures, double seg, double rate, double restart,
                               double confidence, double h, std::size_t cells, double tail) {
    // One interruption's loss: what it cuts short of a segment (nothing when seg is 0:
    // checkpoints without cost and so without end), a restart, and the restarts that are
    // themselves cut short before one completes (a geometric count of them).
    std::vector<double> lost = seg > 0 ? cut_short(rate, seg, h, cells) : std::vector<double>{1.0};
    std::vector<double> chain{1.0};
    const double shift_cells = std::ceil(restart / h * (1.0 - 1e-12));
    if (shift_cells >= static_cast<double>(cells)) return cells;  // one restart fills the grid
    const auto shift = static_cast<std::size_t>(shift_cells);
    if (restart > 0) {
        const double ok = std::exp(-rate * restart);
        const double span = chain_runs(rate, restart, tail) * (shift_cells + 1.0) + 1.0;
        const std::size_t chain_cells =
            static_cast<std::size_t>(std::min(span, static_cast<double>(cells)));
        double ls = 0.0;
        chain = compound(failures_count(1.0, ok), cut_short(rate, restart, h, chain_cells),
                         chain_cells, ls);
        for (double& x : chain) x *= std::exp(ls);
        trim(chain, tail);
    }
    std::vector<double> one(
        std::min({cells, kMaxLossCells, lost.size() + chain.size() - 1 + shift}), 0.0);
    for (std::size_t i = 0; i < lost.size(); ++i) {
        for (std::size_t j = 0; j < chain.size(); ++j) {
            const std::size_t k = i + j + shift;
            if (k >= one.size()) break;
            one[k] += lost[i] * chain[j];
        }
    }
    trim(one, tail);
    double ls = 0.0;
    const std::vector<double> total = compound(failures, one, cells, ls);
    return quantile_cell(total, ls, confidence);
}

// log((e^(a s) - 1) / a), the integral of e^(a x) over [0, s) (s > 0), without overflow.
double log_integral_exp(double a, double s) {
    const double as = a * s;
    if (as > 1.0) return as + std::log(-std::expm1(-as)) - std::log(a);
    if (as < -1.0) return std::log(-std::expm1(as)) - std::log(-a);
    if (as == 0.0) return std::log(s);
    return std::log(s) + std::log(std::expm1(as) / as);
}

// log E[e^(theta X)], X exponential of rate `rate` conditioned on X < len (len > 0).
double log_mgf_cut_short(double theta, double rate, double len) {
    return std::log(rate) - std::log(-std::expm1(-rate * len)) +
           log_integral_exp(theta - rate, len);
}

// Chernoff's bound (P[L > t] <= e^(-theta t) E[e^(theta L)] for every theta > 0) on the
// p-quantile of L = Z_1 + ... + Z_N, N the count `n`, Z_i independent with the moment
// generating function e^log_mz (nan outside its domain): t(theta) = (log E[e^(theta L)] -
// log(1 - p)) / theta, least over theta (one minimum: the numerator is convex and 0 at 0).
// Exact arithmetic of the process, no grid: tight when many interruptions make the sum
// nearly normal, where a grid is coarse. inf when no theta is usable.
template <class LogMgf>
double chernoff_quantile(const Count& n, LogMgf log_mz, double confidence) {
    auto log_ml = [&](double theta) {
        const double lz = log_mz(theta);
        if (std::isnan(lz)) return lz;
        if (n.poisson) {
            const double e = std::expm1(lz);
            return std::isfinite(e) ? n.mu * e : std::numeric_limits<double>::quiet_NaN();
        }
        const double y = (1.0 - n.q) * std::exp(lz);
        if (!(y < 1)) return std::numeric_limits<double>::quiet_NaN();
        return n.m * (std::log(n.q) - std::log1p(-y));
    };
    const double c = -std::log1p(-confidence);
    auto bound = [&](double theta) {
        const double l = log_ml(theta);
        return std::isfinite(l) ? (l + c) / theta : kInf;
    };
    // The domain's end: double up from a small theta, then bisect it.
    const double lo = 1e-12;
    double hi = lo;
    for (int i = 0; i < 200 && std::isfinite(log_ml(hi * 2)); ++i) hi *= 2;
    if (!std::isfinite(log_ml(hi))) return kInf;
    double top = hi * 2;
    for (int i = 0; i < 60; ++i) {
        const double mid = 0.5 * (hi + top);
        if (std::isfinite(log_ml(mid))) hi = mid;
        else top = mid;
    }
    // Golden-section search for the least bound over [lo, hi], in log theta.
    double a = std::log(lo), b = std::log(hi);
    const double g = 0.5 * (std::sqrt(5.0) - 1.0);
    double x1 = b - g * (b - a), x2 = a + g * (b - a);
    double f1 = bound(std::exp(x1)), f2 = bound(std::exp(x2));
    for (int i = 0; i < 80; ++i) {
        if (f1 <= f2) {
            b = x2; x2 = x1; f2 = f1; x1 = b - g * (b - a); f1 = bound(std::exp(x1));
        } else {
            a = x1; x1 = x2; f1 = f2; x2 = a + g * (b - a); f2 = bound(std::exp(x2));
        }
    }
    return std::min({f1, f2, bound(std::exp(a)), bound(std::exp(b))});
}

// Chernoff's bound on the quantile of the hours lost (one interruption's loss: what it cut
// short of a segment, a restart, and a geometric count of restarts cut short).
double chernoff_loss(const Count& failures, double seg, double rate, double restart,
                     double confidence) {
    const double ok = std::exp(-rate * restart);
    return chernoff_quantile(failures, [&](double theta) {
        double v = theta * restart;
        if (seg > 0) v += log_mgf_cut_short(theta, rate, seg);
        if (restart > 0 && ok < 1) {
            const double y = (1.0 - ok) * std::exp(log_mgf_cut_short(theta, rate, restart));
            if (!(y < 1)) return std::numeric_limits<double>::quiet_NaN();
            v += std::log(ok) - std::log1p(-y);
        }
        return v;
    }, confidence);
}

// Chernoff's bound on the quantile of the number of interruptions (each failure and the
// geometric count of restarts it cuts short).
double chernoff_count(const Count& failures, double ok, double confidence) {
    return chernoff_quantile(failures, [&](double theta) {
        const double y = (1.0 - ok) * std::exp(theta);
        if (!(y < 1)) return std::numeric_limits<double>::quiet_NaN();
        return theta + std::log(ok) - std::log1p(-y);
    }, confidence);
}

// The worst-case fixed point (each interruption wastes a whole segment and a restart): an
// upper bound on the quantile that needs no distribution. inf when it has none.
double worst_case_hours(double base, double rate, double per, double confidence) {
    if (!(rate * per < 1)) return kInf;
    std::int64_t k = 0;
    for (int it = 0; it < 10000; ++it) {
        const double t = base + static_cast<double>(k) * per;
        const std::int64_t q = poisson_quantile(rate * t, confidence);
        if (q < 0 || !std::isfinite(t)) return kInf;
        if (q <= k) return t;
        k = q;
    }
    return kInf;
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

namespace {

// The p-quantile of the number of interruptions: the segments' failures, each followed by a
// geometric count of failed restarts (restarts cut short by another interruption). Where
// the grid does not reach it, the lesser of Markov's and Chernoff's bounds on it.
std::int64_t interruptions_quantile(const Count& failures, double ok, double confidence) {
    const double mean = failures.mean() / ok;
    // Markov: the quantile is at most mean / (1 - confidence).
    const double markov = std::floor(mean / (1.0 - confidence)) + 1.0;
    const double support = std::min(markov + 2.0, static_cast<double>(kMaxLossCells));
    std::vector<double> f(static_cast<std::size_t>(support), 0.0);
    double p = ok;
    for (std::size_t j = 1; j < f.size(); ++j, p *= 1.0 - ok) f[j] = p;
    trim(f);
    const double reach = std::min({markov + 2.0, static_cast<double>(kMaxCells),
                                   std::max(16.0, kCountBudget / static_cast<double>(f.size()))});
    const auto cells = static_cast<std::size_t>(reach);
    double ls = 0.0;
    const std::vector<double> g = compound(failures, f, cells, ls);
    const std::size_t k = quantile_cell(g, ls, confidence);
    if (k < cells) return static_cast<std::int64_t>(k);
    const double bound = std::min(markov, std::floor(chernoff_count(failures, ok, confidence)));
    return bound < 9e18 ? static_cast<std::int64_t>(bound) : -1;
}

SpotOutcome unbounded(SpotOutcome out) {
    out.bounded = false;
    out.hours_at_confidence = kInf;
    out.interruptions_at_confidence = -1;
    return out;
}

}  // namespace

SpotOutcome spot_outcome(double work_hours, double rate, double checkpoint, double restart,
                         double confidence) {
    SpotOutcome out;
    const double w = std::isnan(work_hours) ? 0.0 : std::max(0.0, work_hours);
    out.expected_hours = w;
    out.hours_at_confidence = w;
    if (!(rate > 0) || w == 0) return out;
    const double c = std::max(0.0, checkpoint), r = std::max(0.0, restart);
    if (!std::isfinite(w) || !std::isfinite(rate)) {
        out.expected_hours = kInf;
        out.interruptions_expected = kInf;
        return unbounded(out);
    }
    // The job checkpoints every tau hours of work: the work in m equal segments, m the
    // least count whose segments are no longer than the optimal interval (at most the work).
    const double m = c > 0 ? std::max(1.0, std::ceil(w / optimal_interval_hours(rate, c) *
                                                     (1.0 - 1e-12)))
                           : 0.0;
    const double tau = c > 0 ? w / m : 0.0;
    out.interval_hours = tau;
    out.expected_hours = w * spot_factor_at(rate, c, r, tau);
    out.interruptions_expected = rate * out.expected_hours;
    if (!std::isfinite(m) || !std::isfinite(tau) || !std::isfinite(out.expected_hours)) {
        return unbounded(out);
    }

    // The process, as a sum: m segments of tau hours of work, each ending with a checkpoint
    // write of c hours (the last one the final save), so the base W + m c; a segment is cut
    // short by each interruption that falls in it (a geometric count of failures before it
    // completes: it needs e^(-rate seg) luck); each failure loses what it cut short, a
    // restart of r hours, and the restarts that are cut short themselves. Without a
    // checkpoint cost (c = 0) nothing is lost but restarts, and the interruptions over the W
    // hours of work are a Poisson count.
    double base = w, seg = 0.0;
    Count failures;
    if (c > 0) {
        seg = tau + c;
        if (!(rate * (seg + r) <= kMaxExponent)) return unbounded(out);
        base = w + m * c;
        failures = failures_count(m, std::exp(-rate * seg));
    } else {
        if (!(rate * r <= kMaxExponent)) return unbounded(out);
        failures = poisson_count(rate * w);
    }
    const double ok = std::exp(-rate * r);
    if (!(confidence > 0)) {
        out.hours_at_confidence = base;
        out.interruptions_at_confidence = 0;
        return out;
    }
    if (!(confidence < 1) || !(failures.mean() / ok <= kMaxInterruptions)) {
        return unbounded(out);
    }
    const std::int64_t k_count = interruptions_quantile(failures, ok, confidence);
    out.interruptions_at_confidence = k_count;
    if (r == 0 && seg == 0) {  // nothing is ever lost
        out.hours_at_confidence = w;
        return out;
    }
    // A range known to hold the quantile of the loss: the least of the worst-case fixed
    // point (each interruption wastes a whole segment and a restart, their number the Poisson
    // quantile over that time), Markov's inequality on the loss's expectation and
    // Chernoff's bound on the process itself.
    const double worst = worst_case_hours(base, rate, r + std::max(seg, r), confidence) - base;
    const double markov = std::max(0.0, out.expected_hours - base) / (1.0 - confidence);
    const double chern = chernoff_loss(failures, seg, rate, r, confidence);
    double upper = std::min({worst, markov, chern});
    if (!std::isfinite(upper)) return unbounded(out);
    // The coarse pass (only where Chernoff's bound, a close range already, is not the
    // least), then the fine one over what the range has become. Each rounds every loss up
    // to its cell, so its quantile is an upper bound on the process's own. A restart longer
    // than a cell is a whole number of cells (only the lost work and the restarts cut short
    // are rounded), and a grid that would cost more than its budget is made coarser:
    // looser, never below the process's quantile. The tails of one interruption's loss
    // below `tail` are dropped (counted as beyond the grid): at most a millionth of
    // 1 - confidence over all the interruptions.
    const double tail = std::max(kTail, 1e-6 * (1.0 - confidence) / (1.0 + failures.mean() / ok));
    const double per = static_cast<double>(std::max<std::int64_t>(k_count, 0) + 1);
    for (int pass = upper == chern ? 1 : 0; pass < 2 && upper > 0; ++pass) {
        double want = pass == 0 ? static_cast<double>(kCoarseCells)
                                : std::clamp(per * kCellsPerInterruption,
                                             static_cast<double>(kMinCells),
                                             static_cast<double>(kMaxCells));
        for (;;) {
            double h = upper / (want - 1.0);
            if (r >= h) h = r / std::floor(r / h);
            const double n = std::ceil(upper / h * (1.0 - 1e-12)) + 1.0;
            const auto cells = static_cast<std::size_t>(std::min(n, static_cast<double>(kMaxCells)));
            if (want > 16 && grid_work(seg, rate, r, h, cells, tail) >
                                 (pass == 0 ? kCoarseBudget : kFineBudget)) {
                want = std::floor(want * 0.8);
                continue;
            }
            const std::size_t k =
                loss_quantile_cell(failures, seg, rate, r, confidence, h, cells, tail);
            if (k < cells) upper = std::min(upper, static_cast<double>(k) * h);
            break;
        }
    }
    out.hours_at_confidence = base + upper;
    return out;
}

double hours_at_confidence_lb(double work_hours, double rate, double checkpoint,
                              double restart, double confidence, double cap) {
    const double w = std::isnan(work_hours) ? 0.0 : std::max(0.0, work_hours);
    if (!(rate > 0) || w == 0) return w;
    const double c = std::max(0.0, checkpoint), r = std::max(0.0, restart);
    // Every plan writes at least one checkpoint (the final one) and needs at least W hours of
    // work and checkpoint writes; the interruptions that fall in the first W of those hours
    // come before the job ends, are a Poisson count of mean rate W whatever the interval,
    // and each costs at least a whole restart. So the time is at least W + c + r N with
    // N ~ Poisson(rate W), and its quantile at least W + c + r k, k N's quantile.
    const double base = w + c;
    if (!(confidence > 0) || base > cap) return base;
    const std::int64_t k = poisson_quantile(rate * w, confidence);
    if (k < 0) return kInf;  // spot_outcome has no finite time either
    return k == 0 ? base : base + r * static_cast<double>(k);
}

}  // namespace espresso
