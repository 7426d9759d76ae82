// Decoding the activity records CUPTI hands back into CuptiFold's host calls (CUDA builds
// only: needs cupti_activity.h). Which records count (cupti_fold.hpp lists them):
//   MEMORY2 of memory kind DEVICE, operation ALLOCATION or RELEASE  -> add_memory
//   MEMORY2 of any other memory kind or operation                   -> add_other_record
//   EXTERNAL_CORRELATION of kind CUSTOM0 (ours, cupti_tag.hpp)      -> add_external
//   EXTERNAL_CORRELATION of any other kind                          -> add_other_record
//   MEMORY_POOL                                                     -> add_pool_record
//   anything else                                                   -> add_other_record
#pragma once
#include <cupti_activity.h>

#include "cupti_fold.hpp"

namespace trainmem::probes {

// Copies what the fold needs from one record (nullptr: nothing).
void add_cupti_record(CuptiFold& fold, const CUpti_Activity* record);

}  // namespace trainmem::probes
