// CUDA micro-benchmarks: device-memory bandwidth (copy, triad), a hand-written bf16
// tensor-core matrix multiply, and host<->device copies. Each kernel's output is checked
// against a CPU reference on random data before it is timed. Plain C++ API (no pybind11);
// every function validates its arguments and throws std::invalid_argument or
// std::runtime_error (with the CUDA error string) instead of failing on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace espresso::cuda {

struct DeviceInfo {
    bool available = false;
    std::string error;        // why no device is usable (driver, no GPU), when !available
    int device = 0;
    int count = 0;            // CUDA devices visible
    std::string name;
    int cc_major = 0, cc_minor = 0;
    int sms = 0;
    double memory_gb = 0;     // total, 1e9 bytes
    double free_gb = 0;
    int runtime_version = 0;
    int driver_version = 0;
};

struct BenchResult {
    std::string name;
    double seconds = 0;       // per iteration (median of the timed launches' mean)
    double work = 0;          // bytes moved or FLOPs per iteration
    double rate = 0;          // GB/s (1e9 bytes) or TFLOP/s (1e12)
    std::string unit;         // "GB/s" or "TFLOP/s"
    bool verified = false;    // output matched the CPU reference
    double max_error = 0;     // largest error against the reference, relative to tolerance
    int iterations = 0;
    std::string detail;       // sizes, launch shape
};

DeviceInfo device_info(int device);

// Vectorised copy dst = src over `bytes` (a multiple of 16): read + write counted.
BenchResult bench_copy(int device, std::size_t bytes, int iters);
// STREAM triad a = b + s * c over three float arrays of `bytes` each: 2 reads + 1 write.
BenchResult bench_triad(int device, std::size_t bytes, int iters);
// C (m x n, fp32) = A (m x k, bf16, row-major) x B (k x n, bf16, given as n x k row-major),
// tensor cores through WMMA with cp.async double buffering; m, n multiples of 128, k of 32.
BenchResult bench_gemm_bf16(int device, int m, int n, int k, int iters);
// Pinned host memory to device (to_device) or back.
BenchResult bench_host_copy(int device, std::size_t bytes, int iters, bool to_device);

}  // namespace espresso::cuda
