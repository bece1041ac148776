// StorageTier: the third tier, behind the host tier: a store of whole KV blocks keyed by their
// chained prefix hash, that outlives the process (files on local disk) or is shared between
// replicas (Redis). The cache writes back cached host blocks that the host LRU drops, and asks
// the store for the blocks after a prompt's longest cached prefix; a block read back is a hit
// only once it is on the host tier. Every call here is cheap on the caller's thread: I/O runs
// on the store's own threads, and completions are collected with poll(), so the step path never
// waits for storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// A block in a store: the chained hash of the prefix it ends (ControlEvent::block_hash) and its
/// prefix-sharing namespace. The layout fingerprint is the store's own (StorageLayout), so the
/// same key in a store of another model or layout is never found.
struct StorageKey {
  uint64_t block_hash = 0;
  NamespaceId ns = 0;
  friend bool operator==(const StorageKey& a, const StorageKey& b) {
    return a.block_hash == b.block_hash && a.ns == b.ns;
  }
};

/// What a stored block's bytes mean: any difference makes a different store namespace.
struct StorageLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  DType dtype = DType::kFloat16;
  PageLayout page_layout = PageLayout::kNHD;
  /// Keys and values, or one latent page per layer (MLA); a latent block never matches a K/V
  /// block of any shape (the kind is part of the fingerprint).
  KvKind kv_kind = KvKind::kKeyValue;
  /// kLatent only: the rotary (`kpe`) elements at the end of each latent vector; 0 for K/V.
  int32_t rope_dim = 0;
  /// Names the model (and anything else that changes the bytes: weights revision, rope scaling).
  std::string model_id;
  /// Bytes of one block (all layers, K and V or latents), as CacheConfig::block_bytes().
  int64_t block_bytes = 0;
  /// Set only by opaque(): names another engine's block layout; the shape fields above are 0.
  std::string engine_digest;
  /// Tensor parallelism: the block holds rank `tp_rank`'s share of the heads of a deployment of
  /// `tp_size` ranks (num_kv_heads is that share), so a store written at one TP size or rank
  /// never serves another. 1 and 0 without tensor parallelism.
  int32_t tp_size = 1;
  int32_t tp_rank = 0;

  /// The layout of a cache configuration.
  static StorageLayout from_config(const CacheConfig& config, std::string model_id);
  /// The layout of rank `rank`'s pools of a tensor-parallel deployment of `tp_size` ranks:
  /// `rank_config` is that rank's config (KvCache::shard_config, rank_config()).
  static StorageLayout for_rank(const CacheConfig& rank_config, std::string model_id,
                                int32_t tp_size, int32_t rank);
  /// Blocks of `block_bytes` bytes that pagedkv stores and checksums but does not interpret:
  /// another engine's unit (vLLM's CPU-tier chunk rows, SGLang's host pages), for a store driven
  /// directly through StorageTier. `engine_digest` (non-empty) names everything that changes
  /// those bytes (model, dtype, block size, layout, parallelism): a store of another digest
  /// never serves a block. No KvCache takes such a store (its fingerprint is no cache's).
  static StorageLayout opaque(int64_t block_bytes, std::string engine_digest);
  /// A stable 64-bit digest of every field (the same in every process and build).
  uint64_t fingerprint() const;
};

/// What a cache's fetch from its storage tier started (KvCache::fetch_prefix_from_storage).
struct StorageFetch {
  int64_t blocks = 0;  // on their way from the store into the host tier
  int64_t reach = 0;   // the longest prefix hit, in tokens, once they land (none evicted meanwhile)
};

/// A finished put or get.
struct StorageCompletion {
  uint64_t job = 0;
  /// Puts: every block stored (a failed put leaves nothing visible). Gets: every block read and
  /// its checksum verified.
  bool ok = false;
  /// Why it failed (empty when ok).
  std::string error;
  /// Gets: how many blocks, from the first, were read and verified (all of them when ok). The
  /// caller may use those even when the get failed; what a failed block's destination and
  /// every later one hold is unspecified. Puts: 0.
  size_t blocks_ok = 0;
};

/// Counters of a store since it was created.
struct StorageStats {
  int64_t puts = 0;           // blocks stored
  int64_t gets = 0;           // blocks read back and verified
  int64_t bytes_written = 0;  // payload bytes written (a put of a block already stored: 0)
  int64_t bytes_read = 0;
  int64_t failed_puts = 0;    // blocks
  int64_t failed_gets = 0;    // blocks: missing, corrupt (checksum) or unreadable
  int64_t rejected_puts = 0;  // blocks refused because the write queue was full
  int64_t removed = 0;        // blocks removed (remove() or the store's size bound)
  int64_t gets_direct = 0;    // of `gets`: read around the page cache (a file store's O_DIRECT)
  int64_t gets_in_place = 0;  // of `gets_direct`: read straight into the caller's memory (no copy)
};

/// A store of blocks (see the file comment). Thread-compatible: one owner thread calls it.
class StorageTier {
 public:
  virtual ~StorageTier() = default;
  StorageTier() = default;
  StorageTier(const StorageTier&) = delete;
  StorageTier& operator=(const StorageTier&) = delete;

  /// The medium events name this tier by ("DISK", "REDIS").
  virtual const char* medium() const = 0;
  /// The layout every block of this store has.
  virtual const StorageLayout& layout() const = 0;

  /// How many of `keys`, from the first, are stored (stops at the first missing). A store that
  /// cannot be reached answers 0 (and logs a warning once): every lookup becomes a miss.
  virtual StatusOr<size_t> batch_exists(const std::vector<StorageKey>& keys) = 0;
  /// Queues writes of `keys[i]` from `blocks[i]` (layout().block_bytes each). The bytes are
  /// copied before this returns, so the caller may reuse its buffers at once (see
  /// submit_put_borrowed for a put without the copy). Returns the job id.
  /// kResourceExhausted (nothing queued) when the write queue is full: the caller drops the
  /// blocks instead. kInvalidArgument for mismatched sizes.
  virtual StatusOr<uint64_t> submit_put(const std::vector<StorageKey>& keys,
                                        const std::vector<const void*>& blocks) = 0;
  /// As submit_put, but nothing is copied on the caller's thread: the store's threads checksum
  /// and write `blocks[i]` in place, so the caller keeps them valid and unchanged until it has
  /// taken the job's completion (poll or wait). Same errors as submit_put. A store that cannot
  /// borrow copies (the default).
  virtual StatusOr<uint64_t> submit_put_borrowed(const std::vector<StorageKey>& keys,
                                                 const std::vector<const void*>& blocks) {
    return submit_put(keys, blocks);
  }
  /// Queues reads of `keys[i]` into `blocks[i]`, which must stay valid and untouched until the
  /// job completes. Returns the job id; kInvalidArgument for mismatched sizes.
  virtual StatusOr<uint64_t> submit_get(const std::vector<StorageKey>& keys,
                                        const std::vector<void*>& blocks) = 0;
  /// Whether each of `keys` is stored (not only the leading ones, as batch_exists). A store that
  /// cannot be reached answers all false. The default asks batch_exists once per key.
  virtual StatusOr<std::vector<bool>> exists_each(const std::vector<StorageKey>& keys);
  /// The jobs that finished since the last poll, in no particular order.
  virtual std::vector<StorageCompletion> poll() = 0;
  /// Blocks until every job of `jobs` has finished or `timeout_ms` passes (negative: no limit),
  /// and takes their completions (a later poll does not report them; other jobs' completions
  /// stay for poll). Returns those that finished, in no particular order. Unlike the other calls
  /// it may run on another thread beside the owner's. kNotFound (nothing taken) for a job that
  /// is neither running nor waiting to be taken (already polled, or never submitted);
  /// kUnimplemented where the store has no wait (the default).
  virtual StatusOr<std::vector<StorageCompletion>> wait(const std::vector<uint64_t>& jobs,
                                                        int64_t timeout_ms);
  /// Blocks the caller until every queued job has finished (shutdown, tests).
  virtual void drain() = 0;
  /// Removes the blocks of `keys` that are stored (missing ones are not an error).
  virtual Status remove(const std::vector<StorageKey>& keys) = 0;
  virtual StorageStats stats() const = 0;
};

/// Options of the embedded default store: blocks appended to segment files in one directory.
struct FileTierOptions {
  /// The directory (created when missing). Blocks of other layouts in it are never read.
  std::string directory;
  /// Bytes the store's segment files may hold; beyond it the least recently used segments are
  /// deleted whole (0: no bound). Segments being appended to (one per I/O thread) are never
  /// deleted, so the bound also caps segments at max_bytes / 4.
  int64_t max_bytes = 0;
  /// fdatasync each batch of appended blocks before they become visible; off is faster and
  /// survives a process crash but not a power loss.
  bool fsync = false;
  /// Puts queued and not yet written, in blocks; beyond it submit_put is kResourceExhausted.
  int64_t max_queued_blocks = 4096;
  /// I/O threads (each appends to a segment of its own).
  int32_t threads = 2;
  /// A segment takes blocks until it would pass this size (it always takes one).
  int64_t segment_bytes = int64_t{32} << 20;
  /// Write segments with O_DIRECT, bypassing the page cache, from aligned staging buffers (each
  /// record padded to 4 KiB): puts then stay fast when page-cache memory is scarce or cold, and
  /// leave the host's cached pages alone. Where the filesystem refuses O_DIRECT (tmpfs) the
  /// store logs a warning and writes through the page cache as without it.
  bool direct_io = false;
  /// Reads of blocks the page cache does not hold go around it, with O_DIRECT, up to this many
  /// in flight per I/O thread (io_uring; one at a time without it), so that cold reads leave
  /// the host's cached pages alone; blocks it holds are still read from it. 0 (the default,
  /// faster on the machines measured: docs/storage.md): every read through the page cache.
  /// At most 256.
  int32_t direct_read_depth = 0;
};

/// Options of the Redis (or Valkey) store.
struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int32_t port = 6379;
  /// Connect and command timeout.
  int32_t timeout_ms = 1000;
  /// Prefix of every key the store writes.
  std::string key_prefix = "pagedkv";
  int64_t max_queued_blocks = 4096;
  int32_t threads = 2;
};

/// The file store. kInvalidArgument for a bad layout or options; kUnavailable when the directory
/// cannot be created or written.
StatusOr<std::unique_ptr<StorageTier>> make_file_tier(const StorageLayout& layout,
                                                      const FileTierOptions& options);
/// The Redis store. Created even when the server cannot be reached yet (lookups miss until it
/// can); kUnimplemented when this build has no hiredis.
StatusOr<std::unique_ptr<StorageTier>> make_redis_tier(const StorageLayout& layout,
                                                       const RedisTierOptions& options);

}  // namespace pagedkv
