#include "pagedkv/status.hpp"

namespace pagedkv {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "kOk";
    case StatusCode::kInvalidArgument:
      return "kInvalidArgument";
    case StatusCode::kNotFound:
      return "kNotFound";
    case StatusCode::kAlreadyExists:
      return "kAlreadyExists";
    case StatusCode::kOutOfRange:
      return "kOutOfRange";
    case StatusCode::kFailedPrecondition:
      return "kFailedPrecondition";
    case StatusCode::kResourceExhausted:
      return "kResourceExhausted";
    case StatusCode::kUnavailable:
      return "kUnavailable";
    case StatusCode::kUnimplemented:
      return "kUnimplemented";
    case StatusCode::kInternal:
      return "kInternal";
  }
  return "kUnknown";
}

std::string Status::to_string() const {
  if (ok()) return "kOk";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace pagedkv
