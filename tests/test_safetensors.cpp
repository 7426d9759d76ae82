// safetensors reader/writer: round trips, dtype conversions against hand-encoded bytes, and
// malformed files rejected with messages naming the file and the tensor.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trainmem/base/error.hpp"
#include "trainmem/base/safetensors.hpp"

using namespace trainmem;

namespace {

std::string temp_path(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() /
          ("trainmem_st_" + std::to_string(::getpid()) + "_" + leaf))
      .string();
}

// Writes a file from a header text and raw data bytes, as a hostile or broken producer might.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               std::uint64_t header_len_override = 0) {
  std::ofstream f(path, std::ios::binary);
  std::uint64_t n = header_len_override ? header_len_override : header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(data.data(), std::streamsize(data.size()));
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void expect_input_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    SafeTensorsReader r(path);
    FAIL() << "no error for " << path;
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

}  // namespace

TEST(SafeTensors, RoundTripKeepsNamesShapesValuesAndMetadata) {
  const std::string path = temp_path("roundtrip.safetensors");
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7e20f};
  std::vector<std::int32_t> ids = {0, 5, -3, 2147483647};
  {
    SafeTensorsWriter w;
    w.set_metadata("who", "test");
    w.declare("a.weight", SafeDType::F32, {2, 3});
    w.declare("ids", SafeDType::I32, {4});
    w.declare("empty", SafeDType::F32, {0, 3});
    w.open(path);
    w.put("ids", ids.data());  // any order
    w.put("a.weight", a.data());
    w.put("empty", nullptr);
    w.close();
  }
  SafeTensorsReader r(path);
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.metadata().at("who"), "test");
  EXPECT_EQ(r.at("a.weight").shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(r.read_f32("a.weight"), a);
  auto back = r.read_int("ids");
  ASSERT_EQ(back.size(), ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(back[i], ids[i]);
  EXPECT_EQ(r.at("empty").numel(), 0u);
  // Partial reads.
  std::vector<float> part(2);
  r.read_f32("a.weight", part.data(), 3, 2);
  EXPECT_EQ(part[0], 0.0f);
  EXPECT_EQ(part[1], 1e-30f);
  // The header is padded to 8 bytes.
  std::ifstream f(path, std::ios::binary);
  std::uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  std::remove(path.c_str());
}

TEST(SafeTensors, ConvertsEveryStoredFloatDtypeToF32) {
  // Hand-encoded values: 1.5, -2, 0.099975586 (f16 0x2E66), 65504 (f16 max).
  const std::string path = temp_path("dtypes.safetensors");
  std::vector<std::uint16_t> f16 = {0x3E00, 0xC000, 0x2E66, 0x7BFF};
  std::vector<std::uint16_t> bf16 = {0x3FC0, 0xC000, 0x3DCC, 0x477F};  // 1.5 -2 0.099609375 65280
  std::vector<double> f64 = {1.5, -2.0, 0.1, 1e300};
  std::vector<std::uint8_t> e4m3 = {0x3C, 0xC0, 0x01, 0x7E};  // 1.5 -2 2^-9 448
  std::vector<std::uint8_t> e5m2 = {0x3E, 0xC0, 0x01, 0x7B};  // 1.5 -2 2^-16 57344
  std::vector<std::int64_t> i64 = {-5, 1ll << 40};
  std::vector<std::uint8_t> b = {0, 1};
  {
    SafeTensorsWriter w;
    w.declare("f16", SafeDType::F16, {4});
    w.declare("bf16", SafeDType::BF16, {4});
    w.declare("f64", SafeDType::F64, {4});
    w.declare("e4m3", SafeDType::F8_E4M3, {4});
    w.declare("e5m2", SafeDType::F8_E5M2, {4});
    w.declare("i64", SafeDType::I64, {2});
    w.declare("bool", SafeDType::BOOL, {2});
    w.open(path);
    w.put("f16", f16.data());
    w.put("bf16", bf16.data());
    w.put("f64", f64.data());
    w.put("e4m3", e4m3.data());
    w.put("e5m2", e5m2.data());
    w.put("i64", i64.data());
    w.put("bool", b.data());
    w.close();
  }
  SafeTensorsReader r(path);
  EXPECT_EQ(r.read_f32("f16"), (std::vector<float>{1.5f, -2.0f, 0.099975586f, 65504.0f}));
  EXPECT_EQ(r.read_f32("bf16"), (std::vector<float>{1.5f, -2.0f, 0.099609375f, 65280.0f}));
  auto v64 = r.read_f32("f64");
  EXPECT_EQ(v64[2], 0.1f);
  EXPECT_TRUE(std::isinf(v64[3]));  // beyond fp32: rounds to infinity
  EXPECT_EQ(r.read_f32("e4m3"), (std::vector<float>{1.5f, -2.0f, std::ldexp(1.0f, -9), 448.0f}));
  EXPECT_EQ(r.read_f32("e5m2"), (std::vector<float>{1.5f, -2.0f, std::ldexp(1.0f, -16), 57344.0f}));
  EXPECT_EQ(r.read_int("i64"), (std::vector<std::int64_t>{-5, 1ll << 40}));
  EXPECT_EQ(r.read_int("bool"), (std::vector<std::int64_t>{0, 1}));
  // Wrong kind of read names the file, tensor and dtype.
  try {
    r.read_int("f16");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'f16' has dtype F16"), std::string::npos) << e.what();
  }
  try {
    r.read_f32("i64");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  try {
    r.at("nope");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor 'nope'"), std::string::npos);
  }
  std::remove(path.c_str());
}

TEST(SafeTensors, MalformedFilesAreRejectedNamingFileAndTensor) {
  const std::string path = temp_path("bad.safetensors");
  const std::string data8 = bytes_of(std::vector<float>{1.f, 2.f});

  std::ofstream(path, std::ios::binary) << "abc";
  expect_input_error(path, {path, "shorter than the 8-byte header"});

  write_raw(path, "{}", "", 1000);
  expect_input_error(path, {path, "runs past the end of the file"});

  write_raw(path, "{\"w\": {\"dtype\": \"F32\"", data8);
  expect_input_error(path, {path, "not valid JSON"});

  write_raw(path, "[1, 2]", data8);
  expect_input_error(path, {path, "not a JSON object"});

  write_raw(path, R"({"w": {"dtype": "F31", "shape": [2], "data_offsets": [0, 8]}})", data8);
  expect_input_error(path, {path, "tensor 'w'", "unknown dtype 'F31'"});

  write_raw(path, R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", data8);
  expect_input_error(path, {"tensor 'w'", "dtype"});

  write_raw(path, R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data8);
  expect_input_error(path, {"tensor 'w'", "non-negative"});

  write_raw(path, R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", data8);
  expect_input_error(path, {"tensor 'w'", "span 8 bytes", "needs 12"});

  write_raw(path, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", data8);
  expect_input_error(path, {"tensor 'w'", "run past the data section", "truncated"});

  write_raw(path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", data8);
  expect_input_error(path, {"tensor 'w'", "end < begin"});

  write_raw(path,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            data8);
  expect_input_error(path, {"'a' and 'b' overlap"});

  write_raw(path,
            R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 8]}})",
            data8);
  expect_input_error(path, {"tensor 'w'", "overflows"});

  write_raw(path, R"({"__metadata__": {"k": 3}})", "");
  expect_input_error(path, {"__metadata__"});

  expect_input_error(temp_path("does_not_exist.safetensors"),
                     {"does_not_exist.safetensors: cannot read it: No such file or directory"});
  // A tensor named twice: which bytes were meant? (The JSON library would keep the last.)
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            std::string(8, '\0'));
  expect_input_error(path, {"not a valid safetensors file: header: field a appears twice"});
  // A FIFO is refused from its stat (opening it would wait for a writer).
  const std::string fifo = temp_path("fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_input_error(fifo, {"is a FIFO (named pipe); give a regular file"});
  std::remove(fifo.c_str());
  std::remove(path.c_str());
}

// A writer abandoned before close() (an exception mid-dump) leaves no file, not a full-size one
// with holes; one that finishes replaces the old file whole.
TEST(SafeTensors, AnUnfinishedWriteLeavesNoFile) {
  const std::string path = temp_path("unfinished.safetensors");
  std::remove(path.c_str());
  {
    SafeTensorsWriter w;
    w.declare("a", SafeDType::F32, {1024});
    w.declare("b", SafeDType::F32, {4});
    w.open(path, "--dump");
    const std::vector<float> a(1024, 1.0f);
    w.put("a", a.data());
  }
  std::ifstream probe(path);
  EXPECT_FALSE(probe.good()) << path << " was left behind";
  SafeTensorsWriter w;
  w.declare("b", SafeDType::F32, {2});
  w.open(path, "--dump");
  const float b[2] = {1.5f, -2.0f};
  w.put("b", b);
  w.close();
  SafeTensorsReader r(path);
  EXPECT_EQ(r.read_f32("b"), (std::vector<float>{1.5f, -2.0f}));
  std::remove(path.c_str());
}

TEST(SafeTensors, WriterChecksItsOwnUse) {
  const std::string path = temp_path("writer.safetensors");
  SafeTensorsWriter w;
  w.declare("a", SafeDType::F32, {2});
  EXPECT_THROW(w.declare("a", SafeDType::F32, {2}), Error);
  w.open(path);
  EXPECT_THROW(w.put("b", nullptr), Error);
  EXPECT_THROW(w.close(), Error);  // 'a' never written
  std::remove(path.c_str());
}
