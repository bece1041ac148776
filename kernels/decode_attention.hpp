// A reference paged decode attention body: one query token per sequence, grouped-query heads,
// reading the cache through the device view. It is the example of docs/writing-attention-kernels.md
// and runs on either backend; it is written for clarity, not speed (one thread per (sequence,
// query head), two passes over the keys).
#pragma once

#include <cmath>
#include <cstdint>

#include "pagedkv/device/paged_view.cuh"
#include "pagedkv/dtype.hpp"
#include "pagedkv/macros.hpp"

namespace pagedkv::kernels {

/// out[s, qh, :] = softmax(q[s, qh] . K[s, kvh]^T * sm_scale) V[s, kvh], kvh = qh / group.
/// Index space: batch_size * num_q_heads. q: [batch, num_q_heads, head_dim] of q_dtype;
/// out: float32 [batch, num_q_heads, head_dim] (used as the accumulator, so no local array).
/// A latent (MLA) pool is read in the weight-absorbed form: the keys are the whole latent
/// vectors, the values their `ckv` parts, so out[s, qh, :ckv_dim] is the result and the last
/// rope_dim elements stay 0. A sliding-window view attends to positions [window_begin, len).
struct DecodeAttentionBody {
  device::PagedKvView view;
  const void* q;
  DType q_dtype;
  float* out;
  int32_t num_q_heads;
  int32_t layer;
  float sm_scale;

  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const {
    const int32_t seq = static_cast<int32_t>(i / num_q_heads);
    const int32_t qh = static_cast<int32_t>(i % num_q_heads);
    const int32_t group = num_q_heads / view.layout.num_kv_heads;
    const int32_t kvh = qh / group;
    const int32_t dim = view.layout.head_dim;
    const bool latent = view.layout.is_latent();
    const int32_t v_dim = latent ? view.layout.ckv_dim() : dim;
    const KvPart v_part = latent ? KvPart::kKey : KvPart::kValue;
    const int64_t q_base = i * dim;
    float* o = out + i * dim;
    for (int32_t d = 0; d < dim; ++d) o[d] = 0.0f;
    const int64_t len = view.seq_len(seq);
    if (len == 0) return;
    // A sliding-window view: the query (the last position) attends to the last `window` ones.
    const int64_t first = view.window_begin(seq);

    // Pass 1: the largest score, so that the exponentials below cannot overflow.
    float max_score = -INFINITY;
    for (int64_t p = first; p < len; ++p) {
      float dot = 0.0f;
      for (int32_t d = 0; d < dim; ++d) {
        dot +=
            load_as_float(q, q_dtype, q_base + d) * view.load(seq, layer, KvPart::kKey, kvh, p, d);
      }
      const float s = dot * sm_scale;
      max_score = s > max_score ? s : max_score;
    }
    // Pass 2: weights and the weighted sum of values.
    float denom = 0.0f;
    for (int64_t p = first; p < len; ++p) {
      float dot = 0.0f;
      for (int32_t d = 0; d < dim; ++d) {
        dot +=
            load_as_float(q, q_dtype, q_base + d) * view.load(seq, layer, KvPart::kKey, kvh, p, d);
      }
      const float w = expf(dot * sm_scale - max_score);
      denom += w;
      for (int32_t d = 0; d < v_dim; ++d) o[d] += w * view.load(seq, layer, v_part, kvh, p, d);
    }
    const float inv = 1.0f / denom;
    for (int32_t d = 0; d < v_dim; ++d) o[d] *= inv;
  }
};

}  // namespace pagedkv::kernels
