// Writes the seed corpus of every fuzz target into DIR/TARGET/ (fuzz/corpus in
// the source tree): valid inputs that reach each reader's deepest paths, from
// which libFuzzer mutates. Run once when a target or its input format
// changes; the corpus is committed.
//
//   build-fuzz/fuzz/fuzz_write_seeds fuzz/corpus

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "client/idx.h"
#include "common/safetensors.h"
#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "fuzz/fuzz_util.h"

namespace fedlearn::fuzz {
namespace {

std::string root;

void Seed(const std::string& target, const std::string& name,
          const std::string& bytes) {
  const std::filesystem::path dir = std::filesystem::path(root) / target;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

// A length-prefixed piece, as Bytes::Piece reads it.
std::string Piece(const std::string& bytes) {
  std::string out;
  out.push_back(static_cast<char>(bytes.size() & 0xff));
  out.push_back(static_cast<char>(bytes.size() >> 8));
  return out + bytes;
}

std::vector<float> Values() {
  std::vector<float> values(TinySpec().num_parameters);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = 0.125f * static_cast<float>(static_cast<int>(i) - 13);
  }
  return values;
}

void ChunkStreams() {
  const std::vector<float> values = Values();
  for (const v1::Encoding encoding :
       {v1::ENCODING_DENSE, v1::ENCODING_QUANTIZED}) {
    // Options: the encoding, require finite, a 64-byte chunk limit.
    std::string stream(
        1, static_cast<char>((encoding == v1::ENCODING_QUANTIZED ? 1 : 0) | 2 |
                             (3 << 2)));
    ChunkWriter writer(TinySpec(), values, 16, encoding);
    v1::TensorChunk chunk;
    while (writer.Next(&chunk)) stream += Piece(chunk.SerializeAsString());
    Seed("chunk_assembler", v1::Encoding_Name(encoding), stream);
  }
}

// PushGradientRequests carrying a chunk: as a client serializes them, with a
// field the reader does not know, and with the chunk given in two parts
// (protobuf merges them); each after a byte that seeds where it is cut.
void ChunkMessages() {
  ChunkWriter writer(TinySpec(), Values(), 16, v1::ENCODING_DENSE);
  v1::PushGradientRequest request;
  if (!writer.Next(request.mutable_chunk())) std::abort();
  const std::string plain = request.SerializeAsString();
  Seed("chunk_wire", "dense", std::string(1, '\x07') + plain);
  ChunkWriter quantized(TinySpec(), Values(), 16, v1::ENCODING_QUANTIZED);
  v1::PushGradientRequest q;
  if (!quantized.Next(q.mutable_chunk())) std::abort();
  Seed("chunk_wire", "quantized",
       std::string(1, '\x2a') + q.SerializeAsString());
  // Field 15, a varint: unknown to TensorChunk. The chunk stays under 128
  // bytes, so its length is one byte.
  const std::string with_unknown =
      request.chunk().SerializeAsString() + "\x78\x05";
  if (with_unknown.size() >= 128) std::abort();
  Seed("chunk_wire", "unknown_field",
       std::string(1, '\x01') + "\x12" +
           static_cast<char>(with_unknown.size()) + with_unknown);
  v1::PushGradientRequest data_only;
  data_only.mutable_chunk()->set_data(request.chunk().data());
  v1::PushGradientRequest fields_only = request;
  fields_only.mutable_chunk()->clear_data();
  Seed("chunk_wire", "two_parts",
       std::string(1, '\x03') + fields_only.SerializeAsString() +
           data_only.SerializeAsString());
}

void Requests() {
  v1::UpdateHeader header;
  header.set_client_id("client-1");
  header.set_round(3);
  header.set_num_examples(600);
  header.set_train_loss(0.25);
  header.set_train_accuracy(0.9);
  header.set_num_validation_examples(60);
  header.set_validation_loss(0.3);
  header.set_validation_accuracy(0.85);
  header.set_encoding(v1::ENCODING_QUANTIZED);
  Seed("request_validation", "update_header",
       std::string(1, '\0') + header.SerializeAsString());
  v1::ReportEvalRequest report;
  report.set_client_id("client-2");
  report.set_round(3);
  report.set_test_loss(0.2);
  report.set_test_accuracy(0.95);
  report.set_num_examples(100);
  Seed("request_validation", "report_eval",
       std::string(1, '\1') + report.SerializeAsString());
}

void Safetensors() {
  const std::string path = ScratchDir() + "/seed.safetensors";
  if (!WriteSafetensors(path, TinySpec(), Values(), {{"model", "tiny"}}).ok()) {
    std::abort();
  }
  Seed("safetensors", "tiny", ReadAll(path));
}

void Idx() {
  Dataset data;
  data.rows = 3;
  data.cols = 2;
  data.labels = {7, 0, 9};
  for (int i = 0; i < 18; ++i)
    data.pixels.push_back(static_cast<uint8_t>(i * 14));
  const std::string images = ScratchDir() + "/seed-images";
  const std::string labels = ScratchDir() + "/seed-labels";
  if (!WriteIdx(images, labels, data).ok()) std::abort();
  Seed("idx", "three_images", Piece(ReadAll(images)) + ReadAll(labels));
}

void Config() {
  Seed("config", "coordinator",
       "# a coordinator's config file\n"
       "model: \"mlp_2nn\"\n"
       "max_rounds: 30\n"
       "round_timeout: \"90s\"\n"
       "tolerance: 0.25\n"
       "strategy: \"fedadam\"\n"
       "strategy_config { server_learning_rate: 0.03 tau: 0.01 }\n");
}

void State() {
  absl::StatusOr<std::unique_ptr<StateStore>> store =
      StateStore::Open(ScratchDir() + "/seed-state");
  if (!store.ok() || !(*store)->Save(TinySpec(), TinyRun()).ok()) std::abort();
  Seed("state", "round_2_fedadam",
       ReadAll(ScratchDir() + "/seed-state/state.binpb"));
}

}  // namespace
}  // namespace fedlearn::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_write_seeds CORPUS_DIR\n");
    return 2;
  }
  fedlearn::fuzz::root = argv[1];
  fedlearn::fuzz::ChunkStreams();
  fedlearn::fuzz::ChunkMessages();
  fedlearn::fuzz::Requests();
  fedlearn::fuzz::Safetensors();
  fedlearn::fuzz::Idx();
  fedlearn::fuzz::Config();
  fedlearn::fuzz::State();
  return 0;
}
