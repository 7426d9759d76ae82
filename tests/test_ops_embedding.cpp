// Embedding: forward is an exact row gather; backward adds dout rows into dwte (+=), summing
// repeated ids in fp32 before one rounding, against a naive fp64 scatter; bad ids are rejected.
#include <gtest/gtest.h>

#include <cstring>

#include "embedding/embedding.hpp"
#include "ops_testing.hpp"

namespace trainmem {
namespace {
using namespace trainmem::testing;

struct EmbCase {
  DType dt;
  std::int64_t b, s, h, V;
};
void PrintTo(const EmbCase& c, std::ostream* os) {
  *os << dtype_label(c.dt) << " b " << c.b << " s " << c.s << " h " << c.h << " V " << c.V;
}
class OpsEmbeddingP : public ::testing::TestWithParam<EmbCase> {};

TEST_P(OpsEmbeddingP, ForwardGathersAndBackwardScatters) {
  const auto c = GetParam();
  const std::int64_t n = c.b * c.s;
  std::vector<std::int32_t> tokens(n);
  std::mt19937 gen(61);
  for (auto& t : tokens) t = std::int32_t(gen() % std::uint32_t(c.V));
  tokens[0] = tokens[n - 1] = std::int32_t(c.V - 1);  // a repeated id, and the last row of wte
  Buf wte = Buf::from(uniform(c.V * c.h, 62), c.dt);
  Buf out(n * c.h, c.dt);
  embedding_forward_cpu(out.data(), tokens.data(), wte.data(), c.b, c.s, c.h, c.V, c.dt);
  const std::size_t w = dtype_size(c.dt);
  for (std::int64_t row = 0; row < n; ++row)
    ASSERT_EQ(std::memcmp(static_cast<const char*>(out.data()) + row * c.h * w,
                          static_cast<const char*>(wte.data()) + tokens[row] * c.h * w, c.h * w),
              0)
        << "row " << row;

  Buf dwte = Buf::from(uniform(c.V * c.h, 63), c.dt), dout = Buf::from(uniform(n * c.h, 64), c.dt);
  std::vector<double> ref = dwte.f64();
  // fp32 accumulation of each row's contributions, then one rounding (as documented).
  std::vector<double> add(c.V * c.h, 0.0);
  for (std::int64_t row = 0; row < n; ++row)
    for (std::int64_t e = 0; e < c.h; ++e) add[tokens[row] * c.h + e] += dout.get(row * c.h + e);
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] += add[i];
  embedding_backward_cpu(dwte.data(), dout.data(), tokens.data(), c.b, c.s, c.h, c.V, c.dt);
  // Each element adds the rows with its token (<= b·s = 300, ~b·s/V on average) in fp32, then
  // rounds once to D: <= (k+1)u·sum|.| plus the D rounding, the table's single-rounding row.
  EXPECT_TRUE(all_close("dwte", dwte.f32(), ref, tolerance(c.dt)));
}

INSTANTIATE_TEST_SUITE_P(
    DtypeByShape, OpsEmbeddingP,
    ::testing::Values(EmbCase{DType::f32, 2, 7, 13, 11}, EmbCase{DType::bf16, 2, 7, 13, 11},
                      EmbCase{DType::f16, 2, 7, 13, 11}, EmbCase{DType::f32, 3, 50, 40, 5},
                      EmbCase{DType::bf16, 3, 50, 40, 5}, EmbCase{DType::f32, 1, 300, 130, 1000}),
    [](const auto& info) {
      const auto& c = info.param;
      return dtype_label(c.dt) + "_b" + std::to_string(c.b) + "_s" + std::to_string(c.s) + "_h" +
             std::to_string(c.h) + "_V" + std::to_string(c.V);
    });

TEST(OpsEmbedding, RepeatedIdsRoundOnce) {
  // Ten bf16 contributions of 2^-9 to a row holding 1.0: added one at a time in bf16 each
  // would be lost (1 + 2^-9 rounds back to 1); summed in fp32 first they give 1 + 10 * 2^-9.
  const std::int64_t s = 10, h = 1, V = 2;
  std::vector<std::int32_t> tokens(s, 1);
  Buf dwte = Buf::from({0.0f, 1.0f}, DType::bf16);
  Buf dout = Buf::from(std::vector<float>(s, 0x1p-9f), DType::bf16);
  embedding_backward_cpu(dwte.data(), dout.data(), tokens.data(), 1, s, h, V, DType::bf16);
  EXPECT_EQ(dwte.get(1), round_to(DType::bf16, 1.0f + 10 * 0x1p-9f));
  EXPECT_EQ(dwte.get(0), 0.0f);
}

TEST(OpsEmbedding, OutOfRangeIdIsRejected) {
  std::vector<std::int32_t> tokens = {0, 1, 5};
  std::vector<float> wte(5 * 2), out(3 * 2);
  try {
    embedding_forward_cpu(out.data(), tokens.data(), wte.data(), 1, 3, 2, 5, DType::f32);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "tokens: id 5 at position 2 is outside the vocabulary [0, 5)");
  }
  tokens[2] = -1;
  EXPECT_THROW(
      embedding_backward_cpu(wte.data(), out.data(), tokens.data(), 1, 3, 2, 5, DType::f32),
      InputError);
}

}  // namespace
}  // namespace trainmem
