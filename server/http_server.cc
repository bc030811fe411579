#include "server/http_server.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "server/coordinator_server.h"
#include "server/coordinator_service.h"
#include "server/metrics.h"
#include "server/model_stats.h"
#include "server/run_controller.h"
#include "server/web_assets.h"

namespace fedlearn {
namespace {

constexpr int kHistogramBins = 32;
constexpr int kHandlerThreads = 4;
constexpr size_t kMaxRequestBody = 4096;  // bytes; see Start
constexpr char kJson[] = "application/json";

}  // namespace

struct HttpServer::Impl {
  const RunController* controller = nullptr;
  const CoordinatorService* service = nullptr;  // its transfers, for /metrics
  std::unique_ptr<httplib::Server> server;      // an SSLServer for HTTPS
  std::thread thread;
  int port = 0;

  // /api/parameters of the last weights asked for: the model changes once a
  // round, the dashboard asks every few seconds.
  absl::Mutex cache_mu;
  Weights cached_weights ABSL_GUARDED_BY(cache_mu);
  std::string cached_parameters ABSL_GUARDED_BY(cache_mu);

  void Routes();
  std::string Parameters();
};

std::string HttpServer::Impl::Parameters() {
  int64_t round = 0;
  Weights weights = controller->global_weights(&round);
  {
    absl::MutexLock lock(&cache_mu);
    if (weights == cached_weights) return cached_parameters;
  }
  // Computed without any lock held; two racing requests both compute it.
  std::string json = TensorStatsJson(
      round, ComputeTensorStats(controller->spec(), *weights, kHistogramBins));
  absl::MutexLock lock(&cache_mu);
  cached_weights = std::move(weights);
  cached_parameters = json;
  return json;
}

void HttpServer::Impl::Routes() {
  for (const WebAsset& asset : WebAssets()) {
    const std::string path = asset.path;
    auto handler = [&asset](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(reinterpret_cast<const char*>(asset.data), asset.size,
                      asset.content_type);
    };
    server->Get(path, handler);
    if (path == "/index.html") server->Get("/", handler);
  }
  // GetStatus as JSON; ?client_page_size=N&client_page_token=T&history_size=H
  // &client_ids=true as in GetStatusRequest.
  server->Get("/api/status", [this](const httplib::Request& req,
                                    httplib::Response& res) {
    // The query string is a GetStatusRequest, checked as the RPC's is.
    v1::GetStatusRequest request;
    absl::Status bad;
    auto number = [&req, &bad](const char* name) {
      int32_t value = 0;
      if (req.has_param(name) &&
          !absl::SimpleAtoi(req.get_param_value(name), &value)) {
        bad = absl::InvalidArgumentError(absl::StrCat(
            name, " \"", req.get_param_value(name), "\" is not a number"));
      }
      return value;
    };
    request.set_client_page_size(number("client_page_size"));
    request.set_history_size(number("history_size"));
    request.set_client_page_token(req.get_param_value("client_page_token"));
    if (req.has_param("client_ids")) {
      bool ids = false;
      if (!absl::SimpleAtob(req.get_param_value("client_ids"), &ids)) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("client_ids \"", req.get_param_value("client_ids"),
                         "\" is not true or false"));
      }
      request.set_client_ids(ids);
    }
    absl::StatusOr<StatusQuery> query =
        bad.ok() ? ParseStatusRequest(request) : bad;
    if (!query.ok()) {
      res.status = 400;
      res.set_content(absl::StrCat(query.status().message(), "\n"),
                      "text/plain");
      return;
    }
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    options.preserve_proto_field_names = true;
    std::string json;
    const auto status = google::protobuf::util::MessageToJsonString(
        controller->GetStatus(query->page, nullptr, query->history,
                              query->client_ids),
        &json, options);
    if (!status.ok()) {
      res.status = 500;
      res.set_content(status.ToString(), "text/plain");
      return;
    }
    res.set_header("Cache-Control", "no-store");
    res.set_content(json, kJson);
  });
  server->Get("/api/parameters",
              [this](const httplib::Request&, httplib::Response& res) {
                res.set_header("Cache-Control", "no-store");
                res.set_content(Parameters(), kJson);
              });
  server->Get("/api/history.csv", [this](const httplib::Request&,
                                         httplib::Response& res) {
    const v1::GetStatusResponse status = controller->GetStatus(
        ClientPage{0, 0}, nullptr, std::numeric_limits<size_t>::max(),
        /*client_ids=*/false, std::numeric_limits<size_t>::max());
    res.set_header("Cache-Control", "no-store");
    res.set_header("Content-Disposition",
                   absl::StrCat("inline; filename=\"fedlearn-", status.run_id(),
                                "-history.csv\""));
    // The records kept in memory (--history_in_memory): how many older ones
    // are left out, which the state directory's history file still holds.
    res.set_header(
        "X-Fedlearn-Records-Omitted",
        absl::StrCat(status.history_total() - status.history_size()));
    res.set_content(RenderHistoryCsv(status),
                    "text/csv; charset=utf-8; header=present");
  });
  // The current global model as a safetensors file, streamed from the
  // immutable snapshot of the moment of the request: no copy per request, and
  // a new model version meanwhile does not change what this one sends.
  server->Get("/api/model.safetensors", [this](const httplib::Request&,
                                               httplib::Response& res) {
    int64_t round = 0;
    Weights weights = controller->global_weights(&round);
    auto prefix = std::make_shared<const std::string>(SafetensorsPrefix(
        controller->spec(), {{"run_id", controller->run_id()},
                             {"model", controller->spec().name},
                             {"round", absl::StrCat(round)}}));
    const size_t size = prefix->size() + weights->size() * sizeof(float);
    res.set_header("Cache-Control", "no-store");
    res.set_header(
        "Content-Disposition",
        absl::StrCat("attachment; filename=\"", controller->spec().name,
                     "-round", round, ".safetensors\""));
    res.set_content_provider(
        size, "application/octet-stream",
        [prefix, weights](size_t offset, size_t length,
                          httplib::DataSink& sink) {
          constexpr size_t kPiece = size_t{1} << 20;
          length = std::min(length, kPiece);
          if (offset < prefix->size()) {
            length = std::min(length, prefix->size() - offset);
            return sink.write(prefix->data() + offset, length);
          }
          const char* data = reinterpret_cast<const char*>(weights->data());
          return sink.write(data + (offset - prefix->size()), length);
        });
  });
  server->Get("/metrics", [this](const httplib::Request&,
                                 httplib::Response& res) {
    RunCounters counters;
    // Counts only: no client is listed.
    const v1::GetStatusResponse status =
        controller->GetStatus({/*offset=*/0, /*size=*/0}, &counters);
    res.set_content(RenderPrometheus(status, counters, service->transfers()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  server->set_error_handler(
      [](const httplib::Request& req, httplib::Response& res) {
        if (res.status == 404) {
          res.set_content(absl::StrCat("not found: ", req.path, "\n"),
                          "text/plain");
        }
      });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const CoordinatorServer& coordinator, const std::string& host, int port,
    const TlsFiles& tls) {
  auto impl = std::make_unique<Impl>();
  impl->controller = &coordinator.controller();
  impl->service = &coordinator.service();
  if (tls.cert_path.empty() && tls.key_path.empty()) {
    impl->server = std::make_unique<httplib::Server>();
  } else {
    auto https = std::make_unique<httplib::SSLServer>(tls.cert_path.c_str(),
                                                      tls.key_path.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HTTPS: cannot load the certificate ", tls.cert_path, " and key ",
          tls.key_path, " (PEM files of one key pair)"));
    }
    impl->server = std::move(https);
  }
  impl->server->new_task_queue = [] {
    return new httplib::ThreadPool(kHandlerThreads);
  };
  // httplib's default also sets SO_REUSEPORT, which would let a second
  // coordinator share the port silently: SO_REUSEADDR only.
  impl->server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // A dashboard polls every second or two: a short keep-alive returns its
  // worker to the pool between polls, so a few open tabs cannot queue a
  // Prometheus scrape behind them, and Stop() does not wait out idle ones.
  impl->server->set_keep_alive_timeout(1);
  // Every route is a GET: a request body has no use here, and httplib would
  // otherwise read one of any size into memory before routing. Any other
  // method is answered 405 before its body is read (httplib's payload limit
  // holds a Content-Length to it, not a chunked body), and the connection is
  // closed rather than parsing the unread body as the next request. A
  // request's line and headers have their own limit in httplib.
  impl->server->set_pre_routing_handler(
      [](const httplib::Request& req, httplib::Response& res) {
        if (req.method == "GET" || req.method == "HEAD") {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        res.status = 405;
        res.set_header("Allow", "GET, HEAD");
        res.set_header("Connection", "close");
        res.set_content(absl::StrCat(req.method, " ", req.path,
                                     ": only GET and HEAD are served\n"),
                        "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      });
  impl->server->set_payload_max_length(kMaxRequestBody);
  impl->Routes();
  impl->port = port == 0 ? impl->server->bind_to_any_port(host)
                         : (impl->server->bind_to_port(host, port) ? port : -1);
  if (impl->port <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "HTTP: cannot listen on ", host, ":", port,
        " (in use? --http_port=0 picks a free port, -1 turns HTTP off)"));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server->listen_after_bind(); });
  // httplib's stop() does nothing before the loop runs: wait for it.
  while (!impl->server->is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->server->stop();
  impl_->thread.join();
}

}  // namespace fedlearn
