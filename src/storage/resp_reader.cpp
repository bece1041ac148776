#include "storage/resp_reader.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "storage/crc32c.hpp"

namespace pagedkv::detail {
namespace {

// Bulk strings read() keeps in Reply::text: replies this store reads whole are small (status,
// error text); anything larger is a reply it did not expect.
constexpr int64_t kMaxTextBytes = int64_t{1} << 20;

std::string recv_error(ssize_t r) {
  if (r == 0) return "connection closed by the server";
  if (errno == EAGAIN || errno == EWOULDBLOCK) return "timed out waiting for the reply";
  return std::string(std::strerror(errno));
}

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = s[0] == '-' ? -v : v;
  return true;
}

}  // namespace

RespReader::RespReader() : buf_(new char[kBufferBytes]) {}

std::string RespReader::fill(int fd) {
  if (begin_ == end_) begin_ = end_ = 0;
  if (end_ == kBufferBytes) {  // room at the front: move what is left there
    std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == kBufferBytes) return "protocol error: a reply line longer than the buffer";
  for (;;) {
    const ssize_t r = ::recv(fd, buf_.get() + end_, kBufferBytes - end_, 0);
    if (r > 0) {
      end_ += static_cast<size_t>(r);
      return {};
    }
    if (r < 0 && errno == EINTR) continue;
    return recv_error(r);
  }
}

std::string RespReader::read_line(int fd, std::string* line) {
  size_t checked = 0;  // bytes after begin_ known to hold no CRLF start
  for (;;) {
    const char* b = buf_.get();
    for (size_t i = begin_ + checked; i + 1 < end_; ++i) {
      if (b[i] == '\r' && b[i + 1] == '\n') {
        line->assign(b + begin_, i - begin_);
        begin_ = i + 2;
        return {};
      }
    }
    // The last byte may be the CR of a CRLF that is not all here yet.
    checked = end_ - begin_ > 0 ? end_ - begin_ - 1 : 0;
    std::string why = fill(fd);  // may move the bytes to the front of the buffer
    if (!why.empty()) return why;
  }
}

std::string RespReader::read_bytes(int fd, unsigned char* dst, size_t n, uint32_t* crc) {
  // What is buffered already, then the rest straight from the socket.
  const size_t have = std::min(n, end_ - begin_);
  if (have > 0) {
    const char* src = buf_.get() + begin_;
    if (dst != nullptr && crc != nullptr) {
      *crc = crc32c_copy(dst, src, have, *crc);
    } else if (dst != nullptr) {
      std::memcpy(dst, src, have);
    }
    begin_ += have;
  }
  size_t done = have;
  while (done < n) {
    if (dst == nullptr) {  // discarded: through the buffer
      std::string why = fill(fd);
      if (!why.empty()) return why;
      const size_t take = std::min(n - done, end_ - begin_);
      begin_ += take;
      done += take;
      continue;
    }
    const ssize_t r = ::recv(fd, dst + done, n - done, 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return recv_error(r);
    }
    // Checksummed as it lands: a socket read is at most the socket buffer, so these bytes are
    // still in the CPU's cache.
    if (crc != nullptr) *crc = crc32c(dst + done, static_cast<size_t>(r), *crc);
    done += static_cast<size_t>(r);
  }
  return {};
}

std::string RespReader::read_head(int fd, Reply* reply, bool* bulk_body_follows) {
  *bulk_body_follows = false;
  std::string line;
  std::string why = read_line(fd, &line);
  if (!why.empty()) return why;
  if (line.empty()) return "protocol error: an empty reply line";
  const char kind = line[0];
  std::string rest = line.substr(1);
  switch (kind) {
    case '+':
      reply->type = Type::kStatus;
      reply->text = std::move(rest);
      return {};
    case '-':
      reply->type = Type::kError;
      reply->text = std::move(rest);
      return {};
    case ':':
      reply->type = Type::kInteger;
      if (!parse_int(rest, &reply->integer)) return "protocol error: bad integer reply";
      return {};
    case '$':
      if (!parse_int(rest, &reply->integer)) return "protocol error: bad bulk length";
      if (reply->integer < 0) {
        reply->type = Type::kNil;
        return {};
      }
      reply->type = Type::kBulk;
      *bulk_body_follows = true;
      return {};
    default:
      return std::string("protocol error: unexpected reply type '") + kind + "'";
  }
}

std::string RespReader::read(int fd, Reply* reply) {
  bool body = false;
  std::string why = read_head(fd, reply, &body);
  if (!why.empty() || !body) return why;
  if (reply->integer > kMaxTextBytes) return "protocol error: an unexpectedly large reply";
  reply->text.resize(static_cast<size_t>(reply->integer));
  why = read_bytes(fd, reinterpret_cast<unsigned char*>(reply->text.data()), reply->text.size(),
                   nullptr);
  if (!why.empty()) return why;
  unsigned char crlf[2];
  return read_bytes(fd, crlf, 2, nullptr);
}

std::string RespReader::read_block(int fd, Block* block, Reply* reply) {
  bool body = false;
  std::string why = read_head(fd, reply, &body);
  if (!why.empty() || !body) return why;
  const auto size = static_cast<uint64_t>(reply->integer);
  if (size != block->head_bytes + block->payload_bytes) {
    why = read_bytes(fd, nullptr, static_cast<size_t>(size) + 2, nullptr);
    return why;
  }
  block->payload_crc = 0;
  why = read_bytes(fd, block->head, block->head_bytes, nullptr);
  if (why.empty()) {
    why = read_bytes(fd, block->payload, block->payload_bytes, &block->payload_crc);
  }
  if (!why.empty()) return why;
  unsigned char crlf[2];
  return read_bytes(fd, crlf, 2, nullptr);
}

}  // namespace pagedkv::detail
