#include "common/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/crc32c.h"
#include "common/model_spec.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

// 26 floats, 104 bytes: a.weight [3, 5] (60 bytes) at 0, a.bias [3] (12) at 15,
// b.weight [2, 3] (24) at 18, b.bias [2] (8) at 24.
ModelSpec TinySpec() {
  absl::StatusOr<ModelSpec> spec =
      MakeModelSpec("tiny", {{"a.weight", {3, 5}, Init::kGlorotUniform, 5, 3},
                             {"a.bias", {3}, Init::kZeros},
                             {"b.weight", {2, 3}, Init::kGlorotUniform, 3, 2},
                             {"b.bias", {2}, Init::kZeros}});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *std::move(spec);
}

// Distinct values, including a negative zero, a subnormal and the largest
// float.
std::vector<float> TinyValues() {
  std::vector<float> v(26);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * i - 3.0f;
  v[3] = -0.0f;
  v[7] = std::numeric_limits<float>::denorm_min() * 3;
  v[25] = std::numeric_limits<float>::max();
  return v;
}

float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

std::vector<v1::TensorChunk> WriteAll(const ModelSpec& spec,
                                      absl::Span<const float> values,
                                      size_t chunk_bytes) {
  ChunkWriter writer(spec, values, chunk_bytes);
  std::vector<v1::TensorChunk> chunks;
  v1::TensorChunk chunk;
  while (writer.Next(&chunk)) chunks.push_back(chunk);
  return chunks;
}

// Feeds `chunks` in order and returns the first error (and its index in
// `failed_at`), or Finish()'s status.
absl::Status AddAll(ChunkAssembler& assembler,
                    const std::vector<v1::TensorChunk>& chunks,
                    size_t* failed_at = nullptr) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    absl::Status status = assembler.Add(chunks[i]);
    if (!status.ok()) {
      if (failed_at != nullptr) *failed_at = i;
      return status;
    }
  }
  if (failed_at != nullptr) *failed_at = chunks.size();
  return assembler.Finish();
}

// Recomputes a chunk's own checksum after its data was edited, so that the
// check under test is the one that fires.
void Reseal(v1::TensorChunk* chunk) {
  chunk->set_chunk_crc32c(Crc32c(chunk->data().data(), chunk->data().size()));
}

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---------------------------------------------------------------------------------------
// ToProto / FromProto.

TEST(ModelSpecProtoTest, RoundTrip) {
  for (const std::string& name : RegisteredModels()) {
    absl::StatusOr<ModelSpec> spec = LookupModel(name);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const v1::ModelSpec proto = ToProto(*spec);
    EXPECT_EQ(proto.name(), name);
    EXPECT_EQ(proto.num_parameters(), spec->num_parameters);
    ASSERT_EQ(proto.tensors_size(), static_cast<int>(spec->tensors.size()));
    for (int i = 0; i < proto.tensors_size(); ++i) {
      EXPECT_EQ(proto.tensors(i).name(), spec->tensors[i].name);
      EXPECT_THAT(proto.tensors(i).shape(),
                  ::testing::ElementsAreArray(spec->tensors[i].shape));
      EXPECT_EQ(proto.tensors(i).dtype(), v1::DTYPE_FLOAT32);
    }

    absl::StatusOr<ModelSpec> back = FromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->name, name);
    EXPECT_EQ(back->num_parameters, spec->num_parameters);
    ASSERT_EQ(back->tensors.size(), spec->tensors.size());
    for (size_t i = 0; i < spec->tensors.size(); ++i) {
      EXPECT_EQ(back->tensors[i].name, spec->tensors[i].name);
      EXPECT_EQ(back->tensors[i].shape, spec->tensors[i].shape);
      EXPECT_EQ(back->tensors[i].num_elements, spec->tensors[i].num_elements);
      EXPECT_EQ(back->tensors[i].offset, spec->tensors[i].offset);
    }
  }
}

TEST(ModelSpecProtoTest, RejectsNonFloat32Dtype) {
  for (v1::DType dtype :
       {v1::DTYPE_UNSPECIFIED, v1::DTYPE_FLOAT16, v1::DTYPE_INT8}) {
    v1::ModelSpec proto = ToProto(TinySpec());
    proto.mutable_tensors(2)->set_dtype(dtype);
    absl::StatusOr<ModelSpec> spec = FromProto(proto);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << v1::DType_Name(dtype);
    EXPECT_THAT(spec.status().message(), HasSubstr("b.weight"));
  }
}

TEST(ModelSpecProtoTest, RejectsNumParametersMismatch) {
  v1::ModelSpec proto = ToProto(TinySpec());
  for (int64_t n : {int64_t{25}, int64_t{27}, int64_t{0}}) {
    proto.set_num_parameters(n);
    absl::StatusOr<ModelSpec> spec = FromProto(proto);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(spec.status().message(), HasSubstr("26"));
  }
}

TEST(ModelSpecProtoTest, RejectsBadShapesAndNames) {
  v1::ModelSpec zero_dim = ToProto(TinySpec());
  zero_dim.mutable_tensors(0)->set_shape(1, 0);
  EXPECT_EQ(FromProto(zero_dim).status().code(),
            absl::StatusCode::kInvalidArgument);

  v1::ModelSpec duplicate = ToProto(TinySpec());
  duplicate.mutable_tensors(3)->set_name("a.bias");
  EXPECT_EQ(FromProto(duplicate).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------
// ChunkWriter.

TEST(ChunkWriterTest, TinyLayoutAt16Bytes) {
  const ModelSpec spec = TinySpec();
  const std::vector<float> values = TinyValues();
  const std::vector<v1::TensorChunk> chunks = WriteAll(spec, values, 16);
  struct Want {
    const char* name;
    uint64_t offset;
    size_t size;
    bool last;
  };
  const std::vector<Want> want = {
      {"a.weight", 0, 16, false},  {"a.weight", 16, 16, false},
      {"a.weight", 32, 16, false}, {"a.weight", 48, 12, true},
      {"a.bias", 0, 12, true},     {"b.weight", 0, 16, false},
      {"b.weight", 16, 8, true},   {"b.bias", 0, 8, true},
  };
  ASSERT_EQ(chunks.size(), want.size());
  const uint64_t totals[] = {60, 60, 60, 60, 12, 24, 24, 8};
  const size_t first_float[] = {0, 4, 8, 12, 15, 18, 22, 24};
  for (size_t i = 0; i < want.size(); ++i) {
    const v1::TensorChunk& c = chunks[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(c.name(), want[i].name);
    EXPECT_EQ(c.offset(), want[i].offset);
    EXPECT_EQ(c.data().size(), want[i].size);
    EXPECT_EQ(c.last(), want[i].last);
    EXPECT_EQ(c.total_bytes(), totals[i]);
    EXPECT_EQ(c.dtype(), v1::DTYPE_FLOAT32);
    EXPECT_EQ(c.encoding(), v1::ENCODING_DENSE);
    EXPECT_EQ(std::memcmp(c.data().data(), values.data() + first_float[i],
                          want[i].size),
              0);
    EXPECT_EQ(c.chunk_crc32c(), Crc32c(c.data().data(), c.data().size()));
  }
  EXPECT_THAT(chunks[0].shape(), ::testing::ElementsAre(3, 5));
  EXPECT_THAT(chunks[4].shape(), ::testing::ElementsAre(3));
  EXPECT_THAT(chunks[6].shape(), ::testing::ElementsAre(2, 3));
  // The whole-tensor checksum rides on each tensor's last chunk.
  EXPECT_EQ(chunks[3].tensor_crc32c(), Crc32c(values.data(), 60));
  EXPECT_EQ(chunks[4].tensor_crc32c(), Crc32c(values.data() + 15, 12));
  EXPECT_EQ(chunks[6].tensor_crc32c(), Crc32c(values.data() + 18, 24));
  EXPECT_EQ(chunks[7].tensor_crc32c(), Crc32c(values.data() + 24, 8));
}

TEST(ChunkWriterTest, NextReturnsFalseAndLeavesTheChunkAloneWhenDone) {
  const ModelSpec spec = TinySpec();
  const std::vector<float> values = TinyValues();
  ChunkWriter writer(spec, values, 1 << 20);
  EXPECT_EQ(writer.total_bytes(), 104);
  v1::TensorChunk chunk;
  int n = 0;
  while (writer.Next(&chunk)) ++n;
  EXPECT_EQ(n, 4);  // one chunk per tensor
  chunk.Clear();
  chunk.set_name("sentinel");
  EXPECT_FALSE(writer.Next(&chunk));
  EXPECT_FALSE(writer.Next(&chunk));
  EXPECT_EQ(chunk.name(), "sentinel");
}

TEST(ChunkWriterTest, ChunkSizeIsCappedAtTheWireLimit) {
  absl::StatusOr<ModelSpec> spec = LookupModel("mnist_cnn");
  ASSERT_TRUE(spec.ok());
  std::vector<float> values(spec->num_parameters);
  InitializeParameters(*spec, 3, absl::MakeSpan(values));
  for (size_t chunk_bytes : {kMaxChunkBytes, 4 * kMaxChunkBytes}) {
    const std::vector<v1::TensorChunk> chunks =
        WriteAll(*spec, values, chunk_bytes);
    // fc1.weight is 4,718,592 bytes = 4.5 MiB: five chunks; every other tensor
    // fits in one.
    EXPECT_EQ(chunks.size(), 12u) << chunk_bytes;
    for (const v1::TensorChunk& c : chunks) {
      EXPECT_LE(c.data().size(), kMaxChunkBytes);
    }
  }
}

// ---------------------------------------------------------------------------------------
// ChunkWriter -> ChunkAssembler round trips.

// Checks the invariants of a chunk stream for `spec` written `chunk_bytes` at a
// time.
void ExpectWellFormed(const ModelSpec& spec,
                      const std::vector<v1::TensorChunk>& chunks,
                      size_t chunk_bytes) {
  // Payloads are whole floats: the writer rounds the size down to a multiple
  // of 4.
  const size_t limit =
      std::min(std::max<size_t>(chunk_bytes & ~size_t{3}, 4), kMaxChunkBytes);
  size_t tensor = 0;
  uint64_t offset = 0;
  int64_t total = 0;
  for (const v1::TensorChunk& c : chunks) {
    ASSERT_LT(tensor, spec.tensors.size());
    const TensorSpec& t = spec.tensors[tensor];
    ASSERT_EQ(c.name(), t.name);
    ASSERT_EQ(c.offset(), offset) << t.name;
    ASSERT_GT(c.data().size(), 0u) << t.name;
    ASSERT_LE(c.data().size(), limit) << t.name;
    ASSERT_EQ(c.data().size() % 4, 0u) << t.name;
    ASSERT_EQ(c.total_bytes(), static_cast<uint64_t>(t.num_elements) * 4);
    offset += c.data().size();
    total += c.data().size();
    // `last` exactly on the chunk that completes the tensor.
    ASSERT_EQ(c.last(), offset == c.total_bytes())
        << t.name << " @" << c.offset();
    if (c.last()) {
      ++tensor;
      offset = 0;
    }
  }
  EXPECT_EQ(tensor, spec.tensors.size());
  EXPECT_EQ(total, spec.num_parameters * 4);
}

class TinyRoundTripTest : public ::testing::TestWithParam<size_t> {};

TEST_P(TinyRoundTripTest, BitExact) {
  const ModelSpec spec = TinySpec();
  const std::vector<float> values = TinyValues();
  const std::vector<v1::TensorChunk> chunks =
      WriteAll(spec, values, GetParam());
  ExpectWellFormed(spec, chunks, GetParam());

  std::vector<float> out(values.size(), 99.0f);
  ChunkAssembler assembler(spec, absl::MakeSpan(out), /*require_finite=*/true);
  EXPECT_FALSE(assembler.complete());
  ASSERT_TRUE(AddAll(assembler, chunks).ok());
  EXPECT_TRUE(assembler.complete());
  EXPECT_EQ(assembler.bytes_received(), 104);
  EXPECT_TRUE(SameBits(out, values));
}

// 4 is one float per chunk; 6 and 1027 round down to whole floats; 16 splits
// a.weight; 60 is exactly a.weight; the rest exceed every tensor.
INSTANTIATE_TEST_SUITE_P(ChunkSizes, TinyRoundTripTest,
                         ::testing::Values(4, 6, 8, 12, 16, 20, 28, 60, 64,
                                           1027, 1028, kMaxChunkBytes));

class MnistRoundTripTest : public ::testing::TestWithParam<size_t> {};

TEST_P(MnistRoundTripTest, BitExact) {
  absl::StatusOr<ModelSpec> spec = LookupModel("mnist_cnn");
  ASSERT_TRUE(spec.ok());
  std::vector<float> values(spec->num_parameters);
  InitializeParameters(*spec, 11, absl::MakeSpan(values));
  // Make the biases non-zero so that a misplaced chunk would show.
  for (const TensorSpec& t : spec->tensors) {
    if (t.init != Init::kZeros) continue;
    for (int64_t i = 0; i < t.num_elements; ++i) {
      values[t.offset + i] = 0.001f * static_cast<float>(i + 1);
    }
  }
  const std::vector<v1::TensorChunk> chunks =
      WriteAll(*spec, values, GetParam());
  ExpectWellFormed(*spec, chunks, GetParam());

  std::vector<float> out(values.size(), -1.0f);
  ChunkAssembler assembler(*spec, absl::MakeSpan(out), /*require_finite=*/true);
  ASSERT_TRUE(AddAll(assembler, chunks).ok());
  EXPECT_EQ(assembler.bytes_received(), 1199882 * 4);
  EXPECT_TRUE(SameBits(out, values));
}

// 1028 is smaller than conv1.weight (1,152 bytes) and not a power of two.
INSTANTIATE_TEST_SUITE_P(ChunkSizes, MnistRoundTripTest,
                         ::testing::Values(1028, 4100, 65536, kMaxChunkBytes));

// ---------------------------------------------------------------------------------------
// ChunkAssembler rejections. The stream is TinySpec at 16 bytes a chunk:
//   0-3 a.weight @0, 16, 32, 48 (last); 4 a.bias @0 (last);
//   5-6 b.weight @0, 16 (last); 7 b.bias @0 (last).

class ChunkAssemblerTest : public ::testing::Test {
 protected:
  ChunkAssemblerTest()
      : spec_(TinySpec()),
        values_(TinyValues()),
        chunks_(WriteAll(spec_, values_, 16)),
        out_(values_.size()) {}

  // Feeds `chunks` to a fresh assembler; returns the first error and where it
  // came.
  absl::Status Assemble(const std::vector<v1::TensorChunk>& chunks,
                        size_t* failed_at, bool require_finite = true,
                        size_t max_chunk_bytes = kMaxChunkBytes) {
    ChunkAssembler assembler(spec_, absl::MakeSpan(out_), require_finite,
                             max_chunk_bytes);
    return AddAll(assembler, chunks, failed_at);
  }

  // Expects INVALID_ARGUMENT at chunk `index` with a message naming `tensor`
  // and containing `detail`.
  void ExpectRejected(const std::vector<v1::TensorChunk>& chunks, size_t index,
                      const std::string& tensor, const std::string& detail) {
    size_t failed_at = 0;
    absl::Status status = Assemble(chunks, &failed_at);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(failed_at, index) << status;
    EXPECT_THAT(status.message(), HasSubstr(tensor));
    EXPECT_THAT(status.message(), HasSubstr(detail));
  }

  const ModelSpec spec_;
  const std::vector<float> values_;
  std::vector<v1::TensorChunk> chunks_;
  std::vector<float> out_;
};

TEST_F(ChunkAssemblerTest, TheUnmodifiedStreamIsAccepted) {
  ASSERT_EQ(chunks_.size(), 8u);
  size_t failed_at = 0;
  EXPECT_TRUE(Assemble(chunks_, &failed_at).ok());
  EXPECT_EQ(failed_at, 8u);
}

TEST_F(ChunkAssemblerTest, RejectsATensorOutOfOrder) {
  chunks_.erase(chunks_.begin() + 4);  // a.bias skipped: b.weight comes next
  ExpectRejected(chunks_, 4, "a.bias", "b.weight");
}

TEST_F(ChunkAssemblerTest, RejectsTensorsInTheWrongOrder) {
  std::vector<v1::TensorChunk> swapped = {chunks_[4], chunks_[0]};
  ExpectRejected(swapped, 0, "a.weight", "a.bias");
}

TEST_F(ChunkAssemblerTest, RejectsAWrongName) {
  chunks_[2].set_name("a.weights");
  ExpectRejected(chunks_, 2, "a.weight", "a.weights");
}

TEST_F(ChunkAssemblerTest, RejectsAWrongShape) {
  const std::vector<std::vector<int64_t>> bad_shapes = {
      {5, 3}, {15}, {3, 5, 1}, {3}, {}};
  for (const std::vector<int64_t>& shape : bad_shapes) {
    std::vector<v1::TensorChunk> chunks = chunks_;
    chunks[1].clear_shape();
    for (int64_t d : shape) chunks[1].add_shape(d);
    SCOPED_TRACE(chunks[1].ShortDebugString());
    ExpectRejected(chunks, 1, "a.weight", "shape");
  }
}

TEST_F(ChunkAssemblerTest, RejectsAWrongDtype) {
  for (v1::DType dtype :
       {v1::DTYPE_UNSPECIFIED, v1::DTYPE_FLOAT16, v1::DTYPE_INT8}) {
    std::vector<v1::TensorChunk> chunks = chunks_;
    chunks[4].set_dtype(dtype);
    SCOPED_TRACE(v1::DType_Name(dtype));
    ExpectRejected(chunks, 4, "a.bias", "dtype");
  }
}

TEST_F(ChunkAssemblerTest, RejectsAnUnsupportedEncoding) {
  for (v1::Encoding encoding :
       {v1::ENCODING_UNSPECIFIED, v1::ENCODING_QUANTIZED,
        v1::ENCODING_SPARSE_TOPK}) {
    std::vector<v1::TensorChunk> chunks = chunks_;
    chunks[5].set_encoding(encoding);
    SCOPED_TRACE(v1::Encoding_Name(encoding));
    ExpectRejected(chunks, 5, "b.weight", "encoding");
  }
}

TEST_F(ChunkAssemblerTest, RejectsAWrongTotalBytes) {
  for (uint64_t total : {uint64_t{0}, uint64_t{56}, uint64_t{64}}) {
    std::vector<v1::TensorChunk> chunks = chunks_;
    chunks[0].set_total_bytes(total);
    SCOPED_TRACE(total);
    ExpectRejected(chunks, 0, "a.weight", "60");
  }
}

TEST_F(ChunkAssemblerTest, RejectsAGap) {
  chunks_[2].set_offset(36);  // bytes 32..35 never arrive
  ExpectRejected(chunks_, 2, "a.weight", "expected 32");
}

TEST_F(ChunkAssemblerTest, RejectsAnOverlap) {
  chunks_[2].set_offset(28);
  ExpectRejected(chunks_, 2, "a.weight", "expected 32");
}

TEST_F(ChunkAssemblerTest, RejectsARepeatedChunk) {
  chunks_.insert(chunks_.begin() + 2, chunks_[1]);
  ExpectRejected(chunks_, 2, "a.weight", "expected 32");
}

TEST_F(ChunkAssemblerTest, RejectsAFirstChunkThatDoesNotStartAtZero) {
  chunks_.erase(chunks_.begin());
  ExpectRejected(chunks_, 0, "a.weight", "expected 0");
}

// The stream of `values` with every tensor's payload cut into pieces of
// 1, 3, 5, 7, 2, 1, 3, ... bytes: values split across chunks everywhere.
std::vector<v1::TensorChunk> CutAtOddBytes(const ModelSpec& spec,
                                           absl::Span<const float> values) {
  static constexpr size_t kCuts[] = {1, 3, 5, 7, 2};
  std::vector<v1::TensorChunk> out;
  size_t cut = 0;
  for (const v1::TensorChunk& whole : WriteAll(spec, values, 1 << 20)) {
    const std::string& payload = whole.data();
    for (size_t at = 0; at < payload.size();) {
      const size_t n =
          std::min(kCuts[cut++ % std::size(kCuts)], payload.size() - at);
      v1::TensorChunk piece = whole;
      piece.set_offset(at);
      piece.set_data(payload.substr(at, n));
      Reseal(&piece);
      at += n;
      piece.set_last(at == payload.size());
      if (!piece.last()) piece.clear_tensor_crc32c();
      out.push_back(std::move(piece));
    }
  }
  return out;
}

TEST_F(ChunkAssemblerTest, AcceptsChunksCutAtAnyByte) {
  const std::vector<v1::TensorChunk> pieces = CutAtOddBytes(spec_, values_);
  ASSERT_GT(pieces.size(), 8u * 4);
  size_t failed_at = 0;
  ASSERT_TRUE(Assemble(pieces, &failed_at).ok()) << failed_at;
  EXPECT_TRUE(SameBits(out_, values_));
}

TEST_F(ChunkAssemblerTest, SumsTheSquaresOfEveryValueOnceWhateverTheCuts) {
  // Integers -13..12: every square and their sum (1,469) are exact in double,
  // so any order of adding gives the same.
  std::vector<float> values(values_.size());
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(static_cast<int>(i) - 13);
  }
  for (const std::vector<v1::TensorChunk>& chunks :
       {WriteAll(spec_, values, 16), WriteAll(spec_, values, 1 << 20),
        CutAtOddBytes(spec_, values)}) {
    ChunkAssembler assembler(spec_, absl::MakeSpan(out_),
                             /*require_finite=*/true);
    EXPECT_EQ(assembler.sum_of_squares(), 0.0);
    ASSERT_TRUE(AddAll(assembler, chunks).ok());
    EXPECT_EQ(assembler.sum_of_squares(), 1469.0) << chunks.size() << " chunks";
  }
}

TEST_F(ChunkAssemblerTest, RejectsANonFiniteValueSplitAcrossTwoChunks) {
  // Value 1 (bytes 4-7 of a.weight) is cut 1 + 3 + ... : bytes 1-3 arrive in
  // the second piece, 4-8 in the third, which completes the NaN.
  std::vector<float> values = values_;
  values[1] = std::numeric_limits<float>::quiet_NaN();
  ExpectRejected(CutAtOddBytes(spec_, values), 2, "a.weight",
                 "NaN or infinite");
}

TEST_F(ChunkAssemblerTest, RejectsAnEmptyPayload) {
  chunks_[0].clear_data();
  Reseal(&chunks_[0]);
  ExpectRejected(chunks_, 0, "a.weight", "does not fit");
}

TEST_F(ChunkAssemblerTest, RejectsAPayloadRunningPastTheTensor) {
  chunks_[3].mutable_data()->append(
      4, '\0');  // 16 bytes at 48 of a 60-byte tensor
  Reseal(&chunks_[3]);
  ExpectRejected(chunks_, 3, "a.weight", "does not fit");
}

TEST_F(ChunkAssemblerTest, RejectsABadChunkChecksum) {
  (*chunks_[1].mutable_data())[5] ^= 0x10;
  ExpectRejected(chunks_, 1, "a.weight", "checksum");

  std::vector<v1::TensorChunk> chunks = WriteAll(spec_, values_, 16);
  chunks[7].set_chunk_crc32c(chunks[7].chunk_crc32c() ^ 1);
  ExpectRejected(chunks, 7, "b.bias", "checksum");
}

TEST_F(ChunkAssemblerTest, RejectsABadTensorChecksum) {
  chunks_[3].set_tensor_crc32c(chunks_[3].tensor_crc32c() ^ 0x80000000u);
  ExpectRejected(chunks_, 3, "a.weight", "whole-tensor checksum");

  // A single-chunk tensor: the chunk's own checksum is right, the tensor's is
  // not.
  std::vector<v1::TensorChunk> chunks = WriteAll(spec_, values_, 16);
  chunks[4].set_tensor_crc32c(0);
  ExpectRejected(chunks, 4, "a.bias", "whole-tensor checksum");
}

TEST_F(ChunkAssemblerTest, RejectsAChunkSplicedFromAnotherStream) {
  // Every chunk is internally consistent, but chunk 2 comes from different
  // values: the per-chunk checksum passes and the whole-tensor checksum of the
  // original does not.
  std::vector<float> other = values_;
  other[9] = 1234.5f;
  chunks_[2] = WriteAll(spec_, other, 16)[2];
  ExpectRejected(chunks_, 3, "a.weight", "whole-tensor checksum");
}

TEST_F(ChunkAssemblerTest, RejectsLastOnAMiddleChunk) {
  chunks_[1].set_last(true);
  ExpectRejected(chunks_, 1, "a.weight", "marked last");
}

TEST_F(ChunkAssemblerTest, RejectsAFinalChunkNotMarkedLast) {
  chunks_[6].set_last(false);
  ExpectRejected(chunks_, 6, "b.weight", "not marked last");
}

TEST_F(ChunkAssemblerTest, RejectsAChunkAfterTheLastTensor) {
  chunks_.push_back(chunks_[7]);
  ExpectRejected(chunks_, 8, "b.bias", "after the last tensor");
}

TEST_F(ChunkAssemblerTest, RejectsNonFiniteValuesWhenRequired) {
  struct Case {
    size_t index;  // into the flat vector
    float value;
    size_t chunk;
    const char* tensor;
  };
  const Case cases[] = {
      {16, std::numeric_limits<float>::quiet_NaN(), 4, "a.bias"},
      {0, std::numeric_limits<float>::infinity(), 0, "a.weight"},
      {14, -std::numeric_limits<float>::infinity(), 3, "a.weight"},
      {25, FloatFromBits(0xFFC00001u), 7, "b.bias"},    // negative NaN
      {19, FloatFromBits(0x7F800001u), 5, "b.weight"},  // signalling NaN
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.index);
    std::vector<float> values = values_;
    values[c.index] = c.value;
    ExpectRejected(WriteAll(spec_, values, 16), c.chunk, c.tensor,
                   "NaN or infinite");
  }
}

TEST_F(ChunkAssemblerTest, AcceptsNonFiniteValuesWhenNotRequired) {
  std::vector<float> values = values_;
  values[0] = std::numeric_limits<float>::infinity();
  values[14] = -std::numeric_limits<float>::infinity();
  values[16] = FloatFromBits(0x7FC01234u);  // a NaN with a payload
  values[25] = FloatFromBits(0xFFC00001u);
  size_t failed_at = 0;
  absl::Status status = Assemble(WriteAll(spec_, values, 16), &failed_at,
                                 /*require_finite=*/false);
  EXPECT_TRUE(status.ok()) << status;
  // The NaN payloads survive bit for bit.
  EXPECT_TRUE(SameBits(out_, values));
}

TEST_F(ChunkAssemblerTest, RejectsAnOversizedChunk) {
  size_t failed_at = 0;
  absl::Status status =
      Assemble(WriteAll(spec_, values_, 20), &failed_at,
               /*require_finite=*/true, /*max_chunk_bytes=*/16);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(failed_at, 0u);
  EXPECT_THAT(status.message(), HasSubstr("a.weight"));
  EXPECT_THAT(status.message(), HasSubstr("20"));

  // Exactly at the limit is fine.
  EXPECT_TRUE(Assemble(chunks_, &failed_at, true, 16).ok());

  // Under the default limit, a chunk one float over 1 MiB.
  absl::StatusOr<ModelSpec> big =
      MakeModelSpec("big", {{"w", {(1 << 18) + 2}, Init::kZeros}});
  ASSERT_TRUE(big.ok());
  std::vector<float> zeros(big->num_parameters, 0.0f);
  v1::TensorChunk chunk;
  chunk.set_name("w");
  chunk.add_shape((1 << 18) + 2);
  chunk.set_dtype(v1::DTYPE_FLOAT32);
  chunk.set_encoding(v1::ENCODING_DENSE);
  chunk.set_total_bytes(zeros.size() * 4);
  chunk.set_data(std::string(kMaxChunkBytes + 4, '\0'));
  Reseal(&chunk);
  ChunkAssembler assembler(*big, absl::MakeSpan(zeros), true);
  EXPECT_EQ(assembler.Add(chunk).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(ChunkAssemblerTest, AnErrorIsSticky) {
  std::vector<v1::TensorChunk> bad = chunks_;
  bad[2].set_chunk_crc32c(bad[2].chunk_crc32c() + 1);

  ChunkAssembler assembler(spec_, absl::MakeSpan(out_), true);
  ASSERT_TRUE(assembler.Add(chunks_[0]).ok());
  ASSERT_TRUE(assembler.Add(chunks_[1]).ok());
  const absl::Status error = assembler.Add(bad[2]);
  ASSERT_EQ(error.code(), absl::StatusCode::kInvalidArgument);
  // Neither the corrected chunk nor the ones after it get in.
  for (size_t i = 2; i < chunks_.size(); ++i) {
    EXPECT_EQ(assembler.Add(chunks_[i]), error) << i;
  }
  EXPECT_EQ(assembler.Finish(), error);
  EXPECT_FALSE(assembler.complete());
  EXPECT_EQ(assembler.bytes_received(), 32);
}

TEST_F(ChunkAssemblerTest, FinishOnAnIncompleteStreamNamesTheMissingTensor) {
  {
    ChunkAssembler assembler(spec_, absl::MakeSpan(out_), true);
    absl::Status status = assembler.Finish();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("a.weight"));
  }
  {
    // Half of a.weight.
    ChunkAssembler assembler(spec_, absl::MakeSpan(out_), true);
    ASSERT_TRUE(assembler.Add(chunks_[0]).ok());
    ASSERT_TRUE(assembler.Add(chunks_[1]).ok());
    absl::Status status = assembler.Finish();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("a.weight"));
    EXPECT_EQ(assembler.bytes_received(), 32);
  }
  {
    // Everything but b.bias.
    ChunkAssembler assembler(spec_, absl::MakeSpan(out_), true);
    for (size_t i = 0; i < 7; ++i) ASSERT_TRUE(assembler.Add(chunks_[i]).ok());
    EXPECT_FALSE(assembler.complete());
    absl::Status status = assembler.Finish();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("b.bias"));
    EXPECT_EQ(assembler.bytes_received(), 96);
    // Finish does not end the stream: the last tensor may still come.
    ASSERT_TRUE(assembler.Add(chunks_[7]).ok());
    EXPECT_TRUE(assembler.Finish().ok());
    EXPECT_TRUE(SameBits(out_, values_));
  }
}

// ---------------------------------------------------------------------------------------
// AllFinite.

TEST(AllFiniteTest, FiniteValues) {
  EXPECT_TRUE(AllFinite({}));
  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     1.0f,
                                     -1e30f,
                                     std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::lowest(),
                                     std::numeric_limits<float>::min(),
                                     std::numeric_limits<float>::denorm_min()};
  EXPECT_TRUE(AllFinite(values));
}

// Puts each kind of non-finite value first, in the middle and last in vectors
// of odd and even lengths (so that both a vectorised body and its scalar tail
// meet one), and expects `finite` to say no each time, and yes without it.
template <typename Finite>
void ExpectANonFiniteValueFoundAnywhere(Finite finite) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::signaling_NaN(),
                       -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (size_t n : {1u, 7u, 16u, 33u, 1001u}) {
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      for (float v : bad) {
        std::vector<float> values(n, 1.5f);
        values[pos] = v;
        EXPECT_FALSE(finite(values)) << "n " << n << " pos " << pos;
      }
    }
    EXPECT_TRUE(finite(std::vector<float>(n, 1.5f))) << n;
  }
}

TEST(AllFiniteTest, FindsANonFiniteValueAnywhere) {
  ExpectANonFiniteValueFoundAnywhere(
      [](const std::vector<float>& v) { return AllFinite(v); });
}

// ---------------------------------------------------------------------------------------
// SumOfSquares.

TEST(SumOfSquaresTest, ByHand) {
  EXPECT_EQ(SumOfSquares({}), 0.0);
  const std::vector<float> pythagoras = {3.0f, -4.0f};
  EXPECT_EQ(SumOfSquares(pythagoras), 25.0);
  // 1^2 + ... + n^2 = n(n+1)(2n+1)/6, across the eight partial sums and the
  // tail of odd lengths.
  for (int n : {1, 7, 8, 9, 33, 1001}) {
    std::vector<float> values(n);
    for (int i = 0; i < n; ++i) values[i] = static_cast<float>(i + 1);
    EXPECT_EQ(SumOfSquares(values), n * (n + 1.0) * (2.0 * n + 1) / 6) << n;
  }
  // In double, the largest float's square is finite: a large but finite
  // update is not mistaken for a non-finite one.
  const std::vector<float> huge(1001, std::numeric_limits<float>::max());
  EXPECT_TRUE(std::isfinite(SumOfSquares(huge)));
}

TEST(SumOfSquaresTest, IsNotFiniteExactlyWhenAValueIsNot) {
  ExpectANonFiniteValueFoundAnywhere([](const std::vector<float>& v) {
    return std::isfinite(SumOfSquares(v));
  });
}

// ---------------------------------------------------------------------------------------
// Quantized updates (ENCODING_QUANTIZED).

std::vector<v1::TensorChunk> WriteQuantized(const ModelSpec& spec,
                                            absl::Span<const float> values,
                                            size_t chunk_bytes) {
  ChunkWriter writer(spec, values, chunk_bytes, v1::ENCODING_QUANTIZED);
  std::vector<v1::TensorChunk> chunks;
  v1::TensorChunk chunk;
  while (writer.Next(&chunk)) chunks.push_back(chunk);
  return chunks;
}

// Values of both signs; a.bias all zero (a scale of 0).
std::vector<float> DeltaValues() {
  std::vector<float> v(26);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.37f * i - 4.0f;
  std::fill(v.begin() + 15, v.begin() + 18, 0.0f);
  v[20] = -9.5f;  // b.weight's largest magnitude is negative
  return v;
}

TEST(QuantizedTest, EveryValueComesBackWithinHalfAStep) {
  const ModelSpec spec = TinySpec();
  const std::vector<float> values = DeltaValues();
  // Payload: a scale and a byte per element for each of the 4 tensors.
  const int64_t payload = 4 * 4 + 26;
  for (size_t chunk_bytes : {size_t{4}, size_t{16}, kMaxChunkBytes}) {
    SCOPED_TRACE(chunk_bytes);
    ChunkWriter writer(spec, values, chunk_bytes, v1::ENCODING_QUANTIZED);
    EXPECT_EQ(writer.total_bytes(), payload);
    const std::vector<v1::TensorChunk> chunks =
        WriteQuantized(spec, values, chunk_bytes);
    for (const v1::TensorChunk& c : chunks) {
      EXPECT_EQ(c.encoding(), v1::ENCODING_QUANTIZED);
      EXPECT_LE(c.data().size(), std::max<size_t>(chunk_bytes, 4));
    }
    std::vector<float> out(values.size(), 42.0f);
    ChunkAssembler assembler(spec, absl::MakeSpan(out), /*require_finite=*/true,
                             kMaxChunkBytes, v1::ENCODING_QUANTIZED);
    ASSERT_TRUE(AddAll(assembler, chunks).ok());
    EXPECT_EQ(assembler.bytes_received(), payload);
    for (const TensorSpec& t : spec.tensors) {
      float largest = 0;
      for (int64_t i = 0; i < t.num_elements; ++i) {
        largest = std::max(largest, std::abs(values[t.offset + i]));
      }
      const float step = largest / 127;
      for (int64_t i = 0; i < t.num_elements; ++i) {
        const float x = values[t.offset + i], y = out[t.offset + i];
        EXPECT_LE(std::abs(y - x), step / 2 * (1 + 1e-6f))
            << t.name << "[" << i << "] " << x << " -> " << y;
        // Decoded as scale x an integer level in [-127, 127].
        const float level = step > 0 ? std::nearbyint(y / step) : 0;
        EXPECT_EQ(y, step * level) << t.name << "[" << i << "]";
        EXPECT_LE(std::abs(level), 127) << t.name << "[" << i << "]";
      }
    }
    // The zero tensor decodes to exact zeros; the extremes to +-max.
    EXPECT_EQ(out[15], 0.0f);
    EXPECT_EQ(out[20], -9.5f);
  }
}

TEST(ParseUpdateEncodingTest, KnowsDenseAndInt8Only) {
  EXPECT_EQ(*ParseUpdateEncoding("dense"), v1::ENCODING_DENSE);
  EXPECT_EQ(*ParseUpdateEncoding("int8"), v1::ENCODING_QUANTIZED);
  for (const char* bad : {"", "Dense", "int4", "sparse", "quantized"}) {
    absl::StatusOr<v1::Encoding> parsed = ParseUpdateEncoding(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(PayloadBytesTest, AScaleAndAByteAValueWhenQuantized) {
  const ModelSpec spec = TinySpec();  // 4 tensors, 26 floats
  EXPECT_EQ(PayloadBytes(spec, v1::ENCODING_DENSE), 26 * 4);
  EXPECT_EQ(PayloadBytes(spec, v1::ENCODING_UNSPECIFIED), 26 * 4);
  EXPECT_EQ(PayloadBytes(spec, v1::ENCODING_QUANTIZED), 4 * 4 + 26);
}

class QuantizedAssemblerTest : public ::testing::Test {
 protected:
  QuantizedAssemblerTest()
      : spec_(TinySpec()),
        chunks_(WriteQuantized(spec_, DeltaValues(), 16)),
        out_(26) {}

  absl::Status Assemble(const std::vector<v1::TensorChunk>& chunks,
                        size_t* failed_at,
                        v1::Encoding encoding = v1::ENCODING_QUANTIZED) {
    ChunkAssembler assembler(spec_, absl::MakeSpan(out_),
                             /*require_finite=*/true, kMaxChunkBytes, encoding);
    return AddAll(assembler, chunks, failed_at);
  }

  void ExpectRejected(const std::vector<v1::TensorChunk>& chunks, size_t index,
                      const std::string& detail,
                      v1::Encoding encoding = v1::ENCODING_QUANTIZED) {
    size_t failed_at = 0;
    absl::Status status = Assemble(chunks, &failed_at, encoding);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(failed_at, index) << status;
    EXPECT_THAT(status.message(), HasSubstr(detail));
  }

  // Replaces the scale at the start of chunk 0 (a.weight's first).
  void SetScale(float scale) {
    std::string data = chunks_[0].data();
    std::memcpy(data.data(), &scale, sizeof(scale));
    chunks_[0].set_data(data);
    Reseal(&chunks_[0]);
  }

  const ModelSpec spec_;
  std::vector<v1::TensorChunk> chunks_;
  std::vector<float> out_;
};

// a.weight's payload is 4 + 15 = 19 bytes: chunks of 16 and 3.
TEST_F(QuantizedAssemblerTest, TheUnmodifiedStreamIsAccepted) {
  ASSERT_EQ(chunks_.size(), 5u);
  EXPECT_EQ(chunks_[0].total_bytes(), 19u);
  size_t failed_at = 0;
  EXPECT_TRUE(Assemble(chunks_, &failed_at).ok());
}

TEST_F(QuantizedAssemblerTest, SumsTheSquaresOfTheDecodedValues) {
  // Chunks of 16 bytes: a.weight's scale and 12 values, then its last 3.
  ChunkAssembler assembler(spec_, absl::MakeSpan(out_),
                           /*require_finite=*/true, kMaxChunkBytes,
                           v1::ENCODING_QUANTIZED);
  ASSERT_TRUE(AddAll(assembler, chunks_).ok());
  double by_hand = 0;
  for (float v : out_) by_hand += static_cast<double>(v) * v;
  ASSERT_GT(by_hand, 100.0);
  EXPECT_NEAR(assembler.sum_of_squares(), by_hand, 1e-12 * by_hand);
}

TEST_F(QuantizedAssemblerTest, RejectsABadScale) {
  for (float scale : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(scale);
    chunks_ = WriteQuantized(spec_, DeltaValues(), 16);
    SetScale(scale);
    ExpectRejected(chunks_, 0, "quantization scale");
  }
}

TEST_F(QuantizedAssemblerTest, ANonFiniteValueIsSentAsANaNScaleAndRejected) {
  std::vector<float> values = DeltaValues();
  values[20] = std::numeric_limits<float>::infinity();  // in b.weight
  chunks_ = WriteQuantized(spec_, values, 16);
  // Chunks: a.weight 16 + 3, a.bias 7, b.weight 10, b.bias 6.
  ExpectRejected(chunks_, 3, "quantization scale nan");
}

TEST_F(QuantizedAssemblerTest, RejectsValuesThatOverflow) {
  SetScale(std::numeric_limits<float>::max());  // 127 x max is infinite
  ExpectRejected(chunks_, 0, "NaN or infinite");
}

TEST_F(QuantizedAssemblerTest, RejectsAFirstChunkWithoutTheWholeScale) {
  // Chunk 0 split into 2 + 14 bytes, each sealed.
  v1::TensorChunk head = chunks_[0], rest = chunks_[0];
  head.set_data(chunks_[0].data().substr(0, 2));
  Reseal(&head);
  rest.set_data(chunks_[0].data().substr(2));
  rest.set_offset(2);
  Reseal(&rest);
  std::vector<v1::TensorChunk> chunks = {head, rest};
  chunks.insert(chunks.end(), chunks_.begin() + 1, chunks_.end());
  ExpectRejected(chunks, 0, "4-byte scale");
}

TEST_F(QuantizedAssemblerTest, RejectsADenseSizedPayload) {
  chunks_[0].set_total_bytes(15 * 4);
  ExpectRejected(chunks_, 0, "expected 19 bytes");
}

TEST_F(QuantizedAssemblerTest, EveryChunkMustBeInTheExpectedEncoding) {
  // Quantized chunks where dense ones are expected, and the other way round.
  ExpectRejected(chunks_, 0, "want ENCODING_DENSE", v1::ENCODING_DENSE);
  const std::vector<v1::TensorChunk> dense = WriteAll(spec_, DeltaValues(), 16);
  ExpectRejected(dense, 0, "want ENCODING_QUANTIZED");
  std::vector<v1::TensorChunk> mixed = chunks_;
  mixed[1].set_encoding(v1::ENCODING_DENSE);
  ExpectRejected(mixed, 1, "encoding ENCODING_DENSE");
}

}  // namespace
}  // namespace fedlearn
