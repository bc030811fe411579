// The service's surface over real gRPC on a loopback socket
// (server/coordinator_service.h): what bad input gets (and that it changes
// nothing), tokens, quantized and large models, models from a file, shutdown,
// health and reflection, driven by scripted clients (CoordinatorClient, the
// agent's own RPC layer) that push hand-made updates.

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "common/grpc_status.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

using testing::Header;
using testing::kWait;
using testing::SmallRun;

class CoordinatorServiceTest : public testing::ServiceTest {
 protected:
  // Two clients, both given round 1's task, and both updates counted.
  std::vector<std::unique_ptr<CoordinatorClient>> StartRoundOfTwo() {
    CoordinatorOptions o = SmallRun();
    o.min_clients = 2;
    o.clients_per_round = 2;
    o.tolerance = 0;
    Start(o);
    auto clients = JoinAll(2);
    for (auto& c : clients) EXPECT_EQ(NextTask(*c).task.round(), 1);
    return clients;
  }
};

TEST_F(CoordinatorServiceTest, RejectedUpdatesLeaveTheModelBitIdentical) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 3;
  o.clients_per_round = 2;  // one of the three is not selected
  Start(o);
  auto clients = JoinAll(3);
  std::vector<CoordinatorClient*> selected;
  CoordinatorClient* unselected = nullptr;
  for (auto& c : clients) {
    auto task = c->RequestUpdate(absl::Milliseconds(1));
    ASSERT_TRUE(task.ok());
    if (task->task.type() == v1::TASK_TYPE_TRAIN) {
      selected.push_back(c.get());
    } else {
      unselected = c.get();
    }
  }
  ASSERT_EQ(selected.size(), 2u);
  ASSERT_NE(unselected, nullptr);
  CoordinatorClient& a = *selected[0];
  const std::vector<float> before = Global();
  const std::vector<float> good(NumParameters(), 0.25f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  struct Case {
    std::string name;
    absl::StatusCode code;
    std::function<absl::Status()> push;
  };
  auto raw = [&](std::function<void(v1::TensorChunk*)> mutate,
                 std::vector<float> delta) {
    return [&a, this, mutate, delta] {
      return a.PushMessages(Messages(a, Header(1, 10, 1.0), delta, mutate))
          .status();
    };
  };
  std::vector<float> with_nan = good;
  with_nan[12345] = nan;
  std::vector<float> with_inf = good;
  with_inf[NumParameters() - 1] = inf;
  const std::vector<Case> cases = {
      {"stale round", absl::StatusCode::kFailedPrecondition,
       [&] { return a.PushUpdate(Header(2, 10, 1.0), good).status(); }},
      {"not selected", absl::StatusCode::kFailedPrecondition,
       [&] {
         return unselected->PushUpdate(Header(1, 10, 1.0), good).status();
       }},
      {"zero examples", absl::StatusCode::kInvalidArgument,
       [&] { return a.PushUpdate(Header(1, 0, 1.0), good).status(); }},
      // Two such claims would overflow the round's int64 example count.
      {"more examples than any data set", absl::StatusCode::kInvalidArgument,
       [&] {
         return a.PushUpdate(Header(1, (int64_t{1} << 40) + 1, 1.0), good)
             .status();
       }},
      {"NaN loss", absl::StatusCode::kInvalidArgument,
       [&] { return a.PushUpdate(Header(1, 10, nan), good).status(); }},
      {"dense chunks under a quantized header",
       absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_encoding(v1::ENCODING_QUANTIZED);
         return a.PushMessages(Messages(a, h, good)).status();
       }},
      {"sparse encoding (reserved)", absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_encoding(v1::ENCODING_SPARSE_TOPK);
         return a.PushMessages(Messages(a, h, good)).status();
       }},
      {"train accuracy above 1", absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_train_accuracy(1.5);
         return a.PushUpdate(h, good).status();
       }},
      {"negative validation accuracy", absl::StatusCode::kInvalidArgument,
       [&] {
         v1::UpdateHeader h = Header(1, 10, 1.0);
         h.set_num_validation_examples(5);
         h.set_validation_accuracy(-0.1);
         return a.PushUpdate(h, good).status();
       }},
      {"wrong shape", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { c->set_shape(0, c->shape(0) + 1); }, good)},
      {"wrong dtype", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { c->set_dtype(v1::DTYPE_FLOAT16); }, good)},
      {"wrong size", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { c->set_total_bytes(c->total_bytes() - 4); },
           good)},
      {"bad checksum", absl::StatusCode::kInvalidArgument,
       raw([](v1::TensorChunk* c) { (*c->mutable_data())[100] ^= 1; }, good)},
      {"NaN value", absl::StatusCode::kInvalidArgument, raw(nullptr, with_nan)},
      {"Inf value", absl::StatusCode::kInvalidArgument, raw(nullptr, with_inf)},
      {"truncated", absl::StatusCode::kInvalidArgument,
       [&] {
         auto m = Messages(a, Header(1, 10, 1.0), good);
         m.pop_back();
         return a.PushMessages(m).status();
       }},
      {"no header", absl::StatusCode::kInvalidArgument,
       [&] {
         auto m = Messages(a, Header(1, 10, 1.0), good);
         m.erase(m.begin());
         return a.PushMessages(m).status();
       }},
      {"empty push", absl::StatusCode::kInvalidArgument,
       [&] { return a.PushMessages({}).status(); }},
  };
  for (const Case& c : cases) {
    absl::Status s = c.push();
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    // Every error names the client it is for, a push without a header too.
    const CoordinatorClient* by = c.name == "not selected" ? unselected : &a;
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("client ", by->client_id())))
        << c.name;
    ASSERT_EQ(0, std::memcmp(Global().data(), before.data(),
                             before.size() * sizeof(float)))
        << c.name << " changed the global model";
    EXPECT_EQ(Status().history_size(), 0) << c.name;
  }

  // The round still works, and nothing of the rejected pushes leaked into the
  // average: two valid updates of 0.25 move every weight by exactly 0.25.
  ASSERT_TRUE(a.PushUpdate(Header(1, 10, 1.0), good).ok());
  auto duplicate = a.PushUpdate(Header(1, 10, 1.0), good);
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Global(), before);
  ASSERT_TRUE(selected[1]->PushUpdate(Header(1, 30, 1.0), good).ok());
  const std::vector<float> after = Global();
  for (size_t j = 0; j < after.size(); ++j) {
    ASSERT_EQ(after[j], static_cast<float>(double{before[j]} + double{0.25f}))
        << j;
  }
  const v1::RejectionCounts r = Status().history(0).rejected();
  EXPECT_EQ(r.stale_round(), 1);
  EXPECT_EQ(r.not_selected(), 1);
  EXPECT_EQ(r.duplicate(), 1);
  EXPECT_EQ(r.invalid(), 13);
  EXPECT_EQ(r.incomplete(), 1);
}

TEST_F(CoordinatorServiceTest,
       QuantizedUpdatesMoveTheModelByTheirDecodedValues) {
  auto clients = StartRoundOfTwo();
  const std::vector<float> before = Global();
  // Per tensor: values spread over (-1, 1) times a tensor-specific size.
  const ModelSpec& spec = clients[0]->spec();
  std::vector<float> delta(NumParameters());
  for (const TensorSpec& t : spec.tensors) {
    for (int64_t i = 0; i < t.num_elements; ++i) {
      delta[t.offset + i] = std::sin(0.1f * i) * (1 + t.offset % 7);
    }
  }
  // What the coordinator should decode: the codec's own round trip.
  std::vector<float> decoded(delta.size());
  {
    ChunkWriter writer(spec, delta, 64 << 10, v1::ENCODING_QUANTIZED);
    ChunkAssembler assembler(spec, absl::MakeSpan(decoded), true,
                             kMaxChunkBytes, v1::ENCODING_QUANTIZED);
    v1::TensorChunk chunk;
    while (writer.Next(&chunk)) ASSERT_TRUE(assembler.Add(chunk).ok());
    ASSERT_TRUE(assembler.Finish().ok());
  }
  ASSERT_NE(decoded, delta);  // int8 is lossy
  v1::UpdateHeader header = Header(1, 10, 1.0);
  header.set_encoding(v1::ENCODING_QUANTIZED);
  for (auto& c : clients) ASSERT_TRUE(c->PushUpdate(header, delta).ok());
  const std::vector<float> after = Global();
  for (size_t j = 0; j < after.size(); ++j) {
    ASSERT_EQ(after[j], static_cast<float>(double{before[j]} + decoded[j]))
        << j;
  }
  // A quarter of the dense bytes, plus a scale per tensor, per update.
  const int64_t quantized_bytes =
      static_cast<int64_t>(NumParameters() + 4 * spec.tensors.size());
  EXPECT_EQ(Status().history(0).bytes_received(), 2 * quantized_bytes);
}

TEST_F(CoordinatorServiceTest, OversizedChunkIsResourceExhausted) {
  Start(SmallRun());
  auto clients = JoinAll(3);
  CoordinatorClient& a = *clients[0];
  ASSERT_EQ(NextTask(a).task.type(), v1::TASK_TYPE_TRAIN);
  const std::vector<float> before = Global();
  // fc1.weight is 627,200 bytes; pretend it is one 2 MiB chunk.
  auto messages =
      Messages(a, Header(1, 10, 1.0), std::vector<float>(NumParameters()),
               [](v1::TensorChunk* c) { c->mutable_data()->resize(2 << 20); });
  EXPECT_EQ(a.PushMessages(messages).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Global(), before);
}

// The receive limit (one chunk and its framing) is gRPC's, and covers every
// method, not only pushes: a 2 MiB Join is refused before its handler runs
// (which would say INVALID_ARGUMENT, for its display name) and joins nobody.
// gRPC's minimal stack drops that limit (README, "Many clients").
TEST_F(CoordinatorServiceTest, AnOversizedRequestIsRefusedBeforeItsHandler) {
  Start(SmallRun());
  auto stub = v1::Coordinator::NewStub(channel_);
  v1::JoinRequest request;
  request.set_display_name(std::string(2 << 20, 'x'));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1::JoinResponse response;
  const grpc::Status status = stub->Join(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_EQ(Status().client_counts().joined(), 0);
}

// A push of exactly these wire messages through the generic stub, as `client`:
// for bytes no protobuf serializer would write. Returns the call's status and,
// when OK, the response.
absl::StatusOr<v1::PushGradientResponse> RawPush(
    const std::shared_ptr<grpc::Channel>& channel,
    const CoordinatorClient& client, const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  context.AddMetadata("authorization",
                      absl::StrCat("Bearer ", client.session_token()));
  auto call =
      stub.PrepareCall(&context, "/fedlearn.v1.Coordinator/PushGradient", &cq);
  void* tag;
  bool ok;
  auto step = [&](intptr_t id) {
    return cq.Next(&tag, &ok) && ok && tag == reinterpret_cast<void*>(id);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool sending = step(1);
  for (size_t i = 0; sending && i < messages.size(); ++i) {
    grpc::Slice slice(messages[i]);
    grpc::ByteBuffer out(&slice, 1);
    call->Write(out, reinterpret_cast<void*>(2));
    sending = step(2);  // false once the coordinator has answered
  }
  if (sending) {
    call->WritesDone(reinterpret_cast<void*>(3));
    step(3);
  }
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  const bool got = step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  if (!status.ok()) return FromGrpcStatus(status);
  v1::PushGradientResponse response;
  if (!got || !grpc::SerializationTraits<v1::PushGradientResponse>::Deserialize(
                   &in, &response)
                   .ok()) {
    return absl::InternalError("no response");
  }
  return response;
}

// A chunk message may come in any form protobuf parses to the same chunk: the
// coordinator reads the usual form in place and hands the others to protobuf,
// and both count alike. Bytes that are not a push message are rejected, naming
// the client, and change nothing.
TEST_F(CoordinatorServiceTest, ChunkMessagesCountInEveryWireFormProtobufReads) {
  auto clients = StartRoundOfTwo();
  CoordinatorClient& a = *clients[0];
  const std::vector<float> before = Global();
  const std::vector<v1::PushGradientRequest> messages = Messages(
      a, Header(1, 10, 1.0), std::vector<float>(NumParameters(), 0.25f));
  ASSERT_GT(messages.size(), 4u);

  std::vector<std::string> garbage = {messages[0].SerializeAsString(),
                                      std::string("\xff\xff\xff", 3)};
  const absl::StatusOr<v1::PushGradientResponse> rejected =
      RawPush(channel_, a, garbage);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(),
              HasSubstr(absl::StrCat("client ", a.client_id())));
  EXPECT_THAT(rejected.status().message(), HasSubstr("only chunks"));
  ASSERT_EQ(Global(), before);

  // Chunk by chunk: as serialized; in two parts, which protobuf merges (the
  // fields, then the payload); with a field TensorChunk does not have.
  std::vector<std::string> wire = {messages[0].SerializeAsString()};
  for (size_t i = 1; i < messages.size(); ++i) {
    const v1::PushGradientRequest& m = messages[i];
    if (i % 3 == 1) {
      wire.push_back(m.SerializeAsString());
    } else if (i % 3 == 2) {
      v1::PushGradientRequest fields = m;
      fields.mutable_chunk()->clear_data();
      v1::PushGradientRequest payload;
      payload.mutable_chunk()->set_data(m.chunk().data());
      wire.push_back(fields.SerializeAsString() + payload.SerializeAsString());
    } else {
      v1::PushGradientRequest unknown = m;
      unknown.mutable_chunk()
          ->GetReflection()
          ->MutableUnknownFields(unknown.mutable_chunk())
          ->AddVarint(15, 5);
      wire.push_back(unknown.SerializeAsString());
    }
  }
  ASSERT_TRUE(RawPush(channel_, a, wire).ok());
  ASSERT_TRUE(clients[1]
                  ->PushUpdate(Header(1, 30, 1.0),
                               std::vector<float>(NumParameters(), 0.5f))
                  .ok());
  // (10 x 0.25 + 30 x 0.5) / 40 = 0.4375, exactly.
  const std::vector<float> after = Global();
  for (size_t j = 0; j < after.size(); ++j) {
    ASSERT_EQ(after[j], static_cast<float>(double{before[j]} + 0.4375)) << j;
  }
}

TEST_F(CoordinatorServiceTest, TokensAreCheckedOnEveryCall) {
  CoordinatorOptions o = SmallRun();
  o.join_token = "s3cret";
  Start(o);
  {
    CoordinatorClient stranger(channel_);
    EXPECT_EQ(stranger.Join(v1::JoinRequest()).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  auto alice = Join("s3cret");
  auto bob = Join("s3cret");
  const std::string alice_token = alice->session_token();
  v1::HeartbeatRequest beat;
  ASSERT_TRUE(alice->Heartbeat(beat).ok());

  alice->set_session_token("");
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kUnauthenticated);
  alice->set_session_token("not-a-token");
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kUnauthenticated);
  alice->set_session_token(bob->session_token());
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(alice->RequestUpdate(absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      alice->PushUpdate(Header(1, 1, 1), std::vector<float>(NumParameters()))
          .status()
          .code(),
      absl::StatusCode::kPermissionDenied);
  v1::ReportEvalRequest report;
  EXPECT_EQ(alice->ReportEval(report).code(),
            absl::StatusCode::kPermissionDenied);
  alice->set_session_token(alice_token);
  alice->set_client_id("client-999");
  EXPECT_EQ(alice->Heartbeat(beat).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorServiceTest, ModelLargerThanFourMegabytesRoundTrips) {
  CoordinatorOptions o = SmallRun();
  o.model = "mnist_cnn";  // 1,199,882 floats: 4.8 MB, over gRPC's default 4 MB
                          // message
  o.min_clients = 1;
  o.clients_per_round = 1;
  o.max_rounds = 1;
  Start(o);
  auto client = Join();
  ASSERT_EQ(client->spec().num_parameters, 1199882);
  auto task = NextTask(*client);
  ASSERT_EQ(task.task.type(), v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(task.task.payload_bytes(), 1199882 * 4);
  std::vector<float> initial(1199882);
  InitializeParameters(*LookupModel("mnist_cnn"), o.seed,
                       absl::MakeSpan(initial));
  ASSERT_EQ(task.weights, initial);
  std::vector<float> delta(initial.size());
  for (size_t i = 0; i < delta.size(); ++i)
    delta[i] = static_cast<float>(i % 97) * 1e-3f;
  ASSERT_TRUE(client->PushUpdate(Header(1, 10, 1.0), delta).ok());
  const std::vector<float> after = Global();
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after[i],
              static_cast<float>(double{initial[i]} + double{delta[i]}))
        << i;
  }
}

TEST_F(CoordinatorServiceTest, ShutdownAnswersPendingPollsUnavailable) {
  Start(SmallRun());
  auto client = Join();
  absl::StatusOr<CoordinatorClient::ReceivedTask> result;
  std::thread poller(
      [&] { result = client->RequestUpdate(absl::Seconds(20)); });
  ASSERT_TRUE(server_->controller().AwaitPendingPolls(1, kWait));
  server_->Shutdown(absl::Seconds(5));
  poller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
}

TEST_F(CoordinatorServiceTest, HealthIsServing) {
  Start(SmallRun());
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("fedlearn.v1.Coordinator");
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(stub->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// --- Any model --------------------------------------------------------------

// A model of the user's own, from a safetensors file: a 0-d tensor, a
// 1-element one, one larger than a chunk and 200 in all. It travels through
// Join, TRAIN, the pushes and FedAvg exactly.
TEST_F(CoordinatorServiceTest, AFileModelRoundTripsExactly) {
  std::vector<TensorDecl> decls = {{"scalar", {}, Init::kZeros},
                                   {"one", {1}, Init::kZeros},
                                   {"big", {200, 300}, Init::kZeros}};
  for (int i = 0; i < 197; ++i) {
    decls.push_back({absl::StrCat("t", i), {i % 4 + 1, 2}, Init::kZeros});
  }
  absl::StatusOr<ModelSpec> spec = MakeModelSpec("mine", std::move(decls));
  ASSERT_TRUE(spec.ok());
  std::vector<float> initial(spec->num_parameters);
  for (size_t i = 0; i < initial.size(); ++i) {
    initial[i] = static_cast<float>(i % 1000) / 1024.0f - 0.25f;
  }
  testing::ScopedTempDir dir;
  const std::string path = dir.Path("mine.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, *spec, initial).ok());

  CoordinatorOptions options = SmallRun();
  options.model = path;
  options.min_clients = 2;
  options.clients_per_round = 2;
  options.max_rounds = 1;
  Start(options);
  auto a = Join();
  auto b = Join();
  EXPECT_EQ(a->spec().name, "mine");
  ASSERT_EQ(a->spec().tensors.size(), 200u);
  EXPECT_TRUE(a->spec().tensors[0].shape.empty());
  EXPECT_EQ(a->spec().tensors[2].num_elements, 60000);  // 240 KB: 4 chunks
  auto task_a = NextTask(*a);
  auto task_b = NextTask(*b);
  EXPECT_EQ(task_a.weights, initial);
  EXPECT_EQ(task_b.weights, initial);
  // Deltas of 1/8 (n = 100) and -1/4 (n = 300): the mean is -1/8 exactly.
  ASSERT_TRUE(a->PushUpdate(Header(1, 100, 1.0),
                            std::vector<float>(initial.size(), 0.125f))
                  .ok());
  ASSERT_TRUE(b->PushUpdate(Header(1, 300, 1.0),
                            std::vector<float>(initial.size(), -0.25f))
                  .ok());
  std::vector<float> want = initial;
  for (float& w : want) w -= 0.15625f;  // (12.5 - 75) / 400
  EXPECT_EQ(Global(), want);
}

TEST_F(CoordinatorServiceTest, AMalformedModelFileIsAStartupError) {
  testing::ScopedTempDir dir;
  const std::string path = dir.Path("broken.safetensors");
  testing::WriteBytes(path, std::string("\x05\0\0\0\0\0\0\0{\"a\":", 13));
  CoordinatorOptions options = SmallRun();
  options.model = path;
  auto server = CoordinatorServer::Start(options, "127.0.0.1:0");
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(),
              HasSubstr(absl::StrCat("--model: ", path)));
  options.model = "resnet50";
  EXPECT_THAT(
      CoordinatorServer::Start(options, "127.0.0.1:0").status().message(),
      HasSubstr("PATH.safetensors"));
}

// One request on the reflection stream, as grpcurl makes it, through the
// generic stub: the request and response are raw protobuf bytes, so this needs
// no reflection.proto.
std::string Reflect(const std::shared_ptr<grpc::Channel>& channel,
                    const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto step = [&](int id) {
    return cq.Next(&tag, &ok) && ok && tag == reinterpret_cast<void*>(id);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(1)) return "start failed";
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  if (!step(2)) return "write failed";
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  if (!step(3)) return "read failed";
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  std::vector<grpc::Slice> slices;
  if (!in.Dump(&slices).ok()) return "dump failed";
  std::string response;
  for (const grpc::Slice& s : slices) {
    response.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return response;
}

TEST_F(CoordinatorServiceTest, ReflectionDescribesTheServices) {
  Start(SmallRun());
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited,
  // empty.
  const std::string services = Reflect(channel_, std::string("\x3a\x00", 2));
  EXPECT_THAT(services, HasSubstr("fedlearn.v1.Coordinator"));
  EXPECT_THAT(services, HasSubstr("grpc.health.v1.Health"));
  // ServerReflectionRequest{file_containing_symbol: "fedlearn.v1.Coordinator"}:
  // field 4.
  const std::string symbol = "fedlearn.v1.Coordinator";
  const std::string file =
      Reflect(channel_,
              std::string("\x22") + static_cast<char>(symbol.size()) + symbol);
  EXPECT_THAT(file, HasSubstr("fedlearn/v1/coordinator.proto"));
  EXPECT_THAT(file, HasSubstr("PushGradient"));
}

}  // namespace
}  // namespace fedlearn
