// The parallel best-first branch and bound the allocator runs on (docs/search.md, "The
// engine").
//
// A frontier of nodes ordered by their lower bounds, shared by the workers under one mutex. A
// worker takes the node with the least bound and cuts it when the bound is above the k-th best
// plan so far (the threshold, which plans of searches running beside this one lower too); a
// node whose bound was computed cheaply is tightened first and goes back to the frontier if
// its bound rose; any other is expanded outside the lock into children and complete plans.
// When the frontier is full, a node's subtree is finished depth-first (a dive), so memory
// stays bounded. Stopped by the time limit or a cancel, the search keeps the least bound still
// open, so it always returns a lower bound and a gap.
//
// The engine knows nothing of pipelines or GPUs. A Problem provides
//   using Node   (with `double lb` and `std::int64_t seq`, which the engine sets),
//   using Order  (a strict weak order: the node it ranks last comes out of the frontier first),
//   static key(const SearchPlan&)   a total order on plans, so the answer never depends on
//                                   timing,
//   bool lazy(const Node&) const,   a node whose bound may still rise, and
//   double tighten(Node&, double thr) const,   its tightened bound,
//   void expand(const Node&, double thr, std::vector<Node>& children, Local&),
//                                   a node's children and the plans it completes, its work
//                                   counted in Local.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <queue>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "espresso/clock.hpp"
#include "espresso/search.hpp"

namespace espresso::search_detail {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSlack = 1e-9;  // relative: bounds never prune plans within rounding of a tie

// What one expansion found and did, merged into the search under the lock.
struct Local {
    Local(Clock::time_point deadline, Halt halt) : sw(deadline, halt) {}
    SearchStats s;
    std::vector<SearchPlan> plans;
    double open_lb = kInf;
    bool incomplete = false;
    Stopwatch sw;  // this thread's view of the limit
};

template <class Problem>
class BestFirst {
public:
    using Node = typename Problem::Node;
    using Order = typename Problem::Order;

    BestFirst(const SearchOptions& opt, Problem& problem) : opt_(opt), problem_(problem) {}

    // The limits, and the incumbent given (or shared by searches beside this one).
    void start(Clock::time_point deadline, Halt halt) {
        deadline_ = deadline;
        halt_ = halt;
        threshold_.store(std::min(opt_.incumbent, shared_value()));
    }

    // The k-th best objective so far, for work that can cut itself short (the placer).
    const std::atomic<double>* incumbent() const { return &threshold_; }

    SearchStats& stats() { return stats_; }

    // Out of time before the first node: nothing is known about the rest (lower bound 0).
    void give_up() {
        stop_ = true;
        stats_.timed_out = true;
        open_lb_ = 0.0;
    }

    // A node into the frontier (under the lock, or before the workers start).
    void push(Node&& n) {
        n.seq = seq_++;
        queue_.push(std::move(n));
        stats_.frontier_peak = std::max(stats_.frontier_peak, static_cast<std::int64_t>(queue_.size()));
    }

    // Runs opt.threads workers until the frontier is empty or the search is stopped.
    SearchResult run(std::chrono::steady_clock::time_point t_start) {
        const std::int64_t nthreads = std::max<std::int64_t>(1, opt_.threads);
        // This thread is one worker; the others are started here. When the system cannot
        // start one (a memory or process limit), the search goes on with those it has:
        // stats_.threads says how many ran.
        std::vector<std::thread> pool;
        pool.reserve(static_cast<std::size_t>(nthreads - 1));
        for (std::int64_t i = 1; i < nthreads; ++i) {
            try {
                pool.emplace_back([this] { worker(); });
            } catch (const std::system_error&) {
                break;
            }
        }
        stats_.threads = static_cast<std::int64_t>(pool.size()) + 1;
        // Threads of the caller may join while the workers run (a crew: the scheduler's
        // workers whose own queue is empty); the frontier outlives every one of them.
        if (opt_.crew) opt_.crew->open([this] { help(); });
        worker();
        if (opt_.crew) opt_.crew->close();
        for (auto& th : pool) th.join();
        SearchResult out;
        out.plans = best_;
        stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        if (first_plan_at_ != Clock::time_point::max()) {
            stats_.first_plan_s = std::max(0.0, std::chrono::duration<double>(first_plan_at_ - t_start).count());
        }
        if (stop_) {
            stats_.complete = false;
            if (!queue_.empty()) open_lb_ = std::min(open_lb_, queue_.top().lb);
        }
        const double best = best_.empty() ? kInf : best_.front().objective;
        stats_.lower_bound = stats_.complete ? best : std::min(best, open_lb_);
        publish(best, stats_.lower_bound);
        out.stats = stats_;
        return out;
    }

private:
    double threshold() const {  // the k-th best objective so far (under the lock)
        const double given = std::min(opt_.incumbent, shared_value());
        if (static_cast<std::int64_t>(best_.size()) < opt_.top_k) return given;
        return std::min(given, best_.back().objective);
    }

    // What searches running beside this one have found (top_k = 1 only).
    double shared_value() const {
        return opt_.shared && opt_.top_k == 1 ? opt_.shared->value.load() : kInf;
    }

    bool beyond(double lb, double thr) const {
        return opt_.prune_cost && lb > thr * (1 - opt_.gap) * (1 + kSlack);
    }

    bool out_of_time() const {
        const auto t = Clock::now();
        return halt_.now(t) || (deadline_ != Clock::time_point::max() && t >= deadline_);
    }

    // The smallest bound still open (under the lock): the frontier, the nodes being
    // processed, and what incomplete placements left. Shown as progress.
    void report_progress() {
        if (!opt_.monitor) return;
        double lb = open_lb_;
        if (!queue_.empty()) lb = std::min(lb, queue_.top().lb);
        if (!inflight_.empty()) lb = std::min(lb, *inflight_.begin());
        const double best = best_.empty() ? kInf : best_.front().objective;
        publish(best, std::isfinite(lb) ? std::min(lb, best) : best);
    }

    void publish(double best, double lower_bound) const {
        if (!opt_.monitor) return;
        SearchMonitor& m = *opt_.monitor;
        m.best.store(best, std::memory_order_relaxed);
        m.lower_bound.store(lower_bound, std::memory_order_relaxed);
        m.nodes_expanded.store(stats_.nodes_expanded, std::memory_order_relaxed);
        m.leaves_placed.store(stats_.leaves_placed, std::memory_order_relaxed);
    }

    // The bounds of nodes being worked on count in the progress figure; kept only when
    // someone watches (a monitor), off the search's own path otherwise.
    std::multiset<double>::iterator track(double lb) {
        return opt_.monitor ? inflight_.insert(lb) : inflight_.end();
    }

    void untrack(std::multiset<double>::iterator it) {
        if (it != inflight_.end()) inflight_.erase(it);
    }

    // Depth-first branch and bound below `node` (children in bound order), used when the
    // best-first frontier is full: memory stays bounded and the search stays exact.
    void dive(const Node& node, std::unique_lock<std::mutex>& lock) {
        const double thr = std::min(threshold_.load(), shared_value());
        if (beyond(node.lb, thr)) {
            ++stats_.pruned_cost;
            return;
        }
        if (stop_ || out_of_time()) {
            if (!stop_) stats_.timed_out = true;
            stop_ = true;
            open_lb_ = std::min(open_lb_, node.lb);
            return;
        }
        ++stats_.nodes_expanded;
        std::vector<Node> children;
        Local local(deadline_, halt_);
        const auto mark = track(node.lb);
        report_progress();
        lock.unlock();
        problem_.expand(node, thr, children, local);
        lock.lock();
        untrack(mark);
        merge(local);
        std::sort(children.begin(), children.end(),
                  [](const Node& a, const Node& b) { return Order()(b, a); });
        for (const Node& ch : children) dive(ch, lock);
    }

    void worker() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || !queue_.empty() || busy_ == 0; });
            if (stop_ || (queue_.empty() && busy_ == 0)) break;
            if (out_of_time()) {
                stop_ = true;
                stats_.timed_out = true;
                break;
            }
            Node node = queue_.top();
            queue_.pop();
            const double thr = threshold();
            if (thr < threshold_.load()) threshold_.store(thr);  // another search's plan
            if (beyond(node.lb, thr)) {
                ++stats_.pruned_cost;
                continue;
            }
            if (problem_.lazy(node)) {
                // Tighten the bound now; if it rose, the node goes back to the frontier.
                ++busy_;
                const auto mark = track(node.lb);
                lock.unlock();
                const double lb = problem_.tighten(node, thr);
                lock.lock();
                untrack(mark);
                --busy_;
                if (!std::isfinite(lb)) {
                    ++stats_.pruned_deadline;  // no completion can meet the deadline or budget
                    cv_.notify_all();
                    continue;
                }
                if (lb > node.lb * (1 + 1e-9)) {
                    node.lb = lb;
                    if (beyond(node.lb, threshold())) ++stats_.pruned_cost;
                    else push(std::move(node));
                    cv_.notify_all();
                    continue;
                }
                node.lb = std::max(node.lb, lb);
            }
            if (static_cast<std::int64_t>(queue_.size()) >= opt_.max_frontier) {
                // Frontier full: finish this subtree depth-first instead of growing it.
                ++busy_;
                ++stats_.dives;
                dive(node, lock);
                --busy_;
                cv_.notify_all();
                continue;
            }
            ++busy_;
            ++stats_.nodes_expanded;
            const auto mark = track(node.lb);
            report_progress();
            lock.unlock();
            std::vector<Node> children;
            Local local(deadline_, halt_);
            problem_.expand(node, thr, children, local);
            lock.lock();
            untrack(mark);
            merge(local);
            for (Node& ch : children) {
                if (beyond(ch.lb, threshold())) {
                    ++stats_.pruned_cost;
                    continue;
                }
                push(std::move(ch));
            }
            --busy_;
            cv_.notify_all();
        }
        cv_.notify_all();
    }

    // A helper from the crew: one more worker for as long as there is work.
    void help() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            ++stats_.threads;
        }
        opt_.crew->count_helper();
        worker();
    }

    void merge(const Local& l) {
        stats_.nodes_generated += l.s.nodes_generated;
        stats_.pruned_cost += l.s.pruned_cost;
        stats_.pruned_deadline += l.s.pruned_deadline;
        stats_.pruned_memory += l.s.pruned_memory;
        stats_.pruned_availability += l.s.pruned_availability;
        stats_.pruned_dominance += l.s.pruned_dominance;
        stats_.leaves_placed += l.s.leaves_placed;
        stats_.placer_nodes += l.s.placer_nodes;
        stats_.placer_leaves += l.s.placer_leaves;
        open_lb_ = std::min(open_lb_, l.open_lb);
        if (l.incomplete) stats_.complete = false;
        if (!stop_ && out_of_time()) {
            stop_ = true;
            stats_.timed_out = true;
        }
        for (const SearchPlan& p : l.plans) offer(p);
        report_progress();
    }

    void offer(const SearchPlan& p) {
        const auto k = Problem::key(p);
        auto pos = std::find_if(best_.begin(), best_.end(),
                                [&](const SearchPlan& q) { return k < Problem::key(q); });
        best_.insert(pos, p);
        if (first_plan_at_ == Clock::time_point::max()) first_plan_at_ = Clock::now();
        if (static_cast<std::int64_t>(best_.size()) > opt_.top_k) best_.pop_back();
        threshold_.store(threshold());
        if (opt_.shared && opt_.share_plans && opt_.top_k == 1) {
            opt_.shared->offer(best_.front().objective);
        }
    }

    const SearchOptions& opt_;
    Problem& problem_;
    std::priority_queue<Node, std::vector<Node>, Order> queue_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::int64_t busy_ = 0, seq_ = 0;
    bool stop_ = false;
    double open_lb_ = kInf;
    std::atomic<double> threshold_{kInf};  // set from opt_.incumbent in start()
    std::vector<SearchPlan> best_;
    SearchStats stats_;
    Clock::time_point deadline_ = Clock::time_point::max();
    Clock::time_point first_plan_at_ = Clock::time_point::max();  // when a plan first came in
    Halt halt_;
    std::multiset<double> inflight_;  // bounds of the nodes being processed
};

}  // namespace espresso::search_detail
