// Sliding-window caches under random operations: full attention (window 0) against a model and
// against a window that never trims, and a window cache under adds sharing prefixes, chunked and
// single-token commits, forks, finishes, erases, tier moves and rollbacks. Invariants, table
// shapes and the decode bound are checked after every operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/status_matchers.hpp"
#include "window_test_util.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

// ---------------------------------------------------------------- 2. full attention unchanged

// Random sequence work (adds sharing prefixes, chunked and single-token commits, forks,
// finishes, rollbacks) in a pool large enough that nothing is evicted, run on a full-attention
// cache (W = 0) and on a window cache whose window is never exceeded: the same hits, slots and
// block tables. The full-attention hits also match a model (the longest prefix of whole blocks
// any sequence ever committed), no table holds -1 and nothing is released.
TEST(SlidingWindow, FullAttentionMatchesModelAndANeverTrimmingWindow) {
  const int32_t bs = 4;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto full = make_cp(window_config(bs, 0, 8192));
    auto wide = make_cp(window_config(bs, 4096, 8192));
    std::mt19937 rng(seed);
    auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    // Three streams of tokens that prompts are prefixes of (sometimes with one token changed).
    std::vector<std::vector<TokenId>> streams(3);
    for (auto& s : streams) {
      for (int i = 0; i < 300; ++i) s.push_back(static_cast<TokenId>(pick(5) + 1));
    }
    std::set<std::vector<TokenId>> committed_prefixes;  // whole-block prefixes ever committed
    std::map<SequenceId, std::vector<TokenId>> toks;    // committed tokens per sequence (model)
    auto record = [&](SequenceId id) {
      const std::vector<TokenId>& t = toks[id];
      for (size_t k = bs; k <= t.size(); k += bs) {
        committed_prefixes.insert(std::vector<TokenId>(t.begin(), t.begin() + k));
      }
    };
    auto model_hit = [&](const std::vector<TokenId>& p) {
      const int64_t len = static_cast<int64_t>(p.size());
      for (int64_t k = len / bs; k > 0; --k) {
        const int64_t c = std::min<int64_t>(k * bs, len - 1);
        if (c == 0) continue;
        if (committed_prefixes.count(std::vector<TokenId>(p.begin(), p.begin() + k * bs))) {
          return c;
        }
      }
      return int64_t{0};
    };
    SequenceId next_id = 1;
    for (int op = 0; op < 1000; ++op) {
      std::vector<SequenceId> ids;
      for (const auto& kv : toks) ids.push_back(kv.first);
      const int kind = ids.empty() ? 0 : pick(10);
      const SequenceId id =
          ids.empty() ? 0 : ids[static_cast<size_t>(pick(static_cast<int>(ids.size())))];
      if (kind <= 1 && ids.size() < 12) {  // add
        const auto& stream = streams[static_cast<size_t>(pick(3))];
        std::vector<TokenId> p(stream.begin(), stream.begin() + 1 + pick(60));
        if (pick(3) == 0) p[static_cast<size_t>(pick(static_cast<int>(p.size())))] = 99;
        const SequenceId nid = next_id++;
        auto a = full->add_sequence(nid, p);
        auto b = wide->add_sequence(nid, p);
        ASSERT_OK(a);
        ASSERT_OK(b);
        ASSERT_EQ(*a, *b);
        ASSERT_EQ(*a, model_hit(p)) << "op " << op;
        toks[nid].assign(p.begin(), p.begin() + *a);
        // Compute the rest of the prompt.
        const int64_t rest = static_cast<int64_t>(p.size()) - *a;
        auto ra = full->reserve(nid, rest);
        auto rb = wide->reserve(nid, rest);
        ASSERT_OK(ra);
        ASSERT_OK(rb);
        ASSERT_EQ(ra->slots, rb->slots);
        ASSERT_EQ(ra->transfers.copies.size(), rb->transfers.copies.size());
        ASSERT_OK(full->commit(nid, p.data() + *a, rest));
        ASSERT_OK(wide->commit(nid, p.data() + *a, rest));
        toks[nid] = p;
        record(nid);
      } else if (kind <= 5) {  // reserve a chunk or one token, commit part of it
        const int64_t n = pick(2) == 0 ? 1 : 1 + pick(9);
        auto ra = full->reserve(id, n);
        auto rb = wide->reserve(id, n);
        ASSERT_OK(ra);
        ASSERT_OK(rb);
        ASSERT_EQ(ra->slots, rb->slots);
        const int64_t m = pick(4) == 0 ? pick(static_cast<int>(n) + 1) : n;
        std::vector<TokenId> t;
        for (int64_t i = 0; i < m; ++i) t.push_back(static_cast<TokenId>(pick(5) + 1));
        ASSERT_OK(full->commit(id, t));
        ASSERT_OK(wide->commit(id, t));
        toks[id].insert(toks[id].end(), t.begin(), t.end());
        record(id);
      } else if (kind == 6 && ids.size() < 12) {
        const SequenceId child = next_id++;
        ASSERT_OK(full->fork(id, child));
        ASSERT_OK(wide->fork(id, child));
        toks[child] = toks[id];
      } else if (kind == 7) {
        ASSERT_OK(full->finish(id));
        ASSERT_OK(wide->finish(id));
        toks.erase(id);
      } else {
        const int64_t len = static_cast<int64_t>(toks[id].size());
        const int64_t to = pick(4) == 0 ? 0 : std::max<int64_t>(0, len - pick(10));
        ASSERT_OK(full->rollback(id, to));
        ASSERT_OK(wide->rollback(id, to));
        toks[id].resize(static_cast<size_t>(to));
      }
      PAGEDKV_EXPECT_INV(*full);
      PAGEDKV_EXPECT_INV(*wide);
      for (const auto& kv : toks) {
        const std::vector<BlockLocation> t = table(*full, kv.first);
        ASSERT_EQ(t, table(*wide, kv.first)) << "op " << op << " sequence " << kv.first;
        ASSERT_EQ(*full->length(kv.first), static_cast<int64_t>(kv.second.size()));
        for (const BlockLocation& l : t) ASSERT_GE(l.block, 0) << "op " << op;
      }
    }
    const ControlStats a = full->stats();
    const ControlStats b = wide->stats();
    EXPECT_EQ(a.prefix_hit_tokens, b.prefix_hit_tokens);
    EXPECT_EQ(a.prefix_hit_blocks, b.prefix_hit_blocks);
    EXPECT_EQ(a.copy_on_write, b.copy_on_write);
    EXPECT_EQ(a.device, b.device);
    EXPECT_EQ(a.window_released_blocks, 0);
    EXPECT_EQ(b.window_released_blocks, 0);
    EXPECT_EQ(a.blocks_evicted, 0);  // the model above assumes nothing was evicted
  }
}

// ---------------------------------------------------------------- 7. random operations

// Adds sharing prefixes (with bounds), chunked and single-token reserve/commit, forks,
// finishes, erases, offload/restore and rollbacks (valid and not) on W = 48, block 16, a small
// pool and a host tier. After each operation: invariants, every table's shape, the decode bound,
// the released-block count against a model, cached_prefix against add_sequence, and the batch
// rows of the resident sequences against their tables.
TEST(SlidingWindow, RandomOperationsKeepTheWindow) {
  const int64_t w = 48;
  const int64_t bs = 16;
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto cp = make_cp(window_config(16, 48, 40, 24));
    std::mt19937 rng(seed * 7919u);
    auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    std::vector<std::vector<TokenId>> streams(3);
    for (auto& s : streams) {
      for (int i = 0; i < 700; ++i) s.push_back(static_cast<TokenId>(pick(4) + 1));
    }
    struct Model {
      std::vector<TokenId> stream;  // what it commits next: its prompt, then more
      int64_t len = 0;
      int64_t first = 0;  // first held block
    };
    std::map<SequenceId, Model> seqs;
    int64_t released_total = 0;
    SequenceId next_id = 1;
    int adds = 0, hits = 0, rollbacks_refused = 0, offloads = 0, batches = 0;
    auto next_tokens = [&](Model& m, int64_t n) {
      while (static_cast<int64_t>(m.stream.size()) < m.len + n) {
        m.stream.push_back(static_cast<TokenId>(pick(4) + 1));
      }
      return std::vector<TokenId>(m.stream.begin() + m.len, m.stream.begin() + m.len + n);
    };
    auto on_commit = [&](Model& m, int64_t n) {
      m.len += n;
      const int64_t f = first_needed(m.len, w, bs);
      if (f > m.first) {
        released_total += f - m.first;
        m.first = f;
      }
    };
    for (int op = 0; op < 3000; ++op) {
      // Sequences the planner dropped under pressure are gone.
      for (auto it = seqs.begin(); it != seqs.end();) {
        it = cp->contains(it->first) ? std::next(it) : seqs.erase(it);
      }
      std::vector<SequenceId> ids;
      for (const auto& kv : seqs) ids.push_back(kv.first);
      const int kind = ids.empty() ? 0 : pick(16);
      const SequenceId id =
          ids.empty() ? 0 : ids[static_cast<size_t>(pick(static_cast<int>(ids.size())))];
      Model* m = ids.empty() ? nullptr : &seqs[id];
      const bool offloaded = m != nullptr && cp->residency(id)->offloaded;
      if (kind <= 1 && ids.size() < 6) {  // add, sharing a prefix of a stream
        const auto& stream = streams[static_cast<size_t>(pick(3))];
        std::vector<TokenId> p(stream.begin(), stream.begin() + 1 + pick(160));
        if (pick(4) == 0) p[static_cast<size_t>(pick(static_cast<int>(p.size())))] = 9;
        const int64_t cap = pick(3) == 0 ? pick(static_cast<int>(p.size()) + 1) : -1;
        auto want = cp->cached_prefix(p, 0, cap);
        ASSERT_OK(want);
        const SequenceId nid = next_id++;
        auto got = cp->add_sequence(nid, p, {}, cap);
        ASSERT_OK(got);
        ASSERT_EQ(*got, *want) << "op " << op;
        ASSERT_TRUE(cap < 0 || *got <= cap);
        ASSERT_TRUE(*got == 0 || *got % bs == 0 || *got == static_cast<int64_t>(p.size()) - 1);
        ++adds;
        hits += *got > 0 ? 1 : 0;
        Model nm;
        nm.stream = p;
        nm.stream.insert(nm.stream.end(), stream.begin() + static_cast<std::ptrdiff_t>(p.size()),
                         stream.end());
        nm.len = *got;
        nm.first = first_needed(*got, w, bs);
        seqs[nid] = nm;
      } else if (kind <= 6) {  // reserve (a chunk or one token), commit all or part
        const int64_t n = pick(2) == 0 ? 1 : 1 + pick(40);
        auto r = cp->reserve(id, n);
        if (!r.ok()) {
          ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
        } else if (cp->contains(id)) {
          const int64_t c = pick(4) == 0 ? pick(static_cast<int>(n) + 1) : n;
          ASSERT_OK(cp->commit(id, next_tokens(*m, c)));
          on_commit(*m, c);
        }
      } else if (kind <= 9) {  // decode steps
        for (int i = 0; i < 8 && cp->contains(id); ++i) {
          auto r = cp->reserve(id, 1);
          if (!r.ok()) {
            ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
            break;
          }
          PAGEDKV_EXPECT_INV(*cp);
          ASSERT_LE(held(*cp, id), decode_bound(w, bs)) << "op " << op << " (reserved)";
          ASSERT_OK(cp->commit(id, next_tokens(*m, 1)));
          on_commit(*m, 1);
          PAGEDKV_EXPECT_INV(*cp);
          ASSERT_LE(held(*cp, id), decode_bound(w, bs)) << "op " << op << " (committed)";
        }
      } else if (kind == 10 && ids.size() < 6) {
        const Status st = cp->fork(id, next_id);
        if (offloaded) {
          ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition);
        } else {
          ASSERT_OK(st);
          Model c = *m;
          seqs[next_id] = c;
        }
        ++next_id;
      } else if (kind == 11) {
        ASSERT_OK(pick(2) == 0 ? cp->finish(id) : cp->erase(id));
        seqs.erase(id);
      } else if (kind == 12) {
        if (offloaded) {
          auto r = cp->restore(id);
          if (!r.ok()) {
            ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
          }
        } else {
          const int64_t live = held(*cp, id);
          auto r = cp->offload(id);
          if (r.ok()) {
            ++offloads;
            ASSERT_LE(static_cast<int64_t>(r->moves.size()), live);
          } else {
            ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
          }
        }
      } else {  // rollback: within the window, past it, or to 0
        const int64_t to = pick(5) == 0 ? 0 : std::max<int64_t>(0, m->len - pick(80));
        const bool allowed = to == 0 || first_needed(to, w, bs) >= m->first;
        const Snapshot snap = snapshot(*cp, ids);
        const Status st = cp->rollback(id, to);
        if (allowed) {
          ASSERT_OK(st);
          m->len = to;
          if (to == 0) m->first = 0;
        } else {
          ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
          ASSERT_EQ(snapshot(*cp, ids), snap);
          ++rollbacks_refused;
        }
      }
      PAGEDKV_EXPECT_INV(*cp);
      for (auto it = seqs.begin(); it != seqs.end();) {
        it = cp->contains(it->first) ? std::next(it) : seqs.erase(it);
      }
      for (const auto& kv : seqs) {
        ASSERT_EQ(*cp->length(kv.first), kv.second.len) << "op " << op;
        ASSERT_TRUE(table_shape(*cp, kv.first, w, bs)) << "op " << op;
        if (*cp->pending(kv.first) <= 1) {
          ASSERT_LE(held(*cp, kv.first), decode_bound(w, bs)) << "op " << op;
        }
      }
      ASSERT_EQ(cp->stats().window_released_blocks, released_total) << "op " << op;
      // The batch rows of the resident sequences equal their tables (-1 for blocks out of the
      // window and past the end), also when a row is kept from the last build and only updated.
      std::vector<SequenceId> resident;
      for (const auto& kv : seqs) {
        if (!cp->residency(kv.first)->offloaded) resident.push_back(kv.first);
      }
      if (pick(4) == 0) std::shuffle(resident.begin(), resident.end(), rng);
      auto md = cp->build_batch(resident);
      ASSERT_OK(md);
      const auto stride = static_cast<size_t>((*md)->max_blocks);
      for (size_t r = 0; r < resident.size(); ++r) {
        const std::vector<BlockLocation> t = *cp->block_locations(resident[r]);
        for (size_t i = 0; i < stride; ++i) {
          ASSERT_EQ((*md)->block_tables[r * stride + i], i < t.size() ? t[i].block : -1)
              << "op " << op << " row " << r << " entry " << i;
        }
      }
      ++batches;
    }
    // The run reached what it is meant to test.
    EXPECT_GT(hits, adds / 10);
    EXPECT_GT(rollbacks_refused, 0);
    EXPECT_GT(offloads, 0);
    EXPECT_EQ(batches, 3000);
    EXPECT_GT(cp->stats().blocks_evicted + cp->stats().blocks_demoted, 0);
  }
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
