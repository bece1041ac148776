// Replies of the Redis protocol (RESP2) read from a connection's socket by the Redis store.
// hiredis's reader copies a large bulk string three times (its socket buffer, its reader buffer,
// the reply object) before the store could checksum it and copy it a fourth time into the
// destination; that capped the store's large gets near half of a plain GET of the same bytes.
// This reader keeps a small buffer for reply headers and receives a block's payload straight
// into its destination, checksumming each piece as it lands (while it is in the CPU's cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace pagedkv::detail {

class RespReader {
 public:
  enum class Type { kStatus, kError, kInteger, kNil, kBulk };
  struct Reply {
    Type type = Type::kNil;
    std::string text;     // status and error text; a bulk string read by read()
    int64_t integer = 0;  // an integer; a bulk string's length
  };
  /// Where read_block puts a bulk string of exactly head_bytes + payload_bytes bytes.
  struct Block {
    unsigned char* head = nullptr;
    size_t head_bytes = 0;
    unsigned char* payload = nullptr;
    size_t payload_bytes = 0;
    uint32_t payload_crc = 0;  // set by read_block: the CRC-32C of the payload as received
  };

  RespReader();
  /// Forgets what was buffered (a new connection).
  void reset() { begin_ = end_ = 0; }
  /// Reads one reply from `fd`. Empty on success, else why the connection can no longer be used
  /// (closed, timed out, or a reply this store never asks for: it would lose its place).
  std::string read(int fd, Reply* reply);
  /// Reads one reply; a bulk string of exactly the block's size is received into *block (type
  /// kBulk, its head and payload written, payload_crc set). Any other reply is read as read()
  /// does, except that a bulk string of another size is discarded (its length in integer).
  /// Returns as read().
  std::string read_block(int fd, Block* block, Reply* reply);

 private:
  static constexpr size_t kBufferBytes = size_t{64} << 10;
  // Reads one line (without its CRLF).
  std::string read_line(int fd, std::string* line);
  // Reads the header line of a reply and the whole of anything but a bulk string's body.
  std::string read_head(int fd, Reply* reply, bool* bulk_body_follows);
  // Receives `n` bytes into `dst` (null: discarded), continuing *crc over them when crc is set.
  std::string read_bytes(int fd, unsigned char* dst, size_t n, uint32_t* crc);
  // Receives more bytes into the buffer.
  std::string fill(int fd);

  std::unique_ptr<char[]> buf_;
  size_t begin_ = 0;  // buffered and not yet consumed: [begin_, end_)
  size_t end_ = 0;
};

}  // namespace pagedkv::detail
