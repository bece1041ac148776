// KV groups on the wire: a hybrid model's block events carry vLLM's `group_idx` (stored ones
// also `kv_cache_spec_kind` and `kv_cache_spec_sliding_window`), after vLLM's other fields, and
// only with two or more groups. The encoder against hand-written msgpack; the publisher of a
// two-group ModelKvCache (full + window 64, block 16) read back over a socket and decoded with
// msgpack-c's own reader, hashes from the reference formula; a one-group model's messages
// byte-identical to a KvCache's.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "support/status_matchers.hpp"

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

#include "block_hash_reference.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/event_publisher.hpp"
#include "pagedkv/events/wire.hpp"
#include "pagedkv/model_cache.hpp"
#include "wire_test_util.hpp"

namespace pagedkv {
namespace {

using testing::H;
using testing::hex_of;

ControlEvent stored(int32_t group, uint64_t hash, uint64_t parent, std::vector<TokenId> tokens) {
  ControlEvent e;
  e.kind = EventKind::kBlockStored;
  e.group = group;
  e.block_hash = hash;
  e.parent_hash = parent;
  e.tokens = std::move(tokens);
  return e;
}

ControlEvent removed(int32_t group, uint64_t hash) {
  ControlEvent e;
  e.kind = EventKind::kBlockRemoved;
  e.group = group;
  e.block_hash = hash;
  return e;
}

events::WireOptions two_group_wire() {
  events::WireOptions o;
  o.block_size = 2;
  o.groups = {{"full_attention", 0}, {"sliding_window", 64}};
  return o;
}

TEST(GroupWire, HybridBlockEventsCarryVllmGroupFieldsAfterTheirOwn) {
  // vLLM's BlockStored fields in declaration order, then (extra_keys None: omitted) group_idx,
  // kv_cache_spec_kind and kv_cache_spec_sliding_window, omitted when None; BlockRemoved adds
  // group_idx after medium. AllBlocksCleared has no fields in vLLM, so no group.
  ControlEvent dropped;
  dropped.kind = EventKind::kEventsDropped;
  dropped.group = 1;
  const std::vector<ControlEvent> ev = {stored(0, 5, testing::ref_root_hash(0), {1, 2}),
                                        stored(1, 6, 5, {3, 4}), removed(1, 7), removed(0, 8),
                                        dropped};
  const std::string stored_common =
      H("a4") + "type" + H("ab") + "BlockStored" + H("ac") + "block_hashes";
  const std::string tail = H("aa") + "block_size" + H("02") + H("a7") + "lora_id" + H("c0") +
                           H("a6") + "medium" + H("a3") + "GPU" + H("a9") + "lora_name" + H("c0");
  const std::string golden =
      H("93 cb 3f f8 00 00 00 00 00 00 95") +
      // group 0, full attention: map of 10, no window key
      H("8a") + stored_common + H("91 05") + H("b1") + "parent_block_hash" + H("c0") + H("a9") +
      "token_ids" + H("92 01 02") + tail + H("a9") + "group_idx" + H("00") + H("b2") +
      "kv_cache_spec_kind" + H("ae") + "full_attention" +
      // group 1, sliding window 64: map of 11
      H("8b") + stored_common + H("91 06") + H("b1") + "parent_block_hash" + H("05") + H("a9") +
      "token_ids" + H("92 03 04") + tail + H("a9") + "group_idx" + H("01") + H("b2") +
      "kv_cache_spec_kind" + H("ae") + "sliding_window" + H("bc") + "kv_cache_spec_sliding_window" +
      H("40") +
      // BlockRemoved of groups 1 and 0: map of 4
      H("84 a4") + "type" + H("ac") + "BlockRemoved" + H("ac") + "block_hashes" + H("91 07") +
      H("a6") + "medium" + H("a3") + "GPU" + H("a9") + "group_idx" + H("01") + H("84 a4") + "type" +
      H("ac") + "BlockRemoved" + H("ac") + "block_hashes" + H("91 08") + H("a6") + "medium" +
      H("a3") + "GPU" + H("a9") + "group_idx" + H("00") +
      // the resync
      H("81 a4") + "type" + H("b0") + "AllBlocksCleared" + H("00");
  std::string out;
  ASSERT_OK(events::encode_batch(ev, 1.5, two_group_wire(), &out));
  EXPECT_EQ(hex_of(out), hex_of(golden));
}

TEST(GroupWire, OneGroupWritesNoGroupFields) {
  const std::vector<ControlEvent> ev = {stored(0, 5, 9, {1, 2}), removed(0, 5)};
  events::WireOptions plain;
  plain.block_size = 2;
  events::WireOptions one = plain;
  one.groups = {{"sliding_window", 64}};
  std::string a;
  std::string b;
  ASSERT_OK(events::encode_batch(ev, 1.0, plain, &a));
  ASSERT_OK(events::encode_batch(ev, 1.0, one, &b));
  EXPECT_EQ(hex_of(a), hex_of(b));
  EXPECT_EQ(a.find("group_idx"), std::string::npos);
  EXPECT_EQ(a.find("kv_cache_spec"), std::string::npos);
}

TEST(GroupWire, AnEventOfAnUnknownGroupIsRefused) {
  std::string out = "untouched";
  Status s = events::encode_batch({removed(2, 1)}, 0.0, two_group_wire(), &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("group 2"), std::string::npos) << s.message();
  events::WireOptions plain;
  plain.block_size = 2;
  EXPECT_EQ(events::encode_batch({removed(1, 1)}, 0.0, plain, &out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(events::encode_batch({removed(-1, 1)}, 0.0, two_group_wire(), &out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(out, "untouched");
}

TEST(GroupWire, GroupsOfAConfigAreVllmSpecKinds) {
  CacheConfig c;
  c.num_layers = 4;
  KvGroup full;
  full.layers = {0};
  KvGroup window;
  window.layers = {1};
  window.sliding_window = 128;
  KvGroup mla = KvGroup::latent("mla", {2}, 72, 8);
  KvGroup mla_window = KvGroup::latent("mla-window", {3}, 72, 8);
  mla_window.sliding_window = 32;
  c.groups = {full, window, mla, mla_window};
  const std::vector<events::WireGroup> g = events::wire_groups(c);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].kind, "full_attention");
  EXPECT_EQ(g[0].sliding_window, 0);
  EXPECT_EQ(g[1].kind, "sliding_window");
  EXPECT_EQ(g[1].sliding_window, 128);
  EXPECT_EQ(g[2].kind, "mla_attention");
  EXPECT_EQ(g[2].sliding_window, 0);
  EXPECT_EQ(g[3].kind, "sliding_window_mla");
  EXPECT_EQ(g[3].sliding_window, 32);
  CacheConfig uniform;
  uniform.sliding_window = 256;
  ASSERT_EQ(events::wire_groups(uniform).size(), 1u);
  EXPECT_EQ(events::wire_groups(uniform)[0].kind, "sliding_window");
}

// ---------------------------------------------------------------- the publisher of a model

constexpr int32_t kBlock = 16;

// Group 0: layers 0, 2, full attention; group 1: layers 1, 3, window 64, a pool of 8 blocks.
CacheConfig two_groups() {
  CacheConfig c;
  c.num_layers = 4;
  c.block_size = kBlock;
  c.backend = BackendKind::kCpu;
  KvGroup full;
  full.name = "full";
  full.layers = {0, 2};
  full.num_kv_heads = 1;
  full.head_dim = 8;
  full.num_device_blocks = 64;
  KvGroup window = full;
  window.name = "window";
  window.layers = {1, 3};
  window.sliding_window = 64;
  window.num_device_blocks = 8;
  c.groups = {full, window};
  return c;
}

std::vector<TokenId> tokens(int n, TokenId first, TokenId step) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(first + step * i);
  return t;
}

std::vector<uint64_t> ref_hashes(const std::vector<TokenId>& prompt) {
  return testing::ref_prompt_hashes(prompt, kBlock);
}

template <typename Cache>
void prefill(Cache& c, SequenceId id, const std::vector<TokenId>& prompt) {
  ASSERT_OK(c.add_sequence(id, prompt));
  ASSERT_OK(c.reserve(id, static_cast<int64_t>(prompt.size())));
  ASSERT_OK(c.commit(id, prompt));
}

// A publisher (block 16, ts 2.0) and a subscriber that has joined it.
struct Wire {
  zmq::context_t ctx{1};
  std::unique_ptr<EventPublisher> pub;
  zmq::socket_t sub{ctx, zmq::socket_type::sub};

  Wire() {
    EventPublisherOptions o;
    o.clock = [] { return 2.0; };
    auto p = EventPublisher::create(kBlock, o);
    EXPECT_OK(p);
    pub = std::move(*p);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::rcvtimeo, 20);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(pub->endpoint());
    // Messages before the subscription arrives are lost: publish until one comes through.
    bool joined = false;
    for (int i = 0; i < 500 && !joined; ++i) {
      ControlEvent e;
      e.kind = EventKind::kBlockRemoved;
      e.block_hash = 1;
      EXPECT_OK(pub->publish({e}));
      joined = !payload().empty();
    }
    EXPECT_TRUE(joined) << "the subscriber never joined";
    sub.set(zmq::sockopt::rcvtimeo, 5000);
  }

  // The next message's payload ("" on a timeout).
  std::string payload() {
    std::vector<zmq::message_t> msgs;
    if (!zmq::recv_multipart(sub, std::back_inserter(msgs)) || msgs.size() != 3) return "";
    return msgs[2].to_string();
  }
};

// One decoded wire event: its map, keys in order.
struct WireEvent {
  std::vector<std::string> keys;
  std::map<std::string, msgpack::object> fields;
  std::string type() const { return fields.at("type").as<std::string>(); }
  bool has(const std::string& k) const { return fields.count(k) != 0; }
  int64_t integer(const std::string& k) const { return fields.at(k).as<int64_t>(); }
  uint64_t hash() const { return fields.at("block_hashes").as<std::vector<uint64_t>>().at(0); }
};

// Decodes a KVEventBatch payload into its events (`handle` keeps the objects alive).
std::vector<WireEvent> decode(const std::string& payload, msgpack::object_handle* handle) {
  *handle = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& batch = handle->get();
  std::vector<WireEvent> out;
  EXPECT_EQ(batch.type, msgpack::type::ARRAY);
  EXPECT_EQ(batch.via.array.size, 3u);
  const msgpack::object& events = batch.via.array.ptr[1];
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    const msgpack::object& m = events.via.array.ptr[i];
    EXPECT_EQ(m.type, msgpack::type::MAP);
    WireEvent e;
    for (uint32_t k = 0; k < m.via.map.size; ++k) {
      const std::string key = m.via.map.ptr[k].key.as<std::string>();
      e.keys.push_back(key);
      e.fields[key] = m.via.map.ptr[k].val;
    }
    out.push_back(std::move(e));
  }
  return out;
}

const std::vector<std::string> kStoredKeys = {
    "type",    "block_hashes", "parent_block_hash", "token_ids", "block_size",
    "lora_id", "medium",       "lora_name",         "group_idx", "kv_cache_spec_kind"};

void expect_stored(const WireEvent& e, int64_t group, const std::vector<TokenId>& prompt,
                   size_t b) {
  const std::vector<uint64_t> h = ref_hashes(prompt);
  ASSERT_EQ(e.type(), "BlockStored");
  std::vector<std::string> keys = kStoredKeys;
  if (group == 1) keys.push_back("kv_cache_spec_sliding_window");
  EXPECT_EQ(e.keys, keys);
  EXPECT_EQ(e.integer("group_idx"), group);
  EXPECT_EQ(e.fields.at("kv_cache_spec_kind").as<std::string>(),
            group == 0 ? "full_attention" : "sliding_window");
  if (group == 1) {
    EXPECT_EQ(e.integer("kv_cache_spec_sliding_window"), 64);
  }
  EXPECT_EQ(e.hash(), h[b]) << "block " << b;
  if (b == 0) {
    EXPECT_TRUE(e.fields.at("parent_block_hash").is_nil());
  } else {
    EXPECT_EQ(e.fields.at("parent_block_hash").as<uint64_t>(), h[b - 1]);
  }
  EXPECT_EQ(e.fields.at("token_ids").as<std::vector<TokenId>>(),
            std::vector<TokenId>(prompt.begin() + static_cast<std::ptrdiff_t>(b * kBlock),
                                 prompt.begin() + static_cast<std::ptrdiff_t>((b + 1) * kBlock)));
  EXPECT_EQ(e.integer("block_size"), kBlock);
  EXPECT_EQ(e.fields.at("medium").as<std::string>(), "GPU");
}

TEST(GroupWire, PublishedTwoGroupModelDecodesWithEachEventsGroup) {
  Wire w;
  auto m = ModelKvCache::create(two_groups());
  ASSERT_OK(m);
  const std::vector<TokenId> a = tokens(128, 1000, 7);  // 8 blocks: fills the window pool
  const std::vector<TokenId> b = tokens(64, 50000, 3);  // 4 blocks: evicts A's released 0..3
  prefill(**m, 1, a);
  auto n = w.pub->publish(**m);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 16);
  msgpack::object_handle h1;
  const std::vector<WireEvent> first = decode(w.payload(), &h1);
  ASSERT_EQ(first.size(), 16u);
  // Block by block: the full group's store, then the window group's.
  for (size_t i = 0; i < 8; ++i) {
    expect_stored(first[2 * i], 0, a, i);
    expect_stored(first[2 * i + 1], 1, a, i);
  }

  prefill(**m, 2, b);
  n = w.pub->publish(**m);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 12);
  msgpack::object_handle h2;
  const std::vector<WireEvent> second = decode(w.payload(), &h2);
  ASSERT_EQ(second.size(), 12u);
  // The window group's removals (at the reserve) before the stores (at the commit).
  const std::vector<uint64_t> ha = ref_hashes(a);
  std::set<uint64_t> gone;
  for (size_t i = 0; i < 4; ++i) {
    const WireEvent& e = second[i];
    ASSERT_EQ(e.type(), "BlockRemoved");
    EXPECT_EQ(e.keys, (std::vector<std::string>{"type", "block_hashes", "medium", "group_idx"}));
    EXPECT_EQ(e.integer("group_idx"), 1);  // the window group's, not the full group's
    EXPECT_EQ(e.fields.at("medium").as<std::string>(), "GPU");
    gone.insert(e.hash());
  }
  EXPECT_EQ(gone, std::set<uint64_t>(ha.begin(), ha.begin() + 4));
  for (size_t i = 0; i < 4; ++i) {
    expect_stored(second[4 + 2 * i], 0, b, i);
    expect_stored(second[5 + 2 * i], 1, b, i);
  }
}

TEST(GroupWire, ModelOfAnotherBlockSizeIsRefusedAndKeepsItsEvents) {
  Wire w;
  CacheConfig c = two_groups();
  c.block_size = 8;
  for (KvGroup& g : c.groups) g.sliding_window = g.sliding_window ? 32 : 0;
  auto m = ModelKvCache::create(c);
  ASSERT_OK(m);
  prefill(**m, 1, tokens(16, 1, 1));
  EXPECT_EQ(w.pub->publish(**m).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->drain_events().size(), 4u);  // 2 blocks in each group, still there
}

TEST(GroupWire, KvCacheOfAnotherBlockSizeIsRefusedAndKeepsItsEvents) {
  // One group too: refused before draining, not by the encoder after (which loses the events).
  Wire w;
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = kBlock * 2;
  c.num_device_blocks = 8;
  c.backend = BackendKind::kCpu;
  auto kv = KvCache::create(c);
  ASSERT_OK(kv);
  prefill(**kv, 1, tokens(kBlock * 4, 1, 1));
  const int64_t sent = w.pub->counters().messages;  // the Wire's joining messages
  const auto n = w.pub->publish(**kv);
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("block_size"), std::string::npos);
  EXPECT_EQ((*kv)->drain_events().size(), 2u);  // 2 blocks stored, still there
  EXPECT_EQ(w.pub->counters().messages, sent);
}

TEST(GroupWire, OneGroupModelPublishesWhatAKvCachePublishes) {
  Wire w;
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = kBlock;
  c.num_device_blocks = 8;
  c.backend = BackendKind::kCpu;
  auto m = ModelKvCache::create(c);
  ASSERT_OK(m);
  auto kv = KvCache::create(c);
  ASSERT_OK(kv);
  for (SequenceId id = 1; id <= 3; ++id) {  // the third evicts: stores and removals
    const std::vector<TokenId> p = tokens(64, static_cast<TokenId>(id * 1000), 3);
    prefill(**m, id, p);
    prefill(**kv, id, p);
    ASSERT_OK((*m)->finish(id));
    ASSERT_OK((*kv)->finish(id));
    ASSERT_OK(w.pub->publish(**m));
    ASSERT_OK(w.pub->publish(**kv));
    const std::string from_model = w.payload();
    const std::string from_cache = w.payload();
    ASSERT_FALSE(from_cache.empty());
    EXPECT_EQ(hex_of(from_model), hex_of(from_cache)) << "sequence " << id;
    EXPECT_EQ(from_model.find("group_idx"), std::string::npos);
  }
}

}  // namespace
}  // namespace pagedkv
