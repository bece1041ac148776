// A storage tier that holds nothing and never fails: for tests of what a cache does when it is
// given a store (and refuses one), not of the store itself.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/storage_tier.hpp"

namespace pagedkv::testing {

class NullStorage : public StorageTier {
 public:
  const char* medium() const override { return "NULL"; }
  const StorageLayout& layout() const override { return layout_; }
  StatusOr<size_t> batch_exists(const std::vector<StorageKey>&) override { return size_t{0}; }
  StatusOr<uint64_t> submit_put(const std::vector<StorageKey>&,
                                const std::vector<const void*>&) override {
    return uint64_t{0};
  }
  StatusOr<uint64_t> submit_get(const std::vector<StorageKey>&,
                                const std::vector<void*>&) override {
    return uint64_t{0};
  }
  std::vector<StorageCompletion> poll() override { return {}; }
  void drain() override {}
  Status remove(const std::vector<StorageKey>&) override { return ok_status(); }
  StorageStats stats() const override { return {}; }

 private:
  StorageLayout layout_;
};

}  // namespace pagedkv::testing
