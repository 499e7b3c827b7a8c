// Randomized native check of the core's boundary: feeds estimate() and
// simulate_pipeline() with arbitrary, often hostile, inputs. Every call must either throw
// std::invalid_argument or return finite numbers that satisfy basic invariants; crashes,
// hangs and sanitizer reports are failures. Build with -DESPRESSO_NATIVE_TESTS=ON, ideally
// under -fsanitize=address,undefined, and run: espresso_fuzz [iterations] [seed].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "espresso/cost_model.hpp"
#include "espresso/pipeline_sim.hpp"
#include "espresso/search.hpp"
#include "espresso/spot.hpp"

using namespace espresso;

namespace {

std::mt19937_64 rng;
bool hostile = true;  // half the iterations draw only plausible values

double any_double() {
    static const double specials[] = {0.0, -1.0, 1e-300, 1e300, -0.0,
                                      std::numeric_limits<double>::infinity(),
                                      std::numeric_limits<double>::quiet_NaN(),
                                      std::numeric_limits<double>::max()};
    if (!hostile) return 0.05 + static_cast<double>(rng() % 100000) / 100.0;
    if (rng() % 8 == 0) return specials[rng() % 8];
    return std::ldexp(static_cast<double>(rng() % 1000000) / 1000.0,
                      static_cast<int>(rng() % 40) - 20);
}

std::int64_t any_int(std::int64_t typical_max) {
    static const std::int64_t specials[] = {0, -1, 1, std::numeric_limits<std::int64_t>::max(),
                                            std::numeric_limits<std::int64_t>::min(), 1 << 30};
    if (hostile && rng() % 10 == 0) return specials[rng() % 6];
    return 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(typical_max));
}

bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0; }

void fail(const char* what, std::uint64_t i) {
    std::fprintf(stderr, "espresso_fuzz: invariant '%s' broken at iteration %llu\n", what,
                 static_cast<unsigned long long>(i));
    std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    const std::uint64_t iters = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20000;
    rng.seed(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
    std::uint64_t ok = 0, refused = 0, searched = 0, planned = 0;
    for (std::uint64_t i = 0; i < iters; ++i) {
        hostile = i % 2 == 0;
        ModelDims m;
        m.num_layers = any_int(96);
        m.num_heads = any_int(64);
        if (__builtin_mul_overflow(m.num_heads, any_int(128), &m.hidden_size)) m.hidden_size = -1;
        m.num_kv_heads = rng() % 2 ? m.num_heads : (hostile ? any_int(8) : 1);
        m.ffn_hidden_size = any_int(30000);
        m.vocab_size = any_int(150000);
        m.gated_mlp = rng() % 2;
        m.tied_embeddings = rng() % 2;
        m.position_embeddings = rng() % 3 ? 0 : any_int(4096);
        m.layernorm = rng() % 2;
        m.linear_bias = rng() % 2;
        std::vector<GpuSpec> gpus(1 + rng() % 4);
        for (auto& g : gpus) {
            g.memory_gb = any_double();
            g.tflops = any_double();
            if (rng() % 2) g.fp8_tflops = any_double();
            g.mem_bandwidth_gbs = any_double();
            g.intra_node_gbs = any_double();
            g.inter_node_gbs = any_double();
            g.efficiency = rng() % 2 ? 0.0 : (hostile ? any_double() : 0.3);
            g.memory_bytes = rng() % 3 ? 0.0 : (hostile ? any_double() : 8e10);
            g.price_per_hour = any_double();
            g.count = any_int(512);
            g.gpus_per_node = any_int(8);
            // Spot rows now and then: interruptions per instance-hour and a recovery time.
            if (rng() % 3 == 0) {
                g.interruptions_per_hour = hostile ? any_double() : 0.001 * static_cast<double>(rng() % 500);
                g.recovery_hours = hostile ? any_double() : 0.01 * static_cast<double>(rng() % 100);
            }
        }
        CostParams p;
        if (hostile && rng() % 4 == 0) p.efficiency = any_double();
        if (hostile && rng() % 4 == 0) p.link_efficiency = any_double();
        if (hostile && rng() % 4 == 0) p.memory_reserve_fraction = any_double();
        if (hostile && rng() % 4 == 0) p.fp8_efficiency = any_double();
        p.flash_attention = rng() % 2;
        p.dropout_masks = rng() % 2;
        p.zero1 = rng() % 2;
        p.overlap_grad_reduce = rng() % 2;
        p.overlap_param_gather = rng() % 2;
        p.p2p_overlap = rng() % 2;
        p.p2p_scatter_gather = rng() % 2;
        p.stash_stage_io = rng() % 2;
        p.clone_stage_input = rng() % 2;
        p.persistent_recv_buffers = rng() % 2;
        p.recv_buffers_per_microbatch = rng() % 2;
        p.short_1f1b_as_gpipe = rng() % 2;
        p.unfused_fp32_copies = rng() % 2;
        p.kept_last_buffers = hostile ? static_cast<std::int64_t>(rng() % 8) - 2
                                      : static_cast<std::int64_t>(rng() % 3);
        if (rng() % 2) p.blas_workspace_mib = hostile ? any_double() : 32.0;
        if (rng() % 2) p.optimizer_transient_bytes_per_param = hostile ? any_double() : 4.0;
        if (hostile && rng() % 4 == 0) p.loss_bytes_per_logit = any_double();
        if (hostile && rng() % 4 == 0) p.sustained_fraction = any_double();
        if (hostile && rng() % 4 == 0) p.attention_efficiency = any_double();
        if (rng() % 4 == 0) p.checkpoint_gbs = hostile ? any_double() : 0.01 * static_cast<double>(rng() % 1000);
        if (hostile && rng() % 4 == 0) p.restart_hours = any_double();
        Workload w;
        w.seq_len = any_int(8192);
        w.micro_batch_size = any_int(8);
        w.num_microbatches = any_int(128);
        w.dp = any_int(16);
        if (__builtin_mul_overflow(w.dp, w.micro_batch_size, &w.global_batch_size) ||
            __builtin_mul_overflow(w.global_batch_size, w.num_microbatches, &w.global_batch_size)) {
            w.global_batch_size = -1;
        }
        if (hostile && rng() % 5 == 0) w.global_batch_size = any_int(1024);
        w.schedule = rng() % 2 ? Schedule::GPipe : Schedule::OneFOneB;
        w.recompute = static_cast<Recompute>(
            hostile && rng() % 16 == 0 ? any_int(6) : static_cast<std::int64_t>(rng() % 4));
        w.sharding = static_cast<Sharding>(
            hostile && rng() % 16 == 0 ? any_int(7) : static_cast<std::int64_t>(rng() % 4));
        w.sequence_parallel = rng() % 2;
        w.fp8 = rng() % 2;
        w.iterations = any_double();
        w.deadline_hours = any_double();
        if (rng() % 4 == 0) w.deadline_confidence = hostile ? any_double() : 0.01 * static_cast<double>(1 + rng() % 99);
        std::vector<StageSpec> stages(static_cast<std::size_t>(rng() % 10));
        std::int64_t begin = 0;
        for (auto& s : stages) {
            s.gpu = hostile && rng() % 12 == 0 ? any_int(10) : static_cast<std::int64_t>(rng() % gpus.size());
            s.tp = hostile && rng() % 8 == 0 ? any_int(64) : static_cast<std::int64_t>(1 + rng() % 4);
            s.layer_begin = hostile && rng() % 8 == 0 ? any_int(100) : begin;
            if (__builtin_add_overflow(s.layer_begin, static_cast<std::int64_t>(rng() % 20),
                                       &s.layer_end)) {
                s.layer_end = s.layer_begin;
            }
            begin = s.layer_end;
        }
        // Interleaving: often well formed (chunks on their group's GPU type and width).
        w.virtual_stages = rng() % 3 == 0 ? (hostile && rng() % 4 == 0 ? any_int(2048)
                                                                        : 2 + static_cast<std::int64_t>(rng() % 3))
                                          : 1;
        if (w.virtual_stages > 1 && !stages.empty() && !(hostile && rng() % 2)) {
            const std::size_t groups = std::max<std::size_t>(1, stages.size() / static_cast<std::size_t>(std::min<std::int64_t>(w.virtual_stages, 64)));
            for (std::size_t k = groups; k < stages.size(); ++k) {
                stages[k].gpu = stages[k % groups].gpu;
                stages[k].tp = stages[k % groups].tp;
            }
        }
        try {
            const EstimateResult r = estimate(m, gpus, p, w, stages);
            ++ok;
            if (!finite_nonneg(r.iteration_s) || !finite_nonneg(r.pipeline_s)) fail("finite times", i);
            if (!(r.bubble_fraction >= 0 && r.bubble_fraction < 1)) fail("bubble in [0,1)", i);
            if (r.stages.size() != stages.size()) fail("one result per stage", i);
            for (const auto& s : r.stages) {
                if (!finite_nonneg(s.memory_bytes) || !finite_nonneg(s.fwd_s)) fail("finite stage", i);
                if (r.pipeline_s < static_cast<double>(w.num_microbatches) * (s.fwd_s + s.bwd_s) *
                                       (1 - 1e-9)) {
                    fail("pipeline >= busy time of every stage", i);
                }
            }
            if (r.feasible != r.issues.empty()) fail("feasible iff no issues", i);
            // Spot: expected and at-confidence hours never below the work alone, never NaN.
            if (std::isnan(r.total_hours) || std::isnan(r.hours_at_confidence)) fail("spot hours not NaN", i);
            if (r.total_hours < r.work_hours * (1 - 1e-12) ||
                r.hours_at_confidence < r.work_hours * (1 - 1e-12)) {
                fail("spot hours >= work hours", i);
            }
            if (r.meets_deadline && !(r.hours_at_confidence <= w.deadline_hours)) fail("deadline at confidence", i);
        } catch (const std::invalid_argument&) {
            ++refused;
        }
        // Now and then the whole search on the same inputs, under a short time limit, with
        // arbitrary depth tiers (often invalid when hostile): refused, or plans that keep
        // their tier.
        if (i % 40 < 2) {
            SearchOptions o;
            o.time_limit_s = 0.02;
            o.max_stages = 1 + static_cast<std::int64_t>(rng() % 12);
            o.top_k = 1 + static_cast<std::int64_t>(rng() % 3);
            o.sharding = {Sharding::None, Sharding::Zero2};
            // Baseline spaces now and then: one TP width, the even split.
            if (rng() % 4 == 0) o.min_tp = hostile && rng() % 2 ? any_int(16) : 1 + static_cast<std::int64_t>(rng() % 8);
            o.placer.even_split = rng() % 4 == 0;
            o.placer.fixed_order = rng() % 4 == 0;
            o.max_stages_by_types.resize(rng() % 4);
            std::int64_t prev = o.max_stages;
            for (auto& t : o.max_stages_by_types) {
                t = hostile && rng() % 3 == 0 ? (rng() % 2 ? any_int(2048) : -static_cast<std::int64_t>(rng() % 3))
                                              : 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(prev));
                prev = std::max<std::int64_t>(1, std::min(prev, t));
            }
            try {
                const SearchResult r = search(m, gpus, p, w, o);
                ++searched;
                planned += r.plans.empty() ? 0U : 1U;
                for (const SearchPlan& pl : r.plans) {
                    std::vector<std::int64_t> types;
                    for (const StageSpec& st : pl.stages) {
                        if (std::find(types.begin(), types.end(), st.gpu) == types.end()) types.push_back(st.gpu);
                    }
                    const auto groups = static_cast<std::int64_t>(pl.stages.size()) /
                                        std::max<std::int64_t>(1, pl.work.virtual_stages);
                    std::int64_t cap = o.max_stages;
                    const auto& by = o.max_stages_by_types;
                    if (!by.empty()) {
                        cap = std::min(cap, by[std::min(types.size(), by.size()) - 1]);
                    }
                    if (groups > cap) fail("plans keep their depth tier", i);
                    if (!finite_nonneg(pl.objective)) fail("finite objective", i);
                }
            } catch (const std::invalid_argument&) {
            }
        }
        // The spot model on its own, with arbitrary numbers.
        {
            const double work = any_double(), rate = any_double(), ck = any_double(),
                         rs = any_double(), conf = rng() % 2 ? any_double() : 0.9;
            const SpotOutcome o = spot_outcome(work, rate, ck, rs, conf);
            if (std::isnan(o.expected_hours) || std::isnan(o.hours_at_confidence) ||
                std::isnan(o.interval_hours) || o.expected_hours < 0 || o.interval_hours < 0) {
                std::fprintf(stderr, "spot_outcome(%.17g, %.17g, %.17g, %.17g, %.17g)\n", work,
                             rate, ck, rs, conf);
                fail("spot outcome defined", i);
            }
            // The search's bound stays below the quantile (the exact arithmetic of the process
            // has it at least W + C + R k; rounding aside, a hair of slack).
            const double lb = hours_at_confidence_lb(work, rate, ck, rs, conf);
            if (std::isnan(lb) || lb > o.hours_at_confidence * (1 + 1e-9) + 1e-300) {
                std::fprintf(stderr, "lb %.17g > %.17g: spot_outcome(%.17g, %.17g, %.17g, %.17g, %.17g)\n",
                             lb, o.hours_at_confidence, work, rate, ck, rs, conf);
                fail("spot bound below the quantile", i);
            }
            const double f = spot_factor(rate, ck, rs);
            if (std::isnan(f) || f < 1 - 1e-12) fail("spot factor >= 1", i);
        }
        // The simulator on its own, with arbitrary times.
        const std::size_t P = rng() % 6;
        std::vector<double> f(P), b(P), c(P > 0 ? P - 1 : 0);
        for (auto& x : f) x = rng() % 10 == 0 ? any_double() : static_cast<double>(rng() % 100);
        for (auto& x : b) x = static_cast<double>(rng() % 100);
        for (auto& x : c) x = rng() % 10 == 0 ? any_double() : 0.5;
        try {
            const PipelineResult r =
                simulate_pipeline(f, b, c, c, any_int(64), rng() % 2 ? Schedule::GPipe : Schedule::OneFOneB);
            if (!finite_nonneg(r.makespan_s)) fail("finite makespan", i);
            const std::int64_t M = 1 + static_cast<std::int64_t>(rng() % 8);
            const std::vector<TimelineOp> ops = pipeline_timeline(f, b, c, c, M, Schedule::OneFOneB);
            if (ops.size() != 2 * P * static_cast<std::size_t>(M)) fail("a whole timeline", i);
            for (const TimelineOp& op : ops) {
                if (!(op.start_s >= 0) || !(op.end_s >= op.start_s)) fail("ordered timeline", i);
            }
        } catch (const std::invalid_argument&) {
        }
        // Interleaved 1F1B with arbitrary shapes (refused unless v >= 2 and M % P == 0).
        const std::size_t devices = 1 + rng() % 4, virt = devices * (rng() % 4);
        std::vector<double> fi(virt), bi(virt), ci(virt > 0 ? virt - 1 : 0);
        for (auto& x : fi) x = rng() % 10 == 0 ? any_double() : static_cast<double>(rng() % 50);
        for (auto& x : bi) x = static_cast<double>(rng() % 50);
        for (auto& x : ci) x = rng() % 10 == 0 ? any_double() : 0.25;
        try {
            const double ms = interleaved_makespan(fi, bi, ci, ci, static_cast<std::int64_t>(devices),
                                                   any_int(32));
            if (!finite_nonneg(ms)) fail("finite interleaved makespan", i);
        } catch (const std::invalid_argument&) {
        }
        // ... and with DP collectives of arbitrary sizes (any of the three may be empty).
        try {
            DpTraffic dp;
            for (std::vector<double>* t : {&dp.under_backward, &dp.under_forward, &dp.exposed}) {
                if (rng() % 3 == 0) continue;
                t->resize(rng() % 8 == 0 ? virt + 1 : virt);
                for (auto& x : *t) x = rng() % 10 == 0 ? any_double() : static_cast<double>(rng() % 20);
            }
            const InterleavedRun run = interleaved_run(fi, bi, ci, ci, static_cast<std::int64_t>(devices),
                                                       any_int(32), &dp);
            if (!finite_nonneg(run.makespan_s)) fail("finite interleaved makespan with DP", i);
            for (const double t : run.tail_s) {
                if (!finite_nonneg(t)) fail("finite interleaved DP tail", i);
            }
        } catch (const std::invalid_argument&) {
        }
        std::vector<double> chunks(rng() % 5);
        for (auto& x : chunks) x = rng() % 10 == 0 ? any_double() : static_cast<double>(rng() % 9);
        try {
            const double peak = interleaved_peak(chunks, any_int(8), any_int(8), any_int(64));
            if (!finite_nonneg(peak)) fail("finite interleaved peak", i);
        } catch (const std::invalid_argument&) {
        }
    }
    std::printf("espresso_fuzz: %llu estimates, %llu refused with invalid_argument; %llu searches "
                "(%llu with a plan); no failures\n",
                static_cast<unsigned long long>(ok), static_cast<unsigned long long>(refused),
                static_cast<unsigned long long>(searched), static_cast<unsigned long long>(planned));
    return 0;
}
