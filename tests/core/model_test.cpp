// Randomized model-based test. A reference model keeps each sequence's token list; a shadow of
// every physical slot (per tier) is updated only from what the control plane tells the data
// plane (reserve slots, moves, copy-on-write pairs) and from the test's own commits. After every
// operation the tokens found through each sequence's block table must equal the model's, and
// check_invariants() must pass. PAGEDKV_MODEL_OPS=<n> sets the operations per seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

struct Loc {
  Tier tier;
  int32_t block;
  int32_t offset;
};

struct ModelSeq {
  std::vector<TokenId> tokens;
  std::vector<Loc> pending;     // where the reserved tokens will be written
  std::vector<TokenId> future;  // prompt tokens still to compute
  NamespaceId ns = 0;
};

class ModelRun {
 public:
  ModelRun(uint64_t seed) : rng_(seed) {
    const int32_t sizes[] = {1, 2, 4, 16};
    bs_ = sizes[pick(4)];
    const int64_t device = 4 + pick(21);
    const int64_t host = pick(3) == 0 ? 0 : 4 + pick(12);
    const EvictionPolicy pol = static_cast<EvictionPolicy>(pick(3));
    cfg_ = tiny_config(bs_, device, host, pol);
    cfg_.enable_prefix_caching = pick(8) != 0;
    cfg_.max_sequence_length = 8 * bs_ + 5;
    ControlOptions o;
    o.clock = fc_.clock();
    cp_ = std::move(ControlPlane::create(cfg_, o)).value();
    for (int t = 0; t < kNumTiers; ++t) {
      shadow_[t].assign(static_cast<size_t>((t == 0 ? device : host) * bs_), -1);
    }
    for (int i = 0; i < 4; ++i) {
      std::vector<TokenId> base;
      const int n = static_cast<int>(pick(static_cast<uint32_t>(4 * bs_ + 2)));
      for (int j = 0; j < n; ++j) base.push_back(static_cast<TokenId>(pick(3)));
      bases_.push_back(base);
    }
  }

  uint32_t pick(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }

  TokenId& shadow(Tier t, int32_t block, int32_t offset) {
    return shadow_[static_cast<int>(t)][static_cast<size_t>(block) * bs_ + offset];
  }

  void apply(const Transfers& tr) {
    for (const BlockMove& m : tr.moves) {
      for (int32_t o = 0; o < bs_; ++o) {
        shadow(m.dst_tier, m.dst_block, o) = shadow(m.src_tier, m.src_block, o);
        shadow(m.src_tier, m.src_block, o) = -7;  // poison: the old slot may be reused
      }
      for (auto& kv : model_) {
        for (Loc& l : kv.second.pending) {
          if (l.tier == m.src_tier && l.block == m.src_block) {
            l.tier = m.dst_tier;
            l.block = m.dst_block;
          }
        }
      }
    }
    for (const BlockCopy& c : tr.copies) {
      for (int32_t o = 0; o < bs_; ++o) {
        shadow(Tier::kDevice, c.dst_block, o) = shadow(Tier::kDevice, c.src_block, o);
      }
    }
    for (SequenceId id : tr.evicted) {
      ASSERT_EQ(model_.erase(id), 1u) << "evicted an unknown sequence";
      ASSERT_FALSE(cp_->contains(id));
    }
    for (SequenceId id : tr.offloaded) ASSERT_TRUE(model_.count(id));
  }

  SequenceId random_live() {
    auto it = model_.begin();
    std::advance(it, pick(static_cast<uint32_t>(model_.size())));
    return it->first;
  }

  std::vector<SequenceId> ids() const {
    std::vector<SequenceId> out;
    for (const auto& kv : model_) out.push_back(kv.first);
    return out;
  }

  void expect_unchanged(const Snapshot& before, const Status& s, const char* op) {
    ASSERT_EQ(snapshot(*cp_, ids()), before)
        << op << " failed with " << s.to_string() << " but changed state";
  }

  void step() {
    const uint32_t op = pick(100);
    if (op < 12 || model_.empty()) {
      if (model_.size() >= 10) return;
      const SequenceId id = next_id_;
      next_id_ += 1 + pick(3);
      std::vector<TokenId> prompt = bases_[pick(4)];
      prompt.resize(
          std::min<size_t>(prompt.size(), pick(static_cast<uint32_t>(prompt.size() + 1))));
      const int extra = static_cast<int>(pick(static_cast<uint32_t>(2 * bs_ + 2)));
      for (int j = 0; j < extra; ++j) prompt.push_back(static_cast<TokenId>(pick(5)));
      SequenceOptions o;
      o.ns = pick(4) == 0 ? 1 : 0;
      o.priority = static_cast<int32_t>(pick(3));
      o.retention_priority = static_cast<int32_t>(pick(101));
      o.retention_duration_ns = pick(2) ? static_cast<int64_t>(pick(50)) : 0;
      auto r = cp_->add_sequence(id, prompt, o);
      if (static_cast<int64_t>(prompt.size()) > cfg_.max_sequence_length) {
        ASSERT_EQ(r.status().code(), StatusCode::kOutOfRange);
        return;
      }
      ASSERT_OK(r);
      const int64_t cached = *r;
      ASSERT_GE(cached, 0);
      ASSERT_LT(cached, std::max<int64_t>(1, static_cast<int64_t>(prompt.size())) + 0);
      ModelSeq m;
      m.ns = o.ns;
      m.tokens.assign(prompt.begin(), prompt.begin() + cached);
      m.future.assign(prompt.begin() + cached, prompt.end());
      model_[id] = m;
    } else if (op < 40) {  // reserve (the common case), sometimes large: memory pressure
      const SequenceId id = random_live();
      ModelSeq& m = model_[id];
      int64_t n = pick(4) == 0 ? pick(static_cast<uint32_t>(3 * bs_ + 2)) : 1 + pick(3);
      if (!m.future.empty() && pick(2)) n = static_cast<int64_t>(m.future.size());
      const Snapshot before = snapshot(*cp_, ids());
      auto r = cp_->reserve(id, n);
      const int64_t len = static_cast<int64_t>(m.tokens.size());
      if (len + n > cfg_.max_sequence_length) {
        ASSERT_EQ(r.status().code(), StatusCode::kOutOfRange);
        expect_unchanged(before, r.status(), "reserve");
        return;
      }
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
        expect_unchanged(before, r.status(), "reserve");
        return;
      }
      apply(r->transfers);
      ASSERT_TRUE(model_.count(id));
      ModelSeq& mm = model_[id];
      ASSERT_EQ(r->slots.size(), static_cast<size_t>(n));
      mm.pending.clear();
      for (int64_t s : r->slots) {
        mm.pending.push_back(
            Loc{Tier::kDevice, static_cast<int32_t>(s / bs_), static_cast<int32_t>(s % bs_)});
      }
    } else if (op < 62) {  // commit
      const SequenceId id = random_live();
      ModelSeq& m = model_[id];
      const int64_t k = m.pending.empty() ? 0 : 1 + pick(static_cast<uint32_t>(m.pending.size()));
      std::vector<TokenId> toks;
      for (int64_t i = 0; i < k; ++i) {
        if (!m.future.empty()) {
          toks.push_back(m.future.front());
          m.future.erase(m.future.begin());
        } else {
          toks.push_back(static_cast<TokenId>(pick(4)));
        }
      }
      const bool offloaded = cp_->residency(id)->offloaded;
      const Status s = cp_->commit(id, toks);
      if (offloaded && k >= 0) {
        if (!s.ok()) {
          ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition);
          m.future.insert(m.future.begin(), toks.begin(), toks.end());
          return;
        }
      }
      ASSERT_OK(s);
      for (int64_t i = 0; i < k; ++i) {
        const Loc& l = m.pending[static_cast<size_t>(i)];
        ASSERT_EQ(l.tier, Tier::kDevice);
        shadow(l.tier, l.block, l.offset) = toks[static_cast<size_t>(i)];
      }
      m.pending.erase(m.pending.begin(), m.pending.begin() + k);
      m.tokens.insert(m.tokens.end(), toks.begin(), toks.end());
    } else if (op < 68) {  // rollback
      const SequenceId id = random_live();
      ModelSeq& m = model_[id];
      const int64_t len = pick(static_cast<uint32_t>(m.tokens.size() + 2));
      const Status s = cp_->rollback(id, len);
      if (len > static_cast<int64_t>(m.tokens.size())) {
        ASSERT_EQ(s.code(), StatusCode::kOutOfRange);
        return;
      }
      ASSERT_OK(s);
      m.tokens.resize(static_cast<size_t>(len));
      m.pending.clear();
      m.future.clear();
    } else if (op < 73) {  // fork
      if (model_.size() >= 10) return;
      const SequenceId id = random_live();
      const SequenceId child = next_id_++;
      const Status s = cp_->fork(id, child);
      if (cp_->residency(id)->offloaded) {
        ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition);
        return;
      }
      ASSERT_OK(s);
      ModelSeq c;
      c.tokens = model_[id].tokens;
      c.ns = model_[id].ns;
      model_[child] = c;
    } else if (op < 79) {  // finish / erase
      const SequenceId id = random_live();
      const Status s = pick(3) == 0 ? cp_->erase(id) : cp_->finish(id);
      ASSERT_OK(s);
      model_.erase(id);
    } else if (op < 85) {  // active set
      std::vector<SequenceId> act;
      for (SequenceId id : ids()) {
        if (pick(3) == 0) act.push_back(id);
      }
      ASSERT_OK(cp_->set_active(act));
    } else if (op < 89) {  // offload
      const SequenceId id = random_live();
      const Snapshot before = snapshot(*cp_, ids());
      auto r = cp_->offload(id);
      if (!r.ok()) {
        ASSERT_TRUE(r.status().code() == StatusCode::kFailedPrecondition ||
                    r.status().code() == StatusCode::kResourceExhausted)
            << r.status().to_string();
        expect_unchanged(before, r.status(), "offload");
        return;
      }
      apply(*r);
    } else if (op < 93) {  // restore
      const SequenceId id = random_live();
      const Snapshot before = snapshot(*cp_, ids());
      auto r = cp_->restore(id);
      if (!r.ok()) {
        ASSERT_TRUE(r.status().code() == StatusCode::kFailedPrecondition ||
                    r.status().code() == StatusCode::kResourceExhausted)
            << r.status().to_string();
        expect_unchanged(before, r.status(), "restore");
        return;
      }
      apply(*r);
    } else if (op < 95) {
      ASSERT_OK(cp_->set_priority(random_live(), static_cast<int32_t>(pick(3))));
    } else if (op < 97) {
      *fc_.now += pick(40);
    } else {  // batch metadata of the resident sequences
      std::vector<SequenceId> rows;
      std::vector<int64_t> want_slots;
      for (SequenceId id : ids()) {
        if (cp_->residency(id)->offloaded || pick(2)) continue;
        rows.push_back(id);
        for (const Loc& l : model_[id].pending) want_slots.push_back(l.block * bs_ + l.offset);
      }
      std::shuffle(rows.begin(), rows.end(), rng_);
      BatchOptions bo;
      bo.build_csr = pick(2) == 0;
      auto md = cp_->build_batch(rows, bo);
      ASSERT_OK(md);
      std::vector<int64_t> got_sorted = (*md)->slot_mapping;
      std::sort(got_sorted.begin(), got_sorted.end());
      std::sort(want_slots.begin(), want_slots.end());
      ASSERT_EQ(got_sorted, want_slots);
      const BatchMetadata& b = **md;
      int32_t csr = 0;
      for (size_t r = 0; r < rows.size(); ++r) {
        const ModelSeq& m = model_[rows[r]];
        ASSERT_EQ(b.seq_lens[r], static_cast<int32_t>(m.tokens.size() + m.pending.size()));
        auto locs = *cp_->block_locations(rows[r]);
        for (int32_t i = 0; i < b.max_blocks; ++i) {
          const int32_t want =
              i < static_cast<int32_t>(locs.size()) ? locs[static_cast<size_t>(i)].block : -1;
          ASSERT_EQ(b.block_tables[r * static_cast<size_t>(b.max_blocks) + static_cast<size_t>(i)],
                    want);
        }
        if (bo.build_csr) {
          ASSERT_EQ(b.indptr[r], csr);
          for (const BlockLocation& l : locs)
            ASSERT_EQ(b.indices[static_cast<size_t>(csr++)], l.block);
        }
      }
    }
  }

  void verify() {
    const Status inv = cp_->check_invariants();
    ASSERT_OK(inv);
    ASSERT_EQ(cp_->stats().sequences, static_cast<int64_t>(model_.size()));
    for (const auto& kv : model_) {
      const ModelSeq& m = kv.second;
      ASSERT_EQ(*cp_->length(kv.first), static_cast<int64_t>(m.tokens.size()));
      ASSERT_EQ(*cp_->pending(kv.first), static_cast<int64_t>(m.pending.size()));
      auto locs = *cp_->block_locations(kv.first);
      for (size_t p = 0; p < m.tokens.size(); ++p) {
        const BlockLocation& l = locs[p / static_cast<size_t>(bs_)];
        ASSERT_EQ(shadow(l.tier, l.block, static_cast<int32_t>(p % static_cast<size_t>(bs_))),
                  m.tokens[p])
            << "sequence " << kv.first << " position " << p;
      }
    }
  }

  const ControlPlane& cp() const { return *cp_; }

  void run(int64_t ops) {
    for (int64_t i = 0; i < ops; ++i) {
      step();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "at op " << i;
        return;
      }
      verify();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "after op " << i;
        return;
      }
    }
  }

 private:
  std::mt19937_64 rng_;
  int32_t bs_;
  CacheConfig cfg_;
  FakeClock fc_;
  std::unique_ptr<ControlPlane> cp_;
  std::vector<TokenId> shadow_[kNumTiers];
  std::vector<std::vector<TokenId>> bases_;
  std::map<SequenceId, ModelSeq> model_;
  SequenceId next_id_ = 100;
};

int64_t ops_per_seed() {
  const char* env = std::getenv("PAGEDKV_MODEL_OPS");
  return env != nullptr ? std::max<int64_t>(1, std::atoll(env)) : 5000;
}

class ModelTest : public ::testing::TestWithParam<int> {};

TEST_P(ModelTest, BlockTablesHoldTheModelsTokens) {
  ModelRun run(static_cast<uint64_t>(GetParam()) * 7919 + 17);
  run.run(ops_per_seed());
}

// The random operations must reach every mechanism, or the model test proves little.
TEST(ModelCoverage, RandomOperationsReachEveryMechanism) {
  ControlStats sum;
  for (int seed = 100; seed < 116; ++seed) {
    ModelRun run(static_cast<uint64_t>(seed));
    run.run(3000);
    const ControlStats st = run.cp().stats();
    sum.copy_on_write += st.copy_on_write;
    sum.blocks_evicted += st.blocks_evicted;
    sum.sequences_evicted += st.sequences_evicted;
    sum.sequences_offloaded += st.sequences_offloaded;
    sum.sequences_restored += st.sequences_restored;
    sum.prefix_hit_blocks += st.prefix_hit_blocks;
  }
  EXPECT_GT(sum.copy_on_write, 100);
  EXPECT_GT(sum.blocks_evicted, 100);
  EXPECT_GT(sum.sequences_evicted, 100);
  EXPECT_GT(sum.sequences_offloaded, 100);
  EXPECT_GT(sum.sequences_restored, 50);
  EXPECT_GT(sum.prefix_hit_blocks, 100);
  std::printf(
      "coverage: cow %lld evicted blocks %lld dropped %lld offloaded %lld restored %lld hits "
      "%lld\n",
      static_cast<long long>(sum.copy_on_write), static_cast<long long>(sum.blocks_evicted),
      static_cast<long long>(sum.sequences_evicted),
      static_cast<long long>(sum.sequences_offloaded),
      static_cast<long long>(sum.sequences_restored),
      static_cast<long long>(sum.prefix_hit_blocks));
}

// 48 seeds x 5000 operations = 240,000 operations by default.
INSTANTIATE_TEST_SUITE_P(Seeds, ModelTest, ::testing::Range(0, 48));

}  // namespace
}  // namespace core
}  // namespace pagedkv
