#include "storage/block_format.hpp"

#include <cstring>

#include "storage/crc32c.hpp"

namespace pagedkv {
namespace detail {
namespace {

constexpr size_t kHeaderCrcOffset = 44;

}  // namespace

void encode_block_header(const BlockHeader& h, unsigned char* out) {
  put_le(out + 0, kBlockMagic, 4);
  put_le(out + 4, kBlockFormatVersion, 2);
  put_le(out + 6, kBlockHeaderBytes, 2);
  put_le(out + 8, h.fingerprint, 8);
  put_le(out + 16, h.key.ns, 8);
  put_le(out + 24, h.key.block_hash, 8);
  put_le(out + 32, h.payload_bytes, 8);
  put_le(out + 40, h.payload_crc, 4);
  put_le(out + kHeaderCrcOffset, crc32c(out, kHeaderCrcOffset), 4);
}

std::string check_block_header(const unsigned char* in, uint64_t fingerprint, const StorageKey& key,
                               uint64_t payload_bytes, uint32_t* payload_crc) {
  if (get_le(in, 4) != kBlockMagic) return "bad magic";
  if (get_le(in + kHeaderCrcOffset, 4) != crc32c(in, kHeaderCrcOffset)) {
    return "header checksum mismatch";
  }
  if (get_le(in + 4, 2) != kBlockFormatVersion) {
    return "format version " + std::to_string(get_le(in + 4, 2)) + ", expected " +
           std::to_string(kBlockFormatVersion);
  }
  if (get_le(in + 6, 2) != kBlockHeaderBytes) return "bad header size";
  if (get_le(in + 8, 8) != fingerprint) return "layout fingerprint differs";
  if (get_le(in + 16, 8) != key.ns || get_le(in + 24, 8) != key.block_hash) {
    return "header names another key";
  }
  if (get_le(in + 32, 8) != payload_bytes) return "payload size differs from the layout's";
  *payload_crc = static_cast<uint32_t>(get_le(in + 40, 4));
  return {};
}

std::string check_stored_block(const unsigned char* data, size_t n, uint64_t fingerprint,
                               const StorageKey& key, uint64_t payload_bytes) {
  if (n != kBlockHeaderBytes + payload_bytes) {
    return "stored size " + std::to_string(n) + " bytes, expected " +
           std::to_string(kBlockHeaderBytes + payload_bytes);
  }
  uint32_t want = 0;
  std::string why = check_block_header(data, fingerprint, key, payload_bytes, &want);
  if (!why.empty()) return why;
  if (crc32c(data + kBlockHeaderBytes, static_cast<size_t>(payload_bytes)) != want) {
    return "payload checksum mismatch";
  }
  return {};
}

std::string hex16(uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[static_cast<size_t>(i)] = kDigits[v & 0xF];
    v >>= 4;
  }
  return s;
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

Status validate_storage_layout(const StorageLayout& l) {
  if (l.tp_size < 1 || l.tp_rank < 0 || l.tp_rank >= l.tp_size) {
    return invalid_argument("layout.tp_rank: rank " + std::to_string(l.tp_rank) +
                            " of a deployment of " + std::to_string(l.tp_size) +
                            " tensor-parallel ranks");
  }
  if (!l.engine_digest.empty()) {
    if (l.num_layers != 0 || l.num_kv_heads != 0 || l.head_dim != 0 || l.block_size != 0 ||
        l.rope_dim != 0) {
      return invalid_argument(
          "layout.engine_digest: an opaque layout (StorageLayout::opaque) has no shape fields");
    }
    if (l.block_bytes <= 0) {
      return invalid_argument("layout.block_bytes: must be positive, got " +
                              std::to_string(l.block_bytes));
    }
    return ok_status();
  }
  const auto positive = [](const char* field, int64_t v) {
    return v > 0 ? ok_status()
                 : invalid_argument(std::string("layout.") + field + ": must be positive, got " +
                                    std::to_string(v));
  };
  for (const Status& s :
       {positive("num_layers", l.num_layers), positive("num_kv_heads", l.num_kv_heads),
        positive("head_dim", l.head_dim), positive("block_size", l.block_size)}) {
    if (!s.ok()) return s;
  }
  if (static_cast<int>(l.dtype) >= kNumDTypes) {
    return invalid_argument("layout.dtype: unknown dtype " +
                            std::to_string(static_cast<int>(l.dtype)));
  }
  if (l.page_layout != PageLayout::kNHD && l.page_layout != PageLayout::kHND) {
    return invalid_argument("layout.page_layout: unknown page layout " +
                            std::to_string(static_cast<int>(l.page_layout)));
  }
  if (l.kv_kind != KvKind::kKeyValue && l.kv_kind != KvKind::kLatent) {
    return invalid_argument("layout.kv_kind: unknown kind " +
                            std::to_string(static_cast<int>(l.kv_kind)));
  }
  if (l.kv_kind == KvKind::kLatent) {
    if (l.num_kv_heads != 1) {
      return invalid_argument("layout.num_kv_heads: a latent (MLA) layout has one head, got " +
                              std::to_string(l.num_kv_heads));
    }
    if (l.rope_dim <= 0 || l.rope_dim >= l.head_dim) {
      return invalid_argument("layout.rope_dim: a latent (MLA) layout needs 0 < rope_dim < " +
                              std::to_string(l.head_dim) + ", got " + std::to_string(l.rope_dim));
    }
  } else if (l.rope_dim != 0) {
    return invalid_argument("layout.rope_dim: only a latent (MLA) layout has one, got " +
                            std::to_string(l.rope_dim));
  }
  CacheConfig shape;
  shape.kv_kind = l.kv_kind;
  shape.rope_dim = l.rope_dim;
  shape.num_layers = l.num_layers;
  shape.num_kv_heads = l.num_kv_heads;
  shape.head_dim = l.head_dim;
  shape.block_size = l.block_size;
  shape.dtype = l.dtype;
  const int64_t expected = shape.block_bytes();
  if (expected <= 0) return invalid_argument("layout: the block's byte size overflows int64");
  if (l.block_bytes != expected) {
    return invalid_argument("layout.block_bytes: " + std::to_string(l.block_bytes) +
                            " does not match the shape's " + std::to_string(expected));
  }
  return ok_status();
}

}  // namespace detail

StorageLayout StorageLayout::from_config(const CacheConfig& config, std::string model_id) {
  StorageLayout l;
  l.num_layers = config.num_layers;
  l.num_kv_heads = config.num_kv_heads;
  l.head_dim = config.head_dim;
  l.block_size = config.block_size;
  l.dtype = config.dtype;
  l.page_layout = config.page_layout;
  l.kv_kind = config.kv_kind;
  l.rope_dim = config.kv_kind == KvKind::kLatent ? config.rope_dim : 0;
  l.model_id = std::move(model_id);
  l.block_bytes = config.block_bytes();
  return l;
}

StorageLayout StorageLayout::for_rank(const CacheConfig& rank_config, std::string model_id,
                                      int32_t tp_size, int32_t rank) {
  StorageLayout l = from_config(rank_config, std::move(model_id));
  l.tp_size = tp_size;
  l.tp_rank = rank;
  return l;
}

StorageLayout StorageLayout::opaque(int64_t block_bytes, std::string engine_digest) {
  StorageLayout l;
  l.block_bytes = block_bytes;
  l.engine_digest = std::move(engine_digest);
  return l;
}

// The canonical encoding (docs/storage.md): the ASCII tag "pagedkv.storage.v1", then
// num_layers, num_kv_heads, head_dim, block_size as 4-byte little-endian integers, dtype and
// page_layout as one byte each, block_bytes as 8 bytes, the model id's length as 8 bytes and its
// bytes; a latent layout then appends kv_kind as one byte and rope_dim as 4 bytes (a K/V layout
// appends nothing, so its fingerprint, and every store written before latents existed, stays as
// it was); an opaque layout then appends the byte 0xE0, the engine digest's length as 8 bytes
// and its bytes; a tensor-parallel rank's layout then appends the byte 0x7A, tp_size and tp_rank
// as 4 bytes each (an unsharded layout appends nothing); the fingerprint is the 64-bit FNV-1a of
// that.
uint64_t StorageLayout::fingerprint() const {
  static const char kTag[] = "pagedkv.storage.v1";
  std::string bytes(kTag, sizeof(kTag) - 1);
  const auto append = [&bytes](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  };
  append(static_cast<uint32_t>(num_layers), 4);
  append(static_cast<uint32_t>(num_kv_heads), 4);
  append(static_cast<uint32_t>(head_dim), 4);
  append(static_cast<uint32_t>(block_size), 4);
  append(static_cast<uint8_t>(dtype), 1);
  append(static_cast<uint8_t>(page_layout), 1);
  append(static_cast<uint64_t>(block_bytes), 8);
  append(model_id.size(), 8);
  bytes += model_id;
  if (kv_kind != KvKind::kKeyValue) {
    append(static_cast<uint8_t>(kv_kind), 1);
    append(static_cast<uint32_t>(rope_dim), 4);
  }
  if (!engine_digest.empty()) {
    append(0xE0, 1);
    append(engine_digest.size(), 8);
    bytes += engine_digest;
  }
  if (tp_size != 1 || tp_rank != 0) {
    append(0x7A, 1);
    append(static_cast<uint32_t>(tp_size), 4);
    append(static_cast<uint32_t>(tp_rank), 4);
  }
  return detail::fnv1a64(bytes.data(), bytes.size());
}

}  // namespace pagedkv
