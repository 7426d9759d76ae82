// safetensors reader and streaming writer. See include/trainmem/base/safetensors.hpp.
#include "trainmem/base/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"

namespace trainmem {

namespace {

// Larger headers are refused (the reference implementation's limit is 100 MB as well).
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeRow {
  SafeDType t;
  const char* name;
  std::size_t size;
  bool is_float;
};
constexpr DTypeRow kDTypes[] = {
    {SafeDType::F64, "F64", 8, true},         {SafeDType::F32, "F32", 4, true},
    {SafeDType::F16, "F16", 2, true},         {SafeDType::BF16, "BF16", 2, true},
    {SafeDType::F8_E4M3, "F8_E4M3", 1, true}, {SafeDType::F8_E5M2, "F8_E5M2", 1, true},
    {SafeDType::I64, "I64", 8, false},        {SafeDType::I32, "I32", 4, false},
    {SafeDType::I16, "I16", 2, false},        {SafeDType::I8, "I8", 1, false},
    {SafeDType::U64, "U64", 8, false},        {SafeDType::U32, "U32", 4, false},
    {SafeDType::U16, "U16", 2, false},        {SafeDType::U8, "U8", 1, false},
    {SafeDType::BOOL, "BOOL", 1, false},
};
const DTypeRow& row(SafeDType t) {
  return kDTypes[static_cast<int>(t)];
}

// fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities, S.1111.111 is NaN.
float f8e4m3_to_f32(std::uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  float r;
  if (exp == 0xf && man == 0x7) {
    r = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    r = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    r = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  }
  return neg ? -r : r;
}
// fp8 e5m2 is the top byte of an IEEE half.
float f8e5m2_to_f32(std::uint8_t v) {
  return f16_to_f32(std::uint16_t(v) << 8);
}

template <class T>
T load_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the file is little-endian, and so is every host we support
  return v;
}

float element_to_f32(SafeDType t, const unsigned char* p) {
  switch (t) {
    case SafeDType::F64:
      return float(load_le<double>(p));
    case SafeDType::F32:
      return load_le<float>(p);
    case SafeDType::F16:
      return f16_to_f32(load_le<std::uint16_t>(p));
    case SafeDType::BF16:
      return bf16_to_f32(load_le<std::uint16_t>(p));
    case SafeDType::F8_E4M3:
      return f8e4m3_to_f32(*p);
    case SafeDType::F8_E5M2:
      return f8e5m2_to_f32(*p);
    default:
      break;
  }
  return 0.0f;
}

std::int64_t element_to_i64(SafeDType t, const unsigned char* p) {
  switch (t) {
    case SafeDType::I64:
      return load_le<std::int64_t>(p);
    case SafeDType::I32:
      return load_le<std::int32_t>(p);
    case SafeDType::I16:
      return load_le<std::int16_t>(p);
    case SafeDType::I8:
      return load_le<std::int8_t>(p);
    case SafeDType::U64:
      return std::int64_t(load_le<std::uint64_t>(p));
    case SafeDType::U32:
      return load_le<std::uint32_t>(p);
    case SafeDType::U16:
      return load_le<std::uint16_t>(p);
    case SafeDType::U8:
    case SafeDType::BOOL:
      return *p;
    default:
      break;
  }
  return 0;
}

[[noreturn]] void invalid(const std::string& path, const std::string& msg) {
  throw InputError(path + ": not a valid safetensors file: " + msg);
}

std::uint64_t numel_of(const std::vector<std::int64_t>& shape, const std::string& what) {
  std::uint64_t n = 1;
  for (auto d : shape) n = checked_mul(n, std::uint64_t(d), what.c_str());
  return n;
}

}  // namespace

const char* safe_dtype_name(SafeDType t) {
  return row(t).name;
}
std::size_t safe_dtype_size(SafeDType t) {
  return row(t).size;
}
bool safe_dtype_is_float(SafeDType t) {
  return row(t).is_float;
}
std::optional<SafeDType> parse_safe_dtype(const std::string& s) {
  for (const auto& r : kDTypes)
    if (s == r.name) return r.t;
  return std::nullopt;
}

std::uint64_t SafeTensorInfo::numel() const {
  return numel_of(shape, name);
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string SafeTensorInfo::shape_string() const {
  return trainmem::shape_string(shape);
}

// ------------------------------------------------------------------------------ reader

SafeTensorsReader::SafeTensorsReader(std::string path) : path_(std::move(path)) {
  auto fail = [&](const std::string& msg) { invalid(path_, msg); };
  // A regular file (a FIFO would block, a device never ends) under the weights' size cap.
  check_input_file(path_, "safetensors file", kMaxWeightsBytes);
  in_.open(path_, std::ios::binary);
  if (!in_) throw InputError(path_ + ": cannot open safetensors file");
  in_.seekg(0, std::ios::end);
  const std::uint64_t file_size = std::uint64_t(in_.tellg());
  in_.seekg(0);
  if (file_size < 8)
    fail("shorter than the 8-byte header length (" + std::to_string(file_size) + " bytes)");
  unsigned char len_bytes[8];
  in_.read(reinterpret_cast<char*>(len_bytes), 8);
  const std::uint64_t header_len = load_le<std::uint64_t>(len_bytes);
  if (header_len > kMaxHeaderBytes)
    fail("header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  if (header_len > file_size - 8)
    fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
         std::to_string(file_size) + " bytes)");
  std::string header(header_len, '\0');
  in_.read(header.data(), std::streamsize(header_len));
  if (!in_) fail("could not read the header");
  data_start_ = 8 + header_len;
  const std::uint64_t data_size = file_size - data_start_;

  // Strict: a tensor named twice, an out-of-range number or an over-long name is refused.
  const nlohmann::json j =
      parse_json_strict<nlohmann::json>(header, path_ + ": not a valid safetensors file: header");
  if (!j.is_object()) fail("header is not a JSON object");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) fail("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail("__metadata__ value of '" + clip(m.key()) + "' is not a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& msg) {
      invalid(path_, "tensor '" + clip(name) + "': " + msg);
    };
    const auto& e = *it;
    if (!e.is_object()) bad("entry is not an object");
    if (!e.contains("dtype") || !e["dtype"].is_string()) bad("missing string field 'dtype'");
    if (!e.contains("shape") || !e["shape"].is_array()) bad("missing array field 'shape'");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      bad("missing field 'data_offsets' ([begin, end])");
    SafeTensorInfo t;
    t.name = name;
    auto dt = parse_safe_dtype(e["dtype"].get<std::string>());
    if (!dt) bad("unknown dtype '" + clip(e["dtype"].get<std::string>()) + "'");
    t.dtype = *dt;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        bad("shape entries must be non-negative integers");
      t.shape.push_back(d.get<std::int64_t>());
    }
    for (int k = 0; k < 2; ++k)
      if (!e["data_offsets"][k].is_number_unsigned() &&
          !(e["data_offsets"][k].is_number_integer() &&
            e["data_offsets"][k].get<std::int64_t>() >= 0))
        bad("data_offsets must be non-negative integers");
    t.begin = e["data_offsets"][0].get<std::uint64_t>();
    t.end = e["data_offsets"][1].get<std::uint64_t>();
    if (t.end < t.begin) bad("data_offsets end < begin");
    if (t.end > data_size)
      bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
          "] run past the data section (" + std::to_string(data_size) + " bytes): file truncated?");
    std::uint64_t expect = 0;
    try {
      expect = checked_mul(numel_of(t.shape, name), safe_dtype_size(t.dtype), name.c_str());
    } catch (const OverflowError&) {
      bad("shape " + t.shape_string() + " overflows 64 bits");
    }
    if (t.end - t.begin != expect)
      bad("data_offsets span " + std::to_string(t.end - t.begin) + " bytes but shape " +
          t.shape_string() + " of " + safe_dtype_name(t.dtype) + " needs " +
          std::to_string(expect));
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (i > 0 && tensors_[i].begin < tensors_[i - 1].end && tensors_[i].begin != tensors_[i].end)
      fail("tensors '" + tensors_[i - 1].name + "' and '" + tensors_[i].name + "' overlap");
    index_[tensors_[i].name] = i;
  }
}

const SafeTensorInfo* SafeTensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafeTensorInfo& SafeTensorsReader::at(const std::string& name) const {
  const auto* t = find(name);
  if (!t) throw InputError(path_ + ": no tensor '" + name + "'");
  return *t;
}

void SafeTensorsReader::read_raw(const SafeTensorInfo& t, std::uint64_t byte_offset,
                                 std::uint64_t bytes, void* dst) const {
  in_.clear();
  in_.seekg(std::streamoff(data_start_ + t.begin + byte_offset));
  in_.read(static_cast<char*>(dst), std::streamsize(bytes));
  if (!in_) throw InputError(path_ + ": tensor '" + t.name + "': read failed");
}

void SafeTensorsReader::read_f32(const std::string& name, float* dst, std::uint64_t first,
                                 std::uint64_t count) const {
  const auto& t = at(name);
  if (!safe_dtype_is_float(t.dtype))
    throw InputError(path_ + ": tensor '" + name + "' has dtype " + safe_dtype_name(t.dtype) +
                     ", expected a floating dtype (F64, F32, F16, BF16, F8_E4M3, F8_E5M2)");
  if (first > t.numel() || count > t.numel() - first)
    throw Error(path_ + ": tensor '" + name + "': element range out of bounds");
  const std::size_t w = safe_dtype_size(t.dtype);
  if (t.dtype == SafeDType::F32) {
    read_raw(t, first * 4, count * 4, dst);
    return;
  }
  constexpr std::uint64_t kChunk = 1 << 20;
  std::vector<unsigned char> buf(std::min(count, kChunk) * w);
  for (std::uint64_t done = 0; done < count;) {
    const std::uint64_t n = std::min(kChunk, count - done);
    read_raw(t, (first + done) * w, n * w, buf.data());
    for (std::uint64_t e = 0; e < n; ++e) dst[done + e] = element_to_f32(t.dtype, &buf[e * w]);
    done += n;
  }
}

std::vector<float> SafeTensorsReader::read_f32(const std::string& name) const {
  const auto& t = at(name);
  std::vector<float> out(t.numel());
  read_f32(name, out.data(), 0, out.size());
  return out;
}

std::vector<std::int64_t> SafeTensorsReader::read_int(const std::string& name) const {
  const auto& t = at(name);
  if (safe_dtype_is_float(t.dtype))
    throw InputError(path_ + ": tensor '" + name + "' has dtype " + safe_dtype_name(t.dtype) +
                     ", expected an integer dtype");
  const std::size_t w = safe_dtype_size(t.dtype);
  std::vector<unsigned char> buf(t.end - t.begin);
  if (!buf.empty()) read_raw(t, 0, buf.size(), buf.data());
  std::vector<std::int64_t> out(t.numel());
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = element_to_i64(t.dtype, &buf[e * w]);
  return out;
}

// ------------------------------------------------------------------------------ writer

void SafeTensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  if (open_) throw Error("safetensors writer: metadata after open()");
  metadata_[key] = value;
}

void SafeTensorsWriter::declare(const std::string& name, SafeDType dtype,
                                std::vector<std::int64_t> shape) {
  if (open_) throw Error("safetensors writer: declare('" + name + "') after open()");
  if (name.empty() || name == "__metadata__")
    throw InputError("safetensors writer: invalid tensor name '" + name + "'");
  if (index_.count(name)) throw Error("safetensors writer: tensor '" + name + "' declared twice");
  SafeTensorInfo t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.begin = next_offset_;
  t.end = checked_add(t.begin, checked_mul(t.numel(), safe_dtype_size(dtype), name.c_str()));
  next_offset_ = t.end;
  index_[name] = tensors_.size();
  tensors_.push_back(std::move(t));
}

void SafeTensorsWriter::open(const std::string& path, const std::string& what) {
  path_ = path;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    j["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) j["__metadata__"][k] = v;
  }
  for (const auto& t : tensors_) {
    j[t.name] = {{"dtype", safe_dtype_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {t.begin, t.end}}};
  }
  std::string header = j.dump();
  while (header.size() % 8) header.push_back(' ');
  out_ = std::make_unique<AtomicFile>(path_, what.empty() ? "writing safetensors" : what);
  unsigned char len[8];
  const std::uint64_t n = header.size();
  std::memcpy(len, &n, 8);
  data_start_ = 8 + n;
  // The whole file's size on the disk now, so that put() may write in any order and a disk
  // too small fails before any tensor is computed.
  out_->reserve(checked_add(data_start_, next_offset_));
  out_->write(len, 8);
  out_->write(header.data(), header.size());
  written_.assign(tensors_.size(), false);
  open_ = true;
}

void SafeTensorsWriter::put(const std::string& name, const void* data) {
  if (!open_) throw Error("safetensors writer: put('" + name + "') before open()");
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(path_ + ": put of undeclared tensor '" + name + "'");
  const auto& t = tensors_[it->second];
  out_->write_at(data, t.end - t.begin, data_start_ + t.begin);
  written_[it->second] = true;
}

void SafeTensorsWriter::close() {
  if (!open_) return;
  open_ = false;
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (!written_[i]) {
      out_.reset();  // the unfinished file is removed
      throw Error(path_ + ": tensor '" + tensors_[i].name + "' was declared but never written");
    }
  out_->commit();
  out_.reset();
}

// An unfinished file (an exception between open() and close()) is removed by out_'s destructor.
SafeTensorsWriter::~SafeTensorsWriter() = default;

}  // namespace trainmem
