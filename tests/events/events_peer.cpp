// pagedkv_events_peer: a KvCache with an EventPublisher on 127.0.0.1, driven line by line on
// stdin by the Python consumer tests (subscriber_test.py, model_subscriber_test.py,
// dynamo_bridge_test.py), which start it, read the endpoints it prints, and stop it. Every
// command publishes what it caused and answers one line: "ok key=value ..." or "error <message>".
//
//   workload <seed> <min_wire_events>   random adds, extends, finishes, erases, offloads,
//                                       restores and prefetches under pressure, until at least
//                                       that many wire events were published
//   add <id> <ns> <token...>            add_sequence, reserve and commit the uncached rest
//   finish|erase|offload|restore <id>
//   query <ns> <token...>               add_sequence of a scratch sequence, then finish it
//                                       (erase would drop the cached blocks it matched):
//                                       answers the prefix-hit blocks pagedkv's index found
//   quit
//
// With --model, the cache is a two-group ModelKvCache (group 0 full attention, group 1 a sliding
// window of 4 blocks, each with the --device-blocks and --host-blocks pools) and its events go
// out tagged with their group (model_subscriber_test.py); answers' counts are the groups' sums.
//
// With --storage-dir DIR, a FileTier on DIR sits behind the host tier (storage_subscriber_test.py):
// every add first fetches the prompt's blocks from storage (and waits for them), and every command
// then hands finished write-backs to the store (poll_storage; flush_storage every 8th workload op,
// so puts finish in every order); answers also give storage_written and storage_hits.
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/event_publisher.hpp"
#include "pagedkv/model_cache.hpp"
#include "pagedkv/storage_tier.hpp"

namespace {

using namespace pagedkv;

ControlStats stats_of(const KvCache& kv) { return kv.stats(); }

ControlStats stats_of(const ModelKvCache& m) { return m.stats(); }

// The storage tier's calls: a ModelKvCache peer has none.
Status fetch(KvCache& kv, const std::vector<TokenId>& t, const SequenceOptions& o) {
  PAGEDKV_RETURN_IF_ERROR(kv.fetch_from_storage(t, o).status());
  return kv.flush_storage();
}
Status fetch(ModelKvCache&, const std::vector<TokenId>&, const SequenceOptions&) {
  return ok_status();
}
Status settle_storage(KvCache& kv, bool flush) {
  return flush ? kv.flush_storage() : kv.poll_storage();
}
Status settle_storage(ModelKvCache&, bool) { return ok_status(); }

template <typename Cache>
struct Peer {
  std::unique_ptr<StorageTier> store;  // outlives kv (declared first: destroyed last)
  std::unique_ptr<Cache> kv;
  std::unique_ptr<EventPublisher> pub;
  int64_t settles = 0;           // storage settles of workload ops
  std::vector<SequenceId> live;  // workload sequences
  SequenceId next_id = 1000000;

  Status publish() { return pub->publish(*kv).status(); }

  // add + reserve + commit of the uncached part; erases the sequence when it cannot be had.
  Status add(SequenceId id, NamespaceId ns, const std::vector<TokenId>& tokens, int64_t* cached) {
    SequenceOptions o;
    o.ns = ns;
    if (store != nullptr) PAGEDKV_RETURN_IF_ERROR(fetch(*kv, tokens, o));
    PAGEDKV_ASSIGN_OR_RETURN(int64_t c, kv->add_sequence(id, tokens, o));
    if (cached) *cached = c;
    const std::vector<TokenId> rest(tokens.begin() + c, tokens.end());
    auto slots = kv->reserve(id, static_cast<int64_t>(rest.size()));
    if (!slots.ok()) {
      (void)kv->erase(id);
      return slots.status();
    }
    return kv->commit(id, rest);
  }

  void workload_op(std::mt19937_64& rng) {
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    const int op = static_cast<int>(rng() % 100);
    if (live.size() < 3 || op < 30) {
      // A prompt that often starts with one of a few shared prefixes.
      const NamespaceId ns = rng() % 4 == 0 ? 3 : 0;
      std::vector<TokenId> t;
      const size_t prefix = pick(6);
      if (prefix < 4) {
        for (int i = 0; i < 8 + 4 * static_cast<int>(prefix); ++i) t.push_back(100 * prefix + i);
      }
      const size_t extra = 1 + pick(20);
      for (size_t i = 0; i < extra; ++i) t.push_back(static_cast<TokenId>(rng() % 50000));
      const SequenceId id = next_id++;
      if (add(id, ns, t, nullptr).ok()) live.push_back(id);
      if (live.size() > 14) {  // keep the live set bounded: finish the oldest
        (void)kv->finish(live.front());
        live.erase(live.begin());
      }
      return;
    }
    const size_t i = pick(live.size());
    const SequenceId id = live[i];
    if (op < 55) {  // extend by 1-3 tokens
      const int64_t n = 1 + static_cast<int64_t>(pick(3));
      std::vector<TokenId> t;
      for (int64_t k = 0; k < n; ++k) t.push_back(static_cast<TokenId>(rng() % 50000));
      if (kv->reserve(id, n).ok()) (void)kv->commit(id, t);
    } else if (op < 70) {
      (void)kv->finish(id);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op < 76) {
      (void)kv->erase(id);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op < 88) {
      (void)kv->offload(id);
    } else if (op < 95) {
      (void)kv->restore(id);
    } else {
      (void)kv->prefetch({id});
    }
    // Sequences the cache dropped to make room are gone.
    for (SequenceId gone : kv->drain_evicted_sequences()) {
      for (size_t k = 0; k < live.size(); ++k) {
        if (live[k] == gone) {
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
      }
    }
  }

  std::string run(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    std::ostringstream out;
    Status s;
    if (cmd == "workload") {
      uint64_t seed = 0;
      int64_t min_events = 0;
      in >> seed >> min_events;
      std::mt19937_64 rng(seed);
      const EventPublisherCounters before = pub->counters();
      int64_t ops = 0;
      while (s.ok() && pub->counters().events - before.events < min_events) {
        workload_op(rng);
        ++ops;
        if (store != nullptr) s = settle_storage(*kv, ++settles % 8 == 0);
        if (s.ok()) s = publish();
      }
      const EventPublisherCounters after = pub->counters();
      out << "ok ops=" << ops << " events=" << after.events - before.events
          << " messages=" << after.messages - before.messages << " last_seq=" << after.messages - 1;
    } else if (cmd == "add" || cmd == "query") {
      SequenceId id = 0;
      NamespaceId ns = 0;
      if (cmd == "add") in >> id;
      in >> ns;
      std::vector<TokenId> t;
      for (TokenId x; in >> x;) t.push_back(x);
      if (cmd == "add") {
        int64_t cached = 0;
        s = add(id, ns, t, &cached);
        if (s.ok()) out << "ok cached=" << cached;
      } else {
        const ControlStats a = stats_of(*kv);
        SequenceOptions o;
        o.ns = ns;
        auto c = kv->add_sequence(next_id, t, o);
        s = c.status();
        if (s.ok()) {
          const ControlStats b = stats_of(*kv);
          s = kv->finish(next_id);
          out << "ok hit_blocks=" << b.prefix_hit_blocks - a.prefix_hit_blocks
              << " host_hit_blocks=" << b.prefix_host_hit_blocks - a.prefix_host_hit_blocks
              << " cached=" << *c;
        }
        ++next_id;
      }
    } else if (cmd == "finish" || cmd == "erase" || cmd == "offload" || cmd == "restore") {
      SequenceId id = 0;
      in >> id;
      s = cmd == "finish"    ? kv->finish(id)
          : cmd == "erase"   ? kv->erase(id)
          : cmd == "offload" ? kv->offload(id)
                             : kv->restore(id);
      if (s.ok()) out << "ok";
    } else {
      return "error unknown command: " + line;
    }
    if (s.ok() && store != nullptr && cmd != "workload") s = settle_storage(*kv, true);
    if (s.ok()) s = publish();
    if (!s.ok()) return "error " + s.message();
    const ControlStats st = stats_of(*kv);
    out << " demoted=" << st.blocks_demoted << " host_dropped=" << st.host_blocks_dropped
        << " evicted_blocks=" << st.blocks_evicted << " offloaded=" << st.blocks_offloaded
        << " restored=" << st.blocks_restored;
    if (store != nullptr) {
      out << " storage_written=" << st.storage_blocks_written
          << " storage_hits=" << st.storage_hit_blocks;
    }
    return out.str();
  }
};

int64_t arg(int argc, char** argv, const std::string& name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return std::stoll(argv[i + 1]);
  }
  return def;
}

std::string text_arg(int argc, char** argv, const std::string& name) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return argv[i + 1];
  }
  return "";
}

bool has_flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (name == argv[i]) return true;
  }
  return false;
}

template <typename Cache>
int serve(Peer<Cache>& peer, int argc, char** argv, int32_t block_size) {
  EventPublisherOptions o;
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.replay_buffer = static_cast<size_t>(arg(argc, argv, "--replay-buffer", 10000));
  auto pub = EventPublisher::create(block_size, o);
  if (!pub.ok()) {
    std::cerr << "events_peer: " << pub.status().message() << "\n";
    return 1;
  }
  peer.pub = std::move(*pub);
  std::cout << "ready endpoint=" << peer.pub->endpoint()
            << " replay=" << peer.pub->replay_endpoint() << " block_size=" << block_size
            << std::endl;
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "quit") break;
    std::cout << peer.run(line) << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = static_cast<int32_t>(arg(argc, argv, "--block-size", 4));
  c.num_device_blocks = arg(argc, argv, "--device-blocks", 24);
  c.num_host_blocks = arg(argc, argv, "--host-blocks", 32);
  c.max_sequence_length = 256;
  c.backend = BackendKind::kCpu;
  if (has_flag(argc, argv, "--model")) {
    c.num_layers = 2;
    KvGroup full;
    full.name = "full";
    full.layers = {0};
    full.num_kv_heads = 1;
    full.head_dim = 8;
    full.num_device_blocks = c.num_device_blocks;
    full.num_host_blocks = c.num_host_blocks;
    KvGroup window = full;
    window.name = "window";
    window.layers = {1};
    window.sliding_window = 4 * c.block_size;
    c.groups = {full, window};
    Peer<ModelKvCache> peer;
    auto m = ModelKvCache::create(c);
    if (!m.ok()) {
      std::cerr << "events_peer: " << m.status().message() << "\n";
      return 1;
    }
    peer.kv = std::move(*m);
    return serve(peer, argc, argv, c.block_size);
  }
  Peer<KvCache> peer;
  KvCacheOptions options;
  const std::string dir = text_arg(argc, argv, "--storage-dir");
  if (!dir.empty()) {
    FileTierOptions fo;
    fo.directory = dir;
    auto store = make_file_tier(StorageLayout::from_config(c, "events-peer"), fo);
    if (!store.ok()) {
      std::cerr << "events_peer: " << store.status().message() << "\n";
      return 1;
    }
    peer.store = std::move(*store);
    options.storage = peer.store.get();
  }
  auto kv = KvCache::create(c, options);
  if (!kv.ok()) {
    std::cerr << "events_peer: " << kv.status().message() << "\n";
    return 1;
  }
  peer.kv = std::move(*kv);
  return serve(peer, argc, argv, c.block_size);
}
