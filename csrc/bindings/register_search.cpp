// Bindings of the placer and the allocator. Both release the GIL while they run.
#include "pybind11.hpp"

#include "espresso/placer.hpp"
#include "espresso/search.hpp"

using namespace espresso;

void register_search(py::module_& m) {
    py::class_<StageGroup>(m, "StageGroup")
        .def(py::init([](std::int64_t gpu, std::int64_t tp) { return StageGroup{gpu, tp}; }),
             py::arg("gpu"), py::arg("tp"))
        .def_readwrite("gpu", &StageGroup::gpu)
        .def_readwrite("tp", &StageGroup::tp);

    py::class_<PlaceOptions>(m, "PlaceOptions")
        .def(py::init<>())
        .def_readwrite("cutoff_s", &PlaceOptions::cutoff_s)
        .def_readwrite("node_limit", &PlaceOptions::node_limit)
        .def_readwrite("memo_limit", &PlaceOptions::memo_limit)
        .def_readwrite("ratio_order", &PlaceOptions::ratio_order)
        .def_readwrite("even_split", &PlaceOptions::even_split)
        .def_readwrite("middle_equal", &PlaceOptions::middle_equal)
        .def_readwrite("fixed_order", &PlaceOptions::fixed_order)
        .def_readwrite("time_limit_s", &PlaceOptions::time_limit_s)
        .def_readwrite("table_limit", &PlaceOptions::table_limit);

    py::class_<Placement>(m, "Placement")
        .def_readonly("found", &Placement::found)
        .def_readonly("stages", &Placement::stages)
        .def_readonly("iteration_s", &Placement::iteration_s)
        .def_readonly("lower_bound_s", &Placement::lower_bound_s)
        .def_readonly("exhaustive", &Placement::exhaustive)
        .def_readonly("timed_out", &Placement::timed_out)
        .def_readonly("nodes", &Placement::nodes)
        .def_readonly("leaves", &Placement::leaves);

    py::class_<SearchMonitor, std::shared_ptr<SearchMonitor>>(m, "SearchMonitor")
        .def(py::init<>())
        .def_property_readonly("best", [](const SearchMonitor& s) { return s.best.load(); })
        .def_property_readonly("lower_bound",
                               [](const SearchMonitor& s) { return s.lower_bound.load(); })
        .def_property_readonly("nodes_expanded",
                               [](const SearchMonitor& s) { return s.nodes_expanded.load(); })
        .def_property_readonly("leaves_placed",
                               [](const SearchMonitor& s) { return s.leaves_placed.load(); })
        .def("cancel", [](SearchMonitor& s) { s.cancel.store(true); });

    py::class_<SharedIncumbent, std::shared_ptr<SharedIncumbent>>(m, "SharedIncumbent")
        .def(py::init<>())
        .def_property_readonly("value", [](const SharedIncumbent& s) { return s.value.load(); });

    py::class_<Crew, std::shared_ptr<Crew>>(m, "Crew")
        .def(py::init<>())
        .def("help", &Crew::help, py::call_guard<py::gil_scoped_release>(),
             "Work in the search as one more thread until it ends.")
        .def("stop_after", &Crew::stop_after, py::arg("seconds"),
             "The search stops that many seconds from now (inf: at its own limit).")
        .def("share", &Crew::share, py::arg("seconds"),
             "The search stops that many seconds from now, unless no better plan has been "
             "found since it began (the share is then renewed).")
        .def("yield_now", &Crew::yield_now, "Stop the search now, as its time limit would.")
        .def("finish", &Crew::finish,
             "The search is over (or never began): helpers waiting in help() return.")
        .def_property_readonly("helpers", &Crew::helpers);

    py::enum_<Objective>(m, "Objective")
        .value("COST", Objective::Cost)
        .value("TIME", Objective::Time);

    py::class_<SearchOptions>(m, "SearchOptions")
        .def(py::init<>())
        .def_readwrite("micro_batch_sizes", &SearchOptions::micro_batch_sizes)
        .def_readwrite("recompute", &SearchOptions::recompute)
        .def_readwrite("sharding", &SearchOptions::sharding)
        .def_readwrite("virtual_stages", &SearchOptions::virtual_stages)
        .def_readwrite("schedule", &SearchOptions::schedule)
        .def_readwrite("max_stages", &SearchOptions::max_stages)
        .def_readwrite("max_stages_by_types", &SearchOptions::max_stages_by_types)
        .def_readwrite("max_tp", &SearchOptions::max_tp)
        .def_readwrite("min_tp", &SearchOptions::min_tp)
        .def_readwrite("max_dp", &SearchOptions::max_dp)
        .def_readwrite("objective", &SearchOptions::objective)
        .def_readwrite("budget_usd", &SearchOptions::budget_usd)
        .def_readwrite("enforce_deadline", &SearchOptions::enforce_deadline)
        .def_readwrite("time_limit_s", &SearchOptions::time_limit_s)
        .def_readwrite("max_gpu_types", &SearchOptions::max_gpu_types)
        .def_readwrite("pools", &SearchOptions::pools)
        .def_readwrite("incumbent", &SearchOptions::incumbent)
        .def_readwrite("gap", &SearchOptions::gap)
        .def_readwrite("shared", &SearchOptions::shared)
        .def_readwrite("share_plans", &SearchOptions::share_plans)
        .def_readwrite("monitor", &SearchOptions::monitor)
        .def_readwrite("crew", &SearchOptions::crew)
        .def_readwrite("threads", &SearchOptions::threads)
        .def_readwrite("top_k", &SearchOptions::top_k)
        .def_readwrite("max_frontier", &SearchOptions::max_frontier)
        .def_readwrite("placer", &SearchOptions::placer)
        .def_readwrite("prune_cost", &SearchOptions::prune_cost)
        .def_readwrite("prune_deadline", &SearchOptions::prune_deadline)
        .def_readwrite("prune_memory", &SearchOptions::prune_memory)
        .def_readwrite("prune_dominance", &SearchOptions::prune_dominance);

    py::class_<SearchStats>(m, "SearchStats")
        .def_readonly("nodes_expanded", &SearchStats::nodes_expanded)
        .def_readonly("nodes_generated", &SearchStats::nodes_generated)
        .def_readonly("pruned_cost", &SearchStats::pruned_cost)
        .def_readonly("pruned_deadline", &SearchStats::pruned_deadline)
        .def_readonly("pruned_memory", &SearchStats::pruned_memory)
        .def_readonly("pruned_availability", &SearchStats::pruned_availability)
        .def_readonly("pruned_dominance", &SearchStats::pruned_dominance)
        .def_readonly("leaves_placed", &SearchStats::leaves_placed)
        .def_readonly("placer_nodes", &SearchStats::placer_nodes)
        .def_readonly("placer_leaves", &SearchStats::placer_leaves)
        .def_readonly("frontier_peak", &SearchStats::frontier_peak)
        .def_readonly("dives", &SearchStats::dives)
        .def_readonly("combos", &SearchStats::combos)
        .def_readonly("seconds", &SearchStats::seconds)
        .def_readonly("first_plan_s", &SearchStats::first_plan_s)
        .def_readonly("lower_bound", &SearchStats::lower_bound)
        .def_readonly("complete", &SearchStats::complete)
        .def_readonly("timed_out", &SearchStats::timed_out)
        .def_readonly("threads", &SearchStats::threads);

    py::class_<SearchPlan>(m, "SearchPlan")
        .def_readonly("work", &SearchPlan::work)
        .def_readonly("stages", &SearchPlan::stages)
        .def_readonly("estimate", &SearchPlan::estimate)
        .def_readonly("objective", &SearchPlan::objective);

    py::class_<SearchResult>(m, "SearchResult")
        .def_readonly("plans", &SearchResult::plans)
        .def_readonly("stats", &SearchResult::stats);

    m.def("place", &place, py::arg("model"), py::arg("gpus"), py::arg("params"), py::arg("work"),
          py::arg("groups"), py::arg("options"), py::call_guard<py::gil_scoped_release>());
    m.def("search", &search, py::arg("model"), py::arg("gpus"), py::arg("params"), py::arg("job"),
          py::arg("options"), py::call_guard<py::gil_scoped_release>());
}
