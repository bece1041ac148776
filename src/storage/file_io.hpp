// Small POSIX helpers of the file store: directories, and vectored reads and writes that finish
// what a short transfer left (the kernel may stop a pwritev / preadv early at any iovec).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace pagedkv::detail {

/// Frees a buffer from aligned_alloc / posix_memalign (the O_DIRECT buffers' deleter).
struct FreeAligned {
  void operator()(unsigned char* p) const { std::free(p); }
};

/// strerror(e) as a string.
std::string errno_text(int e);

/// mkdir that accepts an existing directory; false (and *error) otherwise.
bool make_dir(const std::string& path, std::string* error);
/// mkdir -p.
bool make_dirs(const std::string& path, std::string* error);
/// fsync of a directory (a new file's name is durable once its directory is).
bool fsync_dir(const std::string& dir, std::string* error);

/// Steps `iov` (and the first iovec's base and length) past `n` bytes; returns how many iovecs
/// are left.
int advance_iovecs(iovec*& iov, int count, size_t n);

/// Writes all of `iov[0..count)` at `offset`. `iov` is modified. Empty string on success, else
/// why not (some bytes may have been written).
std::string pwritev_all(int fd, iovec* iov, int count, int64_t offset);
/// Reads `iov[0..count)` from `offset` until they are full or the file ends. `iov` is modified.
/// Returns the bytes read (short: the file ended), or -1 with *error set.
int64_t preadv_all(int fd, iovec* iov, int count, int64_t offset, std::string* error);
/// The same on a file opened with O_DIRECT (offset and iovecs aligned to `unit`): a read that
/// stops off a `unit` boundary stopped at the end of the file. On failure *err is the errno.
int64_t preadv_direct(int fd, iovec* iov, int count, int64_t offset, int64_t unit,
                      std::string* error, int* err);

}  // namespace pagedkv::detail
