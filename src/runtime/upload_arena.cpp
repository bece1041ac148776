#include "runtime/upload_arena.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace pagedkv::runtime {
namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
size_t pow2_at_least(size_t n) {
  size_t p = kAlign;
  while (p < n) p *= 2;
  return p;
}
}  // namespace

UploadLease& UploadLease::operator=(UploadLease&& other) noexcept {
  if (this != &other) {
    reset();
    arena_ = std::exchange(other.arena_, nullptr);
    chunk_ = std::exchange(other.chunk_, nullptr);
    bases_ = other.bases_;
    offsets_ = other.offsets_;
  }
  return *this;
}

void UploadLease::reset() {
  if (arena_ == nullptr) return;
  std::exchange(arena_, nullptr)->release(std::exchange(chunk_, nullptr));
}

StatusOr<std::unique_ptr<UploadArena>> UploadArena::create(std::vector<UploadTarget> targets,
                                                           size_t capacity, size_t chunks) {
  if (targets.empty() || targets.size() > UploadLease::kMaxTargets) {
    return invalid_argument("upload arena: " + std::to_string(targets.size()) + " targets (1 to " +
                            std::to_string(UploadLease::kMaxTargets) + ")");
  }
  for (const UploadTarget& t : targets) {
    if (t.backend == nullptr) return invalid_argument("upload arena: a target without a backend");
  }
  std::unique_ptr<UploadArena> arena(new UploadArena(std::move(targets)));
  PAGEDKV_ASSIGN_OR_RETURN(arena->current_, arena->new_chunk(pow2_at_least(capacity)));
  // The others stay idle (never fenced, so at once reusable) until the first is full.
  for (size_t i = 1; i < std::min(chunks, kMaxChunks); ++i) {
    PAGEDKV_RETURN_IF_ERROR(arena->new_chunk(pow2_at_least(capacity)).status());
  }
  return arena;
}

UploadArena::~UploadArena() {
  for (const UploadTarget& t : targets_) {  // copies may still read the staging
    t.backend->synchronize_stream(t.stream).ignore_error();
  }
  while (!chunks_.empty()) free_chunk(chunks_.back().get());
}

size_t UploadArena::capacity_bytes() const {
  size_t total = 0;
  for (const std::unique_ptr<Chunk>& c : chunks_) total += c->capacity;
  return total;
}

int64_t UploadArena::live_leases() const {
  int64_t total = 0;
  for (const std::unique_ptr<Chunk>& c : chunks_) total += c->live;
  return total;
}

StatusOr<UploadArena::Chunk*> UploadArena::new_chunk(size_t capacity) {
  chunks_.push_back(std::make_unique<Chunk>());  // free_chunk() undoes a partial one
  Chunk* c = chunks_.back().get();
  c->capacity = capacity;
  StatusOr<void*> staging = staging_backend().allocate_pinned(capacity);
  if (staging.ok()) c->staging = *staging;
  Status s = staging.status();
  for (size_t t = 0; t < targets_.size() && s.ok(); ++t) {
    Backend& be = *targets_[t].backend;
    StatusOr<void*> device = be.allocate_device(capacity);
    if (!device.ok()) {
      s = device.status();
      break;
    }
    c->device.push_back(*device);
    StatusOr<Event> event = be.create_event();
    if (!event.ok()) {
      s = event.status();
      break;
    }
    c->fence.push_back(*event);
  }
  if (!s.ok()) {
    free_chunk(c);
    return s;
  }
  return c;
}

void UploadArena::free_chunk(Chunk* c) {
  if (c->staging != nullptr) staging_backend().free_pinned(c->staging);
  for (size_t t = 0; t < c->device.size(); ++t) targets_[t].backend->free_device(c->device[t]);
  for (size_t t = 0; t < c->fence.size(); ++t) targets_[t].backend->destroy_event(c->fence[t]);
  chunks_.erase(std::find_if(chunks_.begin(), chunks_.end(),
                             [c](const std::unique_ptr<Chunk>& p) { return p.get() == c; }));
}

void UploadArena::fence(Chunk* c) {
  // Every consumer of the chunk's regions was queued before its lease was released, so an event
  // recorded now on each target's stream completes after all of that target's.
  c->fenced = true;
  for (size_t t = 0; t < targets_.size(); ++t) {
    c->fenced =
        targets_[t].backend->record_event(c->fence[t], targets_[t].stream).ok() && c->fenced;
  }
  c->unfenced = !c->fenced;
}

void UploadArena::retire(Chunk* c) {
  if (c == nullptr) return;
  current_ = nullptr;
  if (c->live == 0) fence(c);
}

void UploadArena::release(void* chunk) {
  Chunk* c = static_cast<Chunk*>(chunk);
  if (--c->live == 0 && c != current_) fence(c);
}

StatusOr<bool> UploadArena::reusable(Chunk* c, bool wait) {
  if (c == current_ || c->live > 0) return false;
  for (size_t t = 0; t < targets_.size(); ++t) {
    Backend& be = *targets_[t].backend;
    if (c->unfenced) {
      if (!wait) return false;
      PAGEDKV_RETURN_IF_ERROR(be.synchronize_stream(targets_[t].stream));
    } else if (wait) {
      PAGEDKV_RETURN_IF_ERROR(be.synchronize_event(c->fence[t]));
    } else {
      PAGEDKV_ASSIGN_OR_RETURN(bool done, be.query_event(c->fence[t]));
      if (!done) return false;
    }
  }
  c->fenced = c->unfenced = false;
  return true;
}

StatusOr<UploadArena::Chunk*> UploadArena::chunk_for(size_t need) {
  if (current_ != nullptr && current_->offset + need <= current_->capacity) return current_;
  retire(current_);
  size_t largest = 0;
  for (const std::unique_ptr<Chunk>& c : chunks_) largest = std::max(largest, c->capacity);
  // 1. A chunk the device is done with.
  for (const std::unique_ptr<Chunk>& c : chunks_) {
    if (c->capacity < need) continue;
    PAGEDKV_ASSIGN_OR_RETURN(bool free, reusable(c.get(), /*wait=*/false));
    if (free) return c.get();
  }
  // 2. Too many in flight: wait for the oldest released one that is large enough.
  if (chunks_.size() >= kMaxChunks) {
    for (const std::unique_ptr<Chunk>& c : chunks_) {
      if (c->capacity < need || c->live > 0) continue;
      PAGEDKV_ASSIGN_OR_RETURN(bool free, reusable(c.get(), /*wait=*/true));
      if (free) return c.get();
    }
  }
  // 3. A new chunk, at least as large as any before; smaller idle ones go, so a grown arena
  //    does not keep its old chunks forever. (Chunks still held by leases, or still read by
  //    the device, are kept until a later call finds them idle.)
  PAGEDKV_ASSIGN_OR_RETURN(Chunk * fresh, new_chunk(pow2_at_least(std::max(need, largest))));
  for (size_t i = 0; i < chunks_.size();) {
    Chunk* c = chunks_[i].get();
    if (c != fresh && c->capacity < fresh->capacity) {
      StatusOr<bool> idle = reusable(c, /*wait=*/false);
      if (idle.ok() && *idle) {
        free_chunk(c);
        continue;
      }
    }
    ++i;
  }
  return fresh;
}

StatusOr<UploadLease> UploadArena::upload(const UploadPart* parts, size_t count) {
  if (count > UploadLease::kMaxParts) {
    return invalid_argument("upload of " + std::to_string(count) + " arrays; at most " +
                            std::to_string(UploadLease::kMaxParts));
  }
  if (parts == nullptr && count > 0) return invalid_argument("upload: null parts");
  size_t need = 0;
  for (size_t i = 0; i < count; ++i) {
    const UploadPart& p = parts[i];
    if (p.bytes > SIZE_MAX / 2 - need) return invalid_argument("upload larger than memory");
    need += align_up(p.bytes);
  }
  PAGEDKV_ASSIGN_OR_RETURN(Chunk * c, chunk_for(need));
  if (c != current_) {  // a fresh or reused chunk: fill it from the front
    c->offset = 0;
    current_ = c;
  }
  UploadLease lease;
  size_t at = c->offset;
  for (size_t i = 0; i < count; ++i) {
    const UploadPart& p = parts[i];
    if (p.bytes > 0) std::memcpy(static_cast<char*>(c->staging) + at, p.src, p.bytes);
    lease.offsets_[i] = at;
    at += align_up(p.bytes);
  }
  for (size_t t = 0; t < targets_.size() && need > 0; ++t) {
    const UploadTarget& target = targets_[t];
    PAGEDKV_RETURN_IF_ERROR(target.backend->copy_async(
        static_cast<char*>(c->device[t]) + c->offset, static_cast<char*>(c->staging) + c->offset,
        need, CopyKind::kHostToDevice, target.stream));
  }
  for (size_t t = 0; t < targets_.size(); ++t) {
    lease.bases_[t] = static_cast<const char*>(c->device[t]);
  }
  lease.chunk_ = c;
  lease.arena_ = this;
  c->offset = at;
  ++c->live;
  return lease;
}

}  // namespace pagedkv::runtime
