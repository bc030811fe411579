#include "common/raw_message.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/chunk_wire.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

// A weights chunk as the coordinator sends it in a RequestUpdate stream.
v1::TaskMessage ChunkMessage() {
  v1::TaskMessage message;
  v1::TensorChunk* chunk = message.mutable_chunk();
  chunk->set_name("fc1.weight");
  chunk->add_shape(200);
  chunk->add_shape(784);
  chunk->set_dtype(v1::DTYPE_FLOAT32);
  chunk->set_encoding(v1::ENCODING_DENSE);
  chunk->set_total_bytes(627200);
  chunk->set_offset(65536);
  std::string data(4000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  chunk->set_data(data);
  chunk->set_chunk_crc32c(0x0badf00d);
  return message;
}

std::string Bytes(const grpc::Slice& slice) {
  return std::string(reinterpret_cast<const char*>(slice.begin()),
                     slice.size());
}

TEST(RawMessageTest, ASerializedSliceHoldsTheWireBytesAndParsesBack) {
  const v1::TaskMessage message = ChunkMessage();
  const grpc::Slice slice = SerializeToSlice(message);
  EXPECT_EQ(Bytes(slice), message.SerializeAsString());

  grpc::ByteBuffer buffer(&slice, 1);
  v1::TaskMessage parsed;
  ASSERT_TRUE(
      grpc::SerializationTraits<v1::TaskMessage>::Deserialize(&buffer, &parsed)
          .ok());
  EXPECT_EQ(parsed.SerializeAsString(), message.SerializeAsString());
}

TEST(RawMessageTest, AnEmptyMessageIsAnEmptySlice) {
  EXPECT_EQ(SerializeToSlice(v1::TaskMessage()).size(), 0u);
}

// A message received in several slices, as gRPC hands over a large one: the
// pieces view the slices' own memory, in order, and the chunk in them reads in
// place as protobuf would parse it.
TEST(RawMessageTest, ViewsAMessageInItsSlicesWithoutCopying) {
  const v1::TaskMessage message = ChunkMessage();
  const std::string wire = message.SerializeAsString();
  const std::vector<grpc::Slice> parts = {grpc::Slice(wire.substr(0, 10)),
                                          grpc::Slice(wire.substr(10, 2000)),
                                          grpc::Slice(wire.substr(2010))};
  const grpc::ByteBuffer buffer(parts.data(), parts.size());

  std::vector<grpc::Slice> slices = {grpc::Slice("left over")};
  std::vector<absl::string_view> pieces = {"left over"};
  ASSERT_TRUE(ViewMessage(buffer, &slices, &pieces));
  ASSERT_EQ(slices.size(), 3u);
  ASSERT_EQ(pieces.size(), 3u);
  std::string joined;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(static_cast<const void*>(pieces[i].data()),
              static_cast<const void*>(slices[i].begin()));
    EXPECT_EQ(pieces[i].size(), slices[i].size());
    joined.append(pieces[i].data(), pieces[i].size());
  }
  EXPECT_EQ(joined, wire);

  ChunkInPlace chunk;
  ASSERT_TRUE(
      ReadChunkInPlace(pieces, v1::TaskMessage::kChunkFieldNumber, &chunk));
  EXPECT_EQ(chunk.fields.name(), "fc1.weight");
  EXPECT_EQ(chunk.fields.offset(), 65536);
  EXPECT_EQ(chunk.fields.chunk_crc32c(), 0x0badf00du);
  std::string payload;
  for (absl::string_view piece : chunk.data) {
    payload.append(piece.data(), piece.size());
  }
  EXPECT_EQ(payload, message.chunk().data());
  EXPECT_EQ(chunk.data_bytes, message.chunk().data().size());
}

TEST(RawMessageTest, ATaskHeaderIsNotReadAsAChunk) {
  v1::TaskMessage header;
  header.mutable_task()->set_round(3);
  const grpc::Slice slice = SerializeToSlice(header);
  const grpc::ByteBuffer buffer(&slice, 1);
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> pieces;
  ASSERT_TRUE(ViewMessage(buffer, &slices, &pieces));
  ChunkInPlace chunk;
  EXPECT_FALSE(
      ReadChunkInPlace(pieces, v1::TaskMessage::kChunkFieldNumber, &chunk));
}

}  // namespace
}  // namespace fedlearn
