// The encoder against a KVEventBatch written out by hand, byte for byte, from vLLM's msgspec
// structs (array_like batch, tagged-map events, omit_defaults) and the msgpack spec.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "block_hash_reference.hpp"
#include "pagedkv/events/wire.hpp"
#include "support/status_matchers.hpp"
#include "wire_test_util.hpp"

namespace pagedkv {
namespace {

using testing::H;
using testing::hex_of;

ControlEvent stored(Tier tier, NamespaceId ns, uint64_t hash, uint64_t parent,
                    std::vector<TokenId> tokens) {
  ControlEvent e;
  e.kind = EventKind::kBlockStored;
  e.tier = tier;
  e.ns = ns;
  e.block_hash = hash;
  e.parent_hash = parent;
  e.tokens = std::move(tokens);
  return e;
}

TEST(EncoderGolden, BatchOfEveryKindMatchesHandWrittenMsgpack) {
  std::vector<ControlEvent> events;
  // A first block (parent = the namespace root) on the device, tokens of every integer width.
  events.push_back(stored(Tier::kDevice, 0, 0x0102030405060708ull, testing::ref_root_hash(0),
                          {1, 200, 300, 70000}));
  // A later block of namespace 7 on the host.
  events.push_back(stored(Tier::kHost, 7, 5, 0xfedcba9876543210ull, {5, 6, 7, 8}));
  ControlEvent removed;
  removed.kind = EventKind::kBlockRemoved;
  removed.tier = Tier::kDevice;
  removed.block_hash = 0x0102030405060708ull;
  events.push_back(removed);
  ControlEvent seq_evicted;  // not part of vLLM's format: skipped
  seq_evicted.kind = EventKind::kSequenceEvicted;
  seq_evicted.sequence = 9;
  events.push_back(seq_evicted);
  ControlEvent dropped;
  dropped.kind = EventKind::kEventsDropped;
  dropped.dropped_events = 12;
  events.push_back(dropped);

  const std::string golden = H("93") +                          // KVEventBatch: array of 3
                             H("cb 3f f8 00 00 00 00 00 00") +  // ts: float64 1.5
                             H("94") +                          // events: array of 4
                             H("88") +                          // BlockStored: map of 8
                             H("a4") + "type" + H("ab") + "BlockStored" +  //
                             H("ac") + "block_hashes" + H("91 cf 01 02 03 04 05 06 07 08") +
                             H("b1") + "parent_block_hash" + H("c0") +  // nil: a first block
                             H("a9") + "token_ids" + H("94 01 cc c8 cd 01 2c ce 00 01 11 70") +
                             H("aa") + "block_size" + H("04") +      //
                             H("a7") + "lora_id" + H("c0") +         // namespace 0
                             H("a6") + "medium" + H("a3") + "GPU" +  //
                             H("a9") + "lora_name" + H("c0") +       //
                             H("88") +  // BlockStored on the host, namespace 7
                             H("a4") + "type" + H("ab") + "BlockStored" +  //
                             H("ac") + "block_hashes" + H("91 05") + H("b1") + "parent_block_hash" +
                             H("cf fe dc ba 98 76 54 32 10") + H("a9") + "token_ids" +
                             H("94 05 06 07 08") +                   //
                             H("aa") + "block_size" + H("04") +      //
                             H("a7") + "lora_id" + H("07") +         //
                             H("a6") + "medium" + H("a3") + "CPU" +  //
                             H("a9") + "lora_name" + H("c0") +       //
                             H("83") +                               // BlockRemoved: map of 3
                             H("a4") + "type" + H("ac") + "BlockRemoved" +  //
                             H("ac") + "block_hashes" + H("91 cf 01 02 03 04 05 06 07 08") +
                             H("a6") + "medium" + H("a3") + "GPU" +  //
                             H("81") +                               // AllBlocksCleared: map of 1
                             H("a4") + "type" + H("b0") + "AllBlocksCleared" +  //
                             H("03");  // data_parallel_rank 3

  events::WireOptions options;
  options.block_size = 4;
  options.data_parallel_rank = 3;
  std::string out;
  events::WireCounts counts;
  ASSERT_OK(events::encode_batch(events, 1.5, options, &out, &counts));
  EXPECT_EQ(hex_of(out), hex_of(golden));
  EXPECT_EQ(counts.stored, 2);
  EXPECT_EQ(counts.removed, 1);
  EXPECT_EQ(counts.cleared, 1);
  EXPECT_EQ(counts.skipped, 1);
}

TEST(EncoderGolden, EmptyBatchIsTsEmptyListAndRank) {
  std::string out;
  events::WireOptions options;
  options.block_size = 16;
  ASSERT_OK(events::encode_batch({}, 0.0, options, &out));
  EXPECT_EQ(hex_of(out), hex_of(H("93 cb 00 00 00 00 00 00 00 00 90 00")));
}

TEST(EncoderGolden, SequenceNumberIsEightBytesBigEndian) {
  EXPECT_EQ(hex_of(events::sequence_bytes(0)), hex_of(H("00 00 00 00 00 00 00 00")));
  EXPECT_EQ(hex_of(events::sequence_bytes(0x0102030405060708)),
            hex_of(H("01 02 03 04 05 06 07 08")));
  EXPECT_EQ(hex_of(events::sequence_bytes(-1)), hex_of(H("ff ff ff ff ff ff ff ff")));
}

TEST(EncoderGolden, BadInputIsRefusedAndLeavesOutputAlone) {
  std::string out = "untouched";
  events::WireOptions options;
  options.block_size = 0;
  Status s = events::encode_batch({}, 0.0, options, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block_size"), std::string::npos) << s.message();
  options.block_size = 4;
  options.data_parallel_rank = -1;
  s = events::encode_batch({}, 0.0, options, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("data_parallel_rank"), std::string::npos) << s.message();
  options.data_parallel_rank = 0;
  s = events::encode_batch({stored(Tier::kDevice, 0, 1, 2, {1, 2, 3})}, 0.0, options, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("3 tokens"), std::string::npos) << s.message();
  EXPECT_EQ(out, "untouched");
  EXPECT_EQ(events::encode_batch({}, 0.0, options, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(EncoderGolden, ThroughputFigureForTheDocs) {
  // 64 stored events of 16 tokens per batch, the shape of a prefill step; the figure is printed
  // for docs/events.md, the bound only catches an encoder that became pathologically slow.
  std::vector<ControlEvent> batch;
  for (uint64_t i = 0; i < 64; ++i) {
    batch.push_back(stored(i % 2 ? Tier::kHost : Tier::kDevice, 0, 0x9e3779b97f4a7c15ull * (i + 1),
                           0x51ull * i, std::vector<TokenId>(16, static_cast<TokenId>(i * 977))));
  }
  events::WireOptions options;
  options.block_size = 16;
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t events = 0;
  size_t bytes = 0;
  for (int r = 0; r < 2000; ++r) {
    ASSERT_OK(events::encode_batch(batch, 1.0 + r, options, &out));
    events += static_cast<int64_t>(batch.size());
    bytes += out.size();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "encoder: %lld stored events (16 tokens) in %.3f s: %.2f M events/s, %.0f bytes/event\n",
      static_cast<long long>(events), s, events / s / 1e6,
      static_cast<double>(bytes) / static_cast<double>(events));
  EXPECT_GT(events / s, 1e4);
}

}  // namespace
}  // namespace pagedkv
