// Backend names, and the CUDA entry points when trainmem is built without CUDA.
#include "trainmem/backend.hpp"
#include "trainmem/error.hpp"

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

#ifndef TRAINMEM_HAVE_CUDA
std::string cuda_unavailable_reason() {
  return "trainmem was built without CUDA";
}
std::unique_ptr<Backend> make_cuda_backend(DType) {
  throw DeviceError("cuda backend: trainmem was built without CUDA (TRAINMEM_CUDA=OFF)");
}
#endif

}  // namespace trainmem
