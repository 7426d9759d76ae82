// safetensors files: read (HuggingFace checkpoints, golden data) and write (--dump).
//
// Format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>"}}
// (padded with spaces to a multiple of 8), then the raw little-endian tensor data; offsets are
// relative to the first byte after the header. Tensors are row-major.
//
// Reading validates the whole header up front; every error is an InputError naming the file
// (and the tensor where there is one). Floating tensors of any stored dtype (F64, F32, F16,
// BF16, F8_E4M3, F8_E5M2) are converted to fp32 on read; integer tensors to int64.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainmem/base/atomic_file.hpp"

namespace trainmem {

enum class SafeDType : std::uint8_t {
  F64,
  F32,
  F16,
  BF16,
  F8_E4M3,
  F8_E5M2,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL
};
const char* safe_dtype_name(SafeDType t);  // "F32", "BF16", ...
std::optional<SafeDType> parse_safe_dtype(const std::string& s);
std::size_t safe_dtype_size(SafeDType t);
bool safe_dtype_is_float(SafeDType t);

// A shape as the error messages print it: "[96, 48]".
std::string shape_string(const std::vector<std::int64_t>& shape);

struct SafeTensorInfo {
  std::string name;
  SafeDType dtype = SafeDType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets into the data section
  std::uint64_t end = 0;
  std::uint64_t numel() const;
  std::string shape_string() const;  // "[96, 48]"
};

class SafeTensorsReader {
 public:
  // Opens `path` and validates the header: length within the file, valid JSON, every entry
  // with a known dtype, a shape of non-negative sizes, offsets inside the data section whose
  // length equals numel × width, no two tensors overlapping.
  explicit SafeTensorsReader(std::string path);

  const std::string& path() const { return path_; }
  // In data order (by begin offset).
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafeTensorInfo* find(const std::string& name) const;
  // InputError "<file>: no tensor '<name>'" when absent.
  const SafeTensorInfo& at(const std::string& name) const;

  // Elements [first, first + count) of a floating tensor, converted to fp32, into dst.
  void read_f32(const std::string& name, float* dst, std::uint64_t first,
                std::uint64_t count) const;
  std::vector<float> read_f32(const std::string& name) const;
  // A whole integer (or BOOL) tensor, widened to int64.
  std::vector<std::int64_t> read_int(const std::string& name) const;

 private:
  void read_raw(const SafeTensorInfo& t, std::uint64_t byte_offset, std::uint64_t bytes,
                void* dst) const;
  std::string path_;
  std::uint64_t data_start_ = 0;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable std::ifstream in_;
};

// Streams a safetensors file: declare every tensor first (their offsets follow declaration
// order), open() writes the header, then put() each tensor's bytes in any order; close()
// checks that every declared tensor was written. Errors name the file and tensor.
class SafeTensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  void declare(const std::string& name, SafeDType dtype, std::vector<std::int64_t> shape);
  bool declared(const std::string& name) const { return index_.count(name) != 0; }
  // Writes to a temporary file beside `path`, renamed onto it by close() (atomic_file.hpp);
  // `what` names the flag in messages ("--dump"; "" for the path alone).
  void open(const std::string& path, const std::string& what = "");
  // `data` holds numel × width bytes in the declared dtype.
  void put(const std::string& name, const void* data);
  void close();
  ~SafeTensorsWriter();

 private:
  std::string path_;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::vector<bool> written_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t next_offset_ = 0;
  std::uint64_t data_start_ = 0;
  std::unique_ptr<AtomicFile> out_;
  bool open_ = false;
};

}  // namespace trainmem
