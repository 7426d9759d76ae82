// CuptiTagAllocator (include/trainmem/probes/cupti_tag_allocator.hpp).
#include "trainmem/probes/cupti_tag_allocator.hpp"

#include "cupti_tag.hpp"
#include "trainmem/probes/probes.hpp"

namespace trainmem {

namespace {
// Pops the pushed external id however the inner allocation ends (a DeviceError throws).
class ExternalIdScope {
 public:
  explicit ExternalIdScope(std::uint64_t id)
      : pushed_(id != 0 && probes::cupti_push_external_id(id)) {}
  ~ExternalIdScope() {
    if (pushed_) probes::cupti_pop_external_id();
  }
  ExternalIdScope(const ExternalIdScope&) = delete;
  ExternalIdScope& operator=(const ExternalIdScope&) = delete;

 private:
  bool pushed_;
};
}  // namespace

void CuptiTagAllocator::annotate(Category category, std::uint64_t tensor_id) {
  pending_ = encode_external_id(category, tensor_id);
  inner_.annotate(category, tensor_id);
}

void* CuptiTagAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t id = pending_;
  pending_ = 0;
  ExternalIdScope scope(id);
  return inner_.allocate(bytes);
}

}  // namespace trainmem
