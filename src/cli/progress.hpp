// The progress bar of the commands that run grids of configurations (compare, sweep).
#pragma once
#include <cstddef>
#include <string>

namespace trainmem::cli {

// A one-line progress bar on stderr, drawn only when stderr is a terminal ("sweep 3/8
// [#####.....] llama-7b b4 s256"). Cleared when done or destroyed.
class ProgressBar {
 public:
  ProgressBar(std::string label, std::size_t total);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  void step(const std::string& what);  // the item about to run
  void done();
  bool active() const { return active_; }

 private:
  std::string label_;
  std::size_t total_, current_ = 0;
  bool active_;
};

}  // namespace trainmem::cli
