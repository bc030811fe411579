#ifndef FEDLEARN_SERVER_HTTP_SERVER_H_
#define FEDLEARN_SERVER_HTTP_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fedlearn {

class CoordinatorServer;

// The coordinator's HTTP side (cpp-httplib, on threads of its own):
//   /                  the dashboard (assets built into the binary)
//   /api/status        GetStatus as JSON (proto field names, zeros included)
//   /api/parameters    per-tensor statistics of the global model
//   /api/history.csv   the rounds' history for spreadsheets
//   /metrics           Prometheus text exposition
// Handlers only take snapshots from the round manager (one short lock each);
// everything is rendered outside its lock.
class HttpServer {
 public:
  // PEM files of the certificate chain and private key to serve HTTPS with;
  // empty: plain HTTP.
  struct TlsFiles {
    std::string cert_path;
    std::string key_path;
  };

  // Serves `coordinator` (which must outlive the server) on `host`:`port`;
  // port 0 picks a free one. UNAVAILABLE when the address cannot be bound,
  // INVALID_ARGUMENT when `tls` names files that are not a matching PEM
  // certificate and key.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const CoordinatorServer& coordinator, const std::string& host, int port,
      const TlsFiles& tls = {});

  ~HttpServer();  // Stops.

  int port() const;

  // Stops accepting and waits for the handlers running. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_HTTP_SERVER_H_
