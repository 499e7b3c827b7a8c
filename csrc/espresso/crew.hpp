// Searches side by side: the incumbent they share, and a running search's crew (threads of
// the caller that join it while it runs, and a deadline the caller moves). Pure C++.
//
// The scheduler of a catalog's subproblems (espresso/scheduler.py) runs one search per worker
// thread. A worker whose queue is empty would sit idle while another worker's search, often
// the hardest subproblem, still runs on one thread: with a crew it joins that search instead
// (`help()`), taking nodes from the same frontier as one more worker, in each of the search's
// passes, until the search ends. The engine opens the crew while its workers run and closes
// it (waiting for every helper to leave) before its frontier goes away. The crew's deadline
// stops the search as its time limit would and can be moved while it runs: the scheduler gives
// a subproblem its share of the time with it (`share`), renewed while no better plan has been
// found since the search began (cut then, the search would start over under the same
// incumbent), and lifts it (`stop_after(inf)`) once no other subproblem waits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>

#include "espresso/clock.hpp"

namespace espresso {

// The best objective of searches that run side by side (one per network domain, say):
// each takes it as an incumbent and lowers it with its own plans. Only with top_k = 1.
struct SharedIncumbent {
    std::atomic<double> value{std::numeric_limits<double>::infinity()};
    void offer(double v) {
        double cur = value.load();
        while (v < cur && !value.compare_exchange_weak(cur, v)) {
        }
    }
};

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
        renew_s_.store(0.0, std::memory_order_relaxed);
        until_.store(Stopwatch::after(seconds).time_since_epoch().count(), std::memory_order_relaxed);
    }
    // A share of the time: the search stops `seconds` from now unless no better plan has been
    // found since it began (the shared incumbent it was armed with has not fallen): then a
    // restart would search the same nodes again, and the share is renewed instead.
    void share(double seconds) {
        if (!(seconds > 0)) {
            yield_now();
            return;
        }
        renew_s_.store(seconds, std::memory_order_relaxed);
        until_.store(Stopwatch::after(seconds).time_since_epoch().count(), std::memory_order_relaxed);
    }
    void yield_now() { until_.store(kNow, std::memory_order_relaxed); }

    // ---------------------------------------------------------------- the search's side
    // Before its engines run: the incumbent the search began under, and where later plans
    // (its own and other searches') lower it.
    void arm(const SharedIncumbent* shared, double incumbent) {
        shared_ = shared;
        baseline_ = incumbent;
    }

    // Whether the crew's deadline has passed at `t` (renewing a share that is still of use).
    bool passed(Clock::time_point t) {
        const Clock::rep now = t.time_since_epoch().count();
        Clock::rep until = until_.load(std::memory_order_relaxed);
        if (now < until) return false;
        if (until == kNow) return true;
        const double renew = renew_s_.load(std::memory_order_relaxed);
        if (renew > 0 && shared_ != nullptr && !(shared_->value.load() < baseline_ * (1 - 1e-9))) {
            // (another thread may have moved the deadline meanwhile: then that one holds)
            until_.compare_exchange_strong(until, Stopwatch::after(renew).time_since_epoch().count());
            return false;
        }
        return true;
    }
    static bool passed_at(void* crew, Clock::time_point t) { return static_cast<Crew*>(crew)->passed(t); }

    // The caller's stop flags with this crew's deadline.
    Halt halt(const std::atomic<bool>* cancel) { return Halt{cancel, &Crew::passed_at, this}; }

    std::int64_t helpers() const { return joined_.load(std::memory_order_relaxed); }

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
    static constexpr Clock::rep kNow = std::numeric_limits<Clock::rep>::min();
    std::atomic<Clock::rep> until_{std::numeric_limits<Clock::rep>::max()};
    std::atomic<double> renew_s_{0.0};
    const SharedIncumbent* shared_ = nullptr;
    double baseline_ = std::numeric_limits<double>::infinity();
    std::atomic<std::int64_t> joined_{0};
};

}  // namespace espresso
