// The device allocator's side of CUPTI external correlation: while a ProbeSet collects CUPTI
// records, each allocation is bracketed by a push and a pop of an external id (probes.hpp:
// encode_external_id). No-ops when no collection is running, so CUPTI is never touched
// (nor initialised) by the allocator on its own.
#pragma once
#include <cstdint>

namespace trainmem::probes {

bool cupti_tagging_active();
// Return whether the push happened (pop only then).
bool cupti_push_external_id(std::uint64_t external_id);
void cupti_pop_external_id();

}  // namespace trainmem::probes
