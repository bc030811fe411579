#include "common/crc32c.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fedlearn {
namespace {

// Bit-at-a-time CRC-32C straight from the definition (reflected polynomial
// 0x82F63B78), independent of the table and of the SSE4.2 instruction the
// library uses.
uint32_t ReferenceCrc32c(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    }
  }
  return ~crc;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() >> 24);
  return bytes;
}

TEST(Crc32cTest, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32c(s.data(), s.size()), 0xE3069283u);
}

TEST(Crc32cTest, EmptyIsZero) {
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  const char c = 'x';
  EXPECT_EQ(Crc32c(&c, 0), 0u);
  // Extending by nothing leaves any CRC unchanged.
  EXPECT_EQ(ExtendCrc32c(0xE3069283u, &c, 0), 0xE3069283u);
}

// RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32cTest, Rfc3720Vectors) {
  uint8_t buf[32];
  std::memset(buf, 0x00, sizeof(buf));
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof(buf));
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x113FDB5Cu);
}

TEST(Crc32cTest, SingleBytes) {
  const uint8_t zero = 0x00;
  const uint8_t ff = 0xFF;
  const uint8_t a = 'a';
  EXPECT_EQ(Crc32c(&zero, 1), 0x527D5351u);
  EXPECT_EQ(Crc32c(&ff, 1), 0xFF000000u);
  EXPECT_EQ(Crc32c(&a, 1), 0xC1D04330u);
}

TEST(Crc32cTest, MatchesBitwiseReferenceForEveryLengthUpTo100) {
  const std::vector<uint8_t> bytes = RandomBytes(100, 1);
  for (size_t n = 0; n <= bytes.size(); ++n) {
    EXPECT_EQ(Crc32c(bytes.data(), n), ReferenceCrc32c(bytes.data(), n))
        << "length " << n;
  }
}

TEST(Crc32cTest, UnalignedStartsAndOddLengths) {
  // Every start offset within a 16-byte window and lengths that leave 1..7
  // bytes after the last whole 8-byte word.
  const std::vector<uint8_t> bytes = RandomBytes(4096 + 64, 2);
  for (size_t start = 0; start < 16; ++start) {
    for (size_t n : {1u, 3u, 7u, 9u, 15u, 17u, 63u, 255u, 1029u, 4095u}) {
      EXPECT_EQ(Crc32c(bytes.data() + start, n),
                ReferenceCrc32c(bytes.data() + start, n))
          << "start " << start << ", length " << n;
    }
  }
}

// Long inputs go through three interleaved chains (stretches of 4096 and of
// 128 bytes) whose results are combined; every length around those blocks'
// edges, at odd starts, must still be the plain CRC.
TEST(Crc32cTest, LongInputsAroundTheInterleavedBlocksMatchTheReference) {
  const std::vector<uint8_t> bytes =
      RandomBytes(2 * 3 * 4096 + 3 * 128 + 64, 6);
  std::vector<size_t> lengths;
  for (size_t block : {3u * 128, 3u * 4096, 2u * 3 * 4096}) {
    for (size_t n = block - 9; n <= block + 9; ++n) lengths.push_back(n);
  }
  lengths.push_back(3 * 4096 + 3 * 128 + 8 + 7);  // every tier once
  lengths.push_back(bytes.size() - 3);
  for (size_t start : {0u, 1u, 3u}) {
    for (size_t n : lengths) {
      ASSERT_LE(start + n, bytes.size());
      EXPECT_EQ(Crc32c(bytes.data() + start, n),
                ReferenceCrc32c(bytes.data() + start, n))
          << "start " << start << ", length " << n;
    }
  }
}

TEST(Crc32cTest, AFlippedBitInAnyInterleavedStretchIsDetected) {
  // One bit in each of the three stretches of a long block, and in the tail.
  std::vector<uint8_t> bytes = RandomBytes(3 * 4096 + 100, 7);
  const uint32_t before = Crc32c(bytes.data(), bytes.size());
  for (size_t i : {0u, 4095u, 4096u, 8191u, 8192u, 12287u, 12288u, 12387u}) {
    bytes[i] ^= 0x10;
    EXPECT_EQ(Crc32c(bytes.data(), bytes.size()),
              ReferenceCrc32c(bytes.data(), bytes.size()))
        << "byte " << i;
    EXPECT_NE(Crc32c(bytes.data(), bytes.size()), before) << "byte " << i;
    bytes[i] ^= 0x10;
  }
}

TEST(Crc32cTest, SameBytesAtDifferentAlignmentsGiveTheSameValue) {
  const std::string s = "123456789";
  alignas(16) char buf[32];
  for (size_t start = 0; start < 16; ++start) {
    std::memset(buf, 0xAB, sizeof(buf));
    std::memcpy(buf + start, s.data(), s.size());
    EXPECT_EQ(Crc32c(buf + start, s.size()), 0xE3069283u) << "start " << start;
  }
}

TEST(Crc32cTest, ExtendOverEverySplitEqualsOneShot) {
  const std::string s = "123456789";
  for (size_t split = 0; split <= s.size(); ++split) {
    const uint32_t head = Crc32c(s.data(), split);
    EXPECT_EQ(ExtendCrc32c(head, s.data() + split, s.size() - split),
              0xE3069283u)
        << "split " << split;
  }
}

TEST(Crc32cTest, ExtendOverEveryTwoWaySplitOfRandomBytes) {
  const std::vector<uint8_t> bytes = RandomBytes(257, 3);
  const uint32_t whole = Crc32c(bytes.data(), bytes.size());
  ASSERT_EQ(whole, ReferenceCrc32c(bytes.data(), bytes.size()));
  for (size_t split = 0; split <= bytes.size(); ++split) {
    const uint32_t head = Crc32c(bytes.data(), split);
    EXPECT_EQ(ExtendCrc32c(head, bytes.data() + split, bytes.size() - split),
              whole)
        << "split " << split;
  }
}

TEST(Crc32cTest, ExtendPieceByPieceEqualsOneShot) {
  const std::vector<uint8_t> bytes = RandomBytes(10000, 4);
  const uint32_t whole = Crc32c(bytes.data(), bytes.size());
  for (size_t piece : {1u, 2u, 3u, 5u, 8u, 13u, 1028u, 4096u}) {
    uint32_t crc = 0;
    for (size_t pos = 0; pos < bytes.size(); pos += piece) {
      const size_t n = std::min(piece, bytes.size() - pos);
      crc = ExtendCrc32c(crc, bytes.data() + pos, n);
    }
    EXPECT_EQ(crc, whole) << "piece " << piece;
  }
}

TEST(Crc32cTest, ConcatOfTwoCrcsIsTheCrcOfTheConcatenation) {
  // "123456789" split anywhere: the parts' CRCs give the check value, and
  // joining with an empty part changes nothing.
  const std::string s = "123456789";
  for (size_t split = 0; split <= s.size(); ++split) {
    EXPECT_EQ(ConcatCrc32c(Crc32c(s.data(), split),
                           Crc32c(s.data() + split, s.size() - split),
                           s.size() - split),
              0xE3069283u)
        << "split " << split;
  }
  // Long parts (the chunk sizes clients send: 64 KiB up to 1 MiB, and odd
  // ones), against the bitwise reference over the whole.
  const std::vector<uint8_t> bytes = RandomBytes((1 << 20) + 4099, 8);
  for (size_t head : {1u, 4096u, 65536u, 65539u, 1u << 20}) {
    const size_t tail = bytes.size() - head;
    EXPECT_EQ(ConcatCrc32c(Crc32c(bytes.data(), head),
                           Crc32c(bytes.data() + head, tail), tail),
              ReferenceCrc32c(bytes.data(), bytes.size()))
        << "head " << head;
  }
}

TEST(Crc32cTest, ConcatChunkByChunkEqualsOneShot) {
  // How a tensor's CRC is built from its chunks', at every chunk size a
  // sender may pick (any byte split).
  const std::vector<uint8_t> bytes = RandomBytes(100000, 9);
  const uint32_t whole = ReferenceCrc32c(bytes.data(), bytes.size());
  for (size_t piece : {1u, 3u, 4u, 1000u, 4096u, 65536u}) {
    uint32_t crc = 0;
    for (size_t pos = 0; pos < bytes.size(); pos += piece) {
      const size_t n = std::min(piece, bytes.size() - pos);
      const uint32_t part = Crc32c(bytes.data() + pos, n);
      crc = pos == 0 ? part : ConcatCrc32c(crc, part, n);
    }
    EXPECT_EQ(crc, whole) << "piece " << piece;
  }
}

TEST(Crc32cTest, DetectsASingleFlippedBit) {
  std::vector<uint8_t> bytes = RandomBytes(1024, 5);
  const uint32_t before = Crc32c(bytes.data(), bytes.size());
  for (size_t i : {0u, 1u, 511u, 1023u}) {
    for (int bit = 0; bit < 8; ++bit) {
      bytes[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_NE(Crc32c(bytes.data(), bytes.size()), before)
          << "byte " << i << ", bit " << bit;
      bytes[i] ^= static_cast<uint8_t>(1u << bit);
    }
  }
  EXPECT_EQ(Crc32c(bytes.data(), bytes.size()), before);
}

}  // namespace
}  // namespace fedlearn
