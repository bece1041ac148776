// SeedKvCache facade: validation shared by both modes, NVTX ranges, dispatch to the mode.
#include "pagedkv/seed_cache.hpp"

#include <limits>
#include <string>
#include <utility>

#include "common/nvtx.hpp"
#include "runtime/seed_cache_impl.hpp"

namespace pagedkv {
namespace {

std::string seq_name(SequenceId id) { return "sequence " + std::to_string(id); }

Status check_size(const char* what, const HalfSpan& s, int64_t expected) {
  if (s.data == nullptr && s.size != 0) return invalid_argument(std::string(what) + ": null data");
  if (static_cast<int64_t>(s.size) != expected) {
    // The seed zero-padded short inputs and truncated long ones (defect 8): reject both.
    return invalid_argument(std::string(what) + ": " + std::to_string(s.size) +
                            " fp16 values, expected exactly " + std::to_string(expected));
  }
  return ok_status();
}

// heads * positions * head_dim fp16 values in *out; kInvalidArgument naming `what` (the argument
// that sets `positions`) when that count overflows int64.
Status count_values(const char* what, int64_t heads, int64_t positions, int64_t dim, int64_t* out) {
  if (__builtin_mul_overflow(heads, positions, out) || __builtin_mul_overflow(*out, dim, out)) {
    return invalid_argument(std::string(what) + ": " + std::to_string(positions) +
                            " positions of " + std::to_string(heads) + " heads * " +
                            std::to_string(dim) + " values overflow int64");
  }
  return ok_status();
}

}  // namespace

StatusOr<std::unique_ptr<SeedKvCache>> SeedKvCache::create(const CacheConfig& config,
                                                           SeedKvCacheOptions options) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::create");
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (config.kv_kind != KvKind::kKeyValue) {
    return invalid_argument(
        "kv_kind: the seed-compatible cache stores keys and values; a latent (MLA) cache needs "
        "KvCache");
  }
  if (config.dtype != DType::kFloat16) {
    return invalid_argument("dtype: the seed-compatible cache stores fp16 only, got " +
                            std::string(dtype_name(config.dtype)));
  }
  std::unique_ptr<SeedKvCache> cache(new SeedKvCache());
  cache->config_ = config;
  if (config.mode == CacheMode::kPaged) {
    // Control events stay on, as paged_cache() offers them; a user who never drains them costs
    // at most the KvCache's bounded event ring (KvCacheOptions::event_capacity), not a leak.
    PAGEDKV_ASSIGN_OR_RETURN(cache->impl_, runtime::make_paged_seed_impl(config, options));
  } else {
    PAGEDKV_ASSIGN_OR_RETURN(cache->impl_, runtime::make_dense_seed_impl(config, options));
  }
  return cache;
}

SeedKvCache::~SeedKvCache() = default;

Backend& SeedKvCache::backend() { return impl_->backend(); }
Stream SeedKvCache::compute_stream() const { return impl_->stream(); }
KvCache* SeedKvCache::paged_cache() { return impl_->paged(); }

Status SeedKvCache::check_layer(SequenceId id, int32_t layer) const {
  if (layer < 0 || layer >= config_.num_layers) {
    return out_of_range("layer: " + std::to_string(layer) + " outside [0, " +
                        std::to_string(config_.num_layers) + ")");
  }
  if (!impl_->contains(id)) return not_found(seq_name(id) + " does not exist");
  return ok_status();
}

StatusOr<int64_t> SeedKvCache::allocate_sequence(SequenceId id,
                                                 const std::vector<TokenId>& tokens) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::allocate_sequence");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return invalid_argument("tokens: token " + std::to_string(i) + " is " +
                              std::to_string(tokens[i]) + "; ids must not be negative");
    }
  }
  if (static_cast<int64_t>(tokens.size()) > config_.max_sequence_length) {
    return out_of_range("tokens: " + std::to_string(tokens.size()) +
                        " exceed max_sequence_length " +
                        std::to_string(config_.max_sequence_length));
  }
  return impl_->allocate(id, tokens);
}

Status SeedKvCache::append_token(SequenceId id, int32_t layer, int64_t pos, HalfSpan key,
                                 HalfSpan value, std::optional<TokenId> token_id) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::append_token");
  PAGEDKV_RETURN_IF_ERROR(check_layer(id, layer));
  const int64_t row = int64_t{config_.num_kv_heads} * config_.head_dim;
  PAGEDKV_RETURN_IF_ERROR(check_size("key", key, row));
  PAGEDKV_RETURN_IF_ERROR(check_size("value", value, row));
  if (pos < 0 || pos >= config_.max_sequence_length) {
    return out_of_range("pos: " + std::to_string(pos) + " outside [0, max_sequence_length " +
                        std::to_string(config_.max_sequence_length) + ")");
  }
  if (token_id.has_value() && *token_id < 0) {
    return invalid_argument("token_id: must not be negative");
  }
  return impl_->write_token(id, layer, pos, key.data, value.data, token_id);
}

Status SeedKvCache::append_head_range_seq_first(SequenceId id, int32_t layer, int32_t head,
                                                int64_t pos_start, HalfSpan key, HalfSpan value) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::append_head_range_seq_first");
  PAGEDKV_RETURN_IF_ERROR(check_layer(id, layer));
  if (head < 0 || head >= config_.num_kv_heads) {
    return out_of_range("head: " + std::to_string(head) + " outside [0, " +
                        std::to_string(config_.num_kv_heads) + ")");
  }
  if (key.size == 0 || key.size % static_cast<size_t>(config_.head_dim) != 0 ||
      key.size > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    return invalid_argument("key: " + std::to_string(key.size) +
                            " fp16 values, expected a positive multiple of head_dim " +
                            std::to_string(config_.head_dim));
  }
  const int64_t n = static_cast<int64_t>(key.size) / config_.head_dim;
  PAGEDKV_RETURN_IF_ERROR(check_size("key", key, n * config_.head_dim));
  PAGEDKV_RETURN_IF_ERROR(check_size("value", value, n * config_.head_dim));
  // Compared as a difference: pos_start + n can overflow int64 for caller-supplied values.
  if (pos_start < 0 || pos_start > config_.max_sequence_length - n) {
    return out_of_range("pos_start: positions [" + std::to_string(pos_start) + ", " +
                        std::to_string(pos_start) + " + " + std::to_string(n) +
                        ") outside [0, max_sequence_length " +
                        std::to_string(config_.max_sequence_length) + ")");
  }
  return impl_->write_head_range(id, layer, head, pos_start, n, key.data, value.data);
}

Status SeedKvCache::advance_sequence(SequenceId id) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::advance_sequence");
  if (!impl_->contains(id)) return not_found(seq_name(id) + " does not exist");
  return impl_->advance(id, 1);
}

Status SeedKvCache::advance_sequence_by(SequenceId id, int64_t delta) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::advance_sequence_by");
  if (!impl_->contains(id)) return not_found(seq_name(id) + " does not exist");
  if (delta < 0) return invalid_argument("delta: must not be negative");
  // Checked here for both modes: dense mode would form length + delta, which can overflow.
  PAGEDKV_ASSIGN_OR_RETURN(int64_t len, impl_->length(id));
  if (delta > config_.max_sequence_length - len) {
    return invalid_argument("delta: " + std::to_string(delta) + " would take " + seq_name(id) +
                            " from length " + std::to_string(len) + " past max_sequence_length " +
                            std::to_string(config_.max_sequence_length));
  }
  return impl_->advance(id, delta);
}

Status SeedKvCache::rollback_sequence(SequenceId id, int64_t length) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::rollback_sequence");
  if (!impl_->contains(id)) return not_found(seq_name(id) + " does not exist");
  return impl_->rollback(id, length);
}

StatusOr<SeedKvView> SeedKvCache::get_layer_view(SequenceId id, int32_t layer) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::get_layer_view");
  PAGEDKV_RETURN_IF_ERROR(check_layer(id, layer));
  return impl_->layer_view(id, layer);
}

StatusOr<SeedKvView> SeedKvCache::get_packed_layer(SequenceId id, int32_t layer) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::get_packed_layer");
  PAGEDKV_RETURN_IF_ERROR(check_layer(id, layer));
  return impl_->packed_layer(id, layer);
}

Status SeedKvCache::set_packed_layer(SequenceId id, int32_t layer, int64_t length, HalfSpan key,
                                     HalfSpan value) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::set_packed_layer");
  PAGEDKV_RETURN_IF_ERROR(check_layer(id, layer));
  PAGEDKV_ASSIGN_OR_RETURN(int64_t len, impl_->length(id));
  if (length != len) {
    return invalid_argument("length: " + std::to_string(length) + " differs from " + seq_name(id) +
                            "'s length " + std::to_string(len) +
                            " (use overwrite_layer to change the length)");
  }
  int64_t elems = 0;
  PAGEDKV_RETURN_IF_ERROR(
      count_values("length", config_.num_kv_heads, length, config_.head_dim, &elems));
  PAGEDKV_RETURN_IF_ERROR(check_size("key", key, elems));
  PAGEDKV_RETURN_IF_ERROR(check_size("value", value, elems));
  return impl_->import(id, layer, length, key.data, value.data);
}

Status SeedKvCache::overwrite_layer(SequenceId id, int32_t layer, HalfSpan key, HalfSpan value,
                                    int64_t length, int64_t src_capacity) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::overwrite_layer");
  PAGEDKV_RETURN_IF_ERROR(check_layer(id, layer));
  if (length < 0 || length > config_.max_sequence_length) {
    return out_of_range("length: " + std::to_string(length) + " outside [0, max_sequence_length " +
                        std::to_string(config_.max_sequence_length) + "]");
  }
  if (src_capacity == 0) src_capacity = length;
  if (src_capacity < length) {
    return invalid_argument("src_capacity: " + std::to_string(src_capacity) +
                            " is shorter than length " + std::to_string(length));
  }
  const int64_t heads = config_.num_kv_heads;
  const int64_t dim = config_.head_dim;
  // The size check bounds every offset of the copy below by key.size.
  int64_t src_values = 0;
  PAGEDKV_RETURN_IF_ERROR(count_values("src_capacity", heads, src_capacity, dim, &src_values));
  PAGEDKV_RETURN_IF_ERROR(check_size("key", key, src_values));
  PAGEDKV_RETURN_IF_ERROR(check_size("value", value, src_values));
  if (src_capacity == length) return impl_->import(id, layer, length, key.data, value.data);
  // A KvTensor with spare capacity: pack its first `length` positions per head on the host.
  std::vector<uint16_t> k(static_cast<size_t>(heads * length * dim));
  std::vector<uint16_t> v(k.size());
  for (int64_t h = 0; h < heads; ++h) {
    std::copy(key.data + h * src_capacity * dim, key.data + (h * src_capacity + length) * dim,
              k.begin() + h * length * dim);
    std::copy(value.data + h * src_capacity * dim, value.data + (h * src_capacity + length) * dim,
              v.begin() + h * length * dim);
  }
  return impl_->import(id, layer, length, k.data(), v.data());
}

StatusOr<SeedOnnxLayer> SeedKvCache::get_layer_as_onnx(SequenceId id, int32_t layer) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::get_layer_as_onnx");
  PAGEDKV_RETURN_IF_ERROR(check_layer(id, layer));
  SeedOnnxLayer out;
  out.shape[1] = config_.num_kv_heads;
  out.shape[3] = config_.head_dim;
  PAGEDKV_ASSIGN_OR_RETURN(int64_t len, impl_->length(id));
  if (len == 0) return out;  // [1, heads, 0, dim], as the seed's dense export
  PAGEDKV_ASSIGN_OR_RETURN(SeedKvView view, impl_->packed_layer(id, layer));
  out.shape[2] = view.length;
  const size_t elems = static_cast<size_t>(config_.num_kv_heads * view.length * config_.head_dim);
  out.key.resize(elems);
  out.value.resize(elems);
  Backend& be = impl_->backend();
  const Stream s = impl_->stream();
  // Keys AND values (seed defect 4 returned only the keys).
  PAGEDKV_RETURN_IF_ERROR(
      be.copy_async(out.key.data(), view.key, elems * 2, CopyKind::kDeviceToHost, s));
  PAGEDKV_RETURN_IF_ERROR(
      be.copy_async(out.value.data(), view.value, elems * 2, CopyKind::kDeviceToHost, s));
  PAGEDKV_RETURN_IF_ERROR(be.synchronize_stream(s));
  return out;
}

Status SeedKvCache::remove_sequence(SequenceId id) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::remove_sequence");
  if (!impl_->contains(id)) return not_found(seq_name(id) + " does not exist");
  return impl_->remove(id);
}

bool SeedKvCache::has_sequence(SequenceId id) const {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::has_sequence");
  return impl_->contains(id);
}

StatusOr<int64_t> SeedKvCache::sequence_length(SequenceId id) const {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::sequence_length");
  if (!impl_->contains(id)) return not_found(seq_name(id) + " does not exist");
  return impl_->length(id);
}

Status SeedKvCache::set_active_sequences(const std::vector<SequenceId>& ids) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::set_active_sequences");
  return impl_->set_active(ids);
}

Status SeedKvCache::set_sequence_priority(SequenceId id, int32_t priority) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::set_sequence_priority");
  return impl_->set_priority(id, priority);
}

std::vector<SequenceId> SeedKvCache::drain_evicted_sequences() {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::drain_evicted_sequences");
  return impl_->drain_evicted();
}

Status SeedKvCache::restore_offloaded_sequence(SequenceId id) {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::restore_offloaded_sequence");
  if (!impl_->contains(id)) return not_found(seq_name(id) + " does not exist");
  return impl_->restore(id);
}

SeedKvCacheStats SeedKvCache::stats() const {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::stats");
  return impl_->stats();
}

Status SeedKvCache::synchronize() {
  PAGEDKV_NVTX_RANGE("pagedkv::SeedKvCache::synchronize");
  return impl_->synchronize();
}

}  // namespace pagedkv
