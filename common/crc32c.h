#ifndef FEDLEARN_COMMON_CRC32C_H_
#define FEDLEARN_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace fedlearn {

// CRC-32C (Castagnoli, as in iSCSI and gRPC's own compression checks) of `n`
// bytes. Uses the SSE4.2 crc32 instruction when the CPU has it, a table
// otherwise; both give the same value. Thread-safe.
uint32_t Crc32c(const void* data, size_t n);

// The CRC-32C of the concatenation A+B, given `crc` = Crc32c(A) and B = data[0,
// n).
uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t n);

// The CRC-32C of the concatenation A+B from `crc_a` = Crc32c(A), `crc_b` =
// Crc32c(B) and B's length `n_b`, without B's bytes: crc_a * x^(8 n_b) ^
// crc_b modulo the polynomial (the register's start and final inversions
// cancel out). Steps logarithmic in n_b (a few microseconds for a chunk of
// 1 MiB): a whole tensor's CRC from its chunks' costs no second pass over the
// data.
uint32_t ConcatCrc32c(uint32_t crc_a, uint32_t crc_b, uint64_t n_b);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_CRC32C_H_
