// SIZE parsing (see src/cli/size.hpp).
#include "size.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "trainmem/base/error.hpp"

namespace trainmem::cli {

std::uint64_t parse_size(const std::string& text, const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return InputError(flag + ": '" + text + "' is not a size (" + why +
                      "); use e.g. 80GiB, 24GB, 512MiB or a byte count");
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (!text.empty() && text.front() == '-') throw bad("negative");
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".")
    throw bad("no number");
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  long double scale;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kib") {
    scale = 1024.0L;
  } else if (unit == "m" || unit == "mib") {
    scale = 1024.0L * 1024;
  } else if (unit == "g" || unit == "gib") {
    scale = 1024.0L * 1024 * 1024;
  } else if (unit == "t" || unit == "tib") {
    scale = 1024.0L * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    scale = 1e3L;
  } else if (unit == "mb") {
    scale = 1e6L;
  } else if (unit == "gb") {
    scale = 1e9L;
  } else if (unit == "tb") {
    scale = 1e12L;
  } else {
    throw bad("unknown unit '" + text.substr(i) + "'");
  }
  const long double value = std::strtold(number.c_str(), nullptr) * scale;
  if (!(value < 18446744073709551615.0L)) throw bad("larger than 2^64 bytes");
  return static_cast<std::uint64_t>(std::floor(value));
}

std::optional<double> parse_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace trainmem::cli
