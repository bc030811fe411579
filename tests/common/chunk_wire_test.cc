#include "common/chunk_wire.h"

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/model_spec.h"
#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

constexpr uint32_t kChunk = v1::PushGradientRequest::kChunkFieldNumber;

// A chunk as a client sends it: every field set, a 40-byte payload.
v1::PushGradientRequest Request() {
  v1::PushGradientRequest request;
  v1::TensorChunk* chunk = request.mutable_chunk();
  chunk->set_name("conv1.weight");
  chunk->add_shape(32);
  chunk->add_shape(1);
  chunk->add_shape(3);
  chunk->add_shape(3);
  chunk->set_dtype(v1::DTYPE_FLOAT32);
  chunk->set_encoding(v1::ENCODING_DENSE);
  chunk->set_total_bytes(1152);
  chunk->set_offset(640);
  std::string data;
  for (int i = 0; i < 40; ++i) data.push_back(static_cast<char>(i * 7 - 128));
  chunk->set_data(data);
  chunk->set_chunk_crc32c(0xdeadbeef);
  chunk->set_last(true);
  chunk->set_tensor_crc32c(0x12345678);
  return request;
}

// `bytes` cut at `cuts` (ascending offsets).
std::vector<absl::string_view> Cut(absl::string_view bytes,
                                   const std::vector<size_t>& cuts) {
  std::vector<absl::string_view> pieces;
  size_t at = 0;
  for (size_t cut : cuts) {
    pieces.push_back(bytes.substr(at, cut - at));
    at = cut;
  }
  pieces.push_back(bytes.substr(at));
  return pieces;
}

std::string Joined(const std::vector<absl::string_view>& pieces) {
  std::string out;
  for (absl::string_view p : pieces) out.append(p.data(), p.size());
  return out;
}

// What ReadChunkInPlace gave, as one message: its fields with the payload.
std::string AsParsed(const ChunkInPlace& chunk) {
  EXPECT_TRUE(chunk.fields.data().empty());
  v1::TensorChunk whole = chunk.fields;
  whole.set_data(Joined(chunk.data));
  EXPECT_EQ(chunk.data_bytes, whole.data().size());
  return whole.SerializeAsString();
}

TEST(ReadChunkInPlaceTest, ReadsWhatProtobufReadsWhereverTheBytesAreCut) {
  const std::string wire = Request().SerializeAsString();
  const std::string want = Request().chunk().SerializeAsString();
  ChunkInPlace chunk;
  for (size_t cut = 0; cut <= wire.size(); ++cut) {
    ASSERT_TRUE(ReadChunkInPlace(Cut(wire, {cut}), kChunk, &chunk)) << cut;
    EXPECT_EQ(AsParsed(chunk), want) << cut;
  }
  std::vector<size_t> every_byte;
  for (size_t i = 1; i < wire.size(); ++i) every_byte.push_back(i);
  ASSERT_TRUE(ReadChunkInPlace(Cut(wire, every_byte), kChunk, &chunk));
  EXPECT_EQ(AsParsed(chunk), want);
  EXPECT_EQ(chunk.data.size(), 40u);  // a view per byte of the payload
}

TEST(ReadChunkInPlaceTest, ThePayloadIsViewedWhereItLies) {
  const std::string wire = Request().SerializeAsString();
  const absl::string_view pieces[] = {wire};
  ChunkInPlace chunk;
  ASSERT_TRUE(ReadChunkInPlace(pieces, kChunk, &chunk));
  ASSERT_EQ(chunk.data.size(), 1u);
  EXPECT_GE(chunk.data[0].data(), wire.data());
  EXPECT_LE(chunk.data[0].data() + 40, wire.data() + wire.size());
  EXPECT_EQ(chunk.data[0], Request().chunk().data());
}

TEST(ReadChunkInPlaceTest, KeepsFieldsItDoesNotKnowAsProtobufDoes) {
  // Field 15 (a varint) and field 16 (bytes) are not TensorChunk's.
  const std::string chunk_wire =
      Request().chunk().SerializeAsString() + "\x78\x05" + "\x82\x01\x02hi";
  const std::string wire =
      "\x12" + std::string(1, static_cast<char>(chunk_wire.size())) +
      chunk_wire;
  ASSERT_LT(chunk_wire.size(), 128u);
  v1::PushGradientRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  const absl::string_view pieces[] = {wire};
  ChunkInPlace chunk;
  ASSERT_TRUE(ReadChunkInPlace(pieces, kChunk, &chunk));
  EXPECT_EQ(AsParsed(chunk), parsed.chunk().SerializeAsString());
  EXPECT_FALSE(
      chunk.fields.GetReflection()->GetUnknownFields(chunk.fields).empty());
}

// The sender's side writes what protobuf writes around the payload, fields it
// does not know included (protobuf puts them last, after the checksums).
TEST(WriteChunkAroundTest, WritesWhatProtobufWritesUnknownFieldsLast) {
  v1::PushGradientRequest request = Request();
  ASSERT_TRUE(request.mutable_chunk()->MergeFromString("\x78\x05"));
  ASSERT_FALSE(request.chunk().data().empty());
  v1::TensorChunk fields = request.chunk();
  fields.clear_data();
  const ChunkAround around =
      WriteChunkAround(kChunk, fields, request.chunk().data().size());
  EXPECT_EQ(around.before + request.chunk().data() + around.after,
            request.SerializeAsString());
}

TEST(ReadChunkInPlaceTest, ReadsOverlongVarintsToTheSameValues) {
  // offset = 5 as a three-byte varint, total_bytes = 8 likewise.
  const std::string chunk_wire = std::string("\x30\x85\x80\x00", 4) +
                                 std::string("\x28\x88\x80\x00", 4) +
                                 "\x3a\x02xy";
  const std::string wire =
      "\x12" + std::string(1, static_cast<char>(chunk_wire.size())) +
      chunk_wire;
  v1::PushGradientRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  ASSERT_EQ(parsed.chunk().offset(), 5u);
  const absl::string_view pieces[] = {wire};
  ChunkInPlace chunk;
  ASSERT_TRUE(ReadChunkInPlace(pieces, kChunk, &chunk));
  EXPECT_EQ(AsParsed(chunk), parsed.chunk().SerializeAsString());
}

// Every shape the reader declines: the caller parses these with protobuf.
TEST(ReadChunkInPlaceTest, DeclinesAnythingButOneChunkWithOnePayload) {
  const v1::PushGradientRequest request = Request();
  const std::string wire = request.SerializeAsString();
  v1::PushGradientRequest header;
  header.mutable_header()->set_client_id("c");
  v1::PushGradientRequest data_only;
  data_only.mutable_chunk()->set_data("more");
  std::string twice_data = request.chunk().SerializeAsString() + "\x3a\x01z";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nothing", ""},
      {"a header", header.SerializeAsString()},
      {"a chunk, then a header (the oneof's last wins)",
       wire + header.SerializeAsString()},
      {"the chunk in two parts (protobuf merges them)",
       wire + data_only.SerializeAsString()},
      {"the payload twice (the last wins)",
       "\x12" + std::string(1, static_cast<char>(twice_data.size())) +
           twice_data},
      {"a group inside the chunk", std::string("\x12\x02\x0b\x0c", 4)},
      {"field number 0 inside the chunk", std::string("\x12\x02\x00\x01", 4)},
      {"a tag of six bytes", std::string("\x92\x80\x80\x80\x80\x00\x00", 7)},
      {"a length past the message", "\x12\x7f\x3a\x01x"},
      {"a payload past its chunk", std::string("\x12\x03\x3a\x05xyzzy", 9)},
      {"a length of 2^31", std::string("\x12\x80\x80\x80\x80\x08", 6)},
      {"the chunk with wire type varint", "\x10\x01"},
  };
  ChunkInPlace chunk;
  for (const auto& [name, bytes] : cases) {
    const absl::string_view pieces[] = {bytes};
    EXPECT_FALSE(ReadChunkInPlace(pieces, kChunk, &chunk)) << name;
  }
  for (size_t n = 0; n < wire.size(); ++n) {
    const absl::string_view pieces[] = {absl::string_view(wire).substr(0, n)};
    EXPECT_FALSE(ReadChunkInPlace(pieces, kChunk, &chunk))
        << "truncated to " << n << " bytes";
  }
  // Invalid UTF-8 in the name: protobuf rejects the message, and so does the
  // reader.
  v1::PushGradientRequest bad_name = request;
  bad_name.mutable_chunk()->set_name("a");
  std::string bad = bad_name.SerializeAsString();
  bad[bad.find('a')] = '\xff';
  const absl::string_view bad_pieces[] = {bad};
  v1::PushGradientRequest parsed;
  ASSERT_FALSE(parsed.ParseFromString(bad));
  EXPECT_FALSE(ReadChunkInPlace(bad_pieces, kChunk, &chunk));
}

// The assembler takes a payload in pieces to the same bits as in one.
TEST(ChunkAssemblerPiecesTest, AnyCutGivesTheSameValuesAndNorm) {
  absl::StatusOr<ModelSpec> spec =
      MakeModelSpec("tiny", {{"a.weight", {3, 5}, Init::kGlorotUniform, 5, 3},
                             {"a.bias", {3}, Init::kZeros}});
  ASSERT_TRUE(spec.ok());
  std::vector<float> values(spec->num_parameters);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * i - 4.25f;
  for (const v1::Encoding encoding :
       {v1::ENCODING_DENSE, v1::ENCODING_QUANTIZED}) {
    std::vector<v1::TensorChunk> chunks;
    ChunkWriter writer(*spec, values, 24, encoding);
    v1::TensorChunk chunk;
    while (writer.Next(&chunk)) chunks.push_back(chunk);
    std::vector<float> whole(values.size());
    ChunkAssembler one(*spec, absl::MakeSpan(whole), true, kMaxChunkBytes,
                       encoding);
    for (const v1::TensorChunk& c : chunks) ASSERT_TRUE(one.Add(c).ok());
    ASSERT_TRUE(one.Finish().ok());
    // Each chunk's payload cut at byte `cut` (the scale of a quantized tensor
    // included), and into single bytes.
    for (size_t cut = 0; cut <= 25; ++cut) {
      std::vector<float> out(values.size(), -1.f);
      ChunkAssembler pieces(*spec, absl::MakeSpan(out), true, kMaxChunkBytes,
                            encoding);
      for (const v1::TensorChunk& c : chunks) {
        const std::string& data = c.data();
        std::vector<size_t> cuts;
        if (cut == 25) {
          for (size_t i = 1; i < data.size(); ++i) cuts.push_back(i);
        } else if (cut < data.size()) {
          cuts.push_back(cut);
        }
        v1::TensorChunk fields = c;
        fields.set_data("ignored: not the payload");
        ASSERT_TRUE(pieces.Add(fields, Cut(data, cuts)).ok()) << cut;
      }
      ASSERT_TRUE(pieces.Finish().ok());
      EXPECT_EQ(out, whole) << v1::Encoding_Name(encoding) << " cut " << cut;
      EXPECT_EQ(pieces.sum_of_squares(), one.sum_of_squares());
      EXPECT_EQ(pieces.bytes_received(), one.bytes_received());
    }
    // A flipped byte in the second piece still fails the checksum.
    v1::TensorChunk first = chunks[0];
    std::string data = first.data();
    data[data.size() - 1] ^= 1;
    std::vector<float> out(values.size());
    ChunkAssembler corrupt(*spec, absl::MakeSpan(out), true, kMaxChunkBytes,
                           encoding);
    const absl::Status s = corrupt.Add(first, Cut(data, {5}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("checksum"), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace fedlearn
