// Backend names, and the CUDA entry points when trainmem is built without CUDA.
#include <algorithm>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

const char* backend_name(BackendKind k) {
  switch (k) {
    case BackendKind::cpu:
      return "cpu";
    case BackendKind::meta:
      return "meta";
    case BackendKind::cuda:
      return "cuda";
  }
  return "?";
}

void Backend::init_param(void* dst, float* master, std::uint64_t n, const ParamInit& init) {
  constexpr std::uint64_t kChunk = std::uint64_t(1) << 20;  // host staging, elements
  const DType dt = dtype();
  const std::size_t w = dtype_size(dt);
  std::vector<float> vals(std::size_t(std::min(n, kChunk)));
  std::vector<unsigned char> stored(vals.size() * w);
  for (std::uint64_t first = 0; first < n; first += kChunk) {
    const std::int64_t count = std::int64_t(std::min(kChunk, n - first));
#pragma omp parallel for schedule(static)
    for (std::int64_t e = 0; e < count; ++e) {
      vals[std::size_t(e)] = param_init_value(init, first + std::uint64_t(e));
      store_from_f32(stored.data(), std::size_t(e), dt, vals[std::size_t(e)]);
    }
    upload(static_cast<unsigned char*>(dst) + first * w, stored.data(), std::uint64_t(count) * w);
    if (master) upload(master + first, vals.data(), std::uint64_t(count) * 4);
  }
}

#ifndef TRAINMEM_HAVE_CUDA
std::string cuda_unavailable_reason() {
  return "trainmem was built without CUDA";
}
std::uint64_t cuda_device_total_bytes(std::string* reason) {
  *reason = cuda_unavailable_reason();
  return 0;
}
std::unique_ptr<Backend> make_cuda_backend(DType) {
  throw DeviceError("cuda backend: trainmem was built without CUDA (TRAINMEM_CUDA=OFF)");
}
int cuda_use_device(int) {
  throw InputError("--backend cuda: trainmem was built without CUDA (TRAINMEM_CUDA=OFF)");
}
int cuda_current_device() {
  return 0;
}
#endif

}  // namespace trainmem
