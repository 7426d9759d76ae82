// Error types. Every failure the CLI reports maps to one of these and to an exit code:
// InputError -> 2 (the message names the flag or field and what is allowed),
// OutOfMemory -> 3 (requested bytes, category, tensor, live bytes), anything else -> 1.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace trainmem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input: a flag, a config field, a file. `what()` names the field and what is allowed.
class InputError : public Error {
 public:
  using Error::Error;
};

// Size arithmetic that does not fit in 64 bits.
class OverflowError : public InputError {
 public:
  using InputError::InputError;
};

// An allocation the allocator could not satisfy (real device OOM or a budget-limited one).
class OutOfMemory : public Error {
 public:
  OutOfMemory(std::uint64_t requested_bytes, std::string category, std::string tensor,
              std::uint64_t live_bytes, std::string detail);
  std::uint64_t requested_bytes;
  std::string category;
  std::string tensor;
  std::uint64_t live_bytes;
};

// A failed CUDA / cuBLAS / CUPTI call: file, line and the library's error name.
class DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace trainmem
