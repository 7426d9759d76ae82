// The diff's own formatting (see diff_internal.hpp).
#include <cmath>
#include <limits>

#include "diff_internal.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/report.hpp"

namespace trainmem::diff::detail {

using nlohmann::json;

std::string join(const std::vector<std::string>& xs, const char* sep) {
  std::string out;
  for (std::size_t n = 0; n < xs.size(); ++n) out += (n ? sep : "") + xs[n];
  return out;
}

std::string plain(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

const char* monomial(Term t) {
  return t == Term::as2b ? "as²b" : term_name(t);
}

std::int64_t signed_delta(std::uint64_t b, std::uint64_t a) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (b >= a) {
    if (b - a > kMax) throw OverflowError("diff: a difference past 2^63 bytes");
    return static_cast<std::int64_t>(b - a);
  }
  if (a - b > kMax) throw OverflowError("diff: a difference past 2^63 bytes");
  return -static_cast<std::int64_t>(a - b);
}

std::uint64_t magnitude(std::int64_t d) {
  return d < 0 ? static_cast<std::uint64_t>(-(d + 1)) + 1 : static_cast<std::uint64_t>(d);
}

std::string signed_commas(std::int64_t d) {
  if (d == 0) return "0";
  return (d < 0 ? "-" : "+") + report::with_commas(magnitude(d));
}

std::string signed_unit(std::int64_t d, ByteUnit unit) {
  if (d == 0) return "0";
  return (d < 0 ? "-" : "+") + format_bytes(magnitude(d), unit);
}

std::string signed_coef(double v) {
  return (v < 0 ? "-" : "+") + report::coef(std::fabs(v));
}

bool nonzero(double v) {
  return std::fabs(v) > 1e-9;
}

std::string formula(const Coefficients& c) {
  std::string out;
  auto add = [&](double v, Term t) {
    if (!nonzero(v)) return;
    out += (out.empty() ? "" : " + ") + report::coef(v) + "·" + monomial(t);
  };
  add(c.sbh, Term::sbh);
  add(c.sbi, Term::sbi);
  add(c.as2b, Term::as2b);
  add(c.sb, Term::sb);
  if (c.other_bytes) out += (out.empty() ? "" : " + ") + report::with_commas(c.other_bytes) + " B";
  return out.empty() ? "0" : out;
}

std::string formula_change(const Coefficients& a, const Coefficients& b) {
  std::vector<std::string> parts;
  auto add = [&](double d, Term t) {
    if (nonzero(d)) parts.push_back(signed_coef(d) + "·" + monomial(t));
  };
  add(b.sbh - a.sbh, Term::sbh);
  add(b.sbi - a.sbi, Term::sbi);
  add(b.as2b - a.as2b, Term::as2b);
  add(b.sb - a.sb, Term::sb);
  const std::int64_t other = signed_delta(b.other_bytes, a.other_bytes);
  if (other) parts.push_back(signed_commas(other) + " B");
  return parts.empty() ? "0" : join(parts, " ");
}

std::string describe_side(const Side& s) {
  std::string out = s.profile;
  if (!s.file.empty()) out += " from " + s.file;
  if (!s.label.empty()) out += " (" + s.label + ")";
  auto get = [&](const json& block, const char* k) {
    return block.is_object() && block.contains(k) ? plain(block.at(k)) : std::string("?");
  };
  namespace run = report::schema::run_key;
  out += ": " + get(s.model, report::schema::model_key::kName) + ", batch " +
         get(s.run, run::kBatch) + ", seq " + get(s.run, run::kSeq) + ", " +
         get(s.run, run::kDtype) + ", attention " + get(s.run, run::kAttention) + ", " +
         get(s.run, run::kOptimizer) + ", checkpointing " + get(s.run, run::kCheckpointing);
  // trainmem's own LoRA / QLoRA step (the run block's LoRA keys, docs/output-formats.md).
  if (s.run.is_object() && s.run.contains("finetune"))
    out += ", " + get(s.run, "finetune") + " r " + get(s.run, "lora_rank") + " on " +
           get(s.run, "lora_targets") +
           (s.run.contains("quant") ? ", 4-bit " + get(s.run, "quant") : std::string()) +
           (s.run.contains("lora_dropout") && s.run.at("lora_dropout").is_number() &&
                    s.run.at("lora_dropout").get<double>() > 0
                ? ", dropout " + get(s.run, "lora_dropout")
                : std::string());
  return out;
}

}  // namespace trainmem::diff::detail
