// Batch metadata of one step: slot mapping, block tables ([batch, max_blocks] int32, vLLM style)
// and CSR (FlashInfer style). The block tables persist across steps: a row is rewritten only
// when its sequence or that sequence's table version changed, otherwise only appended blocks
// are written, so a decode step costs O(new tokens + new blocks), not O(all blocks).
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/sequence_table.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace core {

/// Builds and keeps a step's BatchMetadata.
class BatchMetadataBuilder {
 public:
  explicit BatchMetadataBuilder(int32_t block_size) : block_size_(block_size), bdiv_(block_size) {}

  /// Rebuilds the metadata for `rows` (device-resident sequences, in batch order). Fails with
  /// kOutOfRange, changing nothing, when a count would overflow int32.
  Status build(const std::vector<Sequence*>& rows, const BlockAllocator& blocks,
               const BatchOptions& options);
  /// The metadata of the last successful build.
  const BatchMetadata& metadata() const { return md_; }
  /// Forgets the cached rows (the next build rewrites every row).
  void invalidate() { row_state_.clear(); }

 private:
  struct RowState {
    uint64_t arrival = 0;  // unique per sequence incarnation
    uint64_t version = 0;
    int32_t num_blocks = -1;  // -1: row content unknown
    int32_t first_live = 0;   // the sequence's first_live when the row was written
  };
  void relayout(int32_t max_blocks);

  int32_t block_size_;
  BlockDivider bdiv_;
  BatchMetadata md_;
  std::vector<RowState> row_state_;
};

}  // namespace core
}  // namespace pagedkv
