#include "model.hpp"

#include <algorithm>
#include <cmath>

namespace pagedkv {
namespace sim {

const std::vector<ModelShape>& model_presets() {
  // KV shapes from the models' published configs (GQA: KV heads, not query heads).
  auto uniform = [](const char* name, int32_t layers, int32_t heads, int32_t dim,
                    const char* like) {
    ModelShape m;
    m.name = name;
    m.num_layers = layers;
    m.num_kv_heads = heads;
    m.head_dim = dim;
    m.like = like;
    return m;
  };
  auto hybrid = [&](const char* name, int32_t layers, int32_t heads, int32_t dim, int32_t window,
                    int32_t global_every, const char* like) {
    ModelShape m = uniform(name, layers, heads, dim, like);
    m.sliding_window = window;
    m.global_every = global_every;
    return m;
  };
  static const std::vector<ModelShape> kPresets = [&] {
    std::vector<ModelShape> p = {
        uniform("tiny", 4, 4, 64, "a small test model"),
        uniform("llama", 32, 8, 128, "Llama 3 8B: uniform, full attention"),
        uniform("llama3-8b", 32, 8, 128, "Llama 3 8B"),
        uniform("llama3-70b", 80, 8, 128, "Llama 3 70B"),
        uniform("qwen2-7b", 28, 4, 128, "Qwen2 7B"),
        uniform("mistral-7b", 32, 8, 128, "Mistral 7B"),
        // gpt-oss-120b: sliding (128) and full attention alternate, the first layer sliding.
        hybrid("gpt-oss", 36, 8, 64, 128, 2, "gpt-oss-120b: window 128 / full, alternating"),
        // Gemma 3 27B: five local layers (window 1024), then one global, repeated.
        hybrid("gemma3", 62, 16, 128, 1024, 6, "Gemma 3 27B: 5 local (window 1024) : 1 global"),
    };
    // DeepSeek V3: MLA, one latent of kv_lora_rank 512 + qk_rope_head_dim 64 per token and layer.
    ModelShape ds = uniform("deepseek", 61, 1, 576, "DeepSeek V3: MLA, latent 512 + rope 64");
    ds.kv_kind = KvKind::kLatent;
    ds.rope_dim = 64;
    p.push_back(ds);
    return p;
  }();
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

std::string shape_summary(const ModelShape& m) {
  if (m.kv_kind == KvKind::kLatent) {
    return std::to_string(m.num_layers) + " x latent " + std::to_string(m.head_dim) + " (" +
           std::to_string(m.head_dim - m.rope_dim) + " + " + std::to_string(m.rope_dim) + ")";
  }
  std::string s = std::to_string(m.num_layers) + "x" + std::to_string(m.num_kv_heads) + "x" +
                  std::to_string(m.head_dim);
  if (m.sliding_window > 0) {
    s += ", window " + std::to_string(m.sliding_window) + " on " +
         std::to_string(m.global_every - 1) + " of " + std::to_string(m.global_every) + " layers";
  }
  return s;
}

Status apply_model(const ModelShape& m, CacheConfig* c) {
  c->num_layers = m.num_layers;
  c->num_kv_heads = m.num_kv_heads;
  c->head_dim = m.head_dim;
  c->kv_kind = m.kv_kind;
  c->rope_dim = m.rope_dim;
  c->sliding_window = 0;
  c->groups.clear();
  if (m.sliding_window == 0) return ok_status();
  if (m.global_every < 2) return invalid_argument("model: a hybrid model needs global_every >= 2");
  KvGroup full, window;
  full.name = "full";
  window.name = "window";
  for (KvGroup* g : {&full, &window}) {
    g->num_kv_heads = m.num_kv_heads;
    g->head_dim = m.head_dim;
    g->dtype = c->dtype;
    g->kv_kind = m.kv_kind;
    g->rope_dim = m.rope_dim;
  }
  window.sliding_window = m.sliding_window;
  for (int32_t layer = 0; layer < m.num_layers; ++layer) {
    ((layer + 1) % m.global_every == 0 ? full : window).layers.push_back(layer);
  }
  // A model too short to have a global layer (--layers 1) is all window layers.
  if (!full.layers.empty()) c->groups.push_back(std::move(full));
  c->groups.push_back(std::move(window));
  return ok_status();
}

CacheConfig uniform_config(const CacheConfig& config) {
  CacheConfig u = config;
  u.sliding_window = 0;
  for (KvGroup& g : u.groups) g.sliding_window = 0;
  if (u.groups.empty()) return u;
  const KvGroup& first = u.groups.front();
  for (const KvGroup& g : u.groups) {
    if (g.num_kv_heads != first.num_kv_heads || g.head_dim != first.head_dim ||
        g.dtype != first.dtype || g.kv_kind != first.kv_kind || g.rope_dim != first.rope_dim) {
      return u;  // page shapes differ: one full-attention group each
    }
  }
  u.num_kv_heads = first.num_kv_heads;
  u.head_dim = first.head_dim;
  u.dtype = first.dtype;
  u.kv_kind = first.kv_kind;
  u.rope_dim = first.rope_dim;
  u.groups.clear();
  return u;
}

int64_t uniform_block_bytes(const CacheConfig& config) {
  const CacheConfig u = uniform_config(config);
  if (u.groups.empty()) return u.block_bytes();
  int64_t bytes = 0;
  for (int32_t g = 0; g < u.num_groups(); ++g) {
    const int64_t b = u.group_config(g).block_bytes();
    if (b < 0) return -1;
    bytes += b;
  }
  return bytes;
}

int64_t blocks_in_gib(double gib, int64_t block_bytes) {
  if (gib <= 0 || block_bytes <= 0) return 0;
  return static_cast<int64_t>(std::floor(gib * 1073741824.0 / static_cast<double>(block_bytes)));
}

}  // namespace sim
}  // namespace pagedkv
