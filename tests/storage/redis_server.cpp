#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "storage/storage_test_util.hpp"

namespace pagedkv::testing {

RespClient::RespClient(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{2, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

RespClient::~RespClient() {
  if (fd_ >= 0) ::close(fd_);
}

bool RespClient::read_exact(size_t n, std::string* out) {
  while (buffered_.size() < n) {
    char buf[65536];
    const ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
    if (r <= 0) return false;
    buffered_.append(buf, size_t(r));
  }
  *out = buffered_.substr(0, n);
  buffered_.erase(0, n);
  return true;
}

bool RespClient::read_line(std::string* line) {
  for (;;) {
    const size_t end = buffered_.find("\r\n");
    if (end != std::string::npos) {
      *line = buffered_.substr(0, end);
      buffered_.erase(0, end + 2);
      return true;
    }
    char buf[4096];
    const ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
    if (r <= 0) return false;
    buffered_.append(buf, size_t(r));
  }
}

std::optional<std::string> RespClient::command(const std::vector<std::string>& args) {
  if (fd_ < 0) return std::nullopt;
  std::string req = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args) req += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t w = ::send(fd_, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (w <= 0) return std::nullopt;
    sent += size_t(w);
  }
  std::string line;
  if (!read_line(&line) || line.empty()) return std::nullopt;
  if (line[0] != '$') return line;
  const long n = std::strtol(line.c_str() + 1, nullptr, 10);
  if (n < 0) return std::string("nil");
  std::string body;
  if (!read_exact(size_t(n) + 2, &body)) return std::nullopt;
  return "$" + body.substr(0, size_t(n));
}

std::string RedisServer::binary() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return {};
}

RedisServer::RedisServer() {
  // A free port: bind to port 0 and take what the kernel chose.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port_ = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
}

std::string RedisServer::start() {
  if (pid_ > 0) return "already running";
  const std::string bin = binary();
  if (bin.empty()) return "redis-server is not installed";
  if (port_ <= 0) return "no free port";
  const std::string port = std::to_string(port_);
  std::vector<std::string> args = {
      bin,  "--port",      port, "--bind",     "127.0.0.1", "--save",           "",  "--appendonly",
      "no", "--daemonize", "no", "--loglevel", "warning",   "--protected-mode", "no"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec. The server dies with the test
    // process, even when that crashes, so that no server is left running.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (devnull >= 0) {
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (devnull >= 0) ::close(devnull);
  if (pid < 0) return "fork: " + std::string(std::strerror(errno));
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    RespClient c(port_);
    if (c.connected()) {
      auto reply = c.command({"PING"});
      if (reply && *reply == "+PONG") return {};
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return "redis-server exited at startup (port " + port + " taken?)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop(true);
  return "redis-server did not answer PING within 10 s";
}

void RedisServer::stop(bool crash) {
  if (pid_ <= 0) return;
  ::kill(pid_, crash ? SIGKILL : SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
}

}  // namespace pagedkv::testing
