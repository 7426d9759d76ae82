// dtype names, the --dtype / torch_dtype parser, and the widths every byte count uses.
#include <gtest/gtest.h>

#include "trainmem/base/dtype.hpp"

namespace trainmem {
namespace {

TEST(DType, NamesAreTheCliSpellings) {
  EXPECT_STREQ(dtype_name(DType::f32), "fp32");
  EXPECT_STREQ(dtype_name(DType::f16), "fp16");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::i32), "int32");
}

TEST(DType, WidthsInBytes) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
}

TEST(DType, ParsesTheCliAndHuggingFaceSpellings) {
  for (const char* s : {"fp32", "float32", "f32"}) EXPECT_EQ(parse_dtype(s), DType::f32) << s;
  for (const char* s : {"fp16", "float16", "f16", "half"})
    EXPECT_EQ(parse_dtype(s), DType::f16) << s;
  for (const char* s : {"bf16", "bfloat16"}) EXPECT_EQ(parse_dtype(s), DType::bf16) << s;
}

TEST(DType, RejectsEverythingElse) {
  for (const char* s : {"", "int32", "fp8", "float64", "FP16", "bf 16", "bfloat"})
    EXPECT_FALSE(parse_dtype(s).has_value()) << s;
}

TEST(DType, NameRoundTripsThroughParser) {
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t) << dtype_name(t);
}

}  // namespace
}  // namespace trainmem
