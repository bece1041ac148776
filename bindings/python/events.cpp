// pagedkv._C.EventPublisher: a cache's block events on a ZeroMQ PUB socket in vLLM's format
// (docs/events.md). Compiled only when the extension links pagedkv_events (PAGEDKV_BUILD_EVENTS).
#include <nanobind/stl/string.h>

#include <climits>
#include <memory>
#include <mutex>
#include <string>

#include "common.hpp"
#include "pagedkv/event_publisher.hpp"

namespace pagedkv::python {
namespace {

/// The object Python holds. publish() drains a cache on the calling thread and sends on the PUB
/// socket, which is not thread-safe: `mu` serializes the calls (taken before the cache's lock)
/// and close().
struct PyEventPublisher {
  std::unique_ptr<EventPublisher> pub;  // null once closed
  std::mutex mu;
  std::string endpoint, replay_endpoint;  // as bound; kept after close()

  ~PyEventPublisher() { close(); }

  /// Stops the replay thread and closes the sockets; later calls raise FailedPreconditionError.
  void close() {
    nb::gil_scoped_release release;  // joins the replay thread; waits for a publish()
    std::lock_guard<std::mutex> lock(mu);
    pub.reset();
  }
  /// Runs `fn(EventPublisher&)` without the GIL and under `mu`; kFailedPrecondition once closed.
  template <typename Fn>
  auto locked(Fn&& fn) -> decltype(fn(*pub)) {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu);
    if (!pub) return failed_precondition("EventPublisher: closed");
    return fn(*pub);
  }
};

void init_publisher(PyEventPublisher* self, int32_t block_size, const std::string& endpoint,
                    const std::string& replay_endpoint, const std::string& topic,
                    int32_t data_parallel_rank, int64_t replay_buffer, int64_t send_hwm) {
  // The C++ fields are size_t and int: a negative or huge value is refused here rather than
  // wrapped around (create() checks the rest).
  if (replay_buffer < 0) {
    throw_invalid("EventPublisher: replay_buffer must be >= 1, got " +
                  std::to_string(replay_buffer));
  }
  if (send_hwm < 1 || send_hwm > INT32_MAX) {
    throw_invalid("EventPublisher: send_hwm must be in [1, 2^31), got " + std::to_string(send_hwm));
  }
  EventPublisherOptions o;
  o.endpoint = endpoint;
  o.replay_endpoint = replay_endpoint;
  o.topic = topic;
  o.data_parallel_rank = data_parallel_rank;
  o.replay_buffer = static_cast<size_t>(replay_buffer);
  o.send_hwm = static_cast<int>(send_hwm);
  auto made = [&] {
    nb::gil_scoped_release release;  // binds sockets, starts the replay thread
    return EventPublisher::create(block_size, o);
  }();
  if (!made.ok()) throw StatusError(made.status());
  new (self) PyEventPublisher();
  self->pub = std::move(made).value();
  self->endpoint = self->pub->endpoint();
  self->replay_endpoint = self->pub->replay_endpoint();
}

KvCache& cpp(PyCache& c) { return *c.kv; }
ModelKvCache& cpp(PyModelCache& c) { return *c.model; }

/// publish(cache) of a KvCache or ModelKvCache wrapper: the publisher's lock, then the cache's
/// (the order every caller takes them in), without the GIL.
template <typename Wrapper>
int64_t publish(PyEventPublisher& self, Wrapper& cache) {
  return value_or_throw(self.locked([&](EventPublisher& pub) -> StatusOr<int64_t> {
    std::lock_guard<std::mutex> lock(cache.mu);
    return pub.publish(cpp(cache));
  }));
}

nb::dict counters_dict(const EventPublisherCounters& c) {
  nb::dict d;
  d["messages"] = c.messages;
  d["events"] = c.events;
  d["bytes"] = c.bytes;
  d["skipped"] = c.skipped;
  d["replay_requests"] = c.replay_requests;
  d["replay_resyncs"] = c.replay_resyncs;
  d["bad_requests"] = c.bad_requests;
  return d;
}

}  // namespace

void register_events(nb::module_& m) {
  nb::class_<PyEventPublisher> cls(
      m, "EventPublisher",
      "Publishes a cache's block events on a ZeroMQ PUB socket in vLLM's KVEventBatch format, "
      "for KV-aware routers (docs/events.md). Each publish(cache) drains the cache's events "
      "and sends one message [topic, 8-byte big-endian sequence number, msgpack batch]; "
      "numbers start at 0 and have no gaps. With a replay_endpoint, a ROUTER socket serves "
      "readers that missed messages.");
  cls.def("__init__", &init_publisher, nb::arg("block_size"),
          nb::arg("endpoint") = "tcp://127.0.0.1:*", nb::arg("replay_endpoint") = "",
          nb::arg("topic") = "", nb::arg("data_parallel_rank") = 0,
          nb::arg("replay_buffer") = 10000, nb::arg("send_hwm") = 100000,
          "Binds the PUB socket at `endpoint` (port '*': a free port, see .endpoint) and, when "
          "`replay_endpoint` is not empty, the ROUTER socket for replay requests, keeping the "
          "last `replay_buffer` messages. `block_size` must be the caches'. InvalidArgumentError "
          "for a bad option (block_size < 1, a negative data_parallel_rank, send_hwm < 1, "
          "replay_buffer < 1 with a replay_endpoint); UnavailableError when an endpoint cannot be "
          "bound.");
  cls.def(
      "publish", [](PyEventPublisher& s, PyCache& cache) { return publish(s, cache); },
      nb::arg("cache"),
      "Drains the KvCache's events and sends them as one message (none when no event goes on "
      "the wire); returns the number of wire events sent. InvalidArgumentError when the cache's "
      "block_size is not the publisher's (nothing drained); UnavailableError when ZeroMQ refuses "
      "the send (the drained events are lost and the next message starts with "
      "AllBlocksCleared).");
  cls.def(
      "publish", [](PyEventPublisher& s, PyModelCache& model) { return publish(s, model); },
      nb::arg("cache"),
      "Drains every group's events of the ModelKvCache and sends them as one message; with two "
      "or more groups each block event carries group_idx (stored ones also kv_cache_spec_kind "
      "and kv_cache_spec_sliding_window).");
  cls.def_ro("endpoint", &PyEventPublisher::endpoint,
             "The bound PUB endpoint, e.g. 'tcp://127.0.0.1:41234'.");
  cls.def_ro("replay_endpoint", &PyEventPublisher::replay_endpoint,
             "The bound replay (ROUTER) endpoint; '' without one.");
  cls.def(
      "counters",
      [](PyEventPublisher& s) {
        return counters_dict(value_or_throw(s.locked(
            [](EventPublisher& p) -> StatusOr<EventPublisherCounters> { return p.counters(); })));
      },
      "What the publisher has done as a dict: messages (the next sequence number), events, "
      "bytes (payload), skipped (sequence events not sent), replay_requests, replay_resyncs, "
      "bad_requests.");
  cls.def_prop_ro(
      "closed",
      [](PyEventPublisher& s) {
        nb::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(s.mu);
        return s.pub == nullptr;
      },
      "Whether close() was called.");
  cls.def("close", &PyEventPublisher::close,
          "Stops the replay thread and closes the sockets (unsent messages are dropped); "
          "idempotent. Later calls raise FailedPreconditionError.");
  cls.def(
      "__enter__", [](nb::handle self) { return nb::borrow(self); }, "Returns the publisher.");
  cls.def(
      "__exit__",
      [](PyEventPublisher& s, nb::handle, nb::handle, nb::handle) {
        s.close();
        return false;
      },
      nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
      "close().");
}

}  // namespace pagedkv::python
