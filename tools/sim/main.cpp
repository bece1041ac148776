// pagedkv-sim: drives a realistic LLM-serving workload through the whole runtime and reports
// what happened (docs/pagedkv-sim.md).
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "cli.hpp"

int main(int argc, char** argv) {
  // The library's info lines (backend chosen, pools allocated) repeat what the report says;
  // PAGEDKV_LOG_LEVEL set by the user still wins (overwrite = 0).
  setenv("PAGEDKV_LOG_LEVEL", "warn", 0);
  return pagedkv::sim::run_cli(argc, argv, std::cout, std::cerr, isatty(STDOUT_FILENO) != 0);
}
