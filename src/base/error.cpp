// Out-of-line constructors of the error types (include/trainmem/base/error.hpp).
#include "trainmem/base/error.hpp"

namespace trainmem {

namespace {
std::string oom_message(std::uint64_t requested, const std::string& category,
                        const std::string& tensor, std::uint64_t live, const std::string& detail) {
  std::string m = "out of memory: allocating " + std::to_string(requested) + " bytes for tensor '" +
                  tensor + "' (category " + category + ") with " + std::to_string(live) +
                  " bytes live";
  if (!detail.empty()) m += ": " + detail;
  return m;
}
}  // namespace

OutOfMemory::OutOfMemory(std::uint64_t requested_bytes_, std::string category_, std::string tensor_,
                         std::uint64_t live_bytes_, std::string detail)
    : Error(oom_message(requested_bytes_, category_, tensor_, live_bytes_, detail)),
      requested_bytes(requested_bytes_),
      category(std::move(category_)),
      tensor(std::move(tensor_)),
      live_bytes(live_bytes_) {}

}  // namespace trainmem
