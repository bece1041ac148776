// RedisTier: one Redis string per block, key "<prefix>:<fingerprint>:<ns>:<hash>" (16 hex digits
// each), value header + payload as in the file store (docs/storage.md). Every I/O thread owns
// one connection, the owner thread another (for batch_exists); a connection that fails is
// dropped and made again on the next call (at most every kRetryInterval while the server is
// down), so the store follows the server through restarts.
//
// hiredis only connects (and sets the socket's timeouts). Commands are written by this file with
// sendmsg(MSG_NOSIGNAL) on the connection's socket: hiredis writes with write(), which raises
// SIGPIPE once the server has gone (killing a host process that does not ignore it), and it
// would copy every block twice (formatting, then its output buffer) before writing it. Replies
// are read by RespReader (resp_reader.hpp), which receives a block straight into its
// destination. A batch of puts or gets is pipelined: its SETs or GETs go out in one sendmsg,
// then the replies are read in order, so the server is never idle waiting for the next request.
#include "pagedkv/storage_tier.hpp"

#if PAGEDKV_WITH_HIREDIS

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <initializer_list>

#include "common/logging.hpp"
#include "storage/block_format.hpp"
#include "storage/queued_tier.hpp"
#include "storage/resp_reader.hpp"

namespace pagedkv {
namespace {

using Clock = std::chrono::steady_clock;
using detail::hex16;
using detail::kBlockHeaderBytes;

// While the server is down, each connection tries to connect again at most this often.
constexpr auto kRetryInterval = std::chrono::milliseconds(200);
// batch_exists pipelines its EXISTS commands in chunks of this many, stopping after the chunk
// that holds the first missing key.
constexpr size_t kExistsChunk = 32;
// A batch of puts or gets pipelines about this many bytes of blocks: enough that the server has the
// next GET to answer while a reply is received. Deeper is slower for large blocks (1 MiB and
// 2 MiB measured 0.65-0.71 of a plain GET at 256 KiB, 512 KiB 0.95-1.2): replies that cannot go
// to the socket at once are copied into the server's output buffer.
constexpr size_t kPipelineBytes = size_t{512} << 10;
// ... and at most this many commands (small blocks).
constexpr size_t kPipelineCommands = 64;

using Reply = detail::RespReader::Reply;
using ReplyType = detail::RespReader::Type;

struct Connection {
  redisContext* ctx = nullptr;
  detail::RespReader reader;
  Clock::time_point retry_at{};
  Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
    if (ctx != nullptr) redisFree(ctx);
  }
};

// Commands in the Redis protocol (RESP), built without copying large arguments: the small parts
// go into one buffer, an argument of kCopyLimit bytes or more is sent from the caller's memory.
class Request {
 public:
  // One argument: `size` bytes at `data`, then `more_size` at `more` (a block's header and its
  // payload, which a borrowed put keeps apart).
  struct Arg {
    const void* data;
    size_t size;
    const void* more = nullptr;
    size_t more_size = 0;
  };
  void add(std::initializer_list<Arg> args) {
    text("*" + std::to_string(args.size()) + "\r\n");
    for (const Arg& a : args) {
      text("$" + std::to_string(a.size + a.more_size) + "\r\n");
      part(a.data, a.size);
      if (a.more_size > 0) part(a.more, a.more_size);
      text("\r\n");
    }
  }
  // Sends everything; false (and errno set) when the connection failed or timed out.
  bool send(int fd) {
    std::vector<iovec> iov;
    for (const Piece& p : pieces_) {
      iov.push_back(p.data != nullptr ? iovec{const_cast<void*>(p.data), p.size}
                                      : iovec{&buf_[p.offset], p.size});
    }
    if (buf_.size() > mark_) iov.push_back(iovec{&buf_[mark_], buf_.size() - mark_});
    size_t first = 0;
    while (first < iov.size()) {
      msghdr msg{};
      msg.msg_iov = &iov[first];
      msg.msg_iovlen = std::min<size_t>(iov.size() - first, 512);
      const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      auto left = static_cast<size_t>(w);
      while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (first < iov.size()) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    return true;
  }

 private:
  static constexpr size_t kCopyLimit = 4096;
  struct Piece {
    const void* data;  // null: buf_[offset, offset + size)
    size_t size;
    size_t offset;
  };
  void text(const std::string& t) { buf_ += t; }
  void part(const void* data, size_t size) {
    if (size < kCopyLimit) {
      buf_.append(static_cast<const char*>(data), size);
      return;
    }
    pieces_.push_back(Piece{nullptr, buf_.size() - mark_, mark_});
    mark_ = buf_.size();
    pieces_.push_back(Piece{data, size, 0});
  }
  std::string buf_;
  std::vector<Piece> pieces_;
  size_t mark_ = 0;  // buf_ before it is covered by pieces_
};

class RedisTier final : public detail::QueuedStorageTier {
 public:
  RedisTier(const StorageLayout& layout, const RedisTierOptions& options)
      : QueuedStorageTier(layout, options.threads, options.max_queued_blocks),
        options_(options),
        key_base_(options.key_prefix + ":" + hex16(fingerprint_) + ":"),
        workers_conn_(static_cast<size_t>(options.threads)) {
    connect(owner_conn_);  // a failure only logs: lookups miss until the server is there
    start_workers();
  }

  ~RedisTier() override { stop_workers(); }

  const char* medium() const override { return "REDIS"; }

  StatusOr<size_t> batch_exists(const std::vector<StorageKey>& keys) override {
    std::vector<bool> found = exists(keys, /*stop_at_missing=*/true);
    return static_cast<size_t>(std::find(found.begin(), found.end(), false) - found.begin());
  }

  StatusOr<std::vector<bool>> exists_each(const std::vector<StorageKey>& keys) override {
    return exists(keys, /*stop_at_missing=*/false);
  }

 protected:
  std::string put_block(int thread, const StorageKey& key, const unsigned char* header,
                        const unsigned char* payload) override {
    BlockIo b{key, const_cast<unsigned char*>(payload), header, {}};
    put_blocks(thread, &b, 1);
    return b.error;
  }

  // Pipelined SETs, as get_blocks pipelines GETs. A SET sent again after a lost connection
  // stores the same bytes again (a key names its bytes).
  void put_blocks(int thread, BlockIo* blocks, size_t n) override {
    pipelined(thread, blocks, n, "SET", [this](Connection& c, BlockIo& b) {
      Reply r;
      std::string lost = c.reader.read(c.ctx->fd, &r);
      if (!lost.empty()) return "SET: " + lost;
      if (r.type != ReplyType::kStatus) b.error = "SET: " + reply_text(r);
      return std::string();
    });
  }

  size_t max_batch_blocks() const override {
    return std::clamp<size_t>(kPipelineBytes / static_cast<size_t>(layout_.block_bytes), 1,
                              kPipelineCommands);
  }

  std::string get_block(int thread, const StorageKey& key, void* dst) override {
    BlockIo b{key, static_cast<unsigned char*>(dst), nullptr, {}};
    get_blocks(thread, &b, 1);
    return b.error;
  }

  // Pipelined GETs (see the file comment).
  void get_blocks(int thread, BlockIo* blocks, size_t n) override {
    pipelined(thread, blocks, n, "GET",
              [this](Connection& c, BlockIo& b) { return read_block(c, b); });
  }

  bool remove_block(int thread, const StorageKey& key) override {
    const std::string k = redis_key(key);
    Request req;
    req.add({{"DEL", 3}, {k.data(), k.size()}});
    std::string error;
    Reply r;
    return command(conn(thread), "DEL", req, &r, &error) && r.type == ReplyType::kInteger &&
           r.integer == 1;
  }

 private:
  // Whether each key is stored, by pipelined EXISTS in chunks; with `stop_at_missing` the
  // chunks after the one holding the first missing key are not asked (those answer false).
  // A server that cannot be reached answers all false.
  std::vector<bool> exists(const std::vector<StorageKey>& keys, bool stop_at_missing) {
    // On a connection that was open before this call the server may have restarted since:
    // one more try on a fresh connection tells that apart from a server that is gone.
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool was_open = owner_conn_.ctx != nullptr && owner_conn_.ctx->err == 0;
      redisContext* c = connect(owner_conn_);
      if (c == nullptr) break;
      std::vector<bool> found(keys.size(), false);
      std::string failure;
      bool missing = false;
      for (size_t begin = 0; begin < keys.size() && !(stop_at_missing && missing);
           begin += kExistsChunk) {
        const size_t end = std::min(keys.size(), begin + kExistsChunk);
        std::vector<std::string> names;
        names.reserve(end - begin);
        Request req;
        for (size_t i = begin; i < end; ++i) {
          names.push_back(redis_key(keys[i]));
          req.add({{"EXISTS", 6}, {names.back().data(), names.back().size()}});
        }
        if (!req.send(c->fd)) {
          failure = "EXISTS: " + std::string(std::strerror(errno));
          break;
        }
        for (size_t i = begin; i < end; ++i) {
          Reply r;
          std::string why = owner_conn_.reader.read(c->fd, &r);
          if (!why.empty()) {
            failure = "EXISTS: " + why;
            break;
          }
          found[i] = r.type == ReplyType::kInteger && r.integer == 1;
          missing = missing || !found[i];
        }
        if (!failure.empty()) break;
      }
      if (failure.empty()) return found;
      drop(owner_conn_, failure);
      if (!was_open) break;
    }
    return std::vector<bool>(keys.size(), false);
  }

  // Sends one `what` (SET or GET) per block in one sendmsg, then reads the replies in order
  // with read_reply(connection, block), which sets the block's error for a block that failed
  // and returns why the connection was lost (empty: it was not). On a connection that was open
  // before, a lost connection is tried once more on a fresh one for the blocks not answered yet
  // (the server may have restarted).
  template <typename ReadReply>
  void pipelined(int thread, BlockIo* blocks, size_t n, const char* what, ReadReply read_reply) {
    Connection& c = conn(thread);
    const bool set = what[0] == 'S';
    size_t done = 0;
    std::string error;
    for (int attempt = 0; attempt < 2 && done < n; ++attempt) {
      const bool was_open = c.ctx != nullptr && c.ctx->err == 0;
      redisContext* ctx = connect(c);
      if (ctx == nullptr) {
        error = "not connected to " + options_.host + ":" + std::to_string(options_.port);
        break;
      }
      std::vector<std::string> names;
      names.reserve(n - done);
      Request req;
      for (size_t i = done; i < n; ++i) {
        names.push_back(redis_key(blocks[i].key));
        if (set) {
          req.add({{"SET", 3},
                   {names.back().data(), names.back().size()},
                   {blocks[i].header, kBlockHeaderBytes, blocks[i].data,
                    static_cast<size_t>(layout_.block_bytes)}});
        } else {
          req.add({{"GET", 3}, {names.back().data(), names.back().size()}});
        }
      }
      if (!req.send(ctx->fd)) {
        error = std::string(what) + ": " + std::strerror(errno);
      } else {
        for (; done < n; ++done) {
          error = read_reply(c, blocks[done]);
          if (!error.empty()) break;
        }
        if (done == n) return;
      }
      drop(c, error);
      if (!was_open) break;
    }
    for (size_t i = done; i < n; ++i) blocks[i].error = error;
  }

  Connection& conn(int thread) { return workers_conn_[static_cast<size_t>(thread)]; }

  std::string redis_key(const StorageKey& k) const {
    return key_base_ + hex16(k.ns) + ":" + hex16(k.block_hash);
  }

  static std::string reply_text(const Reply& r) {
    if (r.type == ReplyType::kError) return r.text;
    if (r.type == ReplyType::kNil) return "unexpected nil reply";
    return "unexpected reply type " + std::to_string(static_cast<int>(r.type));
  }

  // Reads the reply to one GET into `b` and verifies it; sets b.error for a block that is
  // missing or bad. Returns why the connection was lost (empty: it was not).
  std::string read_block(Connection& c, BlockIo& b) {
    unsigned char head[kBlockHeaderBytes];
    detail::RespReader::Block block;
    block.head = head;
    block.head_bytes = kBlockHeaderBytes;
    block.payload = b.data;
    block.payload_bytes = static_cast<size_t>(layout_.block_bytes);
    Reply r;
    std::string lost = c.reader.read_block(c.ctx->fd, &block, &r);
    if (!lost.empty()) return "GET: " + lost;
    const uint64_t want_size = kBlockHeaderBytes + block.payload_bytes;
    if (r.type == ReplyType::kNil) {
      b.error = "not stored";
    } else if (r.type != ReplyType::kBulk) {
      b.error = "GET: " + reply_text(r);
    } else if (static_cast<uint64_t>(r.integer) != want_size) {
      b.error = "stored size " + std::to_string(r.integer) + " bytes, expected " +
                std::to_string(want_size);
    } else {
      uint32_t crc = 0;
      b.error = detail::check_block_header(head, fingerprint_, b.key, block.payload_bytes, &crc);
      if (b.error.empty() && crc != block.payload_crc) b.error = "payload checksum mismatch";
    }
    return {};
  }

  timeval timeout() const {
    timeval tv{};
    tv.tv_sec = options_.timeout_ms / 1000;
    tv.tv_usec = static_cast<suseconds_t>((options_.timeout_ms % 1000) * 1000);
    return tv;
  }

  // The connection's context, connecting when there is none (at most every kRetryInterval);
  // null while the server cannot be reached.
  redisContext* connect(Connection& c) {
    if (c.ctx != nullptr && c.ctx->err == 0) return c.ctx;
    if (c.ctx != nullptr) drop(c, c.ctx->errstr);
    const auto now = Clock::now();
    if (now < c.retry_at) return nullptr;
    redisContext* ctx = redisConnectWithTimeout(options_.host.c_str(), options_.port, timeout());
    if (ctx == nullptr || ctx->err != 0) {
      const std::string why =
          ctx == nullptr ? std::string("cannot allocate a connection") : std::string(ctx->errstr);
      if (ctx != nullptr) redisFree(ctx);
      c.retry_at = now + kRetryInterval;
      note_unreachable(options_.host + ":" + std::to_string(options_.port) + ": " + why);
      return nullptr;
    }
    if (redisSetTimeout(ctx, timeout()) != REDIS_OK) {
      redisFree(ctx);
      c.retry_at = now + kRetryInterval;
      return nullptr;
    }
    c.ctx = ctx;
    c.reader.reset();
    note_reachable();
    return ctx;
  }

  // Drops a failed connection (the next call connects again at once).
  void drop(Connection& c, const std::string& why) {
    if (c.ctx == nullptr) return;
    note_unreachable(options_.host + ":" + std::to_string(options_.port) + ": " + why);
    redisFree(c.ctx);
    c.ctx = nullptr;
  }

  // Sends `req` (one command) and reads its reply into *reply; on a connection that was open
  // before, a failure is tried once more on a fresh one (the server may have restarted). False
  // with *error set when it could not be sent or answered.
  bool command(Connection& c, const char* what, Request& req, Reply* reply, std::string* error) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool was_open = c.ctx != nullptr && c.ctx->err == 0;
      redisContext* ctx = connect(c);
      if (ctx == nullptr) {
        *error = "not connected to " + options_.host + ":" + std::to_string(options_.port);
        return false;
      }
      if (!req.send(ctx->fd)) {
        *error = std::string(what) + ": " + std::strerror(errno);
      } else {
        std::string why = c.reader.read(ctx->fd, reply);
        if (why.empty()) return true;
        *error = std::string(what) + ": " + why;
      }
      drop(c, *error);
      if (!was_open) break;
    }
    return false;
  }

  const RedisTierOptions options_;
  const std::string key_base_;
  Connection owner_conn_;
  std::vector<Connection> workers_conn_;
};

}  // namespace

StatusOr<std::unique_ptr<StorageTier>> make_redis_tier(const StorageLayout& layout,
                                                       const RedisTierOptions& options) {
  Status s = detail::validate_storage_layout(layout);
  if (!s.ok()) return Status(s.code(), "make_redis_tier: " + s.message());
  s = detail::check_queue_options(options.threads, options.max_queued_blocks);
  if (!s.ok()) return Status(s.code(), "make_redis_tier: " + s.message());
  if (options.host.empty()) return invalid_argument("make_redis_tier: host is empty");
  if (options.port < 1 || options.port > 65535) {
    return invalid_argument("make_redis_tier: port: must be in [1, 65535], got " +
                            std::to_string(options.port));
  }
  if (options.timeout_ms < 1) {
    return invalid_argument("make_redis_tier: timeout_ms: must be positive, got " +
                            std::to_string(options.timeout_ms));
  }
  if (options.key_prefix.empty()) return invalid_argument("make_redis_tier: key_prefix is empty");
  return std::unique_ptr<StorageTier>(std::make_unique<RedisTier>(layout, options));
}

}  // namespace pagedkv

#else  // no hiredis in this build

namespace pagedkv {

StatusOr<std::unique_ptr<StorageTier>> make_redis_tier(const StorageLayout&,
                                                       const RedisTierOptions&) {
  return unimplemented(
      "make_redis_tier: this build has no hiredis (install libhiredis-dev and reconfigure)");
}

}  // namespace pagedkv

#endif
