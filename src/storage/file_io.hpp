// Small POSIX helpers of the file store: directories, and vectored reads and writes that finish
// what a short transfer left (the kernel may stop a pwritev / preadv early at any iovec).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedkv::detail {

/// strerror(e) as a string.
std::string errno_text(int e);

/// mkdir that accepts an existing directory; false (and *error) otherwise.
bool make_dir(const std::string& path, std::string* error);
/// mkdir -p.
bool make_dirs(const std::string& path, std::string* error);
/// fsync of a directory (a new file's name is durable once its directory is).
bool fsync_dir(const std::string& dir, std::string* error);

/// Writes all of `iov[0..count)` at `offset`. `iov` is modified. Empty string on success, else
/// why not (some bytes may have been written).
std::string pwritev_all(int fd, iovec* iov, int count, int64_t offset);
/// Reads `iov[0..count)` from `offset` until they are full or the file ends. `iov` is modified.
/// Returns the bytes read (short: the file ended), or -1 with *error set.
int64_t preadv_all(int fd, iovec* iov, int count, int64_t offset, std::string* error);

}  // namespace pagedkv::detail
