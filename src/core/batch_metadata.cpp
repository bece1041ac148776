#include "core/batch_metadata.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace pagedkv {
namespace core {

namespace {
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
}  // namespace

void BatchMetadataBuilder::relayout(int32_t max_blocks) {
  md_.max_blocks = max_blocks;
  md_.block_tables.assign(static_cast<size_t>(md_.batch_size) * static_cast<size_t>(max_blocks),
                          -1);
  for (RowState& r : row_state_) r.num_blocks = -1;
}

Status BatchMetadataBuilder::build(const std::vector<Sequence*>& rows, const BlockAllocator& blocks,
                                   const BatchOptions& options) {
  // Pass 1: sizes and overflow checks, so that a failure leaves the last metadata untouched.
  int64_t total_slots = 0;
  int64_t total_blocks = 0;
  int64_t widest = 0;
  for (const Sequence* s : rows) {
    const int64_t len = s->length() + s->pending;
    if (len > kMaxInt32) return out_of_range("batch: sequence length exceeds int32");
    total_slots += s->pending;
    total_blocks += static_cast<int64_t>(s->blocks.size());
    widest = std::max<int64_t>(widest, static_cast<int64_t>(s->blocks.size()));
  }
  if (options.pad_slots_to < 0) return invalid_argument("pad_slots_to must be >= 0");
  if (static_cast<int64_t>(rows.size()) > kMaxInt32 - 1) {
    return out_of_range("batch: batch size exceeds int32");
  }
  if (options.build_csr && total_blocks > kMaxInt32) {
    return out_of_range("batch: CSR indices (" + std::to_string(total_blocks) +
                        " blocks) overflow int32 indptr");
  }
  int64_t max_blocks = std::max<int64_t>(md_.max_blocks, 1);
  while (max_blocks < widest) max_blocks *= 2;
  if (max_blocks > kMaxInt32 ||
      static_cast<long double>(max_blocks) * static_cast<long double>(rows.size()) >
          static_cast<long double>(std::numeric_limits<int64_t>::max() / 8)) {
    return out_of_range("batch: block table too large");
  }

  // Pass 2: write. Rows whose sequence and table version are unchanged only get new blocks.
  const int32_t batch = static_cast<int32_t>(rows.size());
  if (batch != md_.batch_size) {
    md_.batch_size = batch;
    md_.block_tables.resize(static_cast<size_t>(batch) * static_cast<size_t>(md_.max_blocks), -1);
    row_state_.resize(static_cast<size_t>(batch));
  }
  if (max_blocks != md_.max_blocks) relayout(static_cast<int32_t>(max_blocks));

  md_.slot_mapping.clear();
  md_.slot_mapping.reserve(static_cast<size_t>(std::max(total_slots, options.pad_slots_to)));
  md_.seq_lens.resize(static_cast<size_t>(batch));
  const size_t stride = static_cast<size_t>(md_.max_blocks);
  const int64_t bs = block_size_;
  for (int32_t r = 0; r < batch; ++r) {
    // Rows are scattered sequences: fetch a few ahead.
    if (static_cast<size_t>(r) + 4 < rows.size())
      __builtin_prefetch(rows[static_cast<size_t>(r) + 4]);
    Sequence& s = *rows[static_cast<size_t>(r)];
    int32_t* row = &md_.block_tables[static_cast<size_t>(r) * stride];
    RowState& st = row_state_[static_cast<size_t>(r)];
    const int32_t n = static_cast<int32_t>(s.blocks.size());
    int32_t from = 0;
    int32_t clear_from = 0;  // entries from here to the first live one are -1
    if (st.num_blocks < 0 || st.arrival != s.arrival) {
      std::fill(row + n, row + stride, -1);  // unknown content or another sequence
    } else {
      // The row holds this sequence at version st.version: keep the entries that did not change
      // since (all of them at the same version), clear what it no longer has.
      int64_t keep = st.num_blocks;
      if (st.version != s.table_version) {
        keep = st.version >= s.base_version
                   ? std::min<int64_t>(keep, static_cast<int64_t>(std::min<size_t>(
                                                 s.changed_from, static_cast<size_t>(kMaxInt32))))
                   : 0;
      }
      from = static_cast<int32_t>(std::min<int64_t>(keep, n));
      // A window trims its first entries without a new table version (the entries after them
      // stay): those that left since the row was written become -1 here.
      clear_from = std::min(from, st.first_live);
      if (st.num_blocks > n) std::fill(row + n, row + st.num_blocks, -1);
    }
    // Blocks that fell out of a sliding window have no page: -1, like the padding.
    const int32_t live =
        static_cast<int32_t>(std::min<size_t>(s.first_live, static_cast<size_t>(n)));
    for (int32_t i = clear_from; i < live; ++i) row[i] = -1;
    for (int32_t i = std::max(from, live); i < n; ++i) {
      row[i] = blocks[s.blocks[static_cast<size_t>(i)]].phys;
    }
    st.arrival = s.arrival;
    st.version = s.table_version;
    st.num_blocks = n;
    st.first_live = live;
    // This row is now the only one that could hold an older version of s (a sequence appears
    // once per batch; rows of earlier batches with an older version get rewritten in full).
    s.base_version = s.table_version;
    s.changed_from = SIZE_MAX;

    const int64_t len = s.length();
    md_.seq_lens[static_cast<size_t>(r)] = static_cast<int32_t>(len + s.pending);
    for (int64_t p = len; p < len + s.pending; ++p) {
      md_.slot_mapping.push_back(static_cast<int64_t>(row[bdiv_.div(p)]) * bs + bdiv_.mod(p));
    }
  }
  if (options.pad_slots_to > total_slots) {
    md_.slot_mapping.resize(static_cast<size_t>(options.pad_slots_to), -1);
  }

  if (options.build_csr) {
    md_.indptr.assign(1, 0);
    md_.indptr.reserve(static_cast<size_t>(batch) + 1);
    md_.indices.clear();
    md_.indices.reserve(static_cast<size_t>(total_blocks));
    md_.last_page_len.resize(static_cast<size_t>(batch));
    for (int32_t r = 0; r < batch; ++r) {
      const int32_t* row = &md_.block_tables[static_cast<size_t>(r) * stride];
      const int32_t n = row_state_[static_cast<size_t>(r)].num_blocks;
      md_.indices.insert(md_.indices.end(), row, row + n);
      md_.indptr.push_back(static_cast<int32_t>(md_.indices.size()));
      const int32_t len = md_.seq_lens[static_cast<size_t>(r)];
      md_.last_page_len[static_cast<size_t>(r)] = len == 0 ? 0 : (len - 1) % block_size_ + 1;
    }
  } else {
    md_.indptr.clear();
    md_.indices.clear();
    md_.last_page_len.clear();
  }
  return ok_status();
}

}  // namespace core
}  // namespace pagedkv
