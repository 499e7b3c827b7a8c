// A running search's crew: threads of the caller that join it while it runs, and a flag that
// asks it to yield. Pure C++.
//
// The scheduler of a catalog's subproblems (espresso/scheduler.py) runs one search per worker
// thread. A worker whose queue is empty would sit idle while another worker's search, often
// the hardest subproblem, still runs on one thread: with a crew it joins that search instead
// (`help()`), taking nodes from the same frontier as one more worker, in each of the search's
// passes, until the search ends. The engine opens the crew while its workers run and closes
// it (waiting for every helper to leave) before its frontier goes away. The crew's deadline
// (`stop_after`) stops the search as its time limit would and can be moved while it runs (a
// share of the time a caller can still extend).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>

#include "espresso/clock.hpp"

namespace espresso {

class Crew {
public:
    // ---------------------------------------------------------------- the caller's side
    // Works in the search until it ends (returns at once if it has ended).
    void help() {
        std::unique_lock<std::mutex> lock(mu_);
        std::uint64_t seen = 0;  // the last opening joined: each pass's engine once
        for (;;) {
            cv_.wait(lock, [&] { return done_ || (work_ && generation_ != seen); });
            if (done_) return;
            seen = generation_;
            const std::function<void()> work = work_;
            ++inside_;
            lock.unlock();
            work();
            lock.lock();
            --inside_;
            cv_.notify_all();
        }
    }

    // The search stops (as at its time limit) `seconds` from now, or at its own limit if that
    // comes first; `stop_after(inf)` lets it run to its own limit again (before it stopped).
    void stop_after(double seconds) {
        if (!(seconds > 0)) {  // (NaN too)
            yield_now();
            return;
        }
        until_.store(Stopwatch::after(seconds).time_since_epoch().count(), std::memory_order_relaxed);
    }
    void yield_now() { until_.store(std::numeric_limits<Clock::rep>::min(), std::memory_order_relaxed); }
    const std::atomic<Clock::rep>* until() const { return &until_; }
    std::int64_t helpers() const { return joined_.load(std::memory_order_relaxed); }

    // ---------------------------------------------------------------- the search's side
    // An engine's workers run: helpers may join with `work` (one more worker).
    void open(std::function<void()> work) {
        std::lock_guard<std::mutex> lock(mu_);
        work_ = std::move(work);
        ++generation_;
        cv_.notify_all();
    }

    // No more helpers for this engine; returns once every helper inside has left.
    void close() {
        std::unique_lock<std::mutex> lock(mu_);
        work_ = nullptr;
        cv_.wait(lock, [&] { return inside_ == 0; });
    }

    // The search is over: waiting helpers return.
    void finish() {
        std::lock_guard<std::mutex> lock(mu_);
        work_ = nullptr;
        done_ = true;
        cv_.notify_all();
    }

    void count_helper() { joined_.fetch_add(1, std::memory_order_relaxed); }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::function<void()> work_;
    std::uint64_t generation_ = 0;
    std::int64_t inside_ = 0;
    bool done_ = false;
    std::atomic<Clock::rep> until_{std::numeric_limits<Clock::rep>::max()};
    std::atomic<std::int64_t> joined_{0};
};

}  // namespace espresso
