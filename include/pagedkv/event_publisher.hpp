// EventPublisher: publishes the block events of a KvCache, or of a hybrid model's ModelKvCache
// (each event tagged with its KV group), on a ZeroMQ PUB socket the way vLLM does,
// so KV-aware routers (Dynamo's KV router, llm-d, sgl-router) can follow which prefixes this
// cache holds and on which tier. Optional: built as pagedkv_events when ZeroMQ and msgpack are
// found (PAGEDKV_BUILD_EVENTS). docs/events.md describes the wire format.
//
// Each publish() drains the cache's events and sends one multipart message
// (topic, 8-byte big-endian sequence number, msgpack KVEventBatch); sequence numbers start at 0
// and have no gaps. With a replay endpoint, a ROUTER socket serves readers that missed messages:
// a request holding an 8-byte big-endian start number gets every buffered message from there,
// then an end marker (sequence -1, empty payload). The buffer keeps the last `replay_buffer`
// messages; a reader asking for older ones first gets a batch holding one AllBlocksCleared.
//
// publish() belongs to the cache's owner thread; the replay socket is served by the publisher's
// own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/control_types.hpp"
#include "pagedkv/events/wire.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

class KvCache;
class ModelKvCache;

/// Where and how to publish.
struct EventPublisherOptions {
  /// PUB endpoint to bind. Port "*" binds a free port (endpoint() names it).
  std::string endpoint = "tcp://127.0.0.1:*";
  /// ROUTER endpoint for replay requests to bind; empty: no replay socket.
  std::string replay_endpoint;
  /// Frame 1 of every message (vLLM's default is empty).
  std::string topic;
  /// `data_parallel_rank` of every batch.
  int32_t data_parallel_rank = 0;
  /// Messages kept for replay (>= 1 when replay_endpoint is set).
  size_t replay_buffer = 10000;
  /// ZeroMQ send high-water mark of the PUB socket, in messages (>= 1).
  int send_hwm = 100000;
  /// Batch timestamp in seconds; defaults to the wall clock (seconds since the Unix epoch).
  std::function<double()> clock;
};

/// What a publisher has done since it was created.
struct EventPublisherCounters {
  int64_t messages = 0;         // messages published (next sequence number)
  int64_t events = 0;           // wire events in them
  int64_t bytes = 0;            // payload bytes
  int64_t skipped = 0;          // sequence events drained but not published
  int64_t replay_requests = 0;  // well-formed replay requests served
  int64_t replay_resyncs = 0;   // of those, ones that asked for messages no longer buffered
  int64_t bad_requests = 0;     // malformed replay requests (ignored)
};

class EventPublisher {
 public:
  /// Binds the sockets and starts the replay thread. kInvalidArgument names a bad option
  /// (block_size < 1, a negative rank, replay_buffer or send_hwm < 1); kUnavailable when an
  /// endpoint cannot be bound (the ZeroMQ error says why).
  static StatusOr<std::unique_ptr<EventPublisher>> create(int32_t block_size,
                                                          const EventPublisherOptions& options);
  /// Stops the replay thread and closes the sockets (unsent messages are dropped).
  ~EventPublisher();
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  /// Drains `cache`'s events and publishes them as one message; nothing is sent when none of
  /// them goes on the wire. Returns the number of wire events sent. kInvalidArgument, nothing
  /// drained, when the cache's block_size is not the publisher's; on a later error the drained
  /// events are lost, so the next message starts with AllBlocksCleared (the reader resyncs).
  /// A cache of several groups: each block event carries its group as vLLM's `group_idx`
  /// (stored ones also the group's kind and window; docs/events.md).
  StatusOr<int64_t> publish(KvCache& cache);
  /// Publishes `events` as one message (see publish(KvCache&)). kInvalidArgument from the
  /// encoder (nothing sent); kUnavailable when ZeroMQ refuses the send.
  StatusOr<int64_t> publish(const std::vector<ControlEvent>& events);
  /// publish(model.cache()): a hybrid model's events, each block event with its group.
  StatusOr<int64_t> publish(ModelKvCache& model);
  /// Publishes `events` of the groups described by `groups` (indexed by ControlEvent::group;
  /// events::wire_groups gives them for a config) as one message. kInvalidArgument from the
  /// encoder, also for an event of a group outside `groups`.
  StatusOr<int64_t> publish(const std::vector<ControlEvent>& events,
                            const std::vector<events::WireGroup>& groups);

  /// The bound PUB endpoint, e.g. "tcp://127.0.0.1:41234".
  const std::string& endpoint() const;
  /// The bound replay endpoint ("" without one).
  const std::string& replay_endpoint() const;
  EventPublisherCounters counters() const;

 private:
  struct Impl;
  explicit EventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedkv
