#include "model.hpp"

#include <cmath>

namespace pagedkv {
namespace sim {

const std::vector<ModelShape>& model_presets() {
  // KV shapes from the models' published configs (GQA: KV heads, not query heads).
  static const std::vector<ModelShape> kPresets = {
      {"tiny", 4, 4, 64},       {"llama3-8b", 32, 8, 128},  {"llama3-70b", 80, 8, 128},
      {"qwen2-7b", 28, 4, 128}, {"mistral-7b", 32, 8, 128},
  };
  return kPresets;
}

StatusOr<ModelShape> find_model(const std::string& name) {
  std::string known;
  for (const ModelShape& m : model_presets()) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  return not_found("unknown model '" + name + "' (known: " + known + ")");
}

int64_t blocks_in_gib(double gib, int64_t block_bytes) {
  if (gib <= 0 || block_bytes <= 0) return 0;
  return static_cast<int64_t>(std::floor(gib * 1073741824.0 / static_cast<double>(block_bytes)));
}

}  // namespace sim
}  // namespace pagedkv
