#include "microbench.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

namespace espresso::cuda {
namespace {

constexpr std::size_t kMaxBytes = std::size_t{1} << 38;  // 256 GiB: beyond any device
constexpr int kMaxIters = 100000;

void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
        throw std::runtime_error(std::string("CUDA error in ") + what + ": " +
                                 cudaGetErrorString(err));
    }
}

void check_iters(int iters) {
    if (iters < 1 || iters > kMaxIters) {
        throw std::invalid_argument("iterations: expected 1.." + std::to_string(kMaxIters) +
                                    ", got " + std::to_string(iters));
    }
}

void use_device(int device) {
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device < 0 || device >= count) {
        throw std::invalid_argument("device: expected 0.." + std::to_string(count - 1) +
                                    ", got " + std::to_string(device));
    }
    check(cudaSetDevice(device), "cudaSetDevice");
}

void check_fits(std::size_t need, const char* what) {
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    if (need > free / 10 * 9) {
        throw std::invalid_argument(std::string(what) + ": needs " + std::to_string(need) +
                                    " bytes of device memory but " + std::to_string(free) +
                                    " are free");
    }
}

// Device buffer that frees itself (exceptions must not leak device memory).
struct DeviceBuffer {
    void* ptr = nullptr;
    explicit DeviceBuffer(std::size_t bytes) { check(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    template <class T> T* as() const { return static_cast<T*>(ptr); }
};

struct HostBuffer {
    void* ptr = nullptr;
    explicit HostBuffer(std::size_t bytes) { check(cudaMallocHost(&ptr, bytes), "cudaMallocHost"); }
    ~HostBuffer() { cudaFreeHost(ptr); }
    HostBuffer(const HostBuffer&) = delete;
    HostBuffer& operator=(const HostBuffer&) = delete;
    template <class T> T* as() const { return static_cast<T*>(ptr); }
};

struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    Events() {
        check(cudaEventCreate(&start), "cudaEventCreate");
        check(cudaEventCreate(&stop), "cudaEventCreate");
    }
    ~Events() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
    Events(const Events&) = delete;
    Events& operator=(const Events&) = delete;
};

// Mean seconds per call of `launch`, after one warm-up call.
template <class F> double time_it(F&& launch, int iters) {
    Events ev;
    launch();
    check(cudaGetLastError(), "kernel launch (warm-up)");
    check(cudaDeviceSynchronize(), "warm-up");
    check(cudaEventRecord(ev.start), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) launch();
    check(cudaEventRecord(ev.stop), "cudaEventRecord");
    check(cudaEventSynchronize(ev.stop), "cudaEventSynchronize");
    check(cudaGetLastError(), "kernel launch");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime");
    return static_cast<double>(ms) / 1e3 / iters;
}

int grid_for(std::size_t n, int threads) {
    int dev = 0, sms = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "attribute");
    const std::size_t want = (n + static_cast<std::size_t>(threads) - 1) /
                             static_cast<std::size_t>(threads);
    return static_cast<int>(std::min<std::size_t>(want, static_cast<std::size_t>(sms) * 16));
}

// ------------------------------------------------------------------ bandwidth kernels
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                            std::size_t n) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        dst[i] = src[i];
    }
}

__global__ void triad_kernel(float4* __restrict__ a, const float4* __restrict__ b,
                             const float4* __restrict__ c, float s, std::size_t n) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float4 x = b[i], y = c[i];
        a[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
    }
}

std::size_t check_bytes(std::size_t bytes) {
    if (bytes < 16 || bytes > kMaxBytes || bytes % 16 != 0) {
        throw std::invalid_argument("bytes: expected a multiple of 16 in [16, 2^38], got " +
                                    std::to_string(bytes));
    }
    return bytes;
}

constexpr std::size_t kVerifyBytes = std::size_t{1} << 22;  // 4 MiB of random data

BenchResult start(const char* name, const char* unit, int iters) {
    BenchResult r;
    r.name = name;
    r.unit = unit;
    r.iterations = iters;
    return r;
}

}  // namespace

DeviceInfo device_info(int device) {
    DeviceInfo info;
    info.device = device;
    cudaRuntimeGetVersion(&info.runtime_version);
    cudaDriverGetVersion(&info.driver_version);
    const cudaError_t err = cudaGetDeviceCount(&info.count);
    if (err != cudaSuccess) {
        info.error = cudaGetErrorString(err);
        cudaGetLastError();  // clear the sticky-free error state
        info.count = 0;
        return info;
    }
    if (info.count == 0) {
        info.error = "no CUDA device";
        return info;
    }
    if (device < 0 || device >= info.count) {
        info.error = "device " + std::to_string(device) + " out of range (" +
                     std::to_string(info.count) + " devices)";
        return info;
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    info.available = true;
    info.name = prop.name;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.sms = prop.multiProcessorCount;
    info.memory_gb = static_cast<double>(prop.totalGlobalMem) / 1e9;
    check(cudaSetDevice(device), "cudaSetDevice");
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    info.free_gb = static_cast<double>(free) / 1e9;
    return info;
}

BenchResult bench_copy(int device, std::size_t bytes, int iters) {
    check_bytes(bytes);
    check_iters(iters);
    use_device(device);
    check_fits(2 * bytes, "copy");
    BenchResult r = start("copy", "GB/s", iters);
    constexpr int threads = 256;
    {  // Verify on random data.
        const std::size_t vb = std::min(bytes, kVerifyBytes);
        std::vector<std::uint32_t> host(vb / 4), back(vb / 4);
        std::mt19937 rng(1);
        for (auto& x : host) x = rng();
        DeviceBuffer s(vb), d(vb);
        check(cudaMemcpy(s.ptr, host.data(), vb, cudaMemcpyHostToDevice), "cudaMemcpy");
        check(cudaMemset(d.ptr, 0, vb), "cudaMemset");
        const std::size_t n = vb / 16;
        copy_kernel<<<grid_for(n, threads), threads>>>(s.as<uint4>(), d.as<uint4>(), n);
        check(cudaGetLastError(), "copy_kernel");
        check(cudaMemcpy(back.data(), d.ptr, vb, cudaMemcpyDeviceToHost), "cudaMemcpy");
        r.verified = std::memcmp(host.data(), back.data(), vb) == 0;
        r.max_error = r.verified ? 0.0 : 1.0;
    }
    DeviceBuffer s(bytes), d(bytes);
    check(cudaMemset(s.ptr, 1, bytes), "cudaMemset");
    const std::size_t n = bytes / 16;
    const int grid = grid_for(n, threads);
    r.seconds = time_it([&] { copy_kernel<<<grid, threads>>>(s.as<uint4>(), d.as<uint4>(), n); },
                        iters);
    r.work = 2.0 * static_cast<double>(bytes);
    r.rate = r.work / r.seconds / 1e9;
    r.detail = std::to_string(bytes) + " bytes, " + std::to_string(grid) + " x " +
               std::to_string(threads) + " threads";
    return r;
}

BenchResult bench_triad(int device, std::size_t bytes, int iters) {
    check_bytes(bytes);
    check_iters(iters);
    use_device(device);
    check_fits(3 * bytes, "triad");
    BenchResult r = start("triad", "GB/s", iters);
    constexpr int threads = 256;
    constexpr float scale = 3.0f;
    {
        const std::size_t vb = std::min(bytes, kVerifyBytes), n = vb / 4;
        std::vector<float> b(n), c(n), a(n);
        std::mt19937 rng(2);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (std::size_t i = 0; i < n; ++i) {
            b[i] = u(rng);
            c[i] = u(rng);
        }
        DeviceBuffer da(vb), db(vb), dc(vb);
        check(cudaMemcpy(db.ptr, b.data(), vb, cudaMemcpyHostToDevice), "cudaMemcpy");
        check(cudaMemcpy(dc.ptr, c.data(), vb, cudaMemcpyHostToDevice), "cudaMemcpy");
        const std::size_t n4 = n / 4;
        triad_kernel<<<grid_for(n4, threads), threads>>>(da.as<float4>(), db.as<float4>(),
                                                          dc.as<float4>(), scale, n4);
        check(cudaGetLastError(), "triad_kernel");
        check(cudaMemcpy(a.data(), da.ptr, vb, cudaMemcpyDeviceToHost), "cudaMemcpy");
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const double ref = static_cast<double>(b[i]) + scale * static_cast<double>(c[i]);
            const double tol = 1e-6 * (std::fabs(static_cast<double>(b[i])) +
                                       scale * std::fabs(static_cast<double>(c[i]))) + 1e-30;
            worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - ref) / tol);
        }
        r.max_error = worst;
        r.verified = worst <= 1.0;
    }
    DeviceBuffer a(bytes), b(bytes), c(bytes);
    check(cudaMemset(b.ptr, 0, bytes), "cudaMemset");
    check(cudaMemset(c.ptr, 0, bytes), "cudaMemset");
    const std::size_t n4 = bytes / 16;
    const int grid = grid_for(n4, threads);
    r.seconds = time_it(
        [&] {
            triad_kernel<<<grid, threads>>>(a.as<float4>(), b.as<float4>(), c.as<float4>(),
                                            scale, n4);
        },
        iters);
    r.work = 3.0 * static_cast<double>(bytes);
    r.rate = r.work / r.seconds / 1e9;
    r.detail = "3 arrays of " + std::to_string(bytes) + " bytes";
    return r;
}

// ------------------------------------------------------------------ bf16 GEMM
namespace {

constexpr int BM = 128, BN = 128, BK = 32, PAD = 8, LDS = BK + PAD;  // LDS: 40 bf16 = 80 B
constexpr int kGemmThreads = 256;                                    // 8 warps: 2 (m) x 4 (n)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(gmem));
#else
    *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// A: m x k row-major; Bt: n x k row-major (B column-major); C: m x n row-major fp32.
__global__ void __launch_bounds__(kGemmThreads)
gemm_bf16_kernel(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ Bt,
                 float* __restrict__ C, int m, int n, int k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using namespace nvcuda;
    __shared__ __align__(128) __nv_bfloat16 As[2][BM * LDS];
    __shared__ __align__(128) __nv_bfloat16 Bs[2][BN * LDS];
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32;
    const int warp_m = warp / 4, warp_n = warp % 4;  // warp tile: 64 x 32
    const int bm = static_cast<int>(blockIdx.y) * BM, bn = static_cast<int>(blockIdx.x) * BN;
    (void)m;

    // One tile is 128 rows x 32 bf16 = 512 chunks of 16 B per operand: 2 per thread.
    auto load_tile = [&](int buf, int k0) {
        for (int r = 0; r < 2; ++r) {
            const int c = tid + r * kGemmThreads, row = c / 4, col = (c % 4) * 8;
            cp_async16(&As[buf][row * LDS + col],
                       A + static_cast<std::size_t>(bm + row) * static_cast<std::size_t>(k) + k0 + col);
            cp_async16(&Bs[buf][row * LDS + col],
                       Bt + static_cast<std::size_t>(bn + row) * static_cast<std::size_t>(k) + k0 + col);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const int tiles = k / BK;
    load_tile(0, 0);
    cp_async_commit();
    for (int t = 0; t < tiles; ++t) {
        if (t + 1 < tiles) load_tile((t + 1) & 1, (t + 1) * BK);
        cp_async_commit();
        cp_async_wait<1>();  // every group but the newest: tile t has landed
        __syncthreads();
        const __nv_bfloat16* as = As[t & 1];
        const __nv_bfloat16* bs = Bs[t & 1];
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
            for (int i = 0; i < 4; ++i)
                wmma::load_matrix_sync(fa[i], as + (warp_m * 64 + i * 16) * LDS + kk, LDS);
            for (int j = 0; j < 2; ++j)
                wmma::load_matrix_sync(fb[j], bs + (warp_n * 32 + j * 16) * LDS + kk, LDS);
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();  // the next iteration refills this buffer
    }
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 2; ++j) {
            const std::size_t row = static_cast<std::size_t>(bm + warp_m * 64 + i * 16);
            const std::size_t col = static_cast<std::size_t>(bn + warp_n * 32 + j * 16);
            wmma::store_matrix_sync(C + row * static_cast<std::size_t>(n) + col, acc[i][j], n,
                                    wmma::mem_row_major);
        }
    }
#else
    (void)A, (void)Bt, (void)C, (void)m, (void)n, (void)k;
#endif
}

void launch_gemm(const __nv_bfloat16* A, const __nv_bfloat16* Bt, float* C, int m, int n,
                 int k) {
    const dim3 grid(static_cast<unsigned>(n / BN), static_cast<unsigned>(m / BM));
    gemm_bf16_kernel<<<grid, kGemmThreads>>>(A, Bt, C, m, n, k);
}

void check_gemm_dims(int m, int n, int k) {
    auto bad = [](const char* what, int v, int mult) {
        throw std::invalid_argument(std::string(what) + ": expected a multiple of " +
                                    std::to_string(mult) + " in [" + std::to_string(mult) +
                                    ", 32768], got " + std::to_string(v));
    };
    if (m < BM || m > 32768 || m % BM) bad("m", m, BM);
    if (n < BN || n > 32768 || n % BN) bad("n", n, BN);
    if (k < BK || k > 32768 || k % BK) bad("k", k, BK);
}

}  // namespace

BenchResult bench_gemm_bf16(int device, int m, int n, int k, int iters) {
    check_gemm_dims(m, n, k);
    check_iters(iters);
    use_device(device);
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "attribute");
    if (major < 8) {
        throw std::runtime_error("bf16 tensor cores need compute capability 8.0 or newer");
    }
    const auto sm = static_cast<std::size_t>(m), sn = static_cast<std::size_t>(n),
               sk = static_cast<std::size_t>(k);
    check_fits((sm * sk + sn * sk) * 2 + sm * sn * 4, "gemm");
    BenchResult r = start("gemm_bf16", "TFLOP/s", iters);
    {  // Verify a 256 x 256 x 256 product on random data against a double-precision CPU one.
        constexpr int vm = 256, vn = 256, vk = 256;
        std::vector<__nv_bfloat16> a(vm * vk), bt(vn * vk);
        std::vector<float> af(vm * vk), btf(vn * vk), c(vm * vn);
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (int i = 0; i < vm * vk; ++i) {
            a[static_cast<std::size_t>(i)] = __float2bfloat16(u(rng));
            af[static_cast<std::size_t>(i)] = __bfloat162float(a[static_cast<std::size_t>(i)]);
        }
        for (int i = 0; i < vn * vk; ++i) {
            bt[static_cast<std::size_t>(i)] = __float2bfloat16(u(rng));
            btf[static_cast<std::size_t>(i)] = __bfloat162float(bt[static_cast<std::size_t>(i)]);
        }
        DeviceBuffer da(a.size() * 2), db(bt.size() * 2), dc(c.size() * 4);
        check(cudaMemcpy(da.ptr, a.data(), a.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
        check(cudaMemcpy(db.ptr, bt.data(), bt.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
        check(cudaMemset(dc.ptr, 0, c.size() * 4), "cudaMemset");
        launch_gemm(da.as<__nv_bfloat16>(), db.as<__nv_bfloat16>(), dc.as<float>(), vm, vn, vk);
        check(cudaGetLastError(), "gemm_bf16_kernel");
        check(cudaMemcpy(c.data(), dc.ptr, c.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
        double worst = 0;
        for (int i = 0; i < vm; ++i) {
            for (int j = 0; j < vn; ++j) {
                double ref = 0, mag = 0;
                for (int p = 0; p < vk; ++p) {
                    const double x = af[static_cast<std::size_t>(i * vk + p)];
                    const double y = btf[static_cast<std::size_t>(j * vk + p)];
                    ref += x * y;
                    mag += std::fabs(x * y);
                }
                // Exact bf16 products summed in fp32 (tensor cores may round the running
                // sum more coarsely than IEEE): 1e-4 of the sum of magnitudes; a wrong
                // layout or a missed tile is off by the order of the magnitudes.
                const double tol = 1e-4 * mag + 1e-6;
                const double got = c[static_cast<std::size_t>(i * vn + j)];
                worst = std::max(worst, std::fabs(got - ref) / tol);
            }
        }
        r.max_error = worst;
        r.verified = worst <= 1.0;
    }
    DeviceBuffer a(sm * sk * 2), bt(sn * sk * 2), c(sm * sn * 4);
    check(cudaMemset(a.ptr, 0, sm * sk * 2), "cudaMemset");
    check(cudaMemset(bt.ptr, 0, sn * sk * 2), "cudaMemset");
    r.seconds = time_it(
        [&] { launch_gemm(a.as<__nv_bfloat16>(), bt.as<__nv_bfloat16>(), c.as<float>(), m, n, k); },
        iters);
    r.work = 2.0 * static_cast<double>(m) * n * k;
    r.rate = r.work / r.seconds / 1e12;
    r.detail = std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
               ", tiles 128 x 128 x 32, WMMA 16 x 16 x 16, cp.async double buffer";
    return r;
}

BenchResult bench_host_copy(int device, std::size_t bytes, int iters, bool to_device) {
    check_bytes(bytes);
    check_iters(iters);
    use_device(device);
    check_fits(bytes, "host copy");
    BenchResult r = start(to_device ? "host_to_device" : "device_to_host", "GB/s", iters);
    HostBuffer h(bytes), back(bytes);
    DeviceBuffer d(bytes);
    {  // Verify: random bytes there and back.
        std::mt19937 rng(4);
        auto* p = h.as<std::uint32_t>();
        for (std::size_t i = 0; i < bytes / 4; ++i) p[i] = rng();
        check(cudaMemcpy(d.ptr, h.ptr, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        check(cudaMemcpy(back.ptr, d.ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
        r.verified = std::memcmp(h.ptr, back.ptr, bytes) == 0;
        r.max_error = r.verified ? 0.0 : 1.0;
    }
    r.seconds = time_it(
        [&] {
            if (to_device) {
                cudaMemcpyAsync(d.ptr, h.ptr, bytes, cudaMemcpyHostToDevice);
            } else {
                cudaMemcpyAsync(back.ptr, d.ptr, bytes, cudaMemcpyDeviceToHost);
            }
        },
        iters);
    r.work = static_cast<double>(bytes);
    r.rate = r.work / r.seconds / 1e9;
    r.detail = std::to_string(bytes) + " bytes, pinned host memory";
    return r;
}

}  // namespace espresso::cuda
