// The run path shared by profile, compare, sweep and maxbatch (see include/trainmem/run.hpp).
#include "trainmem/run.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "trainmem/error.hpp"

namespace trainmem {

// ---------------------------------------------------------------- sizes

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

// ---------------------------------------------------------------- search

SearchResult find_largest_fitting(std::int64_t lowest, std::int64_t highest, std::int64_t step,
                                  const std::function<Probe(std::int64_t)>& probe) {
  if (step < 1 || lowest < 1 || highest < lowest)
    throw Error("find_largest_fitting: need 1 <= lowest <= highest and step >= 1");
  SearchResult r;
  auto try_k = [&](std::int64_t k) {
    ++r.probes;
    return probe(lowest + k * step);
  };
  const std::int64_t k_max = (highest - lowest) / step;
  Probe p0 = try_k(0);
  if (!p0.fits) {
    r.best = 0;
    r.at_next = p0;
    return r;
  }
  // Grow k geometrically until a value fails (or the range ends), then bisect between the
  // last good and the first bad k.
  std::int64_t k_good = 0, k_bad = -1;
  Probe good = p0, bad{};
  for (std::int64_t k = 1;; k = k > k_max / 2 ? k_max : 2 * k) {
    if (k > k_max) k = k_max;
    if (k <= k_good) break;  // the whole range fits
    const Probe p = try_k(k);
    if (!p.fits) {
      k_bad = k, bad = p;
      break;
    }
    k_good = k, good = p;
  }
  if (k_bad >= 0) {
    while (k_bad - k_good > 1) {
      const std::int64_t mid = k_good + (k_bad - k_good) / 2;
      const Probe p = try_k(mid);
      if (p.fits) {
        k_good = mid, good = p;
      } else {
        k_bad = mid, bad = p;
      }
    }
  }
  r.best = lowest + k_good * step;
  r.at_best = good;
  // One more: the first failure, or (when the top of the range fits) a probe past it.
  r.at_next = k_bad >= 0 ? bad : try_k(k_good + 1);
  return r;
}

// ---------------------------------------------------------------- progress

ProgressBar::ProgressBar(std::string label, std::size_t total)
    : label_(std::move(label)), total_(total), active_(isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() {
  done();
}

void ProgressBar::step(const std::string& what) {
  if (!active_) return;
  ++current_;
  const int width = 24;
  const int filled = total_ ? int(width * (current_ - 1) / total_) : 0;
  std::string bar(filled, '#');
  bar.append(width - filled, '.');
  std::fprintf(stderr, "\r\033[K%s %zu/%zu [%s] %s", label_.c_str(), current_, total_, bar.c_str(),
               what.c_str());
  std::fflush(stderr);
}

void ProgressBar::done() {
  if (!active_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  active_ = false;
}

}  // namespace trainmem
