// The "trainmem/1" schema's lookups (see include/trainmem/report/schema.hpp).
#include "trainmem/report/schema.hpp"

namespace trainmem::report::schema {

std::size_t group_rank(const std::string& group) {
  std::size_t rank = 0;
  while (rank < kTensorGroups.size() && group != kTensorGroups[rank].name) ++rank;
  return rank;
}

std::optional<Term> parse_term(const std::string& name) {
  for (Term t : kTerms)
    if (name == term_name(t)) return t;
  return std::nullopt;
}

std::string term_names() {
  std::string out;
  for (Term t : kTerms) out += (out.empty() ? "" : ", ") + std::string(term_name(t));
  return out;
}

}  // namespace trainmem::report::schema
