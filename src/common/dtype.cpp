#include "pagedkv/dtype.hpp"

#include <cstring>

namespace pagedkv {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

bool parse_dtype(const char* name, DType* out) {
  struct Entry {
    const char* name;
    DType type;
  };
  static const Entry kEntries[] = {
      {"fp16", DType::kFloat16},        {"float16", DType::kFloat16},   {"half", DType::kFloat16},
      {"bf16", DType::kBFloat16},       {"bfloat16", DType::kBFloat16}, {"fp32", DType::kFloat32},
      {"float32", DType::kFloat32},     {"float", DType::kFloat32},     {"fp8", DType::kFloat8E4M3},
      {"fp8_e4m3", DType::kFloat8E4M3}, {"e4m3", DType::kFloat8E4M3},
  };
  if (name == nullptr) return false;
  for (const Entry& e : kEntries) {
    if (std::strcmp(name, e.name) == 0) {
      *out = e.type;
      return true;
    }
  }
  return false;
}

}  // namespace pagedkv
