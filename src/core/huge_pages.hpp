// Large metadata arrays (block records, prefix nodes, the index's hash slots) backed by
// transparent huge pages where the OS offers them on request (Linux THP "madvise"). At a million
// cached blocks these arrays span ~200 MB, and an eviction's few random reads each cost a page
// walk on 4 KiB pages on top of the cache miss; 2 MiB pages take the walk away.
#pragma once

#include <cstddef>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pagedkv {
namespace core {

/// Below this an array fits a few small pages and the TLB covers it.
inline constexpr size_t kHugePageThreshold = size_t{2} << 20;

/// Asks the OS for huge pages over the whole 2 MiB pages inside [p, p + bytes); a hint only.
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t begin = (reinterpret_cast<size_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const size_t end = (reinterpret_cast<size_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// Sizes an empty vector to `n` value-initialised elements, advising huge pages before the
/// elements are first written (a page faulted in small cannot be advised large afterwards).
template <class T>
void resize_huge(std::vector<T>* v, size_t n) {
  v->reserve(n);
  if (n * sizeof(T) >= kHugePageThreshold) advise_huge_pages(v->data(), n * sizeof(T));
  v->resize(n);
}

}  // namespace core
}  // namespace pagedkv
