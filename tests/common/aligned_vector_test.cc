#include "common/aligned_vector.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace fedlearn {
namespace {

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The "THPeligible" value of the mapping in /proc/self/smaps that holds `p`:
// 1 when the kernel may back it with transparent huge pages; -1 if not found.
int HugePageEligibility(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t start, end;
    char dash;
    std::istringstream header(line);
    if (header >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= Address(p) && Address(p) < end;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(line.find(':') + 1));
    }
  }
  return -1;
}

// The kernel's transparent huge page mode: "always", "madvise" or "never".
std::string HugePageMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(in, modes);
  const size_t open = modes.find('['), close = modes.find(']');
  if (open == std::string::npos || close == std::string::npos) return "never";
  return modes.substr(open + 1, close - open - 1);
}

TEST(AlignedVectorTest, SmallBlocksStartOnACacheLine) {
  for (size_t n : {1, 3, 1000, 100000}) {
    AlignedVector<float> v(n);
    EXPECT_EQ(Address(v.data()) % kCacheLineBytes, 0u) << n;
  }
}

TEST(AlignedVectorTest, ModelSizedBlocksStartOnAHugePageAndAskForHugePages) {
  // mnist_cnn's 1.2M floats (4.8 MB), and a sum of doubles as large.
  AlignedVector<float> floats(1199882, 1.f);
  AlignedVector<double> doubles(1199882, 1.0);
  for (const void* p : {static_cast<const void*>(floats.data()),
                        static_cast<const void*>(doubles.data())}) {
    EXPECT_EQ(Address(p) % kHugePageBytes, 0u);
    if (HugePageMode() == "never") continue;  // the kernel offers none
    EXPECT_EQ(HugePageEligibility(p), 1);
  }
  // Given back with the alignment it was made with, grown and shrunk alike.
  floats.resize(3 * floats.size());
  floats.resize(10);
  floats.shrink_to_fit();
  EXPECT_EQ(Address(floats.data()) % kCacheLineBytes, 0u);
}

}  // namespace
}  // namespace fedlearn
