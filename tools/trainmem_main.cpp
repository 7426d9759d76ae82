// trainmem: where does the GPU memory of an LLM training step go? See README.md.
#include "trainmem/cli/cli.hpp"

int main(int argc, char** argv) {
  return trainmem::cli::run_cli(argc, argv);
}
