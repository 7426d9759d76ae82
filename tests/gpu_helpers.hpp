// Shared helper for GPU tests: skip with the reason when no CUDA device is usable.
// Call it first in every GPU test (or in the fixture's SetUp). Never a bare return.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "trainmem/backends/backend.hpp"

#define require_cuda_device()                                                  \
  do {                                                                         \
    const std::string tm_reason_ = ::trainmem::cuda_unavailable_reason();      \
    if (!tm_reason_.empty()) GTEST_SKIP() << "no CUDA device: " << tm_reason_; \
  } while (0)
