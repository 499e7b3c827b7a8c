// espresso._core: registers each area's bindings and nothing else.
#include "pybind11.hpp"

PYBIND11_MODULE(_core, m) {
    m.doc() = "Espresso's native core: cost model, pipeline simulation, placer and search";
    register_cost_model(m);
    register_search(m);
}
