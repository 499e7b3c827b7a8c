// The one pybind11 header every binding file includes.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

void register_cost_model(py::module_& m);
void register_search(py::module_& m);
