// The Redis store's reply reader over a socketpair: replies cut at every byte, blocks received
// into their destinations with the payload's CRC, and the stream kept in step after a bulk
// string of another size, a nil, an error and a closed connection.
#include "storage/resp_reader.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "storage/crc32c.hpp"
#include "storage/store_env.hpp"

namespace pagedkv::testing {
namespace {

using detail::RespReader;

class RespReaderTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    if (writer_.joinable()) writer_.join();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  // Sends `bytes` from another thread in pieces of `piece` bytes (each its own write), so that
  // the reader sees every reply cut at many places.
  void send_in_pieces(std::string bytes, size_t piece) {
    writer_ = std::thread([this, bytes = std::move(bytes), piece] {
      for (size_t i = 0; i < bytes.size(); i += piece) {
        const size_t n = std::min(piece, bytes.size() - i);
        if (::write(fds_[1], bytes.data() + i, n) != static_cast<ssize_t>(n)) return;
      }
    });
  }
  int fds_[2] = {-1, -1};
  std::thread writer_;
};

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST_F(RespReaderTest, RepliesCutAnywhereReadBackInOrder) {
  const std::string head = random_bytes(48, 1), payload = random_bytes(70001, 2);
  const std::string other = random_bytes(100, 3);
  std::string stream = "+OK\r\n:1\r\n:-7\r\n$-1\r\n-ERR wrong type\r\n";
  stream += "$" + std::to_string(head.size() + payload.size()) + "\r\n" + head + payload + "\r\n";
  stream += "$100\r\n" + other + "\r\n";  // a bulk of another size: discarded by read_block
  stream += "$5\r\nhello\r\n:42\r\n";
  for (size_t piece : {1, 3, 4096, 1 << 20}) {
    SCOPED_TRACE("pieces of " + std::to_string(piece));
    TearDown();
    SetUp();
    send_in_pieces(stream, piece);
    RespReader r;
    RespReader::Reply reply;
    ASSERT_EQ(r.read(fds_[0], &reply), "");
    EXPECT_EQ(reply.type, RespReader::Type::kStatus);
    EXPECT_EQ(reply.text, "OK");
    ASSERT_EQ(r.read(fds_[0], &reply), "");
    EXPECT_EQ(reply.type, RespReader::Type::kInteger);
    EXPECT_EQ(reply.integer, 1);
    ASSERT_EQ(r.read(fds_[0], &reply), "");
    EXPECT_EQ(reply.integer, -7);
    ASSERT_EQ(r.read(fds_[0], &reply), "");
    EXPECT_EQ(reply.type, RespReader::Type::kNil);
    ASSERT_EQ(r.read(fds_[0], &reply), "");
    EXPECT_EQ(reply.type, RespReader::Type::kError);
    EXPECT_EQ(reply.text, "ERR wrong type");

    std::vector<unsigned char> h(48, 0xEE), p(payload.size(), 0xEE);
    RespReader::Block block;
    block.head = h.data();
    block.head_bytes = h.size();
    block.payload = p.data();
    block.payload_bytes = p.size();
    ASSERT_EQ(r.read_block(fds_[0], &block, &reply), "");
    EXPECT_EQ(reply.type, RespReader::Type::kBulk);
    EXPECT_EQ(std::string(h.begin(), h.end()), head);
    EXPECT_EQ(std::string(p.begin(), p.end()), payload);
    EXPECT_EQ(block.payload_crc, reference_crc32c(p.data(), p.size()));

    std::fill(p.begin(), p.end(), 0xEE);
    ASSERT_EQ(r.read_block(fds_[0], &block, &reply), "");
    EXPECT_EQ(reply.type, RespReader::Type::kBulk);
    EXPECT_EQ(reply.integer, 100);
    EXPECT_EQ(p, std::vector<unsigned char>(p.size(), 0xEE));  // not the block's size: untouched

    ASSERT_EQ(r.read(fds_[0], &reply), "");
    EXPECT_EQ(reply.type, RespReader::Type::kBulk);
    EXPECT_EQ(reply.text, "hello");
    ASSERT_EQ(r.read(fds_[0], &reply), "");
    EXPECT_EQ(reply.integer, 42);
  }
}

TEST_F(RespReaderTest, AClosedConnectionOrAnUnexpectedReplyIsAnError) {
  send_in_pieces("$10\r\nabc", 1 << 20);
  writer_.join();
  ::close(fds_[1]);
  fds_[1] = -1;
  RespReader r;
  RespReader::Reply reply;
  EXPECT_NE(r.read(fds_[0], &reply).find("closed"), std::string::npos);

  TearDown();
  SetUp();
  send_in_pieces("*2\r\n:1\r\n:2\r\n", 1 << 20);
  r.reset();
  EXPECT_NE(r.read(fds_[0], &reply).find("protocol error"), std::string::npos);
}

}  // namespace
}  // namespace pagedkv::testing
