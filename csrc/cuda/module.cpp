// espresso._cuda: the CUDA micro-benchmarks (microbench.hpp) for Python. Thin: converts
// results to dicts; argument checks and CUDA errors surface as ValueError / RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "microbench.hpp"

namespace py = pybind11;
using namespace espresso::cuda;

namespace {

py::dict to_dict(const BenchResult& r) {
    py::dict d;
    d["name"] = r.name;
    d["seconds"] = r.seconds;
    d["work"] = r.work;
    d["rate"] = r.rate;
    d["unit"] = r.unit;
    d["verified"] = r.verified;
    d["max_error"] = r.max_error;
    d["iterations"] = r.iterations;
    d["detail"] = r.detail;
    return d;
}

template <class F> py::dict released(F&& f) {
    BenchResult r;
    {
        py::gil_scoped_release nogil;
        r = f();
    }
    return to_dict(r);
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
    m.doc() = "CUDA micro-benchmarks: memory bandwidth, bf16 tensor-core GEMM, host copies";
    m.def("device_info", [](int device) {
        const DeviceInfo i = device_info(device);
        py::dict d;
        d["available"] = i.available;
        d["error"] = i.error;
        d["device"] = i.device;
        d["count"] = i.count;
        d["name"] = i.name;
        d["compute_capability"] = std::to_string(i.cc_major) + "." + std::to_string(i.cc_minor);
        d["sms"] = i.sms;
        d["memory_gb"] = i.memory_gb;
        d["free_gb"] = i.free_gb;
        d["runtime_version"] = i.runtime_version;
        d["driver_version"] = i.driver_version;
        return d;
    }, py::arg("device") = 0);
    m.def("bench_copy", [](int device, std::size_t bytes, int iters) {
        return released([&] { return bench_copy(device, bytes, iters); });
    }, py::arg("device"), py::arg("bytes"), py::arg("iters"));
    m.def("bench_triad", [](int device, std::size_t bytes, int iters) {
        return released([&] { return bench_triad(device, bytes, iters); });
    }, py::arg("device"), py::arg("bytes"), py::arg("iters"));
    m.def("bench_gemm_bf16", [](int device, int mm, int n, int k, int iters) {
        return released([&] { return bench_gemm_bf16(device, mm, n, k, iters); });
    }, py::arg("device"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("iters"));
    m.def("bench_host_copy", [](int device, std::size_t bytes, int iters, bool to_device) {
        return released([&] { return bench_host_copy(device, bytes, iters, to_device); });
    }, py::arg("device"), py::arg("bytes"), py::arg("iters"), py::arg("to_device"));
}
