// PackedMirror: the reused per-(sequence, layer) buffers behind get_packed_layer.
#include <algorithm>

#include "runtime/seed_cache_impl.hpp"

namespace pagedkv::runtime {
namespace {

// Small sequences share one size class instead of regrowing per token; longer ones grow in
// these steps.
constexpr int64_t kStep = 16;
// Spare buffers kept for later reads, at most (a few sequences' worth of read layers).
constexpr int64_t kSpareBytes = int64_t{64} << 20;

}  // namespace

PackedMirror::~PackedMirror() {
  if (!entries_.empty()) {
    backend_.synchronize_stream(stream_).ignore_error();  // queued gathers may still write them
    for (auto& [id, layers] : entries_) free_layers(layers);
  }
  for (Layer& l : spares_) backend_.free_device(l.data);
}

int64_t PackedMirror::buffer_bytes(int64_t capacity) const {
  return int64_t{2} * config_.num_kv_heads * capacity * config_.head_dim *
         static_cast<int64_t>(sizeof(uint16_t));
}

PackedMirror::Layer PackedMirror::take_spare(int64_t capacity) {
  auto best = spares_.end();
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (it->capacity >= capacity && (best == spares_.end() || it->capacity < best->capacity)) {
      best = it;
    }
  }
  if (best == spares_.end()) return Layer{};
  Layer l = *best;
  *best = spares_.back();
  spares_.pop_back();
  spare_bytes_ -= buffer_bytes(l.capacity);
  l.valid_length = -1;
  return l;
}

void PackedMirror::keep_spare(Layer l) {
  spares_.push_back(l);
  spare_bytes_ += buffer_bytes(l.capacity);
  while (spare_bytes_ > kSpareBytes) {
    // The smallest go first: a large spare serves any shorter read, a small one few.
    auto smallest =
        std::min_element(spares_.begin(), spares_.end(),
                         [](const Layer& a, const Layer& b) { return a.capacity < b.capacity; });
    spare_bytes_ -= buffer_bytes(smallest->capacity);
    backend_.free_device(smallest->data);
    *smallest = spares_.back();
    spares_.pop_back();
  }
}

SeedKvView PackedMirror::view(const Layer& l, int64_t length) const {
  const int64_t head_elems = int64_t{config_.num_kv_heads} * l.capacity * config_.head_dim;
  auto* base = static_cast<uint16_t*>(l.data);
  return SeedKvView{base, base + head_elems, length, length * config_.head_dim};
}

void PackedMirror::free_layers(std::vector<Layer>& layers) {
  for (Layer& l : layers) {
    if (l.data != nullptr) keep_spare(l);
    l = Layer{};
  }
}

std::optional<SeedKvView> PackedMirror::find(SequenceId id, int32_t layer, int64_t length) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  const Layer& l = it->second[static_cast<size_t>(layer)];
  if (l.valid_length != length) return std::nullopt;
  return view(l, length);
}

StatusOr<SeedKvView> PackedMirror::slot(SequenceId id, int32_t layer, int64_t length) {
  std::vector<Layer>& layers = entries_[id];
  if (layers.empty()) layers.resize(static_cast<size_t>(config_.num_layers));
  Layer& l = layers[static_cast<size_t>(layer)];
  l.valid_length = -1;  // about to be rewritten
  if (l.capacity < length) {
    // Sized to this read; a regrowth adds at least a quarter so that a sequence read after
    // every step regrows O(log n) times.
    const int64_t want = std::max(length, l.capacity + l.capacity / 4);
    const int64_t capacity = (want + kStep - 1) / kStep * kStep;
    // What the buffer holds is stale (a longer length means a new gather): free it before
    // allocating, once queued reads of it are done, so the peak is the new buffer alone.
    if (l.data != nullptr) {
      PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_stream(stream_));
      backend_.free_device(l.data);
      l = Layer{};
    }
    Layer spare = take_spare(capacity);
    if (spare.data != nullptr) {
      l = spare;
      return view(l, length);
    }
    const size_t bytes = static_cast<size_t>(buffer_bytes(capacity));
    auto fresh = backend_.allocate_device(bytes);
    if (!fresh.ok()) {
      if (std::all_of(layers.begin(), layers.end(),
                      [](const Layer& x) { return x.data == nullptr; })) {
        entries_.erase(id);
      }
      return fresh.status();
    }
    l.data = *fresh;
    l.capacity = capacity;
  }
  return view(l, length);
}

void PackedMirror::mark_valid(SequenceId id, int32_t layer, int64_t length) {
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second[static_cast<size_t>(layer)].valid_length = length;
}

void PackedMirror::invalidate(SequenceId id, int32_t layer) {
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second[static_cast<size_t>(layer)].valid_length = -1;
}

void PackedMirror::invalidate_all(SequenceId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  for (Layer& l : it->second) l.valid_length = -1;
}

void PackedMirror::erase(SequenceId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  backend_.synchronize_stream(stream_).ignore_error();
  free_layers(it->second);
  entries_.erase(it);
}

int64_t PackedMirror::valid_layers() const {
  int64_t n = 0;
  for (const auto& [id, layers] : entries_) {
    n += std::count_if(layers.begin(), layers.end(),
                       [](const Layer& l) { return l.valid_length >= 0; });
  }
  return n;
}

}  // namespace pagedkv::runtime
