// The diff's own formatting, shared by the difference (diff.cpp) and its reports
// (diff_report.cpp): signed figures, the per-layer formulas, a side's description. Defined in
// diff_text.cpp.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainmem/base/bytes.hpp"
#include "trainmem/report/diff.hpp"

namespace trainmem::diff::detail {

std::string join(const std::vector<std::string>& xs, const char* sep);
// A JSON value as a reader would write it in a sentence (strings without quotes).
std::string plain(const nlohmann::json& v);
// The monomial as docs/formulas.md writes it.
const char* monomial(Term t);
// b − a; OverflowError past 2^63.
std::int64_t signed_delta(std::uint64_t b, std::uint64_t a);
// |d|, exact for every int64 (INT64_MIN included).
std::uint64_t magnitude(std::int64_t d);
// "+1,234" / "-1,234" / "0".
std::string signed_commas(std::int64_t d);
// "+1.23" / "-1.23" in `unit` / "0".
std::string signed_unit(std::int64_t d, ByteUnit unit);
// "+2" / "-0.5" (report::coef of the magnitude).
std::string signed_coef(double v);
bool nonzero(double v);
// The per-layer formula of a set of coefficients, as report::per_layer_formula writes it.
std::string formula(const Coefficients& c);
// B's coefficients minus A's, written as a change ("+24·sbh +2·sbi +262,148 B"; "0").
std::string formula_change(const Coefficients& a, const Coefficients& b);
// "native from r.json (label): llama-7b, batch 8, seq 512, fp16, attention eager, ..."
std::string describe_side(const Side& s);

}  // namespace trainmem::diff::detail
