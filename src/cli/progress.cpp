// The progress bar on stderr (see src/cli/progress.hpp).
#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "cli.hpp"

namespace trainmem::cli {

ProgressBar::ProgressBar(std::string label, std::size_t total)
    : label_(std::move(label)), total_(total), active_(user_terminal(STDERR_FILENO)) {}

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

}  // namespace trainmem::cli
