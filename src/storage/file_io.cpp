#include "storage/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pagedkv::detail {

int advance_iovecs(iovec*& iov, int count, size_t n) {
  while (count > 0 && n >= iov->iov_len) {
    n -= iov->iov_len;
    ++iov;
    --count;
  }
  if (count > 0) {
    iov->iov_base = static_cast<unsigned char*>(iov->iov_base) + n;
    iov->iov_len -= n;
  }
  return count;
}

std::string errno_text(int e) { return std::string(std::strerror(e)); }

bool make_dir(const std::string& path, std::string* error) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return true;
    *error = path + ": exists and is not a directory";
    return false;
  }
  *error = path + ": " + errno_text(errno);
  return false;
}

bool make_dirs(const std::string& path, std::string* error) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      const std::string prefix = path.substr(0, pos);
      if (prefix.empty() || prefix.back() == '/') continue;
      if (!make_dir(prefix, error)) return false;
    }
  }
  return true;
}

bool fsync_dir(const std::string& dir, std::string* error) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *error = "open " + dir + ": " + errno_text(errno);
    return false;
  }
  const bool ok = ::fsync(fd) == 0;
  if (!ok) *error = "fsync " + dir + ": " + errno_text(errno);
  ::close(fd);
  return ok;
}

std::string pwritev_all(int fd, iovec* iov, int count, int64_t offset) {
  while (count > 0) {
    const ssize_t w = ::pwritev(fd, iov, count, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return "write: " + errno_text(errno);
    }
    if (w == 0) return "write: no progress";
    offset += w;
    count = advance_iovecs(iov, count, static_cast<size_t>(w));
  }
  return {};
}

int64_t preadv_direct(int fd, iovec* iov, int count, int64_t offset, int64_t unit,
                      std::string* error, int* err) {
  int64_t done = 0;
  while (count > 0) {
    const ssize_t r = ::preadv(fd, iov, count, static_cast<off_t>(offset));
    if (r < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      *err = e;
      *error = "read: " + errno_text(e);
      return -1;
    }
    if (r == 0) break;  // the file ends
    offset += r;
    done += r;
    if (unit > 1 && offset % unit != 0) break;  // ... mid-unit
    count = advance_iovecs(iov, count, static_cast<size_t>(r));
  }
  return done;
}

int64_t preadv_all(int fd, iovec* iov, int count, int64_t offset, std::string* error) {
  int err = 0;
  return preadv_direct(fd, iov, count, offset, /*unit=*/1, error, &err);
}

}  // namespace pagedkv::detail
