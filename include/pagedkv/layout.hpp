// The one place where pool address arithmetic is written.
//
// Pool = [num_blocks][num_layers][num_parts][page]: num_parts is 2 (K, V) for a key/value cache
// and 1 for a latent (MLA) cache, whose one page per layer holds the latent vectors (the `ckv`
// part, head_dim - rope_dim elements, then the `kpe` part, rope_dim elements, per token) and
// which has no values. page = NHD [block_size][heads][head_dim] or HND
// [heads][block_size][head_dim]. Offsets are in elements, 64-bit. Used by the control plane's
// exports, both backends, the device view and the tests; compiles with any C++17 compiler.
#pragma once

#include <cstdint>

#include "pagedkv/config.hpp"
#include "pagedkv/macros.hpp"

namespace pagedkv {

/// Keys or values of a page. A latent (MLA) pool has keys only: its latent page is kKey.
enum class KvPart : int32_t { kKey = 0, kValue = 1 };

/// Address arithmetic of a block-major pool. Trivially copyable; pass by value to kernels.
struct PoolLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  PageLayout page_layout = PageLayout::kNHD;
  /// Pages per layer of a block: 2 (keys, values) or 1 (latent, MLA: keys only).
  int32_t num_parts = 2;
  /// Latent pools only: the rotary (`kpe`) elements at the end of each latent vector; 0 for K/V.
  int32_t rope_dim = 0;

  /// The layout of a config's pools (both tiers share it).
  static PoolLayout from_config(const CacheConfig& c) {
    PoolLayout l;
    l.num_layers = c.num_layers;
    l.num_kv_heads = c.num_kv_heads;
    l.head_dim = c.head_dim;
    l.block_size = c.block_size;
    l.page_layout = c.page_layout;
    l.num_parts = c.kv_kind == KvKind::kLatent ? 1 : 2;
    l.rope_dim = c.kv_kind == KvKind::kLatent ? c.rope_dim : 0;
    return l;
  }

  /// True for a latent (MLA) pool: one page per layer, no values.
  PAGEDKV_HOST_DEVICE bool is_latent() const { return num_parts == 1; }
  /// Latent pools: elements of the `ckv` part of a latent vector (head_dim - rope_dim); it
  /// is also the offset of the `kpe` part inside the vector.
  PAGEDKV_HOST_DEVICE int32_t ckv_dim() const { return head_dim - rope_dim; }

  /// Elements in one page: block_size * heads * head_dim.
  PAGEDKV_HOST_DEVICE int64_t page_elems() const {
    return static_cast<int64_t>(block_size) * num_kv_heads * head_dim;
  }
  /// Elements between the keys and the values of one layer of one block (K/V pools).
  PAGEDKV_HOST_DEVICE int64_t kv_stride() const { return page_elems(); }
  /// Elements between consecutive layers of one block: num_parts pages.
  PAGEDKV_HOST_DEVICE int64_t layer_stride() const { return num_parts * page_elems(); }
  /// Elements in one block (all layers, every part): the stride between blocks, and the page
  /// stride a FlashInfer-style kernel sees when it reads one layer's keys (or latents).
  PAGEDKV_HOST_DEVICE int64_t block_elems() const { return num_layers * layer_stride(); }
  /// Elements between consecutive token positions inside a page.
  PAGEDKV_HOST_DEVICE int64_t token_stride() const {
    return page_layout == PageLayout::kNHD ? static_cast<int64_t>(num_kv_heads) * head_dim
                                           : head_dim;
  }
  /// Elements between consecutive heads inside a page.
  PAGEDKV_HOST_DEVICE int64_t head_stride() const {
    return page_layout == PageLayout::kNHD ? head_dim : static_cast<int64_t>(block_size) * head_dim;
  }

  /// Offset of the first element of page (block, layer, part).
  PAGEDKV_HOST_DEVICE int64_t page_offset(int64_t block, int32_t layer, KvPart part) const {
    return block * block_elems() + layer * layer_stride() +
           static_cast<int32_t>(part) * kv_stride();
  }
  /// Offset of element `dim` of (block, layer, part, position inside the block, head).
  PAGEDKV_HOST_DEVICE int64_t element_offset(int64_t block, int32_t layer, KvPart part,
                                             int32_t pos_in_block, int32_t head,
                                             int32_t dim) const {
    return page_offset(block, layer, part) + pos_in_block * token_stride() + head * head_stride() +
           dim;
  }
  /// Offset of the head vector (dim 0) of one token given by its slot.
  PAGEDKV_HOST_DEVICE int64_t slot_offset(int64_t slot, int32_t layer, KvPart part,
                                          int32_t head) const {
    return element_offset(slot / block_size, layer, part, static_cast<int32_t>(slot % block_size),
                          head, 0);
  }
  /// Offset of the head vector of logical position `pos` of a sequence whose block table is
  /// `table` (physical block ids, one per block of `block_size` positions).
  PAGEDKV_HOST_DEVICE int64_t position_offset(const int32_t* table, int64_t pos, int32_t layer,
                                              KvPart part, int32_t head) const {
    return element_offset(table[pos / block_size], layer, part,
                          static_cast<int32_t>(pos % block_size), head, 0);
  }
};

}  // namespace pagedkv
