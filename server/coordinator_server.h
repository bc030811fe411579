#ifndef FEDLEARN_SERVER_COORDINATOR_SERVER_H_
#define FEDLEARN_SERVER_COORDINATOR_SERVER_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/options.h"

namespace fedlearn {

class CoordinatorService;
class RunController;
class StatusQueue;

// A running coordinator: the run controller, the gRPC service with reflection
// and grpc.health.v1, listening on real sockets. Used by the binary and by
// tests. Not thread-safe: one owner starts it and shuts it down (more than once
// is fine).
class CoordinatorServer {
 public:
  // Builds the model from options.model and options.seed and the strategy
  // from options.strategy, and starts serving on
  // `address`
  // ("0.0.0.0:50051"; port 0 picks a free port). INVALID_ARGUMENT for bad
  // options, NOT_FOUND for an unknown model, UNAVAILABLE when the address
  // cannot be bound, FAILED_PRECONDITION for a state directory holding a run
  // of another mode or strategy.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorOptions& options, const std::string& address,
      std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

  ~CoordinatorServer();  // Shuts down.

  // The bound port.
  int port() const { return port_; }
  // The gRPC memory quota it runs with (--grpc_memory resolved).
  size_t grpc_memory_bytes() const { return grpc_memory_bytes_; }
  RunController& controller() { return *controller_; }
  const RunController& controller() const { return *controller_; }
  const CoordinatorService& service() const { return *service_; }

  // Marks the service NOT_SERVING, fails pending polls with UNAVAILABLE, and
  // stops the server, cancelling calls still running after `grace`.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  CoordinatorServer() = default;

  int port_ = 0;
  size_t grpc_memory_bytes_ = 0;
  std::unique_ptr<RunController> controller_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<StatusQueue> status_;  // stopped after server_ shuts down
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_COORDINATOR_SERVER_H_
