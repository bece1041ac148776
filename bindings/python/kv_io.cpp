// K/V in and out of one group's cache, shared by KvCache and ModelKvCache: the write_kv inputs,
// the zero-copy pool views, the gather_layer outputs and the stats dict.
#include "common.hpp"
#include "pagedkv/layout.hpp"

namespace pagedkv::python {
namespace {

void put(nb::dict& d, const char* name, int64_t value) { d[name] = value; }

void put(nb::dict& d, const char* name, const TierStats& t) {
  nb::dict tier;
#ifdef PAGEDKV_TIER_STATS_FIELDS
#define PAGEDKV_PY_STAT_(type, field, doc) put(tier, #field, t.field);
  PAGEDKV_TIER_STATS_FIELDS(PAGEDKV_PY_STAT_)
#undef PAGEDKV_PY_STAT_
#else
  const std::pair<const char*, int64_t> fields[] = {
      {"total_blocks", t.total_blocks},   {"free_blocks", t.free_blocks},
      {"cached_blocks", t.cached_blocks}, {"used_blocks", t.used_blocks},
      {"total_bytes", t.total_bytes},     {"used_bytes", t.used_bytes}};
  for (const auto& [field, value] : fields) put(tier, field, value);
#endif
  d[name] = tier;
}

bool is_latent(const GroupRef& kv) { return kv.config().kv_kind == KvKind::kLatent; }

// [tokens, heads, dim], or with `layered` [every layer of the cache, tokens, heads, dim].
KvInput kv_input(const GroupRef& kv, nb::handle obj, const std::string& where, const char* what,
                 bool layered = false) {
  const std::string name = where + what;
  nb::ndarray<> a = as_array(obj, name.c_str());
  check_device(kv, a, name.c_str());
  const CacheConfig& c = kv.config();
  const size_t t = layered ? 1 : 0;  // the token axis
  if (a.ndim() != t + 3 || (layered && a.shape(0) != size_t(c.num_layers)) ||
      a.shape(t + 1) != size_t(c.num_kv_heads) || a.shape(t + 2) != size_t(c.head_dim)) {
    throw_invalid(name + ": shape must be [" +
                  (layered ? std::to_string(c.num_layers) + " layers, " : std::string()) +
                  "tokens, " + std::to_string(c.num_kv_heads) + ", " + std::to_string(c.head_dim) +
                  "]");
  }
  const size_t rows = a.shape(t);
  const int64_t row_elems = int64_t{c.num_kv_heads} * c.head_dim;
  if (rows > 0 && ((c.head_dim > 1 && a.stride(t + 2) != 1) ||
                   (c.num_kv_heads > 1 && a.stride(t + 1) != c.head_dim) ||
                   (rows > 1 && a.stride(t) < row_elems))) {
    throw_invalid(name + ": each token's [heads, dim] must be contiguous (any row stride)");
  }
  KvInput in{a,
             a.data(),
             from_dlpack(a.dtype(), name.c_str()),
             static_cast<int64_t>(rows),
             rows > 1 ? a.stride(t) : row_elems,
             a.device_type() == static_cast<int>(nb::device::cpu::value)};
  if (layered && a.shape(0) > 1 && rows > 0) {
    in.layer_stride = a.stride(0);
    // The last row of a layer must end before the next layer begins.
    if (in.layer_stride < (in.rows - 1) * in.row_stride + row_elems) {
      throw_invalid(name + ": layers overlap (layer stride " + std::to_string(in.layer_stride) +
                    " elements)");
    }
  }
  return in;
}

// A view of one layer's keys (or latents) or values of the whole pool, in the page layout's
// axis order. The block stride is a whole block of every layer and part.
DlArray pool_view(nb::handle owner, const GroupRef& kv, int32_t layer, KvPart part) {
  const PoolRef pool = kv.device_pool();
  const PoolLayout& l = pool.layout;
  const size_t elem = dtype_size(pool.dtype);
  const bool nhd = l.page_layout == PageLayout::kNHD;
  const size_t shape[4] = {size_t(pool.num_blocks), size_t(nhd ? l.block_size : l.num_kv_heads),
                           size_t(nhd ? l.num_kv_heads : l.block_size), size_t(l.head_dim)};
  const int64_t strides[4] = {l.block_elems(), nhd ? l.token_stride() : l.head_stride(),
                              nhd ? l.head_stride() : l.token_stride(), 1};
  char* base = static_cast<char*>(pool.data) + l.page_offset(0, layer, part) * int64_t(elem);
  return DlArray(base, 4, shape, owner, strides, to_dlpack(pool.dtype), backend_device_type(kv),
                 backend_device_id(kv));
}

std::pair<KvInput, KvInput> key_value_inputs(const GroupRef& kv, nb::handle key, nb::handle value,
                                             const std::string& where, bool layered) {
  if (is_latent(kv)) {
    // The pool has one page per layer (the latents): a value has nowhere to go.
    if (!value.is_none()) {
      throw_invalid(where + "value: a latent (MLA) cache stores no values; pass None");
    }
    return {kv_input(kv, key, where, "key", layered), KvInput{}};
  }
  if (value.is_none()) throw_invalid(where + "value: required (a key/value cache)");
  KvInput k = kv_input(kv, key, where, "key", layered);
  KvInput v = kv_input(kv, value, where, "value", layered);
  if (k.dtype != v.dtype || k.rows != v.rows || k.row_stride != v.row_stride ||
      k.layer_stride != v.layer_stride) {
    throw_invalid(where + "value: dtype, token count and strides must equal key's");
  }
  return {std::move(k), std::move(v)};
}

// kInvalidArgument unless the inputs hold a row per slot of the batch.
void check_batch_rows(const KvInput& k, size_t rows, const std::string& where) {
  if (k.rows != int64_t(rows)) {
    throw_invalid(where + "key: " + std::to_string(k.rows) + " rows, the batch has " +
                  std::to_string(rows) + " slots (len(slot_mapping))");
  }
}

}  // namespace

std::pair<KvInput, KvInput> kv_inputs(const GroupRef& kv, nb::handle key, nb::handle value,
                                      const std::string& where) {
  return key_value_inputs(kv, key, value, where, /*layered=*/false);
}

std::pair<KvInput, KvInput> kv_batch_inputs(const GroupRef& kv, nb::handle key, nb::handle value,
                                            size_t rows, const std::string& where) {
  std::pair<KvInput, KvInput> in = key_value_inputs(kv, key, value, where, /*layered=*/false);
  check_batch_rows(in.first, rows, where);
  return in;
}

std::pair<KvInput, KvInput> kv_all_layers_inputs(const GroupRef& kv, nb::handle key,
                                                 nb::handle value, size_t rows,
                                                 const std::string& where) {
  std::pair<KvInput, KvInput> in = key_value_inputs(kv, key, value, where, /*layered=*/true);
  check_batch_rows(in.first, rows, where);
  return in;
}

PackedLayout parse_packed(const std::string& s) {
  if (s == "token_major" || s == "nhd") return PackedLayout::kTokenMajor;
  if (s == "head_major" || s == "hnd") return PackedLayout::kHeadMajor;
  throw_invalid("layout: 'token_major' ([len, heads, dim]) or 'head_major' ([heads, len, dim])");
}

std::pair<DlArray, std::optional<DlArray>> layer_views(nb::handle owner, const GroupRef& kv,
                                                       int32_t layer) {
  const int32_t n = kv.config().num_layers;
  if (layer < 0 || layer >= n) {
    throw StatusError(
        out_of_range("layer: " + std::to_string(layer) + " not in [0, " + std::to_string(n) + ")"));
  }
  // A latent pool has one part per layer: the "value" page would be the next layer's latents
  // (or, for the last layer, past the end of the pool).
  if (is_latent(kv)) return {pool_view(owner, kv, layer, KvPart::kKey), std::nullopt};
  return {pool_view(owner, kv, layer, KvPart::kKey), pool_view(owner, kv, layer, KvPart::kValue)};
}

GatherOutput gather_output(nb::handle owner, const GroupRef& kv, const std::string& layout,
                           std::optional<DType> dtype, int64_t tokens) {
  const CacheConfig& c = kv.config();
  GatherOutput out;
  out.layout = parse_packed(layout);
  out.dtype = dtype ? *dtype : (c.dtype == DType::kFloat8E4M3 ? DType::kFloat32 : c.dtype);
  out.tokens = tokens;
  const size_t bytes =
      size_t(tokens) * size_t(c.num_kv_heads) * size_t(c.head_dim) * dtype_size(out.dtype);
  out.key_mem = allocate_device(owner, kv.backend(), bytes, &out.key);
  if (!is_latent(kv)) out.value_mem = allocate_device(owner, kv.backend(), bytes, &out.value);
  return out;
}

std::pair<DlArray, std::optional<DlArray>> gather_result(const GroupRef& kv, GatherOutput&& out) {
  const CacheConfig& c = kv.config();
  const size_t h = size_t(c.num_kv_heads), d = size_t(c.head_dim), len = size_t(out.tokens);
  const size_t shape_tm[3] = {len, h, d}, shape_hm[3] = {h, len, d};
  const size_t* shape = out.layout == PackedLayout::kTokenMajor ? shape_tm : shape_hm;
  const int dev = backend_device_type(kv);
  const int id = backend_device_id(kv);
  DlArray k(out.key, 3, shape, out.key_mem, nullptr, to_dlpack(out.dtype), dev, id);
  if (out.value == nullptr) return {k, std::nullopt};
  return {k, DlArray(out.value, 3, shape, out.value_mem, nullptr, to_dlpack(out.dtype), dev, id)};
}

// Every counter of ControlStats; from its field list where the header has one, so a new counter
// reaches Python without an edit here.
nb::dict stats_dict(const ControlStats& s) {
  nb::dict d;
#ifdef PAGEDKV_CONTROL_STATS_FIELDS
#define PAGEDKV_PY_STAT_(type, field, doc) put(d, #field, s.field);
  PAGEDKV_CONTROL_STATS_FIELDS(PAGEDKV_PY_STAT_)
#undef PAGEDKV_PY_STAT_
#else
  put(d, "device", s.device);
  put(d, "host", s.host);
#define PAGEDKV_PY_STAT_(field) put(d, #field, s.field)
  PAGEDKV_PY_STAT_(sequences);
  PAGEDKV_PY_STAT_(active_sequences);
  PAGEDKV_PY_STAT_(offloaded_sequences);
  PAGEDKV_PY_STAT_(prefix_queries);
  PAGEDKV_PY_STAT_(prefix_hit_blocks);
  PAGEDKV_PY_STAT_(prefix_miss_blocks);
  PAGEDKV_PY_STAT_(prefix_query_tokens);
  PAGEDKV_PY_STAT_(prefix_hit_tokens);
  PAGEDKV_PY_STAT_(prefix_host_hit_blocks);
  PAGEDKV_PY_STAT_(blocks_evicted);
  PAGEDKV_PY_STAT_(sequences_evicted);
  PAGEDKV_PY_STAT_(sequences_offloaded);
  PAGEDKV_PY_STAT_(blocks_offloaded);
  PAGEDKV_PY_STAT_(sequences_restored);
  PAGEDKV_PY_STAT_(blocks_restored);
  PAGEDKV_PY_STAT_(copy_on_write);
  PAGEDKV_PY_STAT_(blocks_demoted);
  PAGEDKV_PY_STAT_(host_blocks_dropped);
  PAGEDKV_PY_STAT_(events_dropped);
#undef PAGEDKV_PY_STAT_
#endif
  return d;
}

nb::dict pool_info_dict(const PoolInfo& p) {
  nb::dict d;
  d["device_bytes"] = p.device_bytes;
  d["host_bytes"] = p.host_bytes;
  d["device_alloc_ms"] = p.device_alloc_ms;
  d["host_alloc_ms"] = p.host_alloc_ms;
  return d;
}

std::vector<std::pair<Tier, int32_t>> location_pairs(const std::vector<BlockLocation>& locations) {
  std::vector<std::pair<Tier, int32_t>> out;
  for (const BlockLocation& l : locations) out.emplace_back(l.tier, l.block);
  return out;
}

}  // namespace pagedkv::python
