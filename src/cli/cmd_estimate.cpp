// trainmem estimate — registered, not built yet: it says so and exits 2.
#include <spdlog/spdlog.h>

#include "cli/cli.hpp"

namespace trainmem::cli {

Runner register_estimate(CLI::App& app) {
  auto* cmd = app.add_subcommand("estimate", "(not built yet)");
  cmd->allow_extras();
  return [] {
    spdlog::error("trainmem estimate is not built yet in this version");
    return 2;
  };
}

}  // namespace trainmem::cli
