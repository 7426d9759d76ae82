// trainmem sweep — registered, not built yet: it says so and exits 2.
#include <spdlog/spdlog.h>

#include "cli/cli.hpp"

namespace trainmem::cli {

Runner register_sweep(CLI::App& app) {
  auto* cmd = app.add_subcommand("sweep", "(not built yet)");
  cmd->allow_extras();
  return [] {
    spdlog::error("trainmem sweep is not built yet in this version");
    return 2;
  };
}

}  // namespace trainmem::cli
