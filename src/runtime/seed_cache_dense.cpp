// Dense mode of SeedKvCache: one contiguous device buffer per sequence,
// [layers][K/V][heads][capacity][head_dim] fp16, so a layer is a zero-copy [heads, len, dim] view
// with a head stride of capacity * head_dim. core::DenseAllocator decides capacities (initial
// length, doubling, capped free list); this file owns the bytes.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/dense_allocator.hpp"
#include "runtime/seed_cache_impl.hpp"

namespace pagedkv::runtime {
namespace {

std::string seq_name(SequenceId id) { return "sequence " + std::to_string(id); }

class DenseSeedImpl final : public SeedImpl {
 public:
  DenseSeedImpl(const CacheConfig& config, std::unique_ptr<Backend> owned, Backend* backend,
                Stream stream, core::DenseAllocator alloc, std::unique_ptr<UploadArena> uploads)
      : config_(config),
        owned_(std::move(owned)),
        backend_(backend),
        stream_(stream),
        alloc_(std::move(alloc)),
        uploads_(std::move(uploads)),
        mirror_(*backend, stream, config) {}

  ~DenseSeedImpl() override {
    backend_->synchronize_stream(stream_).ignore_error();
    for (auto& [id, b] : buffers_) backend_->free_device(b.data);
  }

  Backend& backend() override { return *backend_; }
  Stream stream() const override { return stream_; }

  bool contains(SequenceId id) const override { return seq_buffer_.count(id) != 0; }
  StatusOr<int64_t> length(SequenceId id) const override { return alloc_.length(id); }

  StatusOr<int64_t> allocate(SequenceId id, const std::vector<TokenId>& tokens) override {
    const int64_t cap = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - 1);
    if (contains(id)) {
      PAGEDKV_ASSIGN_OR_RETURN(int64_t len, alloc_.length(id));
      return std::min(len, cap);
    }
    PAGEDKV_ASSIGN_OR_RETURN(core::DenseBuffer b, alloc_.add(id));
    Status st = materialize(b);
    if (!st.ok()) {
      // The id goes back to the free list without memory; materialize() retries next time.
      alloc_.finish(id).ignore_error();
      release_drained();
      return st;
    }
    seq_buffer_[id] = b.buffer_id;
    return int64_t{0};
  }

  Status write_token(SequenceId id, int32_t layer, int64_t pos, const uint16_t* key,
                     const uint16_t* value, std::optional<TokenId>) override {
    PAGEDKV_RETURN_IF_ERROR(ensure(id, pos + 1));
    const size_t row = static_cast<size_t>(config_.num_kv_heads) * config_.head_dim;
    PAGEDKV_ASSIGN_OR_RETURN(UploadLease up, uploads_->upload({{key, row * 2}, {value, row * 2}}));
    const uint16_t* dk = up.device<uint16_t>(0);
    const uint16_t* dv = up.device<uint16_t>(1);
    const Buf& b = buffers_.at(seq_buffer_.at(id));
    for (int32_t h = 0; h < config_.num_kv_heads; ++h) {
      const size_t off = static_cast<size_t>(h) * config_.head_dim;
      PAGEDKV_RETURN_IF_ERROR(copy(at(b, layer, 0, h, pos), dk + off, config_.head_dim));
      PAGEDKV_RETURN_IF_ERROR(copy(at(b, layer, 1, h, pos), dv + off, config_.head_dim));
    }
    mirror_.invalidate(id, layer);
    return ok_status();
  }

  Status write_head_range(SequenceId id, int32_t layer, int32_t head, int64_t pos, int64_t n,
                          const uint16_t* key, const uint16_t* value) override {
    PAGEDKV_RETURN_IF_ERROR(ensure(id, pos + n));
    const size_t elems = static_cast<size_t>(n) * config_.head_dim;
    PAGEDKV_ASSIGN_OR_RETURN(UploadLease up,
                             uploads_->upload({{key, elems * 2}, {value, elems * 2}}));
    const uint16_t* dk = up.device<uint16_t>(0);
    const uint16_t* dv = up.device<uint16_t>(1);
    const Buf& b = buffers_.at(seq_buffer_.at(id));
    // A head's positions are contiguous in the dense layout: one copy per part.
    PAGEDKV_RETURN_IF_ERROR(copy(at(b, layer, 0, head, pos), dk, static_cast<int64_t>(elems)));
    PAGEDKV_RETURN_IF_ERROR(copy(at(b, layer, 1, head, pos), dv, static_cast<int64_t>(elems)));
    mirror_.invalidate(id, layer);
    return ok_status();
  }

  Status advance(SequenceId id, int64_t delta) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, alloc_.length(id));
    if (delta < 0) return invalid_argument("delta: must not be negative");
    if (delta == 0) return ok_status();
    PAGEDKV_RETURN_IF_ERROR(ensure(id, len + delta));  // capacity first: append cannot fail then
    PAGEDKV_ASSIGN_OR_RETURN(core::DenseGrowth g, alloc_.append(id, delta));
    (void)g;
    mirror_.invalidate_all(id);
    return ok_status();
  }

  Status rollback(SequenceId id, int64_t length) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, alloc_.length(id));
    if (length < 0 || length > len) {
      return out_of_range(seq_name(id) + ": cannot roll back to " + std::to_string(length) +
                          ", its length is " + std::to_string(len));
    }
    if (length == len) return ok_status();
    PAGEDKV_RETURN_IF_ERROR(alloc_.rollback(id, length));
    mirror_.invalidate_all(id);
    return ok_status();
  }

  StatusOr<SeedKvView> layer_view(SequenceId id, int32_t layer) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, alloc_.length(id));
    const Buf& b = buffers_.at(seq_buffer_.at(id));
    return SeedKvView{at(b, layer, 0, 0, 0), at(b, layer, 1, 0, 0), len,
                      b.capacity * config_.head_dim};
  }

  StatusOr<SeedKvView> packed_layer(SequenceId id, int32_t layer) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, alloc_.length(id));
    if (len == 0) return failed_precondition(seq_name(id) + " is empty: no layer to pack");
    if (auto hit = mirror_.find(id, layer, len)) return *hit;
    PAGEDKV_ASSIGN_OR_RETURN(SeedKvView view, mirror_.slot(id, layer, len));
    const Buf& b = buffers_.at(seq_buffer_.at(id));
    const int64_t run = len * config_.head_dim;
    for (int32_t h = 0; h < config_.num_kv_heads; ++h) {
      auto* k = static_cast<uint16_t*>(const_cast<void*>(view.key)) + h * run;
      auto* v = static_cast<uint16_t*>(const_cast<void*>(view.value)) + h * run;
      PAGEDKV_RETURN_IF_ERROR(copy(k, at(b, layer, 0, h, 0), run));
      PAGEDKV_RETURN_IF_ERROR(copy(v, at(b, layer, 1, h, 0), run));
    }
    mirror_.mark_valid(id, layer, len);
    return view;
  }

  Status import(SequenceId id, int32_t layer, int64_t length, const uint16_t* key,
                const uint16_t* value) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, alloc_.length(id));
    PAGEDKV_RETURN_IF_ERROR(ensure(id, std::max<int64_t>(length, 1)));
    if (length > 0) {
      const int64_t run = length * config_.head_dim;
      const size_t bytes = static_cast<size_t>(config_.num_kv_heads * run) * 2;
      PAGEDKV_ASSIGN_OR_RETURN(UploadLease up, uploads_->upload({{key, bytes}, {value, bytes}}));
      const uint16_t* dk = up.device<uint16_t>(0);
      const uint16_t* dv = up.device<uint16_t>(1);
      const Buf& b = buffers_.at(seq_buffer_.at(id));
      for (int32_t h = 0; h < config_.num_kv_heads; ++h) {
        PAGEDKV_RETURN_IF_ERROR(copy(at(b, layer, 0, h, 0), dk + h * run, run));
        PAGEDKV_RETURN_IF_ERROR(copy(at(b, layer, 1, h, 0), dv + h * run, run));
      }
    }
    if (length > len) {
      PAGEDKV_ASSIGN_OR_RETURN(core::DenseGrowth g, alloc_.append(id, length - len));
      (void)g;
    } else if (length < len) {
      PAGEDKV_RETURN_IF_ERROR(alloc_.rollback(id, length));
    }
    if (length != len) {
      mirror_.invalidate_all(id);
    } else {
      mirror_.invalidate(id, layer);
    }
    return ok_status();
  }

  Status remove(SequenceId id) override {
    PAGEDKV_RETURN_IF_ERROR(alloc_.finish(id));
    seq_buffer_.erase(id);
    mirror_.erase(id);
    release_drained();
    return ok_status();
  }

  Status set_active(const std::vector<SequenceId>&) override { return ok_status(); }
  Status set_priority(SequenceId id, int32_t) override {
    if (!contains(id)) return not_found(seq_name(id) + " does not exist");
    return ok_status();  // dense mode never evicts, so priorities change nothing
  }
  std::vector<SequenceId> drain_evicted() override { return {}; }
  Status restore(SequenceId id) override {
    return failed_precondition(seq_name(id) + ": dense mode never offloads, nothing to restore");
  }

  SeedKvCacheStats stats() const override {
    SeedKvCacheStats s;
    s.mode = CacheMode::kDense;
    for (const auto& [id, buffer_id] : seq_buffer_) {
      auto it = buffers_.find(buffer_id);
      if (it != buffers_.end()) s.bytes_used += bytes_of(it->second.capacity);
    }
    for (const auto& [id, b] : buffers_) s.bytes_capacity += bytes_of(b.capacity);
    s.sequences = static_cast<int64_t>(seq_buffer_.size());
    s.packed_layers = mirror_.valid_layers();
    return s;
  }

  Status synchronize() override { return backend_->synchronize_stream(stream_); }

  /// Device buffers currently allocated (live sequences and the free list), for tests.
  size_t buffer_count() const { return buffers_.size(); }

 private:
  struct Buf {
    void* data = nullptr;
    int64_t capacity = 0;  // positions actually allocated
  };

  int64_t bytes_of(int64_t capacity) const {
    return int64_t{config_.num_layers} * 2 * config_.num_kv_heads * capacity * config_.head_dim * 2;
  }

  uint16_t* at(const Buf& b, int32_t layer, int32_t part, int32_t head, int64_t pos) const {
    const int64_t plane = ((int64_t{layer} * 2 + part) * config_.num_kv_heads + head);
    return static_cast<uint16_t*>(b.data) + (plane * b.capacity + pos) * config_.head_dim;
  }

  Status copy(void* dst, const void* src, int64_t elems) {
    return backend_->copy_async(dst, src, static_cast<size_t>(elems) * 2, CopyKind::kDeviceToDevice,
                                stream_);
  }

  // Makes the sequence's buffer hold `length` positions: the allocator decides the capacity,
  // then the bytes follow. A failed allocation keeps the old buffer and its data.
  Status ensure(SequenceId id, int64_t length) {
    PAGEDKV_ASSIGN_OR_RETURN(core::DenseGrowth g, alloc_.ensure(id, length));
    (void)g;
    PAGEDKV_ASSIGN_OR_RETURN(core::DenseBuffer b, alloc_.buffer(id));
    return materialize(b);
  }

  // Allocates or grows the device buffer of `b` to b.capacity: allocate new, copy every
  // (layer, part, head) run of the old capacity, free the old one after the copies.
  Status materialize(const core::DenseBuffer& b) {
    auto it = buffers_.find(b.buffer_id);
    if (it != buffers_.end() && it->second.capacity >= b.capacity) return ok_status();
    PAGEDKV_ASSIGN_OR_RETURN(void* fresh,
                             backend_->allocate_device(static_cast<size_t>(bytes_of(b.capacity))));
    Buf nb{fresh, b.capacity};
    if (it == buffers_.end()) {
      buffers_.emplace(b.buffer_id, nb);
      return ok_status();
    }
    const Buf old = it->second;
    const int64_t planes = int64_t{config_.num_layers} * 2 * config_.num_kv_heads;
    for (int64_t p = 0; p < planes; ++p) {
      Status st = copy(static_cast<uint16_t*>(nb.data) + p * nb.capacity * config_.head_dim,
                       static_cast<uint16_t*>(old.data) + p * old.capacity * config_.head_dim,
                       old.capacity * config_.head_dim);
      if (!st.ok()) {
        backend_->synchronize_stream(stream_).ignore_error();
        backend_->free_device(fresh);
        return st;
      }
    }
    // Queued copies and reads of the old buffer must finish before it is freed.
    PAGEDKV_RETURN_IF_ERROR(backend_->synchronize_stream(stream_));
    backend_->free_device(old.data);
    it->second = nb;
    return ok_status();
  }

  void release_drained() {
    std::vector<int64_t> released = alloc_.drain_released();
    if (released.empty()) return;
    backend_->synchronize_stream(stream_).ignore_error();  // queued work may still use them
    for (int64_t id : released) {
      auto it = buffers_.find(id);
      if (it == buffers_.end()) continue;
      backend_->free_device(it->second.data);
      buffers_.erase(it);
    }
  }

  CacheConfig config_;
  std::unique_ptr<Backend> owned_;
  Backend* backend_;
  Stream stream_;
  core::DenseAllocator alloc_;
  std::unique_ptr<UploadArena> uploads_;
  PackedMirror mirror_;
  std::unordered_map<int64_t, Buf> buffers_;            // buffer id -> device memory
  std::unordered_map<SequenceId, int64_t> seq_buffer_;  // live sequence -> buffer id
};

}  // namespace

StatusOr<std::unique_ptr<SeedImpl>> make_dense_seed_impl(const CacheConfig& config,
                                                         const SeedKvCacheOptions& options) {
  PAGEDKV_ASSIGN_OR_RETURN(core::DenseAllocator alloc, core::DenseAllocator::create(config));
  std::unique_ptr<Backend> owned;
  Backend* backend = options.backend;
  if (backend == nullptr) {
    PAGEDKV_ASSIGN_OR_RETURN(owned, create_backend(config.backend));
    backend = owned.get();
  }
  Stream stream = options.compute_stream;
  if (options.native_compute_stream != nullptr) {
    if (stream != Stream{}) {
      return invalid_argument("native_compute_stream: set either it or compute_stream, not both");
    }
    PAGEDKV_ASSIGN_OR_RETURN(stream, backend->wrap_stream(options.native_compute_stream));
  }
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<UploadArena> uploads,
                           UploadArena::create(*backend, stream, 1 << 20));
  return std::unique_ptr<SeedImpl>(new DenseSeedImpl(config, std::move(owned), backend, stream,
                                                     std::move(alloc), std::move(uploads)));
}

}  // namespace pagedkv::runtime
