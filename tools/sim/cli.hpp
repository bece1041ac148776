// The pagedkv-sim command line: parses flags, builds the workload and the cache, runs the
// scheduler and writes the report. main() is a thin wrapper so tests can run it in-process.
#pragma once

#include <iosfwd>

namespace pagedkv {
namespace sim {

/// Runs pagedkv-sim with `argv`; the report goes to `out`, errors to `err`. A progress line is
/// drawn on `out` only when `tty` is true. Returns the process exit code: 0, or non-zero after
/// an error message (and then nothing is written to `out` but help text).
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err, bool tty);

}  // namespace sim
}  // namespace pagedkv
