#include "common/raw_message.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/chunk_wire.h"
#include "common/model_spec.h"
#include "common/tensor_codec.h"
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

std::string Bytes(const std::vector<grpc::Slice>& slices) {
  std::string bytes;
  for (const grpc::Slice& slice : slices) bytes += Bytes(slice);
  return bytes;
}

// Every chunk a download sends, built around the weights' own memory, is
// byte for byte the message protobuf serializes with the data copied in: the
// middle of a tensor, a tensor's last chunk (with the fields after the data),
// a first chunk of another, and data lengths whose varint takes 1 to 3 bytes.
TEST(RawMessageTest, AChunkBuiltAroundItsDataIsWhatProtobufWrites) {
  const ModelSpec spec = *LookupModel("mnist_cnn");
  auto weights = std::make_shared<std::vector<float>>(spec.num_parameters);
  for (size_t i = 0; i < weights->size(); ++i) {
    (*weights)[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  }
  for (size_t chunk_bytes : {size_t{64}, size_t{4096}, size_t{65536}}) {
    SCOPED_TRACE(chunk_bytes);
    ChunkWriter views(spec, *weights, chunk_bytes);
    ChunkWriter copies(spec, *weights, chunk_bytes);
    v1::TensorChunk chunk;
    absl::string_view data;
    v1::TaskMessage expected;
    int last_chunks = 0;
    while (views.Next(&chunk, &data)) {
      ASSERT_TRUE(copies.Next(expected.mutable_chunk()));
      EXPECT_TRUE(chunk.data().empty());
      const std::vector<grpc::Slice> slices = SerializeChunkAround(
          v1::TaskMessage::kChunkFieldNumber, chunk, data, weights);
      ASSERT_EQ(Bytes(slices), expected.SerializeAsString());
      // The data slice is the weights' memory itself, not a copy.
      ASSERT_GE(slices.size(), 2u);
      EXPECT_EQ(slices[1].begin(),
                reinterpret_cast<const uint8_t*>(data.data()));
      last_chunks += chunk.last() ? 1 : 0;
    }
    EXPECT_FALSE(copies.Next(expected.mutable_chunk()));
    EXPECT_EQ(last_chunks, static_cast<int>(spec.tensors.size()));
  }
}

// The data slice keeps the weights alive after every other holder let go, as
// gRPC may still be sending it when the download that wrote it has ended.
TEST(RawMessageTest, TheDataSliceHoldsItsOwnerUntilReleased) {
  auto owner = std::make_shared<std::vector<float>>(16, 1.0f);
  const std::weak_ptr<std::vector<float>> watch = owner;
  v1::TensorChunk chunk;
  chunk.set_name("w");
  chunk.set_offset(0);
  chunk.set_chunk_crc32c(7);
  const absl::string_view data(reinterpret_cast<const char*>(owner->data()),
                               owner->size() * sizeof(float));
  std::vector<grpc::Slice> slices = SerializeChunkAround(
      v1::TaskMessage::kChunkFieldNumber, chunk, data, std::move(owner));
  grpc::Slice held = slices[1];  // a reference, as gRPC would hold one
  slices.clear();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(Bytes(held), std::string(data));
  held = grpc::Slice();
  EXPECT_TRUE(watch.expired());
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
