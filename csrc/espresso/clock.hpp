// Wall-clock limits and a monitor the caller can read while a search runs. Pure C++.
//
// Every loop of the native search that can spend time (the allocator's tree, the placer's
// branch and bound and its dynamic programmes, the per-combination tables) asks a Stopwatch
// whether to stop; it is cheap (a clock read every `stride` calls), so a search stops within
// a small constant of its limit on any input.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>

namespace espresso {

using Clock = std::chrono::steady_clock;

// Shared with the caller (Python polls it from another thread): progress figures written
// with relaxed atomics, and a flag that asks the search to stop as if its time were up.
struct SearchMonitor {
    std::atomic<double> best{std::numeric_limits<double>::infinity()};  // objective so far
    std::atomic<double> lower_bound{0.0};   // smallest bound of a node taken from the tree
    std::atomic<std::int64_t> nodes_expanded{0};
    std::atomic<std::int64_t> leaves_placed{0};
    std::atomic<bool> cancel{false};
};

// What stops a search besides its own deadline (either may be null): the caller's cancel
// (the monitor's flag, shared by every search of a call) and a deadline of this one search that
// the caller may move while it runs (its crew's, crew.hpp: the scheduler's share of the time),
// asked through `passed`.
struct Halt {
    const std::atomic<bool>* cancel = nullptr;
    bool (*passed)(void* ctx, Clock::time_point t) = nullptr;
    void* ctx = nullptr;
    bool set() const { return cancel != nullptr || passed != nullptr; }
    bool now(Clock::time_point t) const {
        return (cancel != nullptr && cancel->load(std::memory_order_relaxed)) ||
               (passed != nullptr && passed(ctx, t));
    }
};

// Thrown inside the placer's recursions when the limit passes; caught at its top level.
struct TimeUp {};

class Stopwatch {
public:
    Stopwatch() = default;
    // `deadline`: Clock::time_point::max() for none.
    Stopwatch(Clock::time_point deadline, Halt halt) : deadline_(deadline), halt_(halt) {}

    static Clock::time_point after(double seconds) {
        if (!(seconds > 0)) return Clock::time_point::max();
        const auto now = Clock::now();
        const double room = std::chrono::duration<double>(Clock::time_point::max() - now).count();
        if (seconds >= room / 2) return Clock::time_point::max();
        return now + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(seconds));
    }

    bool limited() const { return deadline_ != Clock::time_point::max() || halt_.set(); }

    // True once the deadline has passed or the caller cancelled; reads the clock every
    // `stride` calls only (and always once it has said yes).
    bool expired(std::int64_t stride = 256) {
        if (expired_) return true;
        if (!limited()) return false;
        if (++calls_ % stride != 0) return false;
        return check_now();
    }

    bool check_now() {
        if (expired_) return true;
        const auto t = Clock::now();
        if (halt_.now(t) || (deadline_ != Clock::time_point::max() && t >= deadline_)) expired_ = true;
        return expired_;
    }

private:
    Clock::time_point deadline_ = Clock::time_point::max();
    Halt halt_;
    std::int64_t calls_ = 0;
    bool expired_ = false;
};

}  // namespace espresso
