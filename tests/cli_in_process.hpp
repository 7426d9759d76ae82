// Runs the CLI in this process (run_cli with argv = {"trainmem", args...}) with stdout and
// stderr captured by GoogleTest: for tests of argument handling and reports that need no
// separate process (the end-to-end tests run the binary: test_cli_e2e_helpers.hpp).
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/cli.hpp"

namespace trainmem::cli::testing_in_process {

struct Result {
  int code = -1;
  std::string out, err;
};

inline Result run_trainmem(std::vector<std::string> args) {
  args.insert(args.begin(), "trainmem");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Result r;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  r.code = run_cli(static_cast<int>(argv.size()), argv.data());
  std::fflush(stdout);
  r.out = ::testing::internal::GetCapturedStdout();
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
}

inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

}  // namespace trainmem::cli::testing_in_process
