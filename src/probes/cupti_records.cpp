// Decoding CUPTI activity records for the fold (see cupti_records.hpp).
#include "cupti_records.hpp"

namespace trainmem::probes {

void add_cupti_record(CuptiFold& fold, const CUpti_Activity* record) {
  if (record == nullptr) return;
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_MEMORY2: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemory4*>(record);
      const bool alloc = m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
      const bool release = m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
      if (m->memoryKind != CUPTI_ACTIVITY_MEMORY_KIND_DEVICE || (!alloc && !release)) {
        fold.add_other_record();
        return;
      }
      fold.add_memory(CuptiMemEvent{m->timestamp, m->address, m->bytes, m->correlationId, alloc});
      return;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
        fold.add_external(e->correlationId, e->externalId);
      else
        fold.add_other_record();
      return;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL:
      fold.add_pool_record();
      return;
    default:
      fold.add_other_record();
      return;
  }
}

}  // namespace trainmem::probes
