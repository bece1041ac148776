// MemoryStore: a storage tier in memory for the fuzz target, one per input so that an input
// replays alone exactly as it ran. Jobs finish when they are submitted (a get copies the bytes
// then), so what the cache sees depends on the input alone; the FileTier and its threads are
// covered by the storage and runtime suites.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "pagedkv/storage_tier.hpp"

namespace pagedkv::fuzz {

class MemoryStore : public StorageTier {
 public:
  explicit MemoryStore(StorageLayout layout) : layout_(std::move(layout)) {}

  const char* medium() const override { return "DISK"; }
  const StorageLayout& layout() const override { return layout_; }

  StatusOr<size_t> batch_exists(const std::vector<StorageKey>& keys) override {
    size_t n = 0;
    while (n < keys.size() && blocks_.count(key(keys[n])) != 0) ++n;
    return n;
  }
  StatusOr<uint64_t> submit_put(const std::vector<StorageKey>& keys,
                                const std::vector<const void*>& blocks) override {
    if (keys.empty() || keys.size() != blocks.size()) {
      return invalid_argument("MemoryStore::submit_put: keys and blocks differ or are empty");
    }
    const size_t bytes = static_cast<size_t>(layout_.block_bytes);
    for (size_t i = 0; i < keys.size(); ++i) {
      const char* p = static_cast<const char*>(blocks[i]);
      blocks_[key(keys[i])].assign(p, p + bytes);
    }
    stats_.puts += static_cast<int64_t>(keys.size());
    return finish(true, keys.size());
  }
  StatusOr<uint64_t> submit_get(const std::vector<StorageKey>& keys,
                                const std::vector<void*>& blocks) override {
    if (keys.empty() || keys.size() != blocks.size()) {
      return invalid_argument("MemoryStore::submit_get: keys and blocks differ or are empty");
    }
    size_t ok = 0;
    for (; ok < keys.size(); ++ok) {
      auto it = blocks_.find(key(keys[ok]));
      if (it == blocks_.end()) break;
      std::memcpy(blocks[ok], it->second.data(), it->second.size());
    }
    stats_.gets += static_cast<int64_t>(ok);
    return finish(ok == keys.size(), ok);
  }
  std::vector<StorageCompletion> poll() override { return std::exchange(done_, {}); }
  void drain() override {}
  Status remove(const std::vector<StorageKey>& keys) override {
    for (const StorageKey& k : keys) stats_.removed += blocks_.erase(key(k)) != 0 ? 1 : 0;
    return ok_status();
  }
  StorageStats stats() const override { return stats_; }

 private:
  static std::pair<uint64_t, NamespaceId> key(const StorageKey& k) { return {k.block_hash, k.ns}; }
  uint64_t finish(bool ok, size_t blocks_ok) {
    StorageCompletion c;
    c.job = next_job_++;
    c.ok = ok;
    c.blocks_ok = blocks_ok;
    if (!ok) c.error = "missing block";
    done_.push_back(std::move(c));
    return done_.back().job;
  }

  StorageLayout layout_;
  std::map<std::pair<uint64_t, NamespaceId>, std::vector<char>> blocks_;
  std::vector<StorageCompletion> done_;
  StorageStats stats_;
  uint64_t next_job_ = 1;
};

}  // namespace pagedkv::fuzz
