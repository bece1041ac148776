// Large metadata arrays (block records, prefix nodes, the index's hash slots) backed by
// transparent huge pages where the OS offers them on request (Linux THP "madvise"). At a million
// cached blocks these arrays span ~200 MB, and an eviction's few random reads each cost a page
// walk on 4 KiB pages on top of the cache miss; 2 MiB pages take the walk away.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pagedkv {
namespace core {

/// Below this an array fits a few small pages and the TLB covers it.
inline constexpr size_t kHugePageThreshold = size_t{2} << 20;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

/// Asks the OS for huge pages over the whole 2 MiB pages inside [p, p + bytes); a hint only.
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const size_t begin = (reinterpret_cast<size_t>(p) + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const size_t end = (reinterpret_cast<size_t>(p) + bytes) & ~(kHugePageBytes - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// An allocator whose large blocks start on a 2 MiB boundary and span whole 2 MiB pages, advised
/// huge before the elements are first written (a page faulted in small cannot be advised large
/// afterwards). Without the alignment the head and tail of an array (all of one of 2 MiB)
/// would stay on small pages.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // implicit: allocators rebind by converting

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageThreshold) return std::allocator<T>().allocate(n);
    const size_t whole = (bytes + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    void* p = std::aligned_alloc(kHugePageBytes, whole);
    if (p == nullptr) throw std::bad_alloc();
    advise_huge_pages(p, whole);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHugePageThreshold) {
      std::allocator<T>().deallocate(p, n);
    } else {
      std::free(p);
    }
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

/// A fixed-size metadata array (block records, prefix nodes, the index's hash slots).
template <class T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

/// Sizes an empty array to `n` value-initialised elements in one allocation.
template <class T>
void resize_huge(HugeVector<T>* v, size_t n) {
  v->reserve(n);
  v->resize(n);
}

}  // namespace core
}  // namespace pagedkv
