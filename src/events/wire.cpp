// KVEventBatch encoding. The layout follows vLLM's msgspec structs byte for byte: the batch is
// array_like (a 3-element array), each event a tagged map whose "type" key comes first and whose
// fields follow in declaration order; fields with a default that holds it are omitted
// (omit_defaults), fields without one are always written, nil included. msgpack-c picks the
// shortest integer form, as msgspec does, so a decoded and re-encoded batch is the same bytes.
#include "pagedkv/events/wire.hpp"

#include <algorithm>
#include <cstring>

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

#include "core/prefix_index.hpp"

namespace pagedkv::events {

namespace {

// msgpack-c writes through any type with write(const char*, size_t).
struct StringSink {
  std::string* out;
  void write(const char* data, size_t size) { out->append(data, size); }
};

using Packer = msgpack::packer<StringSink>;

// float64 (0xcb + 8 bytes big-endian) always, as msgspec writes a Python float: msgpack-c's
// pack_double would write an integral value such as 2.0 as the integer 2.
void pack_float64(std::string* out, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  out->push_back(static_cast<char>(0xcb));
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(bits >> (56 - 8 * i)));
}

void pack_str(Packer& pk, const char* s) {
  const size_t n = std::char_traits<char>::length(s);
  pk.pack_str(static_cast<uint32_t>(n));
  pk.pack_str_body(s, static_cast<uint32_t>(n));
}

// A batch of a hybrid model: block events say which group they belong to.
bool tags_groups(const WireOptions& o) { return o.groups.size() > 1; }

// BlockStored {type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
// lora_name}: the eight fields of vLLM's struct that have no default. A hybrid model's events
// add, after `extra_keys` (None: omitted), `group_idx`, `kv_cache_spec_kind` and
// `kv_cache_spec_sliding_window`, each omitted where vLLM leaves it None.
void pack_stored(Packer& pk, const ControlEvent& e, const WireOptions& o) {
  const WireGroup* g = tags_groups(o) ? &o.groups[static_cast<size_t>(e.group)] : nullptr;
  const uint32_t group_fields =
      g == nullptr ? 0u : 1u + (g->kind.empty() ? 0u : 1u) + (g->sliding_window > 0 ? 1u : 0u);
  pk.pack_map(8 + group_fields);
  pack_str(pk, "type");
  pack_str(pk, "BlockStored");
  pack_str(pk, "block_hashes");
  pk.pack_array(1);
  pk.pack_uint64(e.block_hash);
  pack_str(pk, "parent_block_hash");
  if (e.parent_hash == root_hash(e.ns)) {
    pk.pack_nil();  // a first block: vLLM sends no parent
  } else {
    pk.pack_uint64(e.parent_hash);
  }
  pack_str(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(e.tokens.size()));
  for (TokenId t : e.tokens) pk.pack_int32(t);
  pack_str(pk, "block_size");
  pk.pack_int32(o.block_size);
  pack_str(pk, "lora_id");
  if (e.ns == 0) {
    pk.pack_nil();
  } else {
    pk.pack_uint64(e.ns);
  }
  pack_str(pk, "medium");
  pack_str(pk, medium_name(e.tier));
  pack_str(pk, "lora_name");
  pk.pack_nil();
  if (g == nullptr) return;
  pack_str(pk, "group_idx");
  pk.pack_int32(e.group);
  if (!g->kind.empty()) {
    pack_str(pk, "kv_cache_spec_kind");
    pack_str(pk, g->kind.c_str());
  }
  if (g->sliding_window > 0) {
    pack_str(pk, "kv_cache_spec_sliding_window");
    pk.pack_int32(g->sliding_window);
  }
}

// BlockRemoved {type, block_hashes, medium}, plus `group_idx` for a hybrid model.
void pack_removed(Packer& pk, const ControlEvent& e, const WireOptions& o) {
  pk.pack_map(tags_groups(o) ? 4 : 3);
  pack_str(pk, "type");
  pack_str(pk, "BlockRemoved");
  pack_str(pk, "block_hashes");
  pk.pack_array(1);
  pk.pack_uint64(e.block_hash);
  pack_str(pk, "medium");
  pack_str(pk, medium_name(e.tier));
  if (!tags_groups(o)) return;
  pack_str(pk, "group_idx");
  pk.pack_int32(e.group);
}

void pack_cleared(Packer& pk) {
  pk.pack_map(1);
  pack_str(pk, "type");
  pack_str(pk, "AllBlocksCleared");
}

}  // namespace

const char* medium_name(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "GPU";
    case Tier::kHost:
      return "CPU";
    case Tier::kStorage:
      return "DISK";
  }
  return "GPU";
}

std::vector<WireGroup> wire_groups(const CacheConfig& config) {
  auto describe = [](KvKind kind, int32_t window) {
    const bool latent = kind == KvKind::kLatent;
    WireGroup w;
    if (window > 0) {
      w.kind = latent ? "sliding_window_mla" : "sliding_window";
      w.sliding_window = window;
    } else {
      w.kind = latent ? "mla_attention" : "full_attention";
    }
    return w;
  };
  std::vector<WireGroup> out;
  if (config.groups.empty()) out.push_back(describe(config.kv_kind, config.sliding_window));
  for (const KvGroup& g : config.groups) out.push_back(describe(g.kv_kind, g.sliding_window));
  return out;
}

uint64_t root_hash(NamespaceId ns) { return core::PrefixIndex::root_hash(ns); }

std::string sequence_bytes(int64_t seq) {
  std::string b(8, '\0');
  const auto u = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<char>(u >> (56 - 8 * i));
  return b;
}

Status encode_batch(const std::vector<ControlEvent>& events, double timestamp,
                    const WireOptions& options, std::string* out, WireCounts* counts) {
  if (out == nullptr) return invalid_argument("encode_batch: out is null");
  if (options.block_size < 1) {
    return invalid_argument("encode_batch: block_size must be >= 1, got " +
                            std::to_string(options.block_size));
  }
  if (options.data_parallel_rank < 0) {
    return invalid_argument("encode_batch: data_parallel_rank must be >= 0, got " +
                            std::to_string(options.data_parallel_rank));
  }
  const size_t num_groups = std::max<size_t>(options.groups.size(), 1);
  WireCounts c;
  for (size_t i = 0; i < events.size(); ++i) {
    const ControlEvent& e = events[i];
    if (e.group < 0 || static_cast<size_t>(e.group) >= num_groups) {
      return invalid_argument("encode_batch: event " + std::to_string(i) + " belongs to group " +
                              std::to_string(e.group) + ", the batch has " +
                              std::to_string(num_groups) + " group(s)");
    }
    if (e.kind == EventKind::kBlockStored &&
        e.tokens.size() != static_cast<size_t>(options.block_size)) {
      return invalid_argument("encode_batch: event " + std::to_string(i) + " stores " +
                              std::to_string(e.tokens.size()) + " tokens, block_size is " +
                              std::to_string(options.block_size));
    }
    switch (e.kind) {
      case EventKind::kBlockStored:
        ++c.stored;
        break;
      case EventKind::kBlockRemoved:
        ++c.removed;
        break;
      case EventKind::kEventsDropped:
        ++c.cleared;
        break;
      default:
        ++c.skipped;
        break;
    }
  }
  std::string bytes;
  StringSink sink{&bytes};
  Packer pk(sink);
  pk.pack_array(3);
  pack_float64(&bytes, timestamp);
  pk.pack_array(static_cast<uint32_t>(c.total()));
  for (const ControlEvent& e : events) {
    switch (e.kind) {
      case EventKind::kBlockStored:
        pack_stored(pk, e, options);
        break;
      case EventKind::kBlockRemoved:
        pack_removed(pk, e, options);
        break;
      case EventKind::kEventsDropped:
        pack_cleared(pk);
        break;
      default:
        break;  // sequence events: not in vLLM's format
    }
  }
  pk.pack_int32(options.data_parallel_rank);
  *out = std::move(bytes);
  if (counts != nullptr) *counts = c;
  return ok_status();
}

}  // namespace pagedkv::events
