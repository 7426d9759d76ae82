// bench_gemm_cuda: the dense GEMM rate of this GPU through trainmem's own GEMM path
// (CudaBackend::matmul -> cublasGemmEx, CUBLAS_COMPUTE_32F, the 32 MiB workspace), the
// denominator of the model FLOP utilisation that tools/gpu_check.sh reports. Times a square
// 8192^3 product and the LLaMA-7B layer shapes at 4096 tokens (q/k/v/o 4096x4096, gate/up
// 4096->11008, down 11008->4096, lm_head 4096->32000), each as the median of timed repeats
// after warm-up, with CUDA events on the backend's stream. Prints a table and, with --json,
// writes {"schema": "trainmem-bench/1", "bench": "gemm_cuda", ...}. Asserts nothing.
//
//   bench_gemm_cuda [--dtype bf16|fp16|fp32] [--repeats N] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

#ifdef TRAINMEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.hpp"
#include "trainmem/base/cuda_check.hpp"
#endif

using namespace trainmem;

namespace {

struct Shape {
  const char* name;
  std::int64_t M, N, K;  // c (M,N) = a (M,K) . b^T (b stored (N,K)), as the model's x . W^T
};

int usage(const char* msg) {
  std::fprintf(stderr,
               "bench_gemm_cuda: %s\nusage: bench_gemm_cuda [--dtype bf16|fp16|fp32] "
               "[--repeats N] [--json FILE]\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtype_arg = "bf16", json_path;
  int repeats = 20;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if ((arg == "--dtype" || arg == "--repeats" || arg == "--json") && a + 1 >= argc)
      return usage(("missing value after " + arg).c_str());
    if (arg == "--dtype") {
      dtype_arg = argv[++a];
    } else if (arg == "--repeats") {
      repeats = std::atoi(argv[++a]);
      if (repeats < 1) return usage("--repeats must be >= 1");
    } else if (arg == "--json") {
      json_path = argv[++a];
    } else {
      return usage(("unknown argument " + arg).c_str());
    }
  }
  std::optional<DType> dt;
  if (dtype_arg == "bf16") dt = DType::bf16;
  if (dtype_arg == "fp16") dt = DType::f16;
  if (dtype_arg == "fp32") dt = DType::f32;
  if (!dt) return usage("--dtype must be bf16, fp16 or fp32");

#ifndef TRAINMEM_HAVE_CUDA
  std::printf("bench_gemm_cuda: trainmem was built without CUDA; nothing to measure\n");
  return 0;
#else
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) {
    std::fprintf(stderr, "bench_gemm_cuda: no usable CUDA device (%s); nothing to measure\n",
                 reason.c_str());
    return 1;
  }
  try {
    CudaBackend be(*dt);
    cudaDeviceProp prop{};
    TM_CUDA_CHECK(cudaGetDeviceProperties(&prop, be.device()));
    const std::vector<Shape> shapes = {
        {"square_8192", 8192, 8192, 8192},      {"llama7b_qkvo", 4096, 4096, 4096},
        {"llama7b_gate_up", 4096, 11008, 4096}, {"llama7b_down", 4096, 4096, 11008},
        {"llama7b_lm_head", 4096, 32000, 4096},
    };
    const std::size_t w = dtype_size(*dt);
    std::uint64_t max_a = 0, max_b = 0, max_c = 0;
    for (const Shape& s : shapes) {
      max_a = std::max<std::uint64_t>(max_a, std::uint64_t(s.M * s.K) * w);
      max_b = std::max<std::uint64_t>(max_b, std::uint64_t(s.N * s.K) * w);
      max_c = std::max<std::uint64_t>(max_c, std::uint64_t(s.M * s.N) * w);
    }
    Allocator& alloc = be.allocator();
    const std::uint64_t ws_bytes = std::uint64_t(32) << 20;
    void* ws = alloc.allocate(ws_bytes);
    void* a = alloc.allocate(max_a);
    void* b = alloc.allocate(max_b);
    void* c = alloc.allocate(max_c);
    if (!ws || !a || !b || !c) throw Error("bench_gemm_cuda: device allocation failed");
    be.set_gemm_workspace(ws, ws_bytes);
    // Operands with small varied values (all-zero operands would flatter the power budget).
    std::vector<unsigned char> host(std::max(max_a, max_b));
    std::uint32_t x = 12345;
    for (std::uint64_t i = 0; i < host.size() / w; ++i) {
      x = x * 1664525u + 1013904223u;
      store_from_f32(host.data(), i, *dt, float(int(x >> 9) % 2001 - 1000) * 1e-3f);
    }
    be.upload(a, host.data(), max_a);
    be.upload(b, host.data(), max_b);

    cudaEvent_t start, stop;
    TM_CUDA_CHECK(cudaEventCreate(&start));
    TM_CUDA_CHECK(cudaEventCreate(&stop));
    nlohmann::json results = nlohmann::json::array();
    double best = 0;
    std::printf("bench_gemm_cuda: %s, %s, cublasGemmEx CUBLAS_COMPUTE_32F, median of %d\n",
                prop.name, dtype_name(*dt), repeats);
    std::printf("%-18s %7s %7s %7s %10s %10s\n", "shape", "M", "N", "K", "ms", "TFLOP/s");
    for (const Shape& s : shapes) {
      for (int i = 0; i < 3; ++i)
        be.matmul(c, a, b, s.M, s.N, s.K, Trans::no, Trans::yes, 1.0f, 0.0f);
      std::vector<double> ms;
      for (int r = 0; r < repeats; ++r) {
        TM_CUDA_CHECK(cudaEventRecord(start, be.stream()));
        be.matmul(c, a, b, s.M, s.N, s.K, Trans::no, Trans::yes, 1.0f, 0.0f);
        TM_CUDA_CHECK(cudaEventRecord(stop, be.stream()));
        TM_CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        TM_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double tflops = 2.0 * double(s.M) * double(s.N) * double(s.K) / (med * 1e-3) / 1e12;
      best = std::max(best, tflops);
      std::printf("%-18s %7lld %7lld %7lld %10.3f %10.1f\n", s.name, (long long)s.M, (long long)s.N,
                  (long long)s.K, med, tflops);
      results.push_back({{"shape", s.name},
                         {"M", s.M},
                         {"N", s.N},
                         {"K", s.K},
                         {"median_ms", med},
                         {"tflops", tflops}});
    }
    TM_CUDA_CHECK(cudaEventDestroy(start));
    TM_CUDA_CHECK(cudaEventDestroy(stop));
    be.synchronize();
    be.set_gemm_workspace(nullptr, 0);
    alloc.deallocate(c, max_c);
    alloc.deallocate(b, max_b);
    alloc.deallocate(a, max_a);
    alloc.deallocate(ws, ws_bytes);
    std::printf("best: %.1f TFLOP/s\n", best);
    if (!json_path.empty()) {
      const nlohmann::json doc = {{"schema", "trainmem-bench/1"},
                                  {"bench", "gemm_cuda"},
                                  {"device", prop.name},
                                  {"dtype", dtype_name(*dt)},
                                  {"compute", "CUBLAS_COMPUTE_32F"},
                                  {"repeats", repeats},
                                  {"results", results},
                                  {"best_tflops", best}};
      std::ofstream(json_path) << doc.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_cuda: %s\n", e.what());
    return 1;
  }
#endif
}
