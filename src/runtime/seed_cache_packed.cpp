// PackedMirror: the reused per-sequence buffers behind get_packed_layer.
#include <algorithm>

#include "runtime/seed_cache_impl.hpp"

namespace pagedkv::runtime {
namespace {

int64_t next_pow2(int64_t n) {
  int64_t p = 16;  // small sequences share one size class instead of regrowing per token
  while (p < n) p *= 2;
  return p;
}

}  // namespace

PackedMirror::~PackedMirror() {
  if (entries_.empty()) return;
  backend_.synchronize_stream(stream_).ignore_error();  // queued gathers may still write them
  for (auto& [id, e] : entries_) backend_.free_device(e.data);
}

std::optional<SeedKvView> PackedMirror::find(SequenceId id, int32_t layer, int64_t length) const {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.valid_length[static_cast<size_t>(layer)] != length) {
    return std::nullopt;
  }
  const Entry& e = it->second;
  const int64_t head_elems = int64_t{config_.num_kv_heads} * e.capacity * config_.head_dim;
  auto* base = static_cast<uint16_t*>(e.data) + int64_t{layer} * 2 * head_elems;
  return SeedKvView{base, base + head_elems, length, length * config_.head_dim};
}

StatusOr<SeedKvView> PackedMirror::slot(SequenceId id, int32_t layer, int64_t length) {
  Entry& e = entries_[id];
  if (e.valid_length.empty()) e.valid_length.assign(static_cast<size_t>(config_.num_layers), -1);
  if (e.capacity < length) {
    const int64_t capacity = next_pow2(length);
    const size_t bytes = static_cast<size_t>(int64_t{config_.num_layers} * 2 *
                                             config_.num_kv_heads * capacity * config_.head_dim) *
                         sizeof(uint16_t);
    auto fresh = backend_.allocate_device(bytes);
    if (!fresh.ok()) {
      if (e.data == nullptr) entries_.erase(id);
      return fresh.status();
    }
    if (e.data != nullptr) {
      PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_stream(stream_));
      backend_.free_device(e.data);
    }
    e.data = *fresh;
    e.capacity = capacity;
    std::fill(e.valid_length.begin(), e.valid_length.end(), -1);
  }
  const int64_t head_elems = int64_t{config_.num_kv_heads} * e.capacity * config_.head_dim;
  auto* base = static_cast<uint16_t*>(e.data) + int64_t{layer} * 2 * head_elems;
  return SeedKvView{base, base + head_elems, length, length * config_.head_dim};
}

void PackedMirror::mark_valid(SequenceId id, int32_t layer, int64_t length) {
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.valid_length[static_cast<size_t>(layer)] = length;
}

void PackedMirror::invalidate(SequenceId id, int32_t layer) {
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.valid_length[static_cast<size_t>(layer)] = -1;
}

void PackedMirror::invalidate_all(SequenceId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  std::fill(it->second.valid_length.begin(), it->second.valid_length.end(), -1);
}

void PackedMirror::erase(SequenceId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  backend_.synchronize_stream(stream_).ignore_error();
  backend_.free_device(it->second.data);
  entries_.erase(it);
}

int64_t PackedMirror::valid_layers() const {
  int64_t n = 0;
  for (const auto& [id, e] : entries_) {
    n += std::count_if(e.valid_length.begin(), e.valid_length.end(),
                       [](int64_t l) { return l >= 0; });
  }
  return n;
}

}  // namespace pagedkv::runtime
