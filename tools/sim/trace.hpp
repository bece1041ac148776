// Trace replay: requests as JSON Lines, one request per line (format in docs/pagedkv-sim.md).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "pagedkv/status.hpp"
#include "workload.hpp"

namespace pagedkv {
namespace sim {

/// Parses a JSONL trace. `source` names the input in messages. Any malformed line fails the
/// whole read with kInvalidArgument "<source>:<line>: <what>"; nothing partial is returned.
/// Requests come back sorted by arrival time (ties by id).
StatusOr<std::vector<Request>> read_trace(std::istream& in, const std::string& source);

/// Reads the trace file at `path`; kNotFound when it cannot be opened.
StatusOr<std::vector<Request>> read_trace_file(const std::string& path);

/// Writes `requests` as JSONL with explicit prompt token ids, so that read_trace gives them back
/// equal. kInternal when the stream fails.
Status write_trace(std::ostream& out, const std::vector<Request>& requests);

/// Writes the trace file at `path`; kUnavailable when it cannot be written.
Status write_trace_file(const std::string& path, const std::vector<Request>& requests);

}  // namespace sim
}  // namespace pagedkv
