// The coordinator's HTTP side over a real loopback socket, next to a real gRPC
// run driven by scripted clients: the dashboard's files, /api/status,
// /api/parameters, /api/history.csv and /metrics, and that what they report is
// one consistent snapshot while rounds run.

#include "server/http_server.h"

#include <arpa/inet.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/coordinator_client.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
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
using testing::NextTask;
using testing::SmallRun;

// Sample values of a Prometheus exposition by series ("name{labels}").
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &value)) << line;
    samples[std::string(line.substr(0, space))] = value;
  }
  return samples;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(const CoordinatorOptions& options) {
    auto server = CoordinatorServer::Start(options, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto http = HttpServer::Start(*server_, "127.0.0.1", 0);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = *std::move(http);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    for (int i = 0; i < 3; ++i) {
      clients_.push_back(std::make_unique<CoordinatorClient>(channel_));
      v1::JoinRequest join;
      join.set_display_name(absl::StrCat("scripted-", i));
      ASSERT_TRUE(clients_.back()->Join(join).ok());
    }
  }

  // GET `path`; fails the test on a transport error.
  httplib::Result Get(const std::string& path) {
    httplib::Client http("127.0.0.1", http_->port());
    http.set_read_timeout(10);
    httplib::Result result = http.Get(path);
    EXPECT_TRUE(result) << path << ": " << httplib::to_string(result.error());
    return result;
  }

  // Every client trains `round` and pushes a delta of `value` everywhere.
  void TrainRound(int64_t round, float value) {
    for (auto& c : clients_) testing::TrainConstant(*c, round, value);
  }

  void Evaluate() {
    for (auto& c : clients_) testing::Evaluate(*c, 0.25, 0.875, 40);
    ASSERT_TRUE(server_->controller().AwaitPhase(v1::PHASE_DONE, kWait));
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<HttpServer> http_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<std::unique_ptr<CoordinatorClient>> clients_;
};

TEST_F(HttpServerTest, ServesTheDashboardFromTheBinary) {
  Start(SmallRun());
  auto index = Get("/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 200);
  EXPECT_THAT(index->get_header_value("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(index->body, HasSubstr("dashboard.js"));
  // Every asset the page names is served from the binary, and nothing comes
  // from elsewhere (no absolute URL: machines here have no internet).
  const std::regex reference(R"re((?:src|href)="([^"]+)")re");
  int assets = 0;
  for (auto it = std::sregex_iterator(index->body.begin(), index->body.end(),
                                      reference);
       it != std::sregex_iterator(); ++it) {
    const std::string url = (*it)[1];
    EXPECT_EQ(url.find("//"), std::string::npos) << "external asset " << url;
    auto asset = Get("/" + url);
    ASSERT_TRUE(asset) << url;
    EXPECT_EQ(asset->status, 200) << url;
    EXPECT_FALSE(asset->body.empty()) << url;
    ++assets;
  }
  EXPECT_GE(assets, 2);  // the script and the style sheet at least
  EXPECT_THAT(index->body, ::testing::Not(HasSubstr("//cdn")));
  auto script = Get("/dashboard.js");
  ASSERT_TRUE(script);
  EXPECT_EQ(script->status, 200);
  EXPECT_THAT(script->get_header_value("Content-Type"),
              HasSubstr("text/javascript"));
  EXPECT_THAT(script->body, HasSubstr("/api/status"));
  auto style = Get("/dashboard.css");
  ASSERT_TRUE(style);
  EXPECT_EQ(style->status, 200);

  auto missing = Get("/no/such/page");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("/no/such/page"));
}

TEST_F(HttpServerTest, ApiStatusIsGetStatusAsJson) {
  Start(SmallRun());
  TrainRound(1, 0.01f);
  TrainRound(2, 0.02f);
  TrainRound(3, 0.03f);
  Evaluate();

  auto response = Get("/api/status");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"), "application/json");
  v1::GetStatusResponse parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(response->body, &parsed).ok())
      << response->body;
  v1::GetStatusResponse expected = server_->controller().GetStatus();
  // Everything but the clock-dependent "last seen" matches field for field.
  for (auto* status : {&parsed, &expected}) {
    for (v1::ClientInfo& c : *status->mutable_clients())
      c.clear_last_seen_ms_ago();
  }
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(parsed, expected))
      << parsed.DebugString() << "\nvs\n"
      << expected.DebugString();
  EXPECT_EQ(parsed.phase(), v1::PHASE_DONE);
  EXPECT_EQ(parsed.history_size(), 4);
  EXPECT_DOUBLE_EQ(parsed.final_evaluation().test_accuracy(), 0.875);
  // Proto field names, and zero values printed rather than left out.
  EXPECT_THAT(response->body, HasSubstr("\"stop_reason\":\"max_rounds\""));
  EXPECT_THAT(response->body, HasSubstr("\"dropped\":0"));
  // Each client's latest update: 0.03 in each of 199,210 parameters.
  const double norm = 0.03 * std::sqrt(199210.0);
  for (const v1::ClientInfo& c : parsed.clients()) {
    EXPECT_NEAR(c.last_update_norm(), norm, 1e-6 * norm);
    EXPECT_EQ(c.last_update_round(), 3);
  }
  const int64_t model_bytes = 4 * 199210;
  EXPECT_EQ(parsed.bytes_received(), 3 * 3 * model_bytes);
  // Three rounds and one evaluation, each sent to three clients.
  EXPECT_EQ(parsed.bytes_sent(), 4 * 3 * model_bytes);
  EXPECT_EQ(parsed.history(0).bytes_sent(), 3 * model_bytes);

  // The client list is paged as GetStatus pages it; the counts cover all.
  auto page = Get("/api/status?client_page_size=2");
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(page->body, &parsed).ok());
  EXPECT_EQ(parsed.clients_size(), 2);
  EXPECT_EQ(parsed.client_counts().joined(), 3);
  EXPECT_EQ(parsed.next_client_page_token(), "2");
  page = Get("/api/status?client_page_size=2&client_page_token=2");
  ASSERT_TRUE(page);
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(page->body, &parsed).ok());
  ASSERT_EQ(parsed.clients_size(), 1);
  EXPECT_EQ(parsed.clients(0).client_id(), clients_[2]->client_id());
  EXPECT_EQ(parsed.next_client_page_token(), "");
  // So is the history: the latest history_size records, all of them counted.
  page = Get("/api/status?history_size=2");
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(page->body, &parsed).ok());
  ASSERT_EQ(parsed.history_size(), 2);
  EXPECT_EQ(parsed.history_total(), 4);  // three rounds and the evaluation
  EXPECT_TRUE(parsed.history(1).evaluation());
  // The records' client ids only when asked for.
  EXPECT_EQ(parsed.history(0).selected_clients_size(), 0);
  page = Get("/api/status?history_size=2&client_ids=true");
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(page->body, &parsed).ok());
  EXPECT_EQ(parsed.history(0).selected_clients_size(),
            parsed.history(0).selected());
  EXPECT_GT(parsed.history(0).selected(), 0);
  for (const char* bad :
       {"/api/status?client_page_size=x", "/api/status?client_page_token=nope",
        "/api/status?history_size=-3", "/api/status?history_size=many",
        "/api/status?client_ids=maybe"}) {
    page = Get(bad);
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 400) << bad;
  }
  // Each says what was wrong, as the RPC would.
  page = Get("/api/status?history_size=many");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->body, "history_size \"many\" is not a number\n");
  page = Get("/api/status?history_size=-3");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->body, "history_size -3 is negative\n");
  page = Get("/api/status?client_ids=maybe");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->body, "client_ids \"maybe\" is not true or false\n");
}

TEST_F(HttpServerTest, OpenRoundIsReportedWhileItRuns) {
  Start(SmallRun());
  auto task = NextTask(*clients_[0]);
  ASSERT_EQ(task.task.type(), v1::TASK_TYPE_TRAIN);
  std::vector<float> delta(server_->controller().spec().num_parameters, 0.5f);
  ASSERT_TRUE(clients_[0]->PushUpdate(Header(1, 100, 1.0), delta).ok());
  // A second push of the same client is turned away.
  EXPECT_EQ(clients_[0]->PushUpdate(Header(1, 100, 1.0), delta).status().code(),
            absl::StatusCode::kAlreadyExists);

  auto response = Get("/api/status");
  ASSERT_TRUE(response);
  v1::GetStatusResponse status;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(response->body, &status)
          .ok());
  EXPECT_EQ(status.phase(), v1::PHASE_TRAINING);
  ASSERT_TRUE(status.has_current_round());
  EXPECT_EQ(status.current_round().outcome(), "open");
  EXPECT_EQ(status.current_round().round(), 1);
  EXPECT_EQ(status.current_round().selected(), 3);
  EXPECT_EQ(status.current_round().responded(), 1);
  EXPECT_EQ(status.current_round().rejected().duplicate(), 1);
  EXPECT_EQ(status.history_size(), 0);

  auto metrics = Get("/metrics");
  ASSERT_TRUE(metrics);
  const auto samples = Samples(metrics->body);
  EXPECT_EQ(samples.at("fedlearn_round_selected_clients"), 3);
  EXPECT_EQ(samples.at("fedlearn_round_responded_clients"), 1);
  EXPECT_EQ(samples.at("fedlearn_updates_accepted_total"), 1);
  EXPECT_EQ(
      samples.at(R"(fedlearn_updates_rejected_total{reason="duplicate"})"), 1);
  EXPECT_EQ(samples.at(R"(fedlearn_phase{phase="training"})"), 1);
  EXPECT_EQ(samples.at(R"(fedlearn_clients{state="training"})"), 2);
  EXPECT_EQ(samples.at(R"(fedlearn_clients{state="ready"})"), 1);
}

TEST_F(HttpServerTest, MetricsCountTheRun) {
  Start(SmallRun());
  TrainRound(1, 0.01f);
  TrainRound(2, 0.01f);
  auto metrics = Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->get_header_value("Content-Type"),
              HasSubstr("text/plain; version=0.0.4"));
  const auto samples = Samples(metrics->body);
  EXPECT_EQ(samples.at("fedlearn_rounds_completed_total"), 2);
  EXPECT_EQ(samples.at("fedlearn_round"), 3);
  EXPECT_EQ(samples.at("fedlearn_updates_accepted_total"), 6);
  EXPECT_EQ(samples.at("fedlearn_round_duration_seconds_count"), 2);
  EXPECT_EQ(samples.at("fedlearn_aggregation_duration_seconds_count"), 6);
  EXPECT_GT(samples.at("fedlearn_aggregation_duration_seconds_sum"), 0);
  EXPECT_EQ(samples.at("fedlearn_received_bytes_total"), 6 * 4 * 199210);
  EXPECT_EQ(samples.at("fedlearn_train_loss"), 1.0);  // round 2: 2.0 / 2
  EXPECT_EQ(samples.at("fedlearn_clients_joined_total"), 3);
  // Between rounds nothing is being sent or received, and nothing was cut
  // off.
  EXPECT_EQ(samples.at("fedlearn_downloads"), 0);
  EXPECT_EQ(samples.at("fedlearn_download_versions"), 0);
  EXPECT_EQ(samples.at("fedlearn_download_version_bytes"), 0);
  EXPECT_EQ(samples.at(R"(fedlearn_downloads_cut_off_total{reason="stalled"})"),
            0);
  EXPECT_EQ(samples.at("fedlearn_receive_buffers"),
            server_->controller().options().max_concurrent_updates);
  EXPECT_EQ(samples.at("fedlearn_uploads_waiting"), 0);
  // A push's reply can reach its client just before its reactor gives the
  // receive buffer back: the last one is back soon after.
  double in_use = samples.at("fedlearn_receive_buffers_in_use");
  const absl::Time deadline = absl::Now() + testing::kWait;
  while (in_use != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    auto again = Get("/metrics");
    ASSERT_TRUE(again);
    in_use = Samples(again->body).at("fedlearn_receive_buffers_in_use");
  }
  EXPECT_EQ(in_use, 0);
}

TEST_F(HttpServerTest, HistoryCsvHasARowPerRound) {
  Start(SmallRun());
  TrainRound(1, 0.01f);
  TrainRound(2, 0.01f);
  auto csv = Get("/api/history.csv");
  ASSERT_TRUE(csv);
  EXPECT_EQ(csv->status, 200);
  EXPECT_THAT(csv->get_header_value("Content-Type"), HasSubstr("text/csv"));
  const std::vector<std::string> rows =
      absl::StrSplit(csv->body, "\r\n", absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_THAT(rows[1], ::testing::StartsWith("1,1,training,all,3,3,0,0,2,"));
  EXPECT_THAT(rows[2], ::testing::StartsWith("2,1,training,all,3,3,0,0,1,"));
  EXPECT_EQ(csv->get_header_value("X-Fedlearn-Records-Omitted"), "0");
}

// --history_in_memory keeps the newest records: the CSV has those and says
// how many older ones it leaves out; the status counts them all.
TEST_F(HttpServerTest, HistoryCsvHasTheRecordsKeptAndCountsTheRest) {
  CoordinatorOptions options = SmallRun();
  options.history_in_memory = 2;
  Start(options);
  TrainRound(1, 0.01f);
  TrainRound(2, 0.01f);
  TrainRound(3, 0.01f);
  auto csv = Get("/api/history.csv");
  ASSERT_TRUE(csv);
  const std::vector<std::string> rows =
      absl::StrSplit(csv->body, "\r\n", absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_THAT(rows[1], ::testing::StartsWith("2,1,training,"));
  EXPECT_THAT(rows[2], ::testing::StartsWith("3,1,training,"));
  EXPECT_EQ(csv->get_header_value("X-Fedlearn-Records-Omitted"), "1");
  EXPECT_EQ(server_->controller().GetStatus().history_total(), 3);
}

// curl -o model.safetensors http://HOST:PORT/api/model.safetensors mid-run:
// the current global model, a file ReadSafetensors (and numpy, PyTorch) reads
// back bit for bit.
TEST_F(HttpServerTest, TheGlobalModelDownloadsAsSafetensors) {
  Start(SmallRun());
  TrainRound(1, 0.25f);
  auto response = Get("/api/model.safetensors");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"),
            "application/octet-stream");
  EXPECT_THAT(response->get_header_value("Content-Disposition"),
              HasSubstr("mlp_2nn-round1.safetensors"));
  testing::ScopedTempDir dir;
  const std::string path = dir.Path("model.safetensors");
  testing::WriteBytes(path, response->body);
  std::map<std::string, std::string> metadata;
  auto weights = ReadSafetensors(path, server_->controller().spec(), &metadata);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(*weights, *server_->controller().global_weights());
  EXPECT_EQ(metadata["round"], "1");
  EXPECT_EQ(metadata["model"], "mlp_2nn");
  EXPECT_EQ(metadata["run_id"], server_->controller().run_id());
}

TEST_F(HttpServerTest, ParametersDescribeTheGlobalModel) {
  Start(SmallRun());
  TrainRound(1, 0.25f);
  auto response = Get("/api/parameters");
  ASSERT_TRUE(response);
  google::protobuf::Struct parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(response->body, &parsed).ok())
      << response->body;
  EXPECT_EQ(parsed.fields().at("round").number_value(), 1);
  const ModelSpec& spec = server_->controller().spec();
  const std::vector<float> weights = *server_->controller().global_weights();
  const auto& tensors = parsed.fields().at("tensors").list_value();
  ASSERT_EQ(tensors.values_size(), static_cast<int>(spec.tensors.size()));
  for (int i = 0; i < tensors.values_size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    const auto& fields = tensors.values(i).struct_value().fields();
    EXPECT_EQ(fields.at("name").string_value(), t.name);
    EXPECT_EQ(fields.at("count").number_value(), t.num_elements);
    double squares = 0;
    for (int64_t j = 0; j < t.num_elements; ++j) {
      squares += double{weights[t.offset + j]} * weights[t.offset + j];
    }
    EXPECT_NEAR(fields.at("l2").number_value(), std::sqrt(squares),
                1e-6 * std::sqrt(squares));
  }
  // Biases start at zero: after one round of +0.25 they are exactly 0.25.
  const auto& bias = tensors.values(1).struct_value().fields();
  EXPECT_EQ(bias.at("mean").number_value(), 0.25);
  EXPECT_EQ(bias.at("std").number_value(), 0);
}

// Readers hammer /metrics and /api/status while rounds close: every response
// must be one moment of the run, so the invariants that hold between its
// numbers hold in every response.
TEST_F(HttpServerTest, SnapshotsAreNeverTorn) {
  CoordinatorOptions options = SmallRun();
  options.max_rounds = 8;
  Start(options);
  std::atomic<bool> stop{false};
  std::atomic<int> checked{0};
  auto reader = [&](const std::string& path) {
    httplib::Client http("127.0.0.1", http_->port());
    while (!stop.load()) {
      httplib::Result r = http.Get(path);
      if (!r || r->status != 200) {
        ADD_FAILURE() << path << " failed";
        return;
      }
      if (path == "/metrics") {
        const auto s = Samples(r->body);
        const double completed = s.at("fedlearn_rounds_completed_total");
        const double accepted = s.at("fedlearn_updates_accepted_total");
        // Three updates per closed round plus those of the open one (when
        // it is a training round).
        const double open_updates =
            s.at(R"(fedlearn_phase{phase="training"})") == 1
                ? s.at("fedlearn_round_responded_clients")
                : 0;
        ASSERT_EQ(accepted, 3 * completed + open_updates) << r->body;
        ASSERT_EQ(s.at("fedlearn_aggregation_duration_seconds_count"),
                  accepted);
        ASSERT_EQ(s.at("fedlearn_round_duration_seconds_count"), completed);
        ASSERT_EQ(s.at("fedlearn_received_bytes_total"), accepted * 4 * 199210);
      } else {
        v1::GetStatusResponse status;
        ASSERT_TRUE(
            google::protobuf::util::JsonStringToMessage(r->body, &status).ok());
        int contributed = 0, responded = 0;
        if (!status.current_round().evaluation()) {
          responded = status.current_round().responded();
        }
        for (const v1::ClientInfo& c : status.clients())
          contributed += c.rounds_contributed();
        for (const v1::RoundRecord& h : status.history()) {
          if (!h.evaluation()) responded += h.responded();
        }
        ASSERT_EQ(contributed, responded) << r->body;
        ASSERT_EQ(status.bytes_received(), int64_t{4 * 199210} * responded);
      }
      ++checked;
    }
  };
  std::vector<std::thread> readers;
  for (const char* path : {"/metrics", "/api/status", "/metrics"}) {
    readers.emplace_back(reader, path);
  }
  for (int round = 1; round <= options.max_rounds; ++round) {
    TrainRound(round, 0.001f);
  }
  Evaluate();
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_GT(checked.load(), 10);
}

// Sends `head` (a request line and headers, no body) over a plain socket and
// returns what comes back until the server closes the connection ("" when
// it cannot connect). The body the headers announce is never sent: a server
// that waits to read it answers only at its read timeout, with 400.
std::string RawRequest(int port, const std::string& head) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) ==
          0 &&
      send(fd, head.data(), head.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(head.size())) {
    char buffer[4096];
    for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) {
      reply.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  return reply;
}

// A body is refused before it is read (every route is a GET): a client cannot
// make the coordinator hold a request of any size, with a Content-Length or
// chunked (which httplib's payload limit does not cover). The refusal comes
// at once, without waiting for the body.
TEST_F(HttpServerTest, ARequestWithABodyIsRefusedUnreadAndServingGoesOn) {
  Start(SmallRun());
  for (const char* head :
       {"POST /api/status HTTP/1.1\r\nHost: t\r\nContent-Length: "
        "1000000000\r\n\r\n",
        "POST /metrics HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
        "chunked\r\n\r\n",
        "PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"}) {
    const std::string reply = RawRequest(http_->port(), head);
    EXPECT_THAT(reply, ::testing::StartsWith("HTTP/1.1 405")) << head;
    EXPECT_THAT(reply, HasSubstr("Allow: GET, HEAD")) << head;
  }
  auto status = Get("/api/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
}

TEST_F(HttpServerTest, BusyPortIsAClearError) {
  Start(SmallRun());
  auto second = HttpServer::Start(*server_, "127.0.0.1", http_->port());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--http_port"));
}

}  // namespace
}  // namespace fedlearn
