// The bounded control-event ring: capacity, oldest-first drops, the kEventsDropped marker that
// opens the next drain, erasing a taken-back call's events by sequence number across overflow,
// and the control plane that uses it (bounded under a long undrained workload, undone plans).
#include "core/event_ring.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

// A sequence event whose `sequence` field tells the events apart.
ControlEvent ev(SequenceId id, EventKind kind = EventKind::kSequenceEvicted) {
  ControlEvent e;
  e.kind = kind;
  e.sequence = id;
  return e;
}

bool is_offload_or_restore(const ControlEvent& e) {
  return e.kind == EventKind::kSequenceOffloaded || e.kind == EventKind::kSequenceRestored;
}

// The `sequence` field of each drained event, with -N for a marker of N dropped events.
std::vector<int64_t> ids_of(const std::vector<ControlEvent>& events) {
  std::vector<int64_t> out;
  for (const ControlEvent& e : events) {
    out.push_back(e.kind == EventKind::kEventsDropped ? -e.dropped_events
                                                      : static_cast<int64_t>(e.sequence));
  }
  return out;
}

TEST(EventRing, HoldsUpToCapacityOldestFirstWithoutMarker) {
  EventRing ring(4);
  EXPECT_EQ(ring.capacity(), 4u);
  EXPECT_TRUE(ring.empty());
  for (SequenceId i = 1; i <= 4; ++i) ring.push(ev(i));
  EXPECT_EQ(ring.size(), 4u);
  EXPECT_EQ(ring.dropped_total(), 0);
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(ring.empty());
  EXPECT_TRUE(ring.drain().empty());
}

TEST(EventRing, OverflowDropsOldestAndMarkerWithCountComesFirst) {
  EventRing ring(4);
  for (SequenceId i = 0; i < 10; ++i) ring.push(ev(i));
  EXPECT_EQ(ring.size(), 5u) << "four events and the marker";
  EXPECT_EQ(ring.dropped_total(), 6);
  const std::vector<ControlEvent> out = ring.drain();
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0].kind, EventKind::kEventsDropped);
  EXPECT_EQ(out[0].dropped_events, 6);
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{-6, 6, 7, 8, 9}));
}

TEST(EventRing, DrainAfterDrainHasNoMarker) {
  EventRing ring(3);
  for (SequenceId i = 0; i < 7; ++i) ring.push(ev(i));
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{-4, 4, 5, 6}));
  EXPECT_TRUE(ring.drain().empty());
  ring.push(ev(7));
  ring.push(ev(8));
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{7, 8}));
  // A second overflow is counted on its own; the total keeps growing.
  for (SequenceId i = 9; i < 14; ++i) ring.push(ev(i));
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{-2, 11, 12, 13}));
  EXPECT_EQ(ring.dropped_total(), 6);
}

TEST(EventRing, CapacityOneKeepsTheNewest) {
  EventRing ring(1);
  for (SequenceId i = 0; i < 5; ++i) ring.push(ev(i));
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{-4, 4}));
}

TEST(EventRing, SequenceNumbersCountEveryPushAndAreNeverReused) {
  EventRing ring(2);
  EXPECT_EQ(ring.next_sequence(), 0u);
  for (SequenceId i = 0; i < 5; ++i) ring.push(ev(i, EventKind::kSequenceOffloaded));
  EXPECT_EQ(ring.next_sequence(), 5u);
  ring.erase_since(0, is_offload_or_restore);
  EXPECT_EQ(ring.next_sequence(), 5u) << "erasing does not give numbers back";
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{-3}));
  EXPECT_EQ(ring.next_sequence(), 5u);
}

TEST(EventRing, EraseSinceRemovesOnlyMatchingEventsFromThatPointOn) {
  EventRing ring(16);
  ring.push(ev(1));
  ring.push(ev(2, EventKind::kSequenceOffloaded));  // before the call: stays
  const uint64_t first = ring.next_sequence();
  ring.push(ev(3, EventKind::kSequenceOffloaded));
  ring.push(ev(4));  // an eviction of the call: stays
  ring.push(ev(5, EventKind::kSequenceRestored));
  ring.erase_since(first, is_offload_or_restore);
  EXPECT_EQ(ring.size(), 3u);
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{1, 2, 4}));
}

TEST(EventRing, EraseRevocableSinceRemovesOnlyRevocableEventsFromThatPointOn) {
  EventRing ring(16);
  ring.push(ev(1), /*revocable=*/true);  // before the call: stays
  const uint64_t first = ring.next_sequence();
  ring.push(ev(2), /*revocable=*/true);
  ring.push(ev(3));  // not revocable (an eviction): stays
  ring.push(ev(4, EventKind::kSequenceOffloaded), /*revocable=*/true);
  ring.push(ev(5, EventKind::kSequenceOffloaded));
  ring.erase_revocable_since(first);
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{1, 3, 5}));
  // A slot reused after the erase forgets its old flag.
  ring.push(ev(6));
  ring.erase_revocable_since(0);
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{6}));
}

TEST(EventRing, EraseSinceAcrossOverflowKeepsTheMarker) {
  EventRing ring(3);
  ring.push(ev(1));
  ring.push(ev(2));
  const uint64_t first = ring.next_sequence();
  // The call's events overflow the ring: 1 and 2 are dropped, then its own 3.
  ring.push(ev(3, EventKind::kSequenceOffloaded));
  ring.push(ev(4));
  ring.push(ev(5, EventKind::kSequenceRestored));
  ring.push(ev(6, EventKind::kSequenceOffloaded));
  EXPECT_EQ(ring.dropped_total(), 3);
  ring.erase_since(first, is_offload_or_restore);
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{-3, 4}));
  EXPECT_EQ(ring.dropped_total(), 3);
}

TEST(EventRing, PushAfterEraseInAWrappedRingKeepsOrder) {
  EventRing ring(4);
  for (SequenceId i = 0; i < 6; ++i) ring.push(ev(i));  // wrapped: holds 2..5
  const uint64_t first = ring.next_sequence();
  ring.push(ev(6, EventKind::kSequenceOffloaded));  // drops 2
  ring.push(ev(7));                                 // drops 3
  ring.erase_since(first, is_offload_or_restore);   // holds 4, 5, 7
  ring.push(ev(8));
  ring.push(ev(9));  // drops 4
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{-5, 5, 7, 8, 9}));
}

TEST(EventRing, EraseSinceAfterADrainChangesNothing) {
  EventRing ring(4);
  const uint64_t first = ring.next_sequence();
  ring.push(ev(1, EventKind::kSequenceOffloaded));
  EXPECT_EQ(ring.drain().size(), 1u);
  ring.erase_since(first, is_offload_or_restore);
  EXPECT_TRUE(ring.empty());
  ring.push(ev(2));
  EXPECT_EQ(ids_of(ring.drain()), (std::vector<int64_t>{2}));
}

// Random pushes, drains and erasures against a deque that keeps the newest `capacity` events.
TEST(EventRing, MatchesAModelUnderRandomUse) {
  std::mt19937_64 rng(20240611);
  for (size_t capacity : {1u, 2u, 3u, 7u, 32u}) {
    EventRing ring(capacity);
    struct Held {
      uint64_t seq;
      ControlEvent event;
    };
    std::deque<Held> model;
    int64_t pending = 0;
    int64_t total = 0;
    uint64_t next = 0;
    uint64_t mark = 0;
    for (int step = 0; step < 5000; ++step) {
      const uint64_t r = rng() % 100;
      if (r < 80) {
        const EventKind kind = rng() % 2 ? EventKind::kSequenceOffloaded : EventKind::kBlockStored;
        ring.push(ev(next, kind));
        model.push_back(Held{next, ev(next, kind)});
        ++next;
        if (model.size() > capacity) {
          model.pop_front();
          ++pending;
          ++total;
        }
      } else if (r < 88) {
        mark = next - rng() % 5;
      } else if (r < 94) {
        ring.erase_since(mark, is_offload_or_restore);
        std::deque<Held> kept;
        for (Held& h : model) {
          if (h.seq < mark || !is_offload_or_restore(h.event)) kept.push_back(std::move(h));
        }
        model.swap(kept);
      } else {
        std::vector<int64_t> expected;
        if (pending > 0) expected.push_back(-pending);
        for (const Held& h : model) expected.push_back(static_cast<int64_t>(h.event.sequence));
        ASSERT_EQ(ring.size(), expected.size()) << "capacity " << capacity << " step " << step;
        ASSERT_EQ(ids_of(ring.drain()), expected) << "capacity " << capacity << " step " << step;
        model.clear();
        pending = 0;
      }
      ASSERT_LE(ring.size(), capacity + 1);
      ASSERT_EQ(ring.dropped_total(), total);
      ASSERT_EQ(ring.next_sequence(), next);
    }
  }
}

// ---------------------------------------------------------------- in the control plane

std::unique_ptr<ControlPlane> make_cp_with_capacity(const CacheConfig& c, size_t capacity) {
  ControlOptions o;
  o.event_capacity = capacity;
  auto r = ControlPlane::create(c, o);
  EXPECT_OK(r);
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(ControlPlaneEvents, ZeroCapacityIsInvalid) {
  ControlOptions o;
  o.event_capacity = 0;
  EXPECT_EQ(ControlPlane::create(tiny_config(4, 8), o).status().code(),
            StatusCode::kInvalidArgument);
  o.enable_events = false;
  EXPECT_EQ(ControlPlane::create(tiny_config(4, 8), o).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ControlPlaneEvents, UndoRemovesTheFailedCallsEventsOnly) {
  auto cp = make_cp_with_capacity(tiny_config(4, 8, 8), 64);
  ASSERT_NE(cp, nullptr);
  add_and_fill(*cp, 1, iota_tokens(8, 100));  // two stored blocks
  ASSERT_OK(cp->offload(1));
  ASSERT_OK(cp->restore(1));
  {
    auto plan = cp->plan_offload(1);  // the call the data plane "fails"
    ASSERT_OK(plan);
    plan->undo(0);
  }
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_FALSE(cp->residency(1)->offloaded);
  const std::vector<ControlEvent> out = cp->drain_events();
  // (kind, tier) of each event: a registered block that changes tier is stored on the new tier,
  // then removed from the old one.
  using K = EventKind;
  const Tier D = Tier::kDevice;
  const Tier H = Tier::kHost;
  const std::vector<std::pair<K, Tier>> expected = {
      {K::kBlockStored, D},  {K::kBlockStored, D},                              // committed
      {K::kBlockStored, H},  {K::kBlockRemoved, D},      {K::kBlockStored, H},  // offload
      {K::kBlockRemoved, D}, {K::kSequenceOffloaded, D},                        //
      {K::kBlockStored, D},  {K::kBlockRemoved, H},      {K::kBlockStored, D},  // restore
      {K::kBlockRemoved, H}, {K::kSequenceRestored, D}};  // (undone call: none)
  std::vector<std::pair<K, Tier>> got;
  for (const ControlEvent& e : out) got.emplace_back(e.kind, e.tier);
  EXPECT_EQ(got, expected);
  // The pairs name the same block, first block first.
  ASSERT_EQ(out.size(), expected.size());
  EXPECT_EQ(out[2].block_hash, out[0].block_hash);
  EXPECT_EQ(out[3].block_hash, out[0].block_hash);
  EXPECT_EQ(out[4].block_hash, out[1].block_hash);
  EXPECT_EQ(out[2].tokens, out[0].tokens);
  EXPECT_EQ(cp->stats().events_dropped, 0);
}

TEST(ControlPlaneEvents, UndoAcrossOverflowRemovesTheCallsEventsAndKeepsTheMarker) {
  auto cp = make_cp_with_capacity(tiny_config(4, 8, 8), 3);
  ASSERT_NE(cp, nullptr);
  add_and_fill(*cp, 1, iota_tokens(8, 100));  // 2 events: stored, stored
  ASSERT_OK(cp->offload(1));                  // 5 more: two stored/removed pairs, offloaded
  ASSERT_OK(cp->restore(1));                  // 5 more; the ring holds the last 3
  auto plan = cp->plan_offload(1);            // the failed call: 5 more
  ASSERT_OK(plan);
  EXPECT_EQ(cp->stats().events_dropped, 14);
  plan->undo(0);
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->stats().events_dropped, 14) << "undo neither emits events nor brings any back";
  const std::vector<ControlEvent> out = cp->drain_events();
  ASSERT_EQ(out.size(), 1u) << "the failed call's events are all gone";
  EXPECT_EQ(out[0].kind, EventKind::kEventsDropped);
  EXPECT_EQ(out[0].dropped_events, 14);
  EXPECT_TRUE(cp->drain_events().empty());
}

// A long workload with block and sequence evictions on a tiny pool, run twice: once into a ring
// too large to overflow, drained every round, once into a 16-event ring drained every 50 rounds.
// Each drain of the small one holds at most 17 events, opens with the marker when it dropped
// any, and the rest is exactly the newest events of the same stretch of the big run.
TEST(ControlPlaneEvents, SmallRingStaysBoundedUnderALongWorkload) {
  constexpr size_t kCapacity = 16;
  const CacheConfig config = tiny_config(4, 12);
  auto big = make_cp_with_capacity(config, size_t{1} << 20);
  auto small = make_cp_with_capacity(config, kCapacity);
  ASSERT_NE(big, nullptr);
  ASSERT_NE(small, nullptr);
  std::mt19937 rng(7);
  std::vector<ControlEvent> stretch;  // the big run's events since the small one's last drain
  int64_t dropped_seen = 0;
  size_t drains_with_marker = 0;
  for (int round = 0; round < 2000; ++round) {
    // Prompts drawn from a few prefixes, so that blocks are shared, cached and evicted.
    std::vector<TokenId> prompt =
        iota_tokens(4 * (1 + static_cast<int>(rng() % 2)), 100 * static_cast<TokenId>(rng() % 6));
    for (int i = 0, n = 1 + static_cast<int>(rng() % 6); i < n; ++i)
      prompt.push_back(static_cast<TokenId>(rng() % 1000));
    const SequenceId id = static_cast<SequenceId>(round);
    for (ControlPlane* cp : {big.get(), small.get()}) {
      add_and_fill(*cp, id, prompt);
      if (round >= 2 && round % 3 != 0 && cp->contains(id - 2)) {
        ASSERT_OK(cp->finish(id - 2));
      }
    }
    for (ControlEvent& e : big->drain_events()) stretch.push_back(std::move(e));
    if (round % 50 != 49) continue;
    const std::vector<ControlEvent> got = small->drain_events();
    ASSERT_LE(got.size(), kCapacity + 1);
    size_t first = 0;
    int64_t dropped = 0;
    if (!got.empty() && got[0].kind == EventKind::kEventsDropped) {
      first = 1;
      dropped = got[0].dropped_events;
      ++drains_with_marker;
    }
    ASSERT_EQ(static_cast<size_t>(dropped) + got.size() - first, stretch.size()) << round;
    for (size_t i = first; i < got.size(); ++i) {
      const ControlEvent& want = stretch[static_cast<size_t>(dropped) + i - first];
      ASSERT_EQ(got[i].kind, want.kind) << round << " " << i;
      ASSERT_EQ(got[i].block_hash, want.block_hash);
      ASSERT_EQ(got[i].sequence, want.sequence);
      ASSERT_EQ(got[i].tokens, want.tokens);
    }
    dropped_seen += dropped;
    stretch.clear();
  }
  PAGEDKV_EXPECT_INV(*small);
  EXPECT_GT(drains_with_marker, 0u) << "the workload never overflowed the small ring";
  EXPECT_EQ(small->stats().events_dropped, dropped_seen);
  EXPECT_EQ(big->stats().events_dropped, 0);
  EXPECT_GT(big->stats().blocks_evicted, 0) << "the workload never evicted";
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
