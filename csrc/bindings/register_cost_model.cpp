// Bindings of the cost model: plain structs in, plain structs out. The GIL is
// released while the estimate runs.
#include <limits>

#include "pybind11.hpp"

#include "espresso/cost_model.hpp"
#include "espresso/pipeline_sim.hpp"
#include "espresso/spot.hpp"

using namespace espresso;

void register_cost_model(py::module_& m) {
    py::enum_<Schedule>(m, "Schedule")
        .value("ONE_F_ONE_B", Schedule::OneFOneB)
        .value("GPIPE", Schedule::GPipe);
    py::enum_<Recompute>(m, "Recompute")
        .value("NONE", Recompute::None)
        .value("FULL", Recompute::Full)
        .value("SELECTIVE", Recompute::Selective)
        .value("SELECTIVE_OP", Recompute::SelectiveOp);
    py::enum_<Sharding>(m, "Sharding")
        .value("NONE", Sharding::None)
        .value("ZERO1", Sharding::Zero1)
        .value("ZERO2", Sharding::Zero2)
        .value("FULL", Sharding::Full);
    py::enum_<IssueKind>(m, "IssueKind")
        .value("LAYERS_NOT_COVERED", IssueKind::LayersNotCovered)
        .value("LAYERS_OVERLAP", IssueKind::LayersOverlap)
        .value("EMPTY_STAGE", IssueKind::EmptyStage)
        .value("OUT_OF_MEMORY", IssueKind::OutOfMemory)
        .value("AVAILABILITY", IssueKind::Availability)
        .value("TP_EXCEEDS_NODE", IssueKind::TpExceedsNode)
        .value("TP_NOT_DIVISOR", IssueKind::TpNotDivisor)
        .value("BATCH_MISMATCH", IssueKind::BatchMismatch);

    py::class_<ModelDims>(m, "ModelDims")
        .def(py::init<>())
        .def_readwrite("num_layers", &ModelDims::num_layers)
        .def_readwrite("hidden_size", &ModelDims::hidden_size)
        .def_readwrite("num_heads", &ModelDims::num_heads)
        .def_readwrite("num_kv_heads", &ModelDims::num_kv_heads)
        .def_readwrite("ffn_hidden_size", &ModelDims::ffn_hidden_size)
        .def_readwrite("vocab_size", &ModelDims::vocab_size)
        .def_readwrite("gated_mlp", &ModelDims::gated_mlp)
        .def_readwrite("tied_embeddings", &ModelDims::tied_embeddings)
        .def_readwrite("position_embeddings", &ModelDims::position_embeddings)
        .def_readwrite("layernorm", &ModelDims::layernorm)
        .def_readwrite("linear_bias", &ModelDims::linear_bias);

    py::class_<GpuSpec>(m, "GpuSpec")
        .def(py::init<>())
        .def("__copy__", [](const GpuSpec& g) { return GpuSpec(g); })
        .def_readwrite("memory_gb", &GpuSpec::memory_gb)
        .def_readwrite("memory_bytes", &GpuSpec::memory_bytes)
        .def_readwrite("tflops", &GpuSpec::tflops)
        .def_readwrite("fp8_tflops", &GpuSpec::fp8_tflops)
        .def_readwrite("mem_bandwidth_gbs", &GpuSpec::mem_bandwidth_gbs)
        .def_readwrite("intra_node_gbs", &GpuSpec::intra_node_gbs)
        .def_readwrite("inter_node_gbs", &GpuSpec::inter_node_gbs)
        .def_readwrite("efficiency", &GpuSpec::efficiency)
        .def_readwrite("price_per_hour", &GpuSpec::price_per_hour)
        .def_readwrite("count", &GpuSpec::count)
        .def_readwrite("pool", &GpuSpec::pool)
        .def_readwrite("pool_units", &GpuSpec::pool_units)
        .def_readwrite("gpus_per_node", &GpuSpec::gpus_per_node)
        .def_readwrite("interruptions_per_hour", &GpuSpec::interruptions_per_hour)
        .def_readwrite("recovery_hours", &GpuSpec::recovery_hours)
        .def_readwrite("block_fwd_scale", &GpuSpec::block_fwd_scale)
        .def_readwrite("block_bwd_scale", &GpuSpec::block_bwd_scale)
        .def_readwrite("head_fwd_scale", &GpuSpec::head_fwd_scale)
        .def_readwrite("head_bwd_scale", &GpuSpec::head_bwd_scale)
        .def_readwrite("activation_scale", &GpuSpec::activation_scale);

    py::class_<CostParams>(m, "CostParams")
        .def(py::init<>())
        .def_readwrite("efficiency", &CostParams::efficiency)
        .def_readwrite("attention_efficiency", &CostParams::attention_efficiency)
        .def_readwrite("sustained_fraction", &CostParams::sustained_fraction)
        .def_readwrite("overlap_grad_reduce", &CostParams::overlap_grad_reduce)
        .def_readwrite("overlap_param_gather", &CostParams::overlap_param_gather)
        .def_readwrite("fp8_efficiency", &CostParams::fp8_efficiency)
        .def_readwrite("nccl_gb_per_group", &CostParams::nccl_gb_per_group)
        .def_readwrite("p2p_overlap", &CostParams::p2p_overlap)
        .def_readwrite("p2p_scatter_gather", &CostParams::p2p_scatter_gather)
        .def_readwrite("bytes_per_weight", &CostParams::bytes_per_weight)
        .def_readwrite("bytes_per_grad", &CostParams::bytes_per_grad)
        .def_readwrite("zero1", &CostParams::zero1)
        .def_readwrite("flash_attention", &CostParams::flash_attention)
        .def_readwrite("dropout_masks", &CostParams::dropout_masks)
        .def_readwrite("bytes_per_activation", &CostParams::bytes_per_activation)
        .def_readwrite("bytes_per_logit", &CostParams::bytes_per_logit)
        .def_readwrite("loss_bytes_per_logit", &CostParams::loss_bytes_per_logit)
        .def_readwrite("stash_stage_io", &CostParams::stash_stage_io)
        .def_readwrite("clone_stage_input", &CostParams::clone_stage_input)
        .def_readwrite("persistent_recv_buffers", &CostParams::persistent_recv_buffers)
        .def_readwrite("recv_buffers_per_microbatch", &CostParams::recv_buffers_per_microbatch)
        .def_readwrite("short_1f1b_as_gpipe", &CostParams::short_1f1b_as_gpipe)
        .def_readwrite("unfused_fp32_copies", &CostParams::unfused_fp32_copies)
        .def_readwrite("kept_last_buffers", &CostParams::kept_last_buffers)
        .def_readwrite("blas_workspace_mib", &CostParams::blas_workspace_mib)
        .def_readwrite("optimizer_transient_bytes_per_param",
                       &CostParams::optimizer_transient_bytes_per_param)
        .def_readwrite("reserved_gb", &CostParams::reserved_gb)
        .def_readwrite("memory_reserve_fraction", &CostParams::memory_reserve_fraction)
        .def_readwrite("link_efficiency", &CostParams::link_efficiency)
        .def_readwrite("link_latency_s", &CostParams::link_latency_s)
        .def_readwrite("optimizer_step_bytes_per_param", &CostParams::optimizer_step_bytes_per_param)
        .def_readwrite("memory_bandwidth_efficiency", &CostParams::memory_bandwidth_efficiency)
        .def_readwrite("checkpoint_gbs", &CostParams::checkpoint_gbs)
        .def_readwrite("restart_hours", &CostParams::restart_hours);

    py::class_<Workload>(m, "Workload")
        .def(py::init<>())
        .def_readwrite("seq_len", &Workload::seq_len)
        .def_readwrite("micro_batch_size", &Workload::micro_batch_size)
        .def_readwrite("num_microbatches", &Workload::num_microbatches)
        .def_readwrite("dp", &Workload::dp)
        .def_readwrite("global_batch_size", &Workload::global_batch_size)
        .def_readwrite("schedule", &Workload::schedule)
        .def_readwrite("recompute", &Workload::recompute)
        .def_readwrite("sharding", &Workload::sharding)
        .def_readwrite("sequence_parallel", &Workload::sequence_parallel)
        .def_readwrite("fp8", &Workload::fp8)
        .def_readwrite("virtual_stages", &Workload::virtual_stages)
        .def_readwrite("optimizer_bytes_per_param", &Workload::optimizer_bytes_per_param)
        .def_readwrite("iterations", &Workload::iterations)
        .def_readwrite("deadline_hours", &Workload::deadline_hours)
        .def_readwrite("transfer_usd_per_gb", &Workload::transfer_usd_per_gb)
        .def_readwrite("deadline_confidence", &Workload::deadline_confidence);

    py::class_<StageSpec>(m, "StageSpec")
        .def(py::init<>())
        .def(py::init([](std::int64_t gpu, std::int64_t tp, std::int64_t begin, std::int64_t end) {
                 return StageSpec{gpu, tp, begin, end};
             }),
             py::arg("gpu"), py::arg("tp"), py::arg("layer_begin"), py::arg("layer_end"))
        .def_readwrite("gpu", &StageSpec::gpu)
        .def_readwrite("tp", &StageSpec::tp)
        .def_readwrite("layer_begin", &StageSpec::layer_begin)
        .def_readwrite("layer_end", &StageSpec::layer_end);

    py::class_<Issue>(m, "Issue")
        .def_readonly("kind", &Issue::kind)
        .def_readonly("stage", &Issue::stage)
        .def_readonly("gpu", &Issue::gpu)
        .def_readonly("value", &Issue::value)
        .def_readonly("limit", &Issue::limit)
        .def_readonly("what", &Issue::what);

    py::class_<StageEstimate>(m, "StageEstimate")
        .def_readonly("num_layers", &StageEstimate::num_layers)
        .def_readonly("params", &StageEstimate::params)
        .def_readonly("fwd_flops", &StageEstimate::fwd_flops)
        .def_readonly("fwd_s", &StageEstimate::fwd_s)
        .def_readonly("bwd_s", &StageEstimate::bwd_s)
        .def_readonly("weights_bytes", &StageEstimate::weights_bytes)
        .def_readonly("grads_bytes", &StageEstimate::grads_bytes)
        .def_readonly("optimizer_bytes", &StageEstimate::optimizer_bytes)
        .def_readonly("activation_bytes", &StageEstimate::activation_bytes)
        .def_readonly("transient_bytes", &StageEstimate::transient_bytes)
        .def_readonly("persistent_bytes", &StageEstimate::persistent_bytes)
        .def_readonly("memory_bytes", &StageEstimate::memory_bytes)
        .def_readonly("capacity_bytes", &StageEstimate::capacity_bytes)
        .def_readonly("in_flight", &StageEstimate::in_flight)
        .def_readonly("send_s", &StageEstimate::send_s)
        .def_readonly("send_intra_node", &StageEstimate::send_intra_node)
        .def_readonly("dp_allreduce_s", &StageEstimate::dp_allreduce_s)
        .def_readonly("optimizer_step_s", &StageEstimate::optimizer_step_s);

    py::class_<EstimateResult>(m, "EstimateResult")
        .def_readonly("stages", &EstimateResult::stages)
        .def_readonly("gpus_used", &EstimateResult::gpus_used)
        .def_readonly("pipeline_s", &EstimateResult::pipeline_s)
        .def_readonly("dp_allreduce_s", &EstimateResult::dp_allreduce_s)
        .def_readonly("optimizer_step_s", &EstimateResult::optimizer_step_s)
        .def_readonly("iteration_s", &EstimateResult::iteration_s)
        .def_readonly("closed_form_s", &EstimateResult::closed_form_s)
        .def_readonly("bubble_fraction", &EstimateResult::bubble_fraction)
        .def_readonly("bottleneck_stage", &EstimateResult::bottleneck_stage)
        .def_readonly("hourly_usd", &EstimateResult::hourly_usd)
        .def_readonly("instances", &EstimateResult::instances)
        .def_readonly("idle_gpus", &EstimateResult::idle_gpus)
        .def_readonly("transfer_gb", &EstimateResult::transfer_gb)
        .def_readonly("transfer_usd", &EstimateResult::transfer_usd)
        .def_readonly("total_hours", &EstimateResult::total_hours)
        .def_readonly("total_usd", &EstimateResult::total_usd)
        .def_readonly("work_hours", &EstimateResult::work_hours)
        .def_readonly("interruptions_per_hour", &EstimateResult::interruptions_per_hour)
        .def_readonly("checkpoint_interval_hours", &EstimateResult::checkpoint_interval_hours)
        .def_readonly("checkpoint_hours", &EstimateResult::checkpoint_hours)
        .def_readonly("restart_hours", &EstimateResult::restart_hours)
        .def_readonly("hours_at_confidence", &EstimateResult::hours_at_confidence)
        .def_readonly("interruptions_expected", &EstimateResult::interruptions_expected)
        .def_readonly("interruptions_at_confidence", &EstimateResult::interruptions_at_confidence)
        .def_readonly("model_flops_per_iteration", &EstimateResult::model_flops_per_iteration)
        .def_readonly("feasible", &EstimateResult::feasible)
        .def_readonly("meets_deadline", &EstimateResult::meets_deadline)
        .def_readonly("issues", &EstimateResult::issues);

    py::class_<PipelineResult>(m, "PipelineResult")
        .def_readonly("makespan_s", &PipelineResult::makespan_s)
        .def_readonly("busy_s", &PipelineResult::busy_s)
        .def_readonly("bubble_fraction", &PipelineResult::bubble_fraction);

    py::class_<TimelineOp>(m, "TimelineOp")
        .def_readonly("stage", &TimelineOp::stage)
        .def_readonly("microbatch", &TimelineOp::microbatch)
        .def_readonly("backward", &TimelineOp::backward)
        .def_readonly("start_s", &TimelineOp::start_s)
        .def_readonly("end_s", &TimelineOp::end_s);

    m.def("block_params", &block_params, py::arg("model"));
    m.def("embedding_params", &embedding_params, py::arg("model"));
    m.def("head_params", &head_params, py::arg("model"));
    m.def("final_norm_params", &final_norm_params, py::arg("model"));
    m.def("total_params", &total_params, py::arg("model"));
    m.def("block_fwd_flops", &block_fwd_flops, py::arg("model"), py::arg("seq_len"),
          py::arg("micro_batch"));
    m.def("head_fwd_flops", &head_fwd_flops, py::arg("model"), py::arg("seq_len"),
          py::arg("micro_batch"));
    m.def("block_activation_bytes", &block_activation_bytes, py::arg("model"), py::arg("params"),
          py::arg("seq_len"), py::arg("micro_batch"), py::arg("tp"),
          py::arg("sequence_parallel") = false);
    py::class_<BlockTimes>(m, "BlockTimes")
        .def_readonly("fwd", &BlockTimes::fwd)
        .def_readonly("bwd", &BlockTimes::bwd)
        .def_readonly("recompute", &BlockTimes::recompute)
        .def_readonly("tp_comm", &BlockTimes::tp_comm);
    // One block's (or the head's) times, with the core's own input checks first.
    auto checked = [](BlockTimes (*fn)(const ModelDims&, const GpuSpec&, const CostParams&,
                                       const Workload&, std::int64_t)) {
        return [fn](const ModelDims& md, const GpuSpec& g, const CostParams& p,
                    const Workload& w, std::int64_t tp) {
            validate(md);
            validate(g, 0);
            validate(p);
            validate(w);
            if (tp < 1 || tp > 1024) throw std::invalid_argument("tp must be in [1, 1024]");
            return fn(md, g, p, w, tp);
        };
    };
    m.def("block_times", checked(&block_times), py::arg("model"), py::arg("gpu"),
          py::arg("params"), py::arg("work"), py::arg("tp"));
    m.def("head_times", checked(&head_times), py::arg("model"), py::arg("gpu"),
          py::arg("params"), py::arg("work"), py::arg("tp"));
    m.def("block_bound_flops", &block_bound_flops, py::arg("model"), py::arg("params"),
          py::arg("seq_len"), py::arg("micro_batch"));
    py::class_<SpotOutcome>(m, "SpotOutcome")
        .def_readonly("interval_hours", &SpotOutcome::interval_hours)
        .def_readonly("expected_hours", &SpotOutcome::expected_hours)
        .def_readonly("hours_at_confidence", &SpotOutcome::hours_at_confidence)
        .def_readonly("interruptions_expected", &SpotOutcome::interruptions_expected)
        .def_readonly("interruptions_at_confidence", &SpotOutcome::interruptions_at_confidence)
        .def_readonly("bounded", &SpotOutcome::bounded);
    m.def("optimal_interval_hours", &optimal_interval_hours, py::arg("rate"), py::arg("checkpoint"));
    m.def("spot_factor", &spot_factor, py::arg("rate"), py::arg("checkpoint"), py::arg("restart"));
    m.def("spot_factor_at", &spot_factor_at, py::arg("rate"), py::arg("checkpoint"),
          py::arg("restart"), py::arg("interval"));
    m.def("spot_outcome", &spot_outcome, py::arg("work_hours"), py::arg("rate"),
          py::arg("checkpoint"), py::arg("restart"), py::arg("confidence"));
    m.def("hours_at_confidence_lb", &hours_at_confidence_lb, py::arg("work_hours"),
          py::arg("rate"), py::arg("checkpoint"), py::arg("restart"), py::arg("confidence"),
          py::arg("cap") = std::numeric_limits<double>::infinity());
    m.def("checkpoint_hours", &checkpoint_hours, py::arg("model"), py::arg("params"),
          py::arg("work"));
    m.def("ring_allreduce_s", &ring_allreduce_s, py::arg("bytes"), py::arg("k"), py::arg("gbs"),
          py::arg("params"));
    m.def("validate_model", [](const ModelDims& md) { validate(md); }, py::arg("model"));
    m.def("validate_cost_params", [](const CostParams& p) { validate(p); }, py::arg("params"));
    m.def("estimate", &estimate, py::arg("model"), py::arg("gpus"), py::arg("params"),
          py::arg("work"), py::arg("stages"), py::call_guard<py::gil_scoped_release>());
    m.def("simulate_pipeline", &simulate_pipeline, py::arg("fwd_s"), py::arg("bwd_s"),
          py::arg("send_fwd_s"), py::arg("send_bwd_s"), py::arg("num_microbatches"),
          py::arg("schedule"), py::call_guard<py::gil_scoped_release>());
    m.def("pipeline_timeline", &pipeline_timeline, py::arg("fwd_s"), py::arg("bwd_s"),
          py::arg("send_fwd_s"), py::arg("send_bwd_s"), py::arg("num_microbatches"),
          py::arg("schedule"), py::call_guard<py::gil_scoped_release>());
    m.def("interleaved_makespan", &interleaved_makespan, py::arg("fwd_s"), py::arg("bwd_s"),
          py::arg("send_fwd_s"), py::arg("send_bwd_s"), py::arg("num_devices"),
          py::arg("num_microbatches"),
          py::arg("abort_above") = std::numeric_limits<double>::infinity(),
          py::call_guard<py::gil_scoped_release>());
    m.def(
        "interleaved_run",
        [](const std::vector<double>& fwd_s, const std::vector<double>& bwd_s,
           const std::vector<double>& send_fwd_s, const std::vector<double>& send_bwd_s,
           std::int64_t num_devices, std::int64_t num_microbatches,
           std::vector<double> under_backward, std::vector<double> under_forward,
           std::vector<double> exposed) {
            DpTraffic dp{std::move(under_backward), std::move(under_forward), std::move(exposed)};
            const InterleavedRun r = interleaved_run(fwd_s, bwd_s, send_fwd_s, send_bwd_s,
                                                     num_devices, num_microbatches, &dp);
            return std::make_pair(r.makespan_s, r.tail_s);
        },
        py::arg("fwd_s"), py::arg("bwd_s"), py::arg("send_fwd_s"), py::arg("send_bwd_s"),
        py::arg("num_devices"), py::arg("num_microbatches"),
        py::arg("under_backward") = std::vector<double>{},
        py::arg("under_forward") = std::vector<double>{}, py::arg("exposed") = std::vector<double>{},
        py::call_guard<py::gil_scoped_release>());
    m.def("interleaved_peak", &interleaved_peak, py::arg("per_chunk"), py::arg("num_devices"),
          py::arg("device"), py::arg("num_microbatches"), py::call_guard<py::gil_scoped_release>());
    m.def("closed_form_s", &closed_form_s, py::arg("fwd_s"), py::arg("bwd_s"),
          py::arg("num_microbatches"));
    m.def("in_flight", &in_flight, py::arg("schedule"), py::arg("stage"), py::arg("num_stages"),
          py::arg("num_microbatches"), py::arg("short_as_gpipe") = true);
}
