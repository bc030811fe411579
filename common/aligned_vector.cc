#include "common/aligned_vector.h"

#include <sys/mman.h>

namespace fedlearn {

void AdviseHugePages(void* p, size_t bytes) {
  const size_t whole = bytes / kHugePageBytes * kHugePageBytes;
  if (whole > 0) (void)madvise(p, whole, MADV_HUGEPAGE);  // advice only
}

}  // namespace fedlearn
