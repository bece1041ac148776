// EventPublisher: the PUB socket (owner thread) and the replay ROUTER socket (its own thread).
// Messages are encoded once; the replay buffer keeps the same bytes, so a replayed message is
// byte-identical to the published one.
#include "pagedkv/event_publisher.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/logging.hpp"
#include "events/replay_buffer.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/events/wire.hpp"
#include "pagedkv/model_cache.hpp"

namespace pagedkv {

namespace {

double wall_clock_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// How long the replay thread waits for a request before it checks whether to stop.
constexpr int kReplayPollMs = 50;

}  // namespace

struct EventPublisher::Impl {
  EventPublisherOptions options;
  events::WireOptions wire;
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::unique_ptr<zmq::socket_t> router;  // null without a replay endpoint
  std::string endpoint;
  std::string replay_endpoint;
  std::unique_ptr<events::ReplayBuffer> buffer;
  std::thread replay_thread;
  std::atomic<bool> stop{false};
  bool resync_next = false;  // a failed publish lost events: the next message starts with a clear
  std::string payload;       // reused between publishes
  mutable std::mutex counters_mutex;
  EventPublisherCounters counters;

  void serve_replay();
  void answer(const zmq::message_t& identity, int64_t start);
  // Encodes `events` with `wire_options` and sends them as the next message (publish()).
  StatusOr<int64_t> send(const std::vector<ControlEvent>& events,
                         const events::WireOptions& wire_options);
};

void EventPublisher::Impl::answer(const zmq::message_t& identity, int64_t start) {
  const events::ReplayBuffer::Reply reply = buffer->from(start);
  auto send = [&](const std::string& seq, const std::string& body) {
    router->send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore);
    router->send(zmq::message_t(), zmq::send_flags::sndmore);
    router->send(zmq::buffer(seq), zmq::send_flags::sndmore);
    router->send(zmq::buffer(body), zmq::send_flags::none);
  };
  if (reply.resync) {
    // The reader missed messages nobody keeps any more: tell it to drop what it knows.
    ControlEvent cleared;
    cleared.kind = EventKind::kEventsDropped;
    std::string body;
    const double ts = options.clock ? options.clock() : wall_clock_seconds();
    if (events::encode_batch({cleared}, ts, wire, &body).ok()) {
      send(events::sequence_bytes(start), body);
    }
  }
  for (const auto& m : reply.messages) send(events::sequence_bytes(m.first), m.second);
  send(events::sequence_bytes(-1), std::string());  // end marker, as vLLM sends it
  std::lock_guard<std::mutex> lock(counters_mutex);
  ++counters.replay_requests;
  if (reply.resync) ++counters.replay_resyncs;
}

void EventPublisher::Impl::serve_replay() {
  while (!stop.load(std::memory_order_relaxed)) {
    std::vector<zmq::message_t> frames;
    try {
      const auto n = zmq::recv_multipart(*router, std::back_inserter(frames));
      if (!n) continue;  // timed out: look at the stop flag again
      // [identity, empty delimiter, 8-byte big-endian start]: what a REQ or DEALER reader sends.
      if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
        std::lock_guard<std::mutex> lock(counters_mutex);
        ++counters.bad_requests;
        continue;
      }
      uint64_t start = 0;
      const auto* b = static_cast<const unsigned char*>(frames[2].data());
      for (int i = 0; i < 8; ++i) start = (start << 8) | b[i];
      const auto s =
          start > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(start);
      answer(frames[0], s);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      detail::logger().warn("EventPublisher: replay: {}", e.what());
    }
  }
}

EventPublisher::EventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EventPublisher::~EventPublisher() {
  impl_->stop.store(true);
  if (impl_->replay_thread.joinable()) impl_->replay_thread.join();
}

StatusOr<std::unique_ptr<EventPublisher>> EventPublisher::create(
    int32_t block_size, const EventPublisherOptions& options) {
  if (block_size < 1) {
    return invalid_argument("EventPublisher: block_size must be >= 1, got " +
                            std::to_string(block_size));
  }
  if (options.data_parallel_rank < 0) {
    return invalid_argument("EventPublisher: data_parallel_rank must be >= 0, got " +
                            std::to_string(options.data_parallel_rank));
  }
  if (options.send_hwm < 1) {
    return invalid_argument("EventPublisher: send_hwm must be >= 1, got " +
                            std::to_string(options.send_hwm));
  }
  if (options.endpoint.empty()) return invalid_argument("EventPublisher: endpoint is empty");
  if (!options.replay_endpoint.empty() && options.replay_buffer < 1) {
    return invalid_argument("EventPublisher: replay_buffer must be >= 1 with a replay endpoint");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->wire.block_size = block_size;
  impl->wire.data_parallel_rank = options.data_parallel_rank;
  try {
    impl->pub.set(zmq::sockopt::linger, 0);
    impl->pub.set(zmq::sockopt::sndhwm, options.send_hwm);
    impl->pub.bind(options.endpoint);
    impl->endpoint = impl->pub.get(zmq::sockopt::last_endpoint);
    if (!options.replay_endpoint.empty()) {
      impl->router = std::make_unique<zmq::socket_t>(impl->context, zmq::socket_type::router);
      impl->router->set(zmq::sockopt::linger, 0);
      impl->router->set(zmq::sockopt::sndhwm, 0);  // a replay may be the whole buffer
      impl->router->set(zmq::sockopt::rcvtimeo, kReplayPollMs);
      impl->router->bind(options.replay_endpoint);
      impl->replay_endpoint = impl->router->get(zmq::sockopt::last_endpoint);
      impl->buffer = std::make_unique<events::ReplayBuffer>(options.replay_buffer);
    }
  } catch (const zmq::error_t& e) {
    return unavailable(std::string("EventPublisher: cannot bind ") +
                       (impl->endpoint.empty() ? options.endpoint : options.replay_endpoint) +
                       ": " + e.what());
  }
  if (impl->router) {
    Impl* raw = impl.get();
    impl->replay_thread = std::thread([raw] { raw->serve_replay(); });
  }
  return std::unique_ptr<EventPublisher>(new EventPublisher(std::move(impl)));
}

StatusOr<int64_t> EventPublisher::publish(KvCache& cache) {
  // Checked before draining, for one group too: the encoder would refuse the stores only after
  // the events were drained, and lose them.
  if (cache.config().block_size != impl_->wire.block_size) {
    return invalid_argument("EventPublisher: the cache's block_size is " +
                            std::to_string(cache.config().block_size) + ", the publisher's " +
                            std::to_string(impl_->wire.block_size));
  }
  if (cache.num_groups() == 1) return publish(cache.drain_events());
  // Several groups: each block event names its group on the wire.
  return publish(cache.drain_events(), events::wire_groups(cache.config()));
}

StatusOr<int64_t> EventPublisher::publish(ModelKvCache& model) { return publish(model.cache()); }

StatusOr<int64_t> EventPublisher::publish(const std::vector<ControlEvent>& events,
                                          const std::vector<events::WireGroup>& groups) {
  // A copy: the replay thread reads impl_->wire for its resync answers.
  events::WireOptions wire = impl_->wire;
  wire.groups = groups;
  return impl_->send(events, wire);
}

StatusOr<int64_t> EventPublisher::publish(const std::vector<ControlEvent>& events) {
  return impl_->send(events, impl_->wire);
}

StatusOr<int64_t> EventPublisher::Impl::send(const std::vector<ControlEvent>& events,
                                             const events::WireOptions& wire_options) {
  Impl& m = *this;
  const std::vector<ControlEvent>* batch = &events;
  std::vector<ControlEvent> with_clear;
  if (m.resync_next) {
    with_clear.reserve(events.size() + 1);
    with_clear.emplace_back();
    with_clear.back().kind = EventKind::kEventsDropped;
    with_clear.insert(with_clear.end(), events.begin(), events.end());
    batch = &with_clear;
  }
  events::WireCounts counts;
  const double ts = m.options.clock ? m.options.clock() : wall_clock_seconds();
  Status s = events::encode_batch(*batch, ts, wire_options, &m.payload, &counts);
  if (!s.ok()) {
    m.resync_next = true;
    return s;
  }
  if (counts.total() == 0) {
    std::lock_guard<std::mutex> lock(m.counters_mutex);
    m.counters.skipped += counts.skipped;
    return int64_t{0};
  }
  int64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(m.counters_mutex);
    seq = m.counters.messages;
  }
  try {
    m.pub.send(zmq::buffer(m.options.topic), zmq::send_flags::sndmore);
    m.pub.send(zmq::buffer(events::sequence_bytes(seq)), zmq::send_flags::sndmore);
    m.pub.send(zmq::buffer(m.payload), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    m.resync_next = true;
    return unavailable(std::string("EventPublisher: send failed: ") + e.what());
  }
  m.resync_next = false;
  if (m.buffer) m.buffer->push(seq, m.payload);
  std::lock_guard<std::mutex> lock(m.counters_mutex);
  ++m.counters.messages;
  m.counters.events += counts.total();
  m.counters.bytes += static_cast<int64_t>(m.payload.size());
  m.counters.skipped += counts.skipped;
  return counts.total();
}

const std::string& EventPublisher::endpoint() const { return impl_->endpoint; }
const std::string& EventPublisher::replay_endpoint() const { return impl_->replay_endpoint; }

EventPublisherCounters EventPublisher::counters() const {
  std::lock_guard<std::mutex> lock(impl_->counters_mutex);
  return impl_->counters;
}

}  // namespace pagedkv
