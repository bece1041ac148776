// Batch metadata of one step: slot mapping, block tables ([batch, max_blocks] int32, vLLM style)
// and CSR (FlashInfer style). The block tables persist across steps: a row is rewritten only
// when its sequence or that sequence's table version changed, otherwise only appended blocks
// are written, so a decode step costs O(new tokens + new blocks), not O(all blocks).
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/group_pages.hpp"
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
  /// kOutOfRange, changing nothing, when a count would overflow int32. `widest`, when given, is
  /// at least every row's table size: when the table already has room for it, no row is read
  /// before it is written.
  Status build(const std::vector<Sequence*>& rows, const BlockAllocator& blocks,
               const BatchOptions& options, size_t widest = SIZE_MAX);
  /// build() of a plane whose groups share the blocks: this builder writes the full group's
  /// rows (`blocks`), `window_builders`[w] window group w's (`pages`[w], -1 before each
  /// sequence's first held block there, GroupPages::first_held), all in one pass over the
  /// rows. Every group's sizes are checked first, so an error changes none of them.
  Status build_groups(const std::vector<Sequence*>& rows, const BlockAllocator& blocks,
                      const std::vector<GroupPages>* pages,
                      std::vector<BatchMetadataBuilder>* window_builders,
                      const BatchOptions& options, size_t widest = SIZE_MAX);
  /// The metadata of the last successful build.
  const BatchMetadata& metadata() const { return md_; }

 private:
  // What a row held when it was last written, of one group's table.
  struct RowTail {
    int32_t first_live = 0;  // its first live entry (the entries before it are -1)
    int32_t page = -1;       // its last entry
  };
  struct RowState {
    uint64_t arrival = 0;  // unique per sequence incarnation
    uint64_t version = 0;
    int32_t num_blocks = -1;  // -1: row content unknown
    RowTail tail;
  };
  void relayout(int32_t max_blocks);
  struct Sizes {
    int64_t batch = 0;
    int64_t total_slots = 0;
    int64_t total_blocks = 0;
    int64_t widest = 0;
  };
  // The steps of a build: the sizes (and int32 checks) of the rows, the table width this
  // builder needs for them, its buffers laid out, one row written, the padding and CSR.
  static Status measure(const std::vector<Sequence*>& rows, const BatchOptions& options,
                        Sizes* out);
  // Whether `rows` whose tables have at most `widest` entries fit this builder's table as it is
  // and every count an int32: measure() would pass and fit() keep the width.
  bool fits_unmeasured(size_t rows, size_t widest, const BatchOptions& options) const;
  Status fit(const Sizes& sizes, int64_t* max_blocks) const;
  // Lays the buffers out for `sizes` at `max_blocks` a row; true when the table was laid out
  // anew (every row's content unknown).
  bool begin(const Sizes& sizes, int64_t max_blocks, const BatchOptions& options);
  // What row r must be rewritten of, for sequence s (from this builder's row state, which it
  // updates but for the tail): the whole row (`reset`), or the entries from `from` on and
  // those past the sequence's `n` entries up to the `old_n` it had. `same_last`: the last entry
  // is the one the row ended with and stays as it was (but for a window's trim).
  struct RowPlan {
    int32_t n = 0;
    int32_t from = 0;
    int32_t old_n = 0;
    bool reset = false;
    bool same_last = false;
  };
  RowPlan plan_row(int32_t r, const Sequence& s);
  // Writes row r of this builder's table by plan `p`: -1 before `first_live` (the entries
  // before tail->first_live already are), page_of(block) from there; then its length and
  // slots. `tail` is what the row held when last written, updated.
  template <typename PageOf>
  void write_row(int32_t r, const Sequence& s, const RowPlan& p, size_t first_live, RowTail* tail,
                 PageOf page_of);
  // write_row() of a ring table (BatchOptions::ring_window_tables): entry e at column
  // e % max_blocks. False, writing nothing, when the row's live entries do not fit the ring.
  template <typename PageOf>
  bool write_ring_row(int32_t r, const Sequence& s, const RowPlan& p, size_t first_live,
                      RowTail* tail, PageOf page_of);
  // build_groups()' usual decode row, every group's at once: one new token in the row's last
  // block, each group's row as it was written but for the entries its window trimmed since
  // (cleared here). Writes every group's slot and this builder's length (the window groups'
  // lengths are copied from it after the pass); false, writing nothing, for any other row.
  // kWindows: the number of window groups when known at compile time (0: `count`).
  template <size_t kWindows>
  bool write_decode_row(int32_t r, const Sequence& s, const RowPlan& p, const GroupPages* pages,
                        BatchMetadataBuilder* followers, size_t count);
  // A window group's builder before the rows of build_groups(): a plain table as wide as the
  // full group's (`max_blocks`), or with `ring` a ring of its own width. A new layout rewrites
  // every row, whatever the full group's plan.
  void begin_follower(const Sizes& sizes, int64_t max_blocks, bool ring,
                      const BatchOptions& options);
  // Rewrites every row of a ring that a row did not fit, at a width that fits them all (at
  // most `max_width`, the full group's).
  void rebuild_ring(const std::vector<Sequence*>& rows, const GroupPages& pages, const Sizes& sizes,
                    int64_t max_width, const BatchOptions& options);
  // Row r's length and s's pending slots, the last of its `n` entries being `last_page` (`row`:
  // the row, when at hand).
  void write_slots(int32_t r, const Sequence& s, int32_t n, int32_t last_page, const int32_t* row);
  // Where entry e of row r is (a ring's at column e % max_blocks).
  size_t table_index(int32_t r, int64_t e) const {
    const int64_t column = md_.ring_table ? e % md_.max_blocks : e;
    return static_cast<size_t>(r) * static_cast<size_t>(md_.max_blocks) +
           static_cast<size_t>(column);
  }
  // The padding and CSR; `row_state` holds the rows' sizes (this builder's, or for a window
  // group's the full group's builder's, which its rows follow).
  void end(const Sizes& sizes, const BatchOptions& options, const std::vector<RowState>& row_state);
  static void mark_seen(Sequence* s);

  int32_t block_size_;
  BlockDivider bdiv_;
  BatchMetadata md_;
  std::vector<RowState> row_state_;
  // A window group's builder (build_groups' `window_builders`) keeps no row state: its rows
  // follow the full group's builder. Only the rows' tails are its own.
  std::vector<RowTail> follower_tails_;
  // A window group's builder: this build rewrites every row (a new layout), and a row did not
  // fit the ring (rebuild_ring() follows).
  bool rewrite_all_ = false;
  bool ring_overflow_ = false;
};

}  // namespace core
}  // namespace pagedkv
