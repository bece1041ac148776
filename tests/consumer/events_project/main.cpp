// Uses the installed events component: a cache computes a prompt of three full blocks, a
// publisher bound to a free local port publishes its events as one message. Exits 0 when the
// message carried the three stored blocks.
#include <cstdio>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/event_publisher.hpp"

int main() {
  pagedkv::CacheConfig config;
  config.num_device_blocks = 8;
  auto cache = pagedkv::KvCache::create(config);
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.status().to_string().c_str());
    return 1;
  }
  pagedkv::KvCache& kv = **cache;
  std::vector<pagedkv::TokenId> prompt(3 * 16 + 1);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<pagedkv::TokenId>(100 + i);
  if (!kv.add_sequence(1, prompt).ok() ||
      !kv.reserve(1, static_cast<int64_t>(prompt.size())).ok() || !kv.commit(1, prompt).ok()) {
    return 1;
  }
  auto publisher = pagedkv::EventPublisher::create(config.block_size, {});
  if (!publisher.ok()) {
    std::fprintf(stderr, "%s\n", publisher.status().to_string().c_str());
    return 1;
  }
  auto sent = (*publisher)->publish(kv);
  if (!sent.ok()) return 1;
  const pagedkv::EventPublisherCounters c = (*publisher)->counters();
  std::printf("events consumer: %lld wire events in %lld message(s) on %s\n",
              static_cast<long long>(*sent), static_cast<long long>(c.messages),
              (*publisher)->endpoint().c_str());
  return *sent == 3 && c.messages == 1 ? 0 : 1;
}
