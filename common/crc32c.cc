#include "common/crc32c.h"

#include <array>
#include <cstring>

namespace fedlearn {
namespace {

// Reflected Castagnoli polynomial.
constexpr uint32_t kPolynomial = 0x82F63B78u;

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    }
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

// `crc` here is the raw register (already inverted by the caller).
uint32_t ExtendTable(uint32_t crc, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    crc = kTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

// Multiplication modulo the polynomial in the reflected form the register
// uses (bit 31 holds the coefficient of x^0, bit 0 that of x^31).
constexpr uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int bit = 31; bit >= 0; --bit) {
    if (a & (1u << bit)) product ^= b;
    b = (b >> 1) ^ ((b & 1u) ? kPolynomial : 0u);  // b *= x
  }
  return product;
}

// x^k modulo the polynomial.
constexpr uint32_t XPowModP(uint64_t k) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 30;  // x^1
  for (; k != 0; k >>= 1) {
    if (k & 1u) result = MultiplyModP(result, square);
    square = MultiplyModP(square, square);
  }
  return result;
}

// Feeding n zero bytes through the register multiplies it by x^(8n). That map
// is linear, so it is the XOR of what it does to each of the register's four
// bytes: a 4 x 256 table per n.
struct ZeroBytesShift {
  std::array<std::array<uint32_t, 256>, 4> table{};
  uint32_t operator()(uint32_t reg) const {
    return table[0][reg & 0xFFu] ^ table[1][(reg >> 8) & 0xFFu] ^
           table[2][(reg >> 16) & 0xFFu] ^ table[3][reg >> 24];
  }
};

constexpr ZeroBytesShift MakeZeroBytesShift(size_t n) {
  const uint32_t factor = XPowModP(8 * uint64_t{n});
  ZeroBytesShift shift;
  for (uint32_t byte = 0; byte < 4; ++byte) {
    for (uint32_t v = 0; v < 256; ++v) {
      shift.table[byte][v] = MultiplyModP(v << (8 * byte), factor);
    }
  }
  return shift;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of about three cycles and a throughput
// of one per cycle, so one chain of it runs at a third of what the unit can
// do. Three chains over three consecutive stretches of `kStretch` bytes keep
// it busy; the raw register is linear in its start value and in the data
// (reg(r, A+B) = reg(r, A) * x^(8|B|) ^ reg(0, B)), so the chains' results
// combine into the one-chain result exactly.
template <size_t kStretch>
__attribute__((target("sse4.2"))) uint64_t ThreeChains(
    uint64_t crc, const uint8_t*& p, size_t& n, const ZeroBytesShift& shift) {
  static_assert(kStretch % 8 == 0);
  while (n >= 3 * kStretch) {
    uint64_t crc1 = 0, crc2 = 0;
    for (size_t i = 0; i < kStretch; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kStretch + i, 8);
      std::memcpy(&w2, p + 2 * kStretch + i, 8);
      crc = __builtin_ia32_crc32di(crc, w0);
      crc1 = __builtin_ia32_crc32di(crc1, w1);
      crc2 = __builtin_ia32_crc32di(crc2, w2);
    }
    const uint32_t ab =
        shift(static_cast<uint32_t>(crc)) ^ static_cast<uint32_t>(crc1);
    crc = shift(ab) ^ static_cast<uint32_t>(crc2);
    p += 3 * kStretch;
    n -= 3 * kStretch;
  }
  return crc;
}

constexpr size_t kLongStretch = 4096, kShortStretch = 128;
constexpr ZeroBytesShift kLongShift = MakeZeroBytesShift(kLongStretch);
constexpr ZeroBytesShift kShortShift = MakeZeroBytesShift(kShortStretch);

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc,
                                                          const uint8_t* p,
                                                          size_t n) {
  uint64_t crc64 = crc;
  crc64 = ThreeChains<kLongStretch>(crc64, p, n, kLongShift);
  crc64 = ThreeChains<kShortStretch>(crc64, p, n, kShortShift);
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    crc64 = __builtin_ia32_crc32di(crc64, word);
    p += 8;
    n -= 8;
  }
  crc = static_cast<uint32_t>(crc64);
  while (n > 0) {
    crc = __builtin_ia32_crc32qi(crc, *p);
    ++p;
    --n;
  }
  return crc;
}

bool HasHardwareCrc() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t reg = ~crc;
#if defined(__x86_64__)
  if (HasHardwareCrc()) return ~ExtendHardware(reg, p, n);
#endif
  return ~ExtendTable(reg, p, n);
}

uint32_t Crc32c(const void* data, size_t n) { return ExtendCrc32c(0, data, n); }

uint32_t ConcatCrc32c(uint32_t crc_a, uint32_t crc_b, uint64_t n_b) {
  return MultiplyModP(crc_a, XPowModP(8 * n_b)) ^ crc_b;
}

}  // namespace fedlearn
