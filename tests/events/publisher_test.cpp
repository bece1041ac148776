// EventPublisher over real sockets on 127.0.0.1 (free ports chosen by the OS): the multipart
// layout, gap-free sequence numbers, replay of a missed range byte for byte, the resync answer
// when a reader asks for what the bounded buffer dropped, malformed requests, bad options.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "pagedkv/cache.hpp"
#include "pagedkv/event_publisher.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using Frames = std::vector<std::string>;

ControlEvent removed_event(uint64_t hash) {
  ControlEvent e;
  e.kind = EventKind::kBlockRemoved;
  e.block_hash = hash;
  return e;
}

int64_t seq_of(const std::string& b) {
  uint64_t v = 0;
  for (unsigned char c : b) v = (v << 8) | c;
  return static_cast<int64_t>(v);
}

std::string be8(int64_t v) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i)
    b[static_cast<size_t>(i)] = static_cast<char>(uint64_t(v) >> (56 - 8 * i));
  return b;
}

Frames recv_frames(zmq::socket_t& s) {
  std::vector<zmq::message_t> msgs;
  Frames out;
  if (!zmq::recv_multipart(s, std::back_inserter(msgs))) return out;  // timed out
  for (auto& m : msgs) out.push_back(m.to_string());
  return out;
}

struct Fixture {
  zmq::context_t ctx{1};
  std::unique_ptr<EventPublisher> pub;
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  std::vector<Frames> received;

  explicit Fixture(EventPublisherOptions o) {
    o.replay_endpoint = "tcp://127.0.0.1:*";
    o.clock = [] { return 2.0; };
    auto p = EventPublisher::create(4, o);
    EXPECT_OK(p);
    pub = std::move(*p);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::rcvtimeo, 20);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(pub->endpoint());
    // A new subscriber misses what is sent before its subscription arrives: publish until one
    // message comes through, then everything after it does.
    for (int i = 0; i < 500 && received.empty(); ++i) {
      EXPECT_OK(pub->publish({removed_event(1000 + i)}));
      Frames f = recv_frames(sub);
      if (!f.empty()) received.push_back(f);
    }
    EXPECT_FALSE(received.empty()) << "the subscriber never joined";
    sub.set(zmq::sockopt::rcvtimeo, 5000);  // joined: later messages must come
    // A warm-up message that came after its 20 ms wait was followed by another publish: read on
    // until the last warm-up, so that received[0] is the newest message sent and the tests
    // count from it.
    const int64_t last_sent = pub->counters().messages - 1;
    while (!received.empty() && seq_of(received[0][1]) < last_sent) {
      Frames f = recv_frames(sub);
      if (f.empty()) {
        ADD_FAILURE() << "warm-up message " << last_sent << " never came";
        break;
      }
      received[0] = f;
    }
  }

  // Replay request from `start` on a fresh DEALER: every frame set until the end marker.
  std::vector<Frames> replay(int64_t start) {
    zmq::socket_t d(ctx, zmq::socket_type::dealer);
    d.set(zmq::sockopt::linger, 0);
    d.set(zmq::sockopt::rcvtimeo, 5000);
    d.connect(pub->replay_endpoint());
    d.send(zmq::message_t(), zmq::send_flags::sndmore);
    d.send(zmq::buffer(be8(start)), zmq::send_flags::none);
    std::vector<Frames> out;
    for (;;) {
      Frames f = recv_frames(d);
      if (f.empty()) {
        ADD_FAILURE() << "replay timed out";
        return out;
      }
      EXPECT_EQ(f.size(), 3u);  // empty delimiter, seq, payload
      if (f.size() != 3) return out;
      f.erase(f.begin());
      if (seq_of(f[0]) == -1) {
        EXPECT_TRUE(f[1].empty());
        return out;
      }
      out.push_back(f);
    }
  }
};

TEST(EventPublisher, MessagesAreTopicSequencePayloadWithoutGaps) {
  EventPublisherOptions o;
  o.topic = "kv@7";
  Fixture fx(o);
  const int64_t first = seq_of(fx.received[0][1]);
  for (int i = 0; i < 50; ++i) ASSERT_OK(fx.pub->publish({removed_event(i)}));
  for (int i = 0; i < 50; ++i) {
    Frames f = recv_frames(fx.sub);
    ASSERT_EQ(f.size(), 3u) << "message " << i;
    EXPECT_EQ(f[0], "kv@7");
    EXPECT_EQ(f[1].size(), 8u);
    EXPECT_EQ(seq_of(f[1]), first + 1 + i);
    EXPECT_EQ(static_cast<unsigned char>(f[2][0]), 0x93);  // [ts, events, rank]
  }
  EXPECT_EQ(fx.pub->counters().messages, first + 51);
}

TEST(EventPublisher, EventsThatAreNotOnTheWireSendNothing) {
  Fixture fx({});
  const int64_t before = fx.pub->counters().messages;
  ControlEvent e;
  e.kind = EventKind::kSequenceOffloaded;
  auto n = fx.pub->publish({e});
  ASSERT_OK(n);
  EXPECT_EQ(*n, 0);
  EXPECT_EQ(fx.pub->counters().messages, before);
  EXPECT_EQ(fx.pub->counters().skipped, 1);
}

TEST(EventPublisher, ReplayReturnsExactlyTheRangeFromStartOn) {
  Fixture fx({});
  const int64_t first = seq_of(fx.received[0][1]);
  for (int i = 0; i < 20; ++i) ASSERT_OK(fx.pub->publish({removed_event(i)}));
  for (int i = 0; i < 20; ++i) fx.received.push_back(recv_frames(fx.sub));
  const int64_t last = first + 20;
  const int64_t start = first + 7;
  std::vector<Frames> r = fx.replay(start);
  ASSERT_EQ(static_cast<int64_t>(r.size()), last - start + 1);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(seq_of(r[i][0]), start + static_cast<int64_t>(i));
    EXPECT_EQ(r[i][1], fx.received[static_cast<size_t>(7) + i][2]) << "payload of " << i;
  }
  EXPECT_TRUE(fx.replay(last + 1).empty());  // nothing missed: just the end marker
  EXPECT_EQ(fx.pub->counters().replay_resyncs, 0);
}

TEST(EventPublisher, AskingForDroppedMessagesGetsAllBlocksClearedFirst) {
  EventPublisherOptions o;
  o.replay_buffer = 3;
  Fixture fx(o);
  for (int i = 0; i < 5; ++i) ASSERT_OK(fx.pub->publish({removed_event(i)}));
  const int64_t next = fx.pub->counters().messages;
  std::vector<Frames> r = fx.replay(0);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(seq_of(r[0][0]), 0);
  // [2.0, [{"type": "AllBlocksCleared"}], 0]
  const std::string cleared =
      std::string("\x93\xcb\x40\x00\x00\x00\x00\x00\x00\x00\x91\x81\xa4", 13) + "type" + "\xb0" +
      "AllBlocksCleared" + std::string(1, '\0');
  EXPECT_EQ(r[0][1], cleared);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(seq_of(r[static_cast<size_t>(i)][0]), next - 4 + i);
  EXPECT_EQ(fx.pub->counters().replay_resyncs, 1);
}

TEST(EventPublisher, MalformedReplayRequestIsIgnoredAndServingGoesOn) {
  Fixture fx({});
  {
    zmq::socket_t d(fx.ctx, zmq::socket_type::dealer);
    d.set(zmq::sockopt::linger, 0);
    d.connect(fx.pub->replay_endpoint());
    d.send(zmq::message_t(), zmq::send_flags::sndmore);
    d.send(zmq::str_buffer("abc"), zmq::send_flags::none);  // not 8 bytes
    for (int i = 0; i < 200 && fx.pub->counters().bad_requests == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_EQ(fx.pub->counters().bad_requests, 1);
  EXPECT_FALSE(fx.replay(0).empty());
}

TEST(EventPublisher, PublishesWhatACacheDrains) {
  Fixture fx({});
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = 4;
  c.num_device_blocks = 8;
  c.backend = BackendKind::kCpu;
  auto kv = KvCache::create(c);
  ASSERT_OK(kv);
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_OK((*kv)->add_sequence(1, prompt));
  ASSERT_OK((*kv)->reserve(1, 8));
  ASSERT_OK((*kv)->commit(1, prompt));
  auto n = fx.pub->publish(**kv);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 2);  // two full blocks stored
  Frames f = recv_frames(fx.sub);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_NE(f[2].find("BlockStored"), std::string::npos);
  EXPECT_TRUE((*kv)->drain_events().empty());
}

// The first event of a payload: the map after [0x93, float64 ts, array header].
std::string first_event_type(const std::string& payload) {
  const size_t at = payload.find("type");
  if (at == std::string::npos) return "";
  const auto len = static_cast<size_t>(static_cast<unsigned char>(payload[at + 4]) & 0x1f);
  return payload.substr(at + 5, len);
}

TEST(EventPublisher, AFailedPublishMakesTheNextMessageStartWithAllBlocksCleared) {
  Fixture fx({});
  ControlEvent bad;
  bad.kind = EventKind::kBlockStored;
  bad.tokens = {1, 2, 3};  // block_size is 4
  auto n = fx.pub->publish({bad});
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  ASSERT_OK(fx.pub->publish({removed_event(5)}));
  Frames f = recv_frames(fx.sub);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(first_event_type(f[2]), "AllBlocksCleared");
  EXPECT_NE(f[2].find("BlockRemoved"), std::string::npos);
  ASSERT_OK(fx.pub->publish({removed_event(6)}));  // once only
  f = recv_frames(fx.sub);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(first_event_type(f[2]), "BlockRemoved");
}

TEST(EventPublisher, AnOverflowedEventRingIsPublishedAsAllBlocksCleared) {
  Fixture fx({});
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = 4;
  c.num_device_blocks = 8;
  c.backend = BackendKind::kCpu;
  KvCacheOptions ko;
  ko.event_capacity = 2;  // nobody drained: 4 stored events overflow it
  auto kv = KvCache::create(c, ko);
  ASSERT_OK(kv);
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  ASSERT_OK((*kv)->add_sequence(1, prompt));
  ASSERT_OK((*kv)->reserve(1, 16));
  ASSERT_OK((*kv)->commit(1, prompt));
  auto n = fx.pub->publish(**kv);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 3);  // the clear, then the 2 stored events the ring kept
  Frames f = recv_frames(fx.sub);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(first_event_type(f[2]), "AllBlocksCleared");
}

TEST(EventPublisher, BadOptionsAreRefusedWithTheirName) {
  EventPublisherOptions o;
  auto p = EventPublisher::create(0, o);
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("block_size"), std::string::npos);
  o.send_hwm = 0;
  p = EventPublisher::create(4, o);
  EXPECT_NE(p.status().message().find("send_hwm"), std::string::npos);
  o = {};
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.replay_buffer = 0;
  p = EventPublisher::create(4, o);
  EXPECT_NE(p.status().message().find("replay_buffer"), std::string::npos);
  o = {};
  o.data_parallel_rank = -2;
  EXPECT_EQ(EventPublisher::create(4, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(EventPublisher, EndpointInUseIsUnavailable) {
  auto a = EventPublisher::create(4, {});
  ASSERT_OK(a);
  EventPublisherOptions o;
  o.endpoint = (*a)->endpoint();
  auto b = EventPublisher::create(4, o);
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(b.status().message().find((*a)->endpoint()), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace pagedkv
