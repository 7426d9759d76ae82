// The command line as one function, the cli layer's public entry (tools/trainmem_main.cpp);
// its flags and subcommands are internal to src/cli/ (docs/design.md, "CLI").
#pragma once

namespace trainmem::cli {

// The whole CLI; returns the process exit code (0 ok, 2 bad input, 3 out of memory, 1 anything
// else). Never throws.
int run_cli(int argc, char** argv);

}  // namespace trainmem::cli
