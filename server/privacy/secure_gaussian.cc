#include "server/privacy/secure_gaussian.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fedlearn {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;
// Pairs drawn per call to the generator: 64 KiB of random bytes.
constexpr size_t kPairsPerBlock = 4096;

// A uniform in (0, 1] from the top 53 bits of `bits`: never 0, so log is
// finite.
double OpenUnit(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53;
}

}  // namespace

absl::Status AddSecureGaussianNoise(double stddev, absl::Span<double> values) {
  // 64 KiB of random bytes at a time, so the draw costs no model-sized buffer.
  std::vector<uint64_t> bits(2 * kPairsPerBlock);
  for (size_t begin = 0; begin < values.size(); begin += 2 * kPairsPerBlock) {
    const size_t count = std::min(values.size() - begin, 2 * kPairsPerBlock);
    const size_t pairs = (count + 1) / 2;
    if (RAND_priv_bytes(reinterpret_cast<unsigned char*>(bits.data()),
                        static_cast<int>(2 * pairs * sizeof(uint64_t))) != 1) {
      return absl::InternalError(
          "the secure random generator failed: no privacy noise drawn");
    }
    double* v = values.data() + begin;
    for (size_t p = 0; p < pairs; ++p) {
      const double radius =
          stddev * std::sqrt(-2.0 * std::log(OpenUnit(bits[2 * p])));
      const double angle = kTwoPi * OpenUnit(bits[2 * p + 1]);
      v[2 * p] += radius * std::cos(angle);
      if (2 * p + 1 < count) v[2 * p + 1] += radius * std::sin(angle);
    }
  }
  return absl::OkStatus();
}

}  // namespace fedlearn
