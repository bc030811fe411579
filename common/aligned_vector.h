#ifndef FEDLEARN_COMMON_ALIGNED_VECTOR_H_
#define FEDLEARN_COMMON_ALIGNED_VECTOR_H_

#include <cstddef>
#include <new>
#include <vector>

namespace fedlearn {

// The alignment of the model-sized arrays every received byte streams through
// (staging buffers, aggregation sums): one cache line, and for a block of one
// huge page or more, a huge page.
inline constexpr size_t kCacheLineBytes = 64;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

constexpr size_t BlockAlignment(size_t bytes) {
  return bytes >= kHugePageBytes ? kHugePageBytes : kCacheLineBytes;
}

// Asks the kernel to back the whole huge pages of [p, p + bytes) with
// transparent huge pages (madvise MADV_HUGEPAGE; a no-op where the kernel has
// them disabled). `p` is huge-page aligned.
void AdviseHugePages(void* p, size_t bytes);

// An allocator whose blocks start on a cache line. glibc's malloc places a
// large block 16 bytes past a page boundary, so with 64-byte vectors
// (AVX-512) most loads and stores of it span two cache lines: fedavg_bench's
// fold ran at 10.3-11.1 GB/s over such blocks and at 14.4-15.3 over aligned
// ones (README, "Receiving updates"). A block of 2 MiB or more also starts on
// a huge page and asks for huge pages: its first touch then costs a fault per
// 2 MiB instead of one per 4 KiB, which on a VM is most of what a staging
// buffer costs the first round that uses it (README, "How updates are
// received").
template <typename T>
struct CacheLineAllocator {
  using value_type = T;

  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}  // NOLINT

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    void* p = ::operator new (bytes, std::align_val_t{BlockAlignment(bytes)});
    if (bytes >= kHugePageBytes) AdviseHugePages(p, bytes);
    return static_cast<T*>(p);
  }
  // The unsized form: clang declares sized deallocation only with
  // -fsized-deallocation.
  void deallocate(T* p, size_t n) noexcept {
    ::operator delete (p, std::align_val_t{BlockAlignment(n * sizeof(T))});
  }

  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator&) {
    return true;
  }
  friend bool operator!=(const CacheLineAllocator&, const CacheLineAllocator&) {
    return false;
  }
};

// A std::vector whose data() starts on a cache line.
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_ALIGNED_VECTOR_H_
