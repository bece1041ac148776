// A model of the decode step's memory traffic, not the product: it answered which design of the
// control plane could bring a two-group step (full attention + window 128) within 1.5x of the
// one-group step (issue #17's goal) before src/core was changed. Its "shared blocks" design is
// the one built (ControlPlane with CacheConfig::groups; BM_DecodeStepSharedGroups measures it).
//
// Per sequence it does what ControlPlane::reserve_batch and build_batch do in a decode step at
// 1,024 sequences: read the sequence record, check the block the next token lands in (its table
// entry and block record), take a block when one fills, save the record in the journal, touch
// it, append the slot, then write the batch row, the length and the slot mapping. Groups are
//   * separate: one plane per group, as ModelKvCache keeps them today (each with its own records),
//   * fused: one plane whose sequence record holds a table per group (one lookup, one journal
//     entry, one touch per sequence; the per-group work stays per group),
//   * shared blocks: one plane whose groups (of one block size) also share the logical blocks:
//     one table per sequence, and a block record holds a physical block per group (-1 where a
//     window gave its page back), so the table entry and block record of the write position are
//     read once for every group; only the slots, the rows and the window's trims are per group
//     (measured in a loop of its own beside a one-group plane of today's design; "sh. one" is
//     the shared plane with one group, "vs one" compares with today's one-group plane),
// and three forms of the per-group work (shared blocks in the first two only):
//   * as today: the table entry and block record of the write position are read every step,
//     build_batch rereads every record and rewrites each row's changes;
//   * cursor: the record keeps the physical block being filled (valid while only this sequence
//     holds it), so a step reads no table entry or block record until a block fills;
//   * cursor + rows: reserve also keeps the batch rows (it writes an entry when it takes a
//     block, a commit clears the entries leaving a window), so building the batch is a copy of
//     the reserved slots. (Tried in the real plane, rows saved 3-10% of the one-group step,
//     not the 20% they save here: docs/hybrid-models.md.)
// No eviction (blocks leaving the window go back to a free list), no copy-on-write, no events:
// the model times the part every step pays. Thread CPU time; the ratios compare planes stepped
// in the same loop. The step's functions are never inlined, so that every plane runs the same code
// whatever the compiler decides for the loop around them.
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kPrompt = 100;
constexpr int64_t kWindow = 128;
constexpr int kSteps = 256;  // then back to the prompt, as the benchmark does

int64_t cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

enum class Form { kToday, kCursor, kCursorRows };

struct BlockRecord {  // the size and fields of core::BlockInfo
  int32_t phys = -1, ref = 0, node = -1, device_children = 0, retention = 0, prev = -1, next = -1;
  int64_t expiry = 0;
  uint64_t generation = 0, last_access = 0;
};

struct GroupTable {  // one group's part of a sequence record
  std::vector<int32_t> blocks;
  size_t first_live = 0;
  uint64_t version = 0;
  int32_t cursor = -1;  // physical block being filled, when kept
};

template <int G>
struct alignas(64) SequenceRecord {
  std::vector<int32_t> tokens;
  int64_t pending = 0;
  bool offloaded = false;
  uint64_t last_used = 0, arrival = 0, id = 0;
  GroupTable group[G];
  char options[40];  // the rest of core::Sequence
};

struct Saved {  // core::Journal::SavedSequence
  uint64_t id, last_used;
  int32_t pending;
  uint32_t blocks;
  int32_t cow_index, cow_source;
  uint32_t tail_begin;
  uint16_t tail_size;
  bool offloaded;
};

struct RowState {
  uint64_t arrival = ~uint64_t{0}, version = 0;
  int32_t num_blocks = -1, first_live = 0;
};

struct GroupPool {  // one group's blocks and batch rows
  int64_t window;
  std::vector<BlockRecord> blocks;
  std::vector<int32_t> free_list;
  static constexpr int32_t kStride = 32;
  std::vector<int32_t> rows;
  std::vector<RowState> row_state;
  std::vector<int64_t> slots, slot_mapping;
  std::vector<int32_t> seq_lens;
  GroupPool(int64_t window, int64_t num_blocks, int64_t seqs)
      : window(window), blocks(static_cast<size_t>(num_blocks)) {
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_list.push_back(static_cast<int32_t>(b));
    for (int64_t b = 0; b < num_blocks; ++b) blocks[b].phys = static_cast<int32_t>(b);
    rows.assign(static_cast<size_t>(seqs * kStride), -1);
    row_state.resize(static_cast<size_t>(seqs));
    seq_lens.resize(static_cast<size_t>(seqs));
  }
  int32_t take() {
    const int32_t b = free_list.back();
    free_list.pop_back();
    blocks[b].ref = 1;
    return b;
  }
  void give_back(int32_t b) {
    blocks[b].ref = 0;
    free_list.push_back(b);
  }
};

// `seqs` empty sequence records with ids 0, 1, ..., room for a run's tokens reserved.
template <typename Record>
std::vector<std::unique_ptr<Record>> make_records(int64_t seqs) {
  std::vector<std::unique_ptr<Record>> out;
  for (int64_t s = 0; s < seqs; ++s) {
    auto r = std::make_unique<Record>();
    r->id = r->arrival = static_cast<uint64_t>(s);
    r->tokens.reserve(kPrompt + kSteps);
    out.push_back(std::move(r));
  }
  return out;
}

// A control plane over G groups with its own sequence records.
template <int G, Form F>
class Plane {
 public:
  Plane(int64_t seqs, const int64_t (&windows)[G]) {
    for (int g = 0; g < G; ++g) pools_.emplace_back(windows[g], seqs * 24, seqs);
    seqs_ = make_records<SequenceRecord<G>>(seqs);
    restart();
  }

  // reserve_batch(ids, 1) + build_batch(ids); returns thread CPU ns.
  [[gnu::noinline]] int64_t step() {
    const int64_t t0 = cpu_ns();
    reserve();
    build();
    return cpu_ns() - t0;
  }

  // commit_batch of one token each: the window releases the blocks that left it.
  [[gnu::noinline]] void commit() {
    for (size_t i = 0; i < seqs_.size(); ++i) {
      SequenceRecord<G>& s = *seqs_[i];
      s.tokens.push_back(7);
      s.pending = 0;
      s.last_used = ++tick_;
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      for (int g = 0; g < G; ++g) {
        GroupPool& pool = pools_[static_cast<size_t>(g)];
        GroupTable& t = s.group[g];
        if (pool.window == 0) continue;
        const size_t first = static_cast<size_t>(std::max<int64_t>(0, len - pool.window) / kBlock);
        for (size_t b = t.first_live; b < first; ++b) {
          pool.give_back(t.blocks[b]);
          t.blocks[b] = -1;
          if (F == Form::kCursorRows) pool.rows[i * GroupPool::kStride + b] = -1;
        }
        t.first_live = std::max(t.first_live, first);
      }
    }
  }

  // Every sequence back to its prompt (untimed).
  void restart() {
    for (size_t i = 0; i < seqs_.size(); ++i) {
      SequenceRecord<G>& s = *seqs_[i];
      s.tokens.resize(kPrompt);
      for (int g = 0; g < G; ++g) {
        GroupPool& pool = pools_[static_cast<size_t>(g)];
        GroupTable& t = s.group[g];
        for (int32_t b : t.blocks)
          if (b >= 0) pool.give_back(b);
        t.blocks.clear();
        for (int64_t b = 0; b * kBlock < kPrompt; ++b) t.blocks.push_back(pool.take());
        t.first_live = 0;
        ++t.version;
        t.cursor = pool.blocks[t.blocks.back()].phys;
        for (int32_t k = 0; k < GroupPool::kStride; ++k) {
          const size_t e = i * GroupPool::kStride + static_cast<size_t>(k);
          pool.rows[e] =
              k < static_cast<int32_t>(t.blocks.size()) ? pool.blocks[t.blocks[k]].phys : -1;
        }
      }
    }
  }

 private:
  [[gnu::noinline]] void reserve() {
    const size_t n = seqs_.size();
    // Pass 1: an upper bound of the blocks needed (the records only).
    int64_t upper = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i + 8 < n) __builtin_prefetch(seqs_[i + 8].get());
      const SequenceRecord<G>& s = *seqs_[i];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      for (int g = 0; g < G; ++g) {
        const int64_t cur = static_cast<int64_t>(s.group[g].blocks.size());
        upper += std::max<int64_t>((len + kBlock) / kBlock - cur, 0) + (len / kBlock < cur);
      }
    }
    sink_ += upper;
    journal_.clear();
    for (GroupPool& pool : pools_) pool.slots.clear();
    // Pass 2: apply.
    for (size_t i = 0; i < n; ++i) {
      if (F != Form::kToday) {
        if (i + 4 < n) __builtin_prefetch(seqs_[i + 4].get());
      } else {
        if (i + 8 < n) {
          const SequenceRecord<G>& a = *seqs_[i + 8];
          const size_t wb = a.tokens.size() / kBlock;
          for (int g = 0; g < G; ++g)
            if (wb < a.group[g].blocks.size()) __builtin_prefetch(&a.group[g].blocks[wb]);
        }
        if (i + 4 < n) {
          const SequenceRecord<G>& a = *seqs_[i + 4];
          const size_t wb = a.tokens.size() / kBlock;
          for (int g = 0; g < G; ++g)
            if (wb < a.group[g].blocks.size())
              __builtin_prefetch(&pools_[static_cast<size_t>(g)].blocks[a.group[g].blocks[wb]]);
        }
      }
      SequenceRecord<G>& s = *seqs_[i];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      journal_.push_back(Saved{s.id, s.last_used, static_cast<int32_t>(s.pending),
                               static_cast<uint32_t>(s.group[0].blocks.size()), -1, -1, 0, 0,
                               s.offloaded});
      const size_t wb = static_cast<size_t>(len / kBlock);
      for (int g = 0; g < G; ++g) {
        GroupPool& pool = pools_[static_cast<size_t>(g)];
        GroupTable& t = s.group[g];
        if (F != Form::kToday && wb < t.blocks.size() && t.cursor >= 0) {
          pool.slots.push_back(int64_t{t.cursor} * kBlock + len % kBlock);
          continue;
        }
        if (wb < t.blocks.size()) {
          const BlockRecord& b = pool.blocks[t.blocks[wb]];
          sink_ += b.ref > 1 || b.node >= 0;  // would copy on write
        } else {
          t.blocks.push_back(pool.take());
          t.cursor = pool.blocks[t.blocks.back()].phys;
          if (F == Form::kCursorRows) pool.rows[i * GroupPool::kStride + wb] = t.cursor;
        }
        pool.slots.push_back(int64_t{pool.blocks[t.blocks[wb]].phys} * kBlock + len % kBlock);
      }
      s.pending = 1;
      s.last_used = ++tick_;
      if (F == Form::kCursorRows) pools_[0].seq_lens[i] = static_cast<int32_t>(len + 1);
    }
  }

  [[gnu::noinline]] void build() {
    if (F == Form::kCursorRows) {
      // Rows and lengths are current: the slot mapping is the reserved slots (one length array
      // serves every group).
      for (GroupPool& pool : pools_) pool.slot_mapping.assign(pool.slots.begin(), pool.slots.end());
      return;
    }
    for (GroupPool& pool : pools_) pool.slot_mapping.clear();
    const size_t n = seqs_.size();
    for (size_t r = 0; r < n; ++r) {
      if (r + 4 < n) __builtin_prefetch(seqs_[r + 4].get());
      SequenceRecord<G>& s = *seqs_[r];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      for (int g = 0; g < G; ++g) {
        GroupPool& pool = pools_[static_cast<size_t>(g)];
        GroupTable& t = s.group[g];
        int32_t* row = &pool.rows[r * GroupPool::kStride];
        RowState& st = pool.row_state[r];
        const int32_t nb = static_cast<int32_t>(t.blocks.size());
        int32_t from = 0;
        int32_t clear_from = 0;
        if (st.num_blocks < 0 || st.arrival != s.arrival || st.version != t.version) {
          std::fill(row + nb, row + GroupPool::kStride, -1);
        } else {
          from = std::min(st.num_blocks, nb);
          clear_from = std::min(from, st.first_live);
        }
        const int32_t live = static_cast<int32_t>(std::min<size_t>(t.first_live, size_t(nb)));
        for (int32_t k = clear_from; k < live; ++k) row[k] = -1;
        for (int32_t k = std::max(from, live); k < nb; ++k) row[k] = pool.blocks[t.blocks[k]].phys;
        st = RowState{s.arrival, t.version, nb, live};
        pool.seq_lens[r] = static_cast<int32_t>(len + s.pending);
        for (int64_t p = len; p < len + s.pending; ++p)
          pool.slot_mapping.push_back(int64_t{row[p / kBlock]} * kBlock + p % kBlock);
      }
    }
  }

  std::vector<GroupPool> pools_;
  std::vector<std::unique_ptr<SequenceRecord<G>>> seqs_;
  std::vector<Saved> journal_;
  uint64_t tick_ = 0;
  int64_t sink_ = 0;  // what the model computes and nobody reads, kept from the optimiser
};

// A control plane over G groups of one block size that shares the logical blocks as well as the
// sequence records: each sequence has one table of logical blocks, and a block record holds one
// physical block per group (-1 where a window group gave its page back). A step reads the
// record, one table entry and one block record per sequence whatever G is; only the slots, the
// rows and the window's trims are per group. With the cursor the record keeps the write block's
// physical ids.
template <int G, Form F>
class SharedPlane {
 public:
  SharedPlane(int64_t seqs, const int64_t (&windows)[G]) {
    const int64_t num_blocks = seqs * 24;
    blocks_.resize(static_cast<size_t>(num_blocks));
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
    for (int g = 0; g < G; ++g) {
      window_[g] = windows[g];
      for (int64_t b = num_blocks - 1; b >= 0; --b)
        phys_free_[g].push_back(static_cast<int32_t>(b));
      rows_[g].assign(static_cast<size_t>(seqs * kStride), -1);
      row_state_[g].resize(static_cast<size_t>(seqs));
      seq_lens_[g].resize(static_cast<size_t>(seqs));
    }
    seqs_ = make_records<Record>(seqs);
    restart();
  }

  [[gnu::noinline]] int64_t step() {
    const int64_t t0 = cpu_ns();
    reserve();
    build();
    return cpu_ns() - t0;
  }

  [[gnu::noinline]] void commit() {
    for (size_t i = 0; i < seqs_.size(); ++i) {
      Record& s = *seqs_[i];
      s.tokens.push_back(7);
      s.pending = 0;
      s.last_used = ++tick_;
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      for (int g = 0; g < G; ++g) {
        if (window_[g] == 0) continue;
        const size_t first = static_cast<size_t>(std::max<int64_t>(0, len - window_[g]) / kBlock);
        for (size_t b = s.first_live[g]; b < first; ++b) {
          Block& blk = blocks_[static_cast<size_t>(s.blocks[b])];
          phys_free_[g].push_back(blk.phys[g]);
          blk.phys[g] = -1;
        }
        s.first_live[g] = std::max(s.first_live[g], first);
      }
    }
  }

  void restart() {
    for (const std::unique_ptr<Record>& r : seqs_) {
      Record& s = *r;
      s.tokens.resize(kPrompt);
      for (int32_t b : s.blocks) give_back(b);
      s.blocks.clear();
      for (int64_t b = 0; b * kBlock < kPrompt; ++b) s.blocks.push_back(take());
      ++s.version;
      for (int g = 0; g < G; ++g) {
        s.first_live[g] = 0;
        s.cursor[g] = blocks_[static_cast<size_t>(s.blocks.back())].phys[g];
      }
    }
    for (int g = 0; g < G; ++g)
      for (RowState& st : row_state_[g]) st.num_blocks = -1;
  }

 private:
  static constexpr int32_t kStride = 32;
  struct Block {  // core::BlockInfo with a physical id per group
    int32_t phys[G];
    int32_t ref = 0, node = -1, device_children = 0, retention = 0, prev = -1, next = -1;
    int64_t expiry = 0;
    uint64_t generation = 0, last_access = 0;
  };
  struct alignas(64) Record {
    std::vector<int32_t> tokens;
    std::vector<int32_t> blocks;  // logical
    size_t first_live[G] = {};
    int32_t cursor[G] = {};
    int64_t pending = 0;
    bool offloaded = false;
    uint64_t last_used = 0, arrival = 0, id = 0, version = 0;
    char options[40];
  };

  int32_t take() {
    const int32_t b = free_.back();
    free_.pop_back();
    Block& blk = blocks_[static_cast<size_t>(b)];
    blk.ref = 1;
    for (int g = 0; g < G; ++g) {
      blk.phys[g] = phys_free_[g].back();
      phys_free_[g].pop_back();
    }
    return b;
  }
  void give_back(int32_t b) {
    Block& blk = blocks_[static_cast<size_t>(b)];
    blk.ref = 0;
    for (int g = 0; g < G; ++g) {
      if (blk.phys[g] >= 0) phys_free_[g].push_back(blk.phys[g]);
      blk.phys[g] = -1;
    }
    free_.push_back(b);
  }

  [[gnu::noinline]] void reserve() {
    const size_t n = seqs_.size();
    int64_t upper = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i + 8 < n) __builtin_prefetch(seqs_[i + 8].get());
      const Record& s = *seqs_[i];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      const int64_t cur = static_cast<int64_t>(s.blocks.size());
      upper += std::max<int64_t>((len + kBlock) / kBlock - cur, 0) + (len / kBlock < cur);
    }
    sink_ += upper;
    journal_.clear();
    for (int g = 0; g < G; ++g) slots_[g].clear();
    for (size_t i = 0; i < n; ++i) {
      if (F != Form::kToday) {
        if (i + 4 < n) __builtin_prefetch(seqs_[i + 4].get());
      } else {
        if (i + 8 < n) {
          const Record& a = *seqs_[i + 8];
          const size_t wb = a.tokens.size() / kBlock;
          if (wb < a.blocks.size()) __builtin_prefetch(&a.blocks[wb]);
        }
        if (i + 4 < n) {
          const Record& a = *seqs_[i + 4];
          const size_t wb = a.tokens.size() / kBlock;
          if (wb < a.blocks.size()) __builtin_prefetch(&blocks_[static_cast<size_t>(a.blocks[wb])]);
        }
      }
      Record& s = *seqs_[i];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      journal_.push_back(Saved{s.id, s.last_used, static_cast<int32_t>(s.pending),
                               static_cast<uint32_t>(s.blocks.size()), -1, -1, 0, 0, s.offloaded});
      const size_t wb = static_cast<size_t>(len / kBlock);
      if (wb < s.blocks.size()) {
        if (F == Form::kToday) {
          const Block& b = blocks_[static_cast<size_t>(s.blocks[wb])];
          sink_ += b.ref > 1 || b.node >= 0;
          for (int g = 0; g < G; ++g)
            slots_[g].push_back(int64_t{b.phys[g]} * kBlock + len % kBlock);
        } else {
          for (int g = 0; g < G; ++g)
            slots_[g].push_back(int64_t{s.cursor[g]} * kBlock + len % kBlock);
        }
      } else {
        s.blocks.push_back(take());
        const Block& b = blocks_[static_cast<size_t>(s.blocks.back())];
        for (int g = 0; g < G; ++g) {
          s.cursor[g] = b.phys[g];
          slots_[g].push_back(int64_t{b.phys[g]} * kBlock + len % kBlock);
        }
      }
      s.pending = 1;
      s.last_used = ++tick_;
    }
  }

  [[gnu::noinline]] void build() {
    for (int g = 0; g < G; ++g) slot_mapping_[g].clear();
    const size_t n = seqs_.size();
    for (size_t r = 0; r < n; ++r) {
      if (r + 4 < n) __builtin_prefetch(seqs_[r + 4].get());
      Record& s = *seqs_[r];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      const int32_t nb = static_cast<int32_t>(s.blocks.size());
      // Which entries are new is the same for every group (one table); the window's trims are
      // per group.
      RowState& st0 = row_state_[0][r];
      int32_t from = 0;
      const bool rewrite =
          st0.num_blocks < 0 || st0.arrival != s.arrival || st0.version != s.version;
      if (!rewrite) from = std::min(st0.num_blocks, nb);
      for (int g = 0; g < G; ++g) {
        int32_t* row = &rows_[g][r * kStride];
        RowState& st = row_state_[g][r];
        int32_t clear_from = 0;
        if (rewrite) {
          std::fill(row + nb, row + kStride, -1);
        } else {
          clear_from = std::min(from, st.first_live);
        }
        const int32_t live = static_cast<int32_t>(std::min<size_t>(s.first_live[g], size_t(nb)));
        for (int32_t k = clear_from; k < live; ++k) row[k] = -1;
        st = RowState{s.arrival, s.version, nb, live};
        seq_lens_[g][r] = static_cast<int32_t>(len + s.pending);
      }
      for (int32_t k = from; k < nb; ++k) {
        const Block& b = blocks_[static_cast<size_t>(s.blocks[static_cast<size_t>(k)])];
        for (int g = 0; g < G; ++g)
          if (k >= row_state_[g][r].first_live)
            rows_[g][r * kStride + static_cast<size_t>(k)] = b.phys[g];
      }
      for (int g = 0; g < G; ++g) {
        const int32_t* row = &rows_[g][r * kStride];
        for (int64_t p = len; p < len + s.pending; ++p)
          slot_mapping_[g].push_back(int64_t{row[p / kBlock]} * kBlock + p % kBlock);
      }
    }
  }

  std::vector<Block> blocks_;
  std::vector<int32_t> free_;
  int64_t window_[G];
  std::vector<int32_t> phys_free_[G];
  std::vector<int32_t> rows_[G];
  std::vector<RowState> row_state_[G];
  std::vector<int32_t> seq_lens_[G];
  std::vector<int64_t> slots_[G], slot_mapping_[G];
  std::vector<std::unique_ptr<Record>> seqs_;
  std::vector<Saved> journal_;
  uint64_t tick_ = 0;
  int64_t sink_ = 0;
};

// One form: a one-group plane, two separate planes (full, window) and a fused two-group plane,
// stepped in the same loop; then, in a second loop of three planes, a one-group plane again
// and the shared-block planes of one and two groups (not in the "rows" form). Prints ns a
// sequence and the ratios: the separate and fused planes to the first loop's one-group plane,
// the shared plane to its own one-group form and ("vs one") to the second loop's one-group plane.
template <Form F>
void run(const char* name, int64_t seqs, int reps) {
  const double per = static_cast<double>(reps) * kSteps * static_cast<double>(seqs);
  int64_t t_one = 0, t_separate = 0, t_fused = 0;
  {
    Plane<1, F> one(seqs, {0});
    Plane<1, F> full(seqs, {0});
    Plane<1, F> window(seqs, {kWindow});
    Plane<2, F> fused(seqs, {0, kWindow});
    for (int rep = 0; rep < reps; ++rep) {
      for (int step = 0; step < kSteps; ++step) {
        t_one += one.step();
        t_separate += full.step() + window.step();
        t_fused += fused.step();
        one.commit();
        full.commit();
        window.commit();
        fused.commit();
      }
      one.restart();
      full.restart();
      window.restart();
      fused.restart();
    }
  }
  std::printf("%-13s %9.1f %9.1f %7.2fx %9.1f %7.2fx", name, t_one / per, t_separate / per,
              static_cast<double>(t_separate) / t_one, t_fused / per,
              static_cast<double>(t_fused) / t_one);
  if (F != Form::kCursorRows) {
    int64_t t_plain = 0, t_shared_one = 0, t_shared = 0;
    Plane<1, F> one(seqs, {0});
    SharedPlane<1, F> shared_one(seqs, {0});
    SharedPlane<2, F> shared(seqs, {0, kWindow});
    for (int rep = 0; rep < reps; ++rep) {
      for (int step = 0; step < kSteps; ++step) {
        t_plain += one.step();
        t_shared_one += shared_one.step();
        t_shared += shared.step();
        one.commit();
        shared_one.commit();
        shared.commit();
      }
      one.restart();
      shared_one.restart();
      shared.restart();
    }
    std::printf(" %9.1f %9.1f %9.1f %7.2fx %7.2fx", t_plain / per, t_shared_one / per,
                t_shared / per, static_cast<double>(t_shared) / t_shared_one,
                static_cast<double>(t_shared) / t_plain);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t seqs = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  std::printf("decode step model, %lld sequences, ns a sequence (reserve + build)\n",
              static_cast<long long>(seqs));
  std::printf("%-13s %9s %9s %8s %9s %8s %9s %9s %9s %8s %8s\n", "form", "one", "separate", "ratio",
              "fused", "ratio", "one", "sh. one", "shared", "ratio", "vs one");
  run<Form::kToday>("as today", seqs, reps);
  run<Form::kCursor>("cursor", seqs, reps);
  run<Form::kCursorRows>("cursor + rows", seqs, reps);
  return 0;
}
