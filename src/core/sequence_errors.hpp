// The control plane's messages about sequences, written once.
#pragma once

#include <string>

#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace core {

inline std::string seq_name(SequenceId id) { return "sequence " + std::to_string(id); }

/// kNotFound for an id the sequence table does not hold.
inline Status unknown(SequenceId id) { return not_found(seq_name(id) + " does not exist"); }

}  // namespace core
}  // namespace pagedkv
