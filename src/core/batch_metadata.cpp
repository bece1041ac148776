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

Status BatchMetadataBuilder::measure(const std::vector<Sequence*>& rows,
                                     const BatchOptions& options, Sizes* out) {
  Sizes z;
  for (const Sequence* s : rows) {
    const int64_t len = s->length() + s->pending;
    if (len > kMaxInt32) return out_of_range("batch: sequence length exceeds int32");
    z.total_slots += s->pending;
    z.total_blocks += static_cast<int64_t>(s->blocks.size());
    z.widest = std::max<int64_t>(z.widest, static_cast<int64_t>(s->blocks.size()));
  }
  if (options.pad_slots_to < 0) return invalid_argument("pad_slots_to must be >= 0");
  if (static_cast<int64_t>(rows.size()) > kMaxInt32 - 1) {
    return out_of_range("batch: batch size exceeds int32");
  }
  if (options.build_csr && z.total_blocks > kMaxInt32) {
    return out_of_range("batch: CSR indices (" + std::to_string(z.total_blocks) +
                        " blocks) overflow int32 indptr");
  }
  z.batch = static_cast<int64_t>(rows.size());
  *out = z;
  return ok_status();
}

bool BatchMetadataBuilder::fits_unmeasured(size_t rows, size_t widest,
                                           const BatchOptions& options) const {
  // A row covers at most widest * block_size tokens (its table covers them all); the CSR needs
  // the total, so it is measured.
  return !options.build_csr && options.pad_slots_to >= 0 && widest <= kMaxInt32 &&
         static_cast<int64_t>(std::max<size_t>(widest, 1)) <= md_.max_blocks &&
         static_cast<int64_t>(widest) * block_size_ <= kMaxInt32 &&
         static_cast<int64_t>(rows) <= kMaxInt32 - 1;
}

Status BatchMetadataBuilder::fit(const Sizes& sizes, int64_t* max_blocks) const {
  int64_t m = std::max<int64_t>(md_.max_blocks, 1);
  while (m < sizes.widest) m *= 2;
  if (m > kMaxInt32 || static_cast<long double>(m) * static_cast<long double>(sizes.batch) >
                           static_cast<long double>(std::numeric_limits<int64_t>::max() / 8)) {
    return out_of_range("batch: block table too large");
  }
  *max_blocks = m;
  return ok_status();
}

bool BatchMetadataBuilder::begin(const Sizes& sizes, int64_t max_blocks,
                                 const BatchOptions& options) {
  const int32_t batch = static_cast<int32_t>(sizes.batch);
  if (batch != md_.batch_size) {
    md_.batch_size = batch;
    md_.block_tables.resize(static_cast<size_t>(batch) * static_cast<size_t>(md_.max_blocks), -1);
    row_state_.resize(static_cast<size_t>(batch));
  }
  const bool relaid = max_blocks != md_.max_blocks;
  if (relaid) relayout(static_cast<int32_t>(max_blocks));
  md_.slot_mapping.clear();
  md_.slot_mapping.reserve(static_cast<size_t>(std::max(sizes.total_slots, options.pad_slots_to)));
  md_.seq_lens.resize(static_cast<size_t>(batch));
  return relaid;
}

void BatchMetadataBuilder::begin_follower(const Sizes& sizes, int64_t max_blocks, bool ring,
                                          const BatchOptions& options) {
  const bool switched = ring != md_.ring_table;
  md_.ring_table = ring;
  // A ring keeps its own width (0 the first time: every row overflows, and rebuild_ring()
  // measures it).
  const int64_t width = ring ? (switched ? 0 : md_.max_blocks) : max_blocks;
  rewrite_all_ = begin(sizes, width, options);
  if (switched && !rewrite_all_) {  // the same width in the other form: lay it out anew
    relayout(static_cast<int32_t>(width));
    rewrite_all_ = true;
  }
  ring_overflow_ = false;
  follower_tails_.resize(static_cast<size_t>(sizes.batch));
}

// Inlined into the row loops: it runs once per row of every step.
[[gnu::always_inline]] inline BatchMetadataBuilder::RowPlan BatchMetadataBuilder::plan_row(
    int32_t r, const Sequence& s) {
  RowState& st = row_state_[static_cast<size_t>(r)];
  RowPlan p;
  p.n = static_cast<int32_t>(s.blocks.size());
  if (st.num_blocks < 0 || st.arrival != s.arrival) {
    p.reset = true;  // unknown content or another sequence
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
    p.from = static_cast<int32_t>(std::min<int64_t>(keep, p.n));
    p.old_n = st.num_blocks;
    p.same_last = keep >= p.n && p.old_n == p.n;
  }
  st.arrival = s.arrival;
  st.version = s.table_version;
  st.num_blocks = p.n;
  return p;
}

// Inlined into the row writers: it runs once per row of every group at every step.
[[gnu::always_inline]] inline void BatchMetadataBuilder::write_slots(int32_t r, const Sequence& s,
                                                                     int32_t n, int32_t last_page,
                                                                     const int32_t* row) {
  const int64_t len = s.length();
  const int64_t pending = s.pending;
  md_.seq_lens[static_cast<size_t>(r)] = static_cast<int32_t>(len + pending);
  const int64_t bs = block_size_;
  const int64_t last = static_cast<int64_t>(n) - 1;
  if (pending == 1 && bdiv_.div(len) == last) {  // a decode step's row
    md_.slot_mapping.push_back(static_cast<int64_t>(last_page) * bs + bdiv_.mod(len));
    return;
  }
  for (int64_t t = len; t < len + pending; ++t) {
    const int64_t e = bdiv_.div(t);
    const int64_t page = e == last        ? last_page
                         : row != nullptr ? row[table_index(0, e)]
                                          : md_.block_tables[table_index(r, e)];
    md_.slot_mapping.push_back(page * bs + bdiv_.mod(t));
  }
}

template <typename PageOf>
void BatchMetadataBuilder::write_row(int32_t r, const Sequence& s, const RowPlan& p,
                                     size_t first_live, RowTail* tail, PageOf page_of) {
  const int32_t n = p.n;
  // Blocks that fell out of a sliding window have no page: -1, like the padding.
  const int32_t live = static_cast<int32_t>(std::min<size_t>(first_live, static_cast<size_t>(n)));
  // The usual decode row: nothing of the table changes, and its last page is known.
  if (p.same_last && live == tail->first_live && live < n) {
    write_slots(r, s, n, tail->page, nullptr);
    return;
  }
  const size_t stride = static_cast<size_t>(md_.max_blocks);
  int32_t* row = &md_.block_tables[static_cast<size_t>(r) * stride];
  int32_t clear_from = 0;  // entries from here to the first live one are -1
  if (p.reset) {
    std::fill(row + n, row + stride, -1);
  } else {
    // A window trims its first entries without a new table version (the entries after them
    // stay): those that left since the row was written become -1 here.
    clear_from = std::min(p.from, tail->first_live);
    if (p.old_n > n) std::fill(row + n, row + p.old_n, -1);
  }
  for (int32_t i = clear_from; i < live; ++i) row[i] = -1;
  for (int32_t i = std::max(p.from, live); i < n; ++i) {
    row[i] = page_of(s.blocks[static_cast<size_t>(i)]);
  }
  tail->first_live = live;
  // The last entry, which a decode step's slots are in: kept from the last build while it is
  // the same entry and this build left it as it was, so that the usual row reads no line of
  // the table.
  if (!p.same_last || live >= n) tail->page = n > 0 ? row[n - 1] : -1;
  write_slots(r, s, n, tail->page, row);
}

template <typename PageOf>
bool BatchMetadataBuilder::write_ring_row(int32_t r, const Sequence& s, const RowPlan& p,
                                          size_t first_live, RowTail* tail, PageOf page_of) {
  const int32_t n = p.n;
  const int32_t live = static_cast<int32_t>(std::min<size_t>(first_live, static_cast<size_t>(n)));
  const int32_t width = md_.max_blocks;
  if (n - live > width || width == 0) return false;
  if (!rewrite_all_ && p.same_last && live == tail->first_live && live < n) {
    write_slots(r, s, n, tail->page, nullptr);
    return true;
  }
  int32_t* row = &md_.block_tables[static_cast<size_t>(r) * static_cast<size_t>(width)];
  // Clears entries [a, b) of the row (the whole ring when they span it).
  const auto clear = [&](int32_t a, int32_t b) {
    if (b - a >= width) {
      std::fill(row, row + width, -1);
      return;
    }
    for (int32_t i = a; i < b; ++i) row[i % width] = -1;
  };
  int32_t from = live;
  if (p.reset || rewrite_all_) {
    std::fill(row, row + width, -1);
  } else {
    // The row holds this sequence's entries [tail->first_live, p.old_n), each within one ring
    // width: clearing what left (the window's trim, a shorter row) and rewriting what changed
    // touches no column of an entry that stays.
    clear(std::min(p.from, tail->first_live), live);
    if (p.old_n > n) clear(n, p.old_n);
    from = std::max(p.from, live);
  }
  for (int32_t i = from; i < n; ++i) row[i % width] = page_of(s.blocks[static_cast<size_t>(i)]);
  tail->first_live = live;
  if (!p.same_last || live >= n || rewrite_all_) tail->page = n > 0 ? row[(n - 1) % width] : -1;
  write_slots(r, s, n, tail->page, row);
  return true;
}

template <size_t kWindows>
[[gnu::always_inline]] inline bool BatchMetadataBuilder::write_decode_row(
    int32_t r, const Sequence& s, const RowPlan& p, const GroupPages* pages,
    BatchMetadataBuilder* followers, size_t count) {
  // A model of one window size (the usual one) gets the loops over its groups unrolled.
  const size_t windows = kWindows > 0 ? kWindows : count;
  if (!p.same_last || s.pending != 1) return false;
  const int64_t len = s.length();
  const int32_t n = p.n;
  if (bdiv_.div(len) != static_cast<int64_t>(n) - 1) return false;
  const size_t row = static_cast<size_t>(r);
  const RowTail& tail = row_state_[row].tail;
  // This builder's row as write_row() would find it: no entry left its window since it was
  // written and the last block is still held (so no table line is read).
  if (s.first_live >= static_cast<size_t>(n) ||
      static_cast<int32_t>(s.first_live) != tail.first_live) {
    return false;
  }
  // Each window group's row likewise, but for the entries that left its window since (a
  // window trims a block every block_size steps): those become -1, as in write_row() and
  // write_ring_row(). They were live entries of a row that fitted its ring, so clearing them
  // touches no column of an entry that stays.
  for (size_t w = 0; w < windows; ++w) {
    const BatchMetadataBuilder& b = followers[w];
    const size_t held = pages[w].first_held(s);
    const int32_t was = b.follower_tails_[row].first_live;
    if (held >= static_cast<size_t>(n) || static_cast<int32_t>(held) < was) return false;
  }
  const int64_t offset = bdiv_.mod(len);
  const int32_t seq_len = static_cast<int32_t>(len + 1);
  const int64_t bs = block_size_;
  md_.seq_lens[row] = seq_len;
  md_.slot_mapping.push_back(static_cast<int64_t>(tail.page) * bs + offset);
  for (size_t w = 0; w < windows; ++w) {
    BatchMetadataBuilder& b = followers[w];
    RowTail& t = b.follower_tails_[row];
    const int32_t held = static_cast<int32_t>(pages[w].first_held(s));
    for (int32_t e = t.first_live; e < held; ++e) b.md_.block_tables[b.table_index(r, e)] = -1;
    t.first_live = held;
    b.md_.slot_mapping.push_back(static_cast<int64_t>(t.page) * bs + offset);
  }
  return true;
}

void BatchMetadataBuilder::rebuild_ring(const std::vector<Sequence*>& rows, const GroupPages& pages,
                                        const Sizes& sizes, int64_t max_width,
                                        const BatchOptions& options) {
  // What a decoding row holds (ceil(W / block_size) + 1) while the rows fit it; past that
  // (prefill chunks) grown by half at least, so that a batch whose rows keep widening does not
  // rebuild at every step; never past the full group's width, which every row fits and whose
  // checks passed.
  const int64_t decoding = (pages.window() + block_size_ - 1) / block_size_ + 1;
  int64_t widest = 1;
  for (const Sequence* s : rows) {
    const int64_t n = static_cast<int64_t>(s->blocks.size());
    widest = std::max(widest, n - std::min<int64_t>(static_cast<int64_t>(pages.first_held(*s)), n));
  }
  const int64_t grown = std::max<int64_t>(md_.max_blocks, 0) * 3 / 2;
  const int64_t width = widest <= decoding ? decoding : std::max(widest, grown);
  begin(sizes, std::min(width, std::max<int64_t>(max_width, 1)), options);
  rewrite_all_ = true;
  ring_overflow_ = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Sequence& s = *rows[r];
    RowPlan p;
    p.n = static_cast<int32_t>(s.blocks.size());
    p.reset = true;
    write_ring_row(static_cast<int32_t>(r), s, p, pages.first_held(s), &follower_tails_[r],
                   [&pages](LogicalId id) { return pages.page(id); });
  }
}

void BatchMetadataBuilder::end(const Sizes& sizes, const BatchOptions& options,
                               const std::vector<RowState>& row_state) {
  if (options.pad_slots_to > static_cast<int64_t>(md_.slot_mapping.size())) {
    md_.slot_mapping.resize(static_cast<size_t>(options.pad_slots_to), -1);
  }
  if (!options.build_csr) {
    md_.indptr.clear();
    md_.indices.clear();
    md_.last_page_len.clear();
    return;
  }
  const int32_t batch = md_.batch_size;
  const size_t stride = static_cast<size_t>(md_.max_blocks);
  md_.indptr.assign(1, 0);
  md_.indptr.reserve(static_cast<size_t>(batch) + 1);
  md_.indices.clear();
  md_.indices.reserve(static_cast<size_t>(sizes.total_blocks));
  md_.last_page_len.resize(static_cast<size_t>(batch));
  for (int32_t r = 0; r < batch; ++r) {
    const int32_t* row = &md_.block_tables[static_cast<size_t>(r) * stride];
    const int32_t n = row_state[static_cast<size_t>(r)].num_blocks;
    if (md_.ring_table) {  // in block order, -1 before the window as in a plain table
      const int32_t live = follower_tails_[static_cast<size_t>(r)].first_live;
      for (int32_t i = 0; i < n; ++i) md_.indices.push_back(i < live ? -1 : row[i % stride]);
    } else {
      md_.indices.insert(md_.indices.end(), row, row + n);
    }
    md_.indptr.push_back(static_cast<int32_t>(md_.indices.size()));
    const int32_t len = md_.seq_lens[static_cast<size_t>(r)];
    md_.last_page_len[static_cast<size_t>(r)] = len == 0 ? 0 : (len - 1) % block_size_ + 1;
  }
}

// This row is now the only one that could hold an older version of s (a sequence appears once
// per batch; rows of earlier batches with an older version get rewritten in full). With several
// groups, every group's row of s is written first.
void BatchMetadataBuilder::mark_seen(Sequence* s) {
  s->base_version = s->table_version;
  s->changed_from = SIZE_MAX;
}

Status BatchMetadataBuilder::build(const std::vector<Sequence*>& rows, const BlockAllocator& blocks,
                                   const BatchOptions& options, size_t widest) {
  // Pass 1: sizes and overflow checks, so that a failure leaves the last metadata untouched
  // (none is needed when the bound on the tables passes them).
  Sizes sizes;
  sizes.batch = static_cast<int64_t>(rows.size());
  int64_t max_blocks = md_.max_blocks;
  if (!fits_unmeasured(rows.size(), widest, options)) {
    PAGEDKV_RETURN_IF_ERROR(measure(rows, options, &sizes));
    PAGEDKV_RETURN_IF_ERROR(fit(sizes, &max_blocks));
  }
  // Pass 2: write. Rows whose sequence and table version are unchanged only get new blocks.
  begin(sizes, max_blocks, options);
  const size_t batch = rows.size();
  for (size_t r = 0; r < batch; ++r) {
    if (r + 4 < batch) __builtin_prefetch(rows[r + 4]);  // scattered sequences: fetch ahead
    Sequence& s = *rows[r];
    const int32_t row = static_cast<int32_t>(r);
    const RowPlan p = plan_row(row, s);
    write_row(row, s, p, s.first_live, &row_state_[r].tail,
              [&blocks](LogicalId b) { return blocks[b].phys; });
    mark_seen(&s);
  }
  end(sizes, options, row_state_);
  return ok_status();
}

Status BatchMetadataBuilder::build_groups(const std::vector<Sequence*>& rows,
                                          const BlockAllocator& blocks,
                                          const std::vector<GroupPages>* pages,
                                          std::vector<BatchMetadataBuilder>* window_builders,
                                          const BatchOptions& options, size_t widest) {
  // Pass 1: sizes and overflow checks, so that a failure leaves every group's last metadata
  // untouched (none is needed when the bound on the tables passes them). Every group's table
  // has this builder's width, so this builder's checks are theirs.
  const size_t windows = window_builders == nullptr ? 0 : window_builders->size();
  Sizes sizes;
  sizes.batch = static_cast<int64_t>(rows.size());
  int64_t max_blocks = md_.max_blocks;
  if (!fits_unmeasured(rows.size(), widest, options)) {
    PAGEDKV_RETURN_IF_ERROR(measure(rows, options, &sizes));
    PAGEDKV_RETURN_IF_ERROR(fit(sizes, &max_blocks));
  }

  // Pass 2: write, every group's row of a sequence while it is at hand. The window groups'
  // rows follow this builder's: written in the same builds at the same width, they hold the
  // same sequence at the same table version, so one decision per row (plan_row, on this
  // builder's row states) serves every group; each keeps only where its live entries begin.
  begin(sizes, max_blocks, options);
  for (size_t w = 0; w < windows; ++w) {
    const bool ring = options.ring_window_tables && (*pages)[w].window() > 0;
    (*window_builders)[w].begin_follower(sizes, max_blocks, ring, options);
  }
  const int32_t batch = static_cast<int32_t>(sizes.batch);
  const GroupPages* const first_pages = windows > 0 ? pages->data() : nullptr;
  BatchMetadataBuilder* const first_follower = windows > 0 ? window_builders->data() : nullptr;
  // write_decode_row() serves the usual rows while no window group's table is rewritten
  // whole (a new layout, or a ring a row overflowed: rebuild_ring() rewrites it after the pass).
  bool decode_rows = windows > 0;
  for (size_t w = 0; w < windows; ++w) decode_rows = decode_rows && !first_follower[w].rewrite_all_;
  for (int32_t r = 0; r < batch; ++r) {
    // Rows are scattered sequences: fetch a few ahead.
    if (static_cast<size_t>(r) + 4 < rows.size()) {
      __builtin_prefetch(rows[static_cast<size_t>(r) + 4]);
    }
    Sequence& s = *rows[static_cast<size_t>(r)];
    const RowPlan p = plan_row(r, s);
    if (decode_rows &&
        (windows == 1 ? write_decode_row<1>(r, s, p, first_pages, first_follower, windows)
                      : write_decode_row<0>(r, s, p, first_pages, first_follower, windows))) {
      mark_seen(&s);
      continue;
    }
    for (size_t w = 0; w < windows; ++w) {
      const GroupPages& g = (*pages)[w];
      BatchMetadataBuilder& b = (*window_builders)[w];
      const auto page_of = [&g](LogicalId id) { return g.page(id); };
      RowTail* tail = &b.follower_tails_[static_cast<size_t>(r)];
      if (!b.md_.ring_table) {
        b.write_row(r, s, b.rewrite_all_ ? RowPlan{p.n, 0, 0, true, false} : p, g.first_held(s),
                    tail, page_of);
      } else if (!b.ring_overflow_) {
        b.ring_overflow_ = !b.write_ring_row(r, s, p, g.first_held(s), tail, page_of);
        decode_rows = decode_rows && !b.ring_overflow_;
      }
    }
    write_row(r, s, p, s.first_live, &row_state_[static_cast<size_t>(r)].tail,
              [&blocks](LogicalId b) { return blocks[b].phys; });
    mark_seen(&s);
  }
  for (size_t w = 0; w < windows; ++w) {
    BatchMetadataBuilder& b = (*window_builders)[w];
    if (b.ring_overflow_) b.rebuild_ring(rows, (*pages)[w], sizes, md_.max_blocks, options);
  }
  end(sizes, options, row_state_);
  for (size_t w = 0; w < windows; ++w) {
    BatchMetadataBuilder& b = (*window_builders)[w];
    b.md_.seq_lens = md_.seq_lens;  // a sequence's length is the same in every group
    b.end(sizes, options, row_state_);
  }
  return ok_status();
}

}  // namespace core
}  // namespace pagedkv
