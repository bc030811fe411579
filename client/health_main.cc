// fedlearn-health: asks a gRPC server's grpc.health.v1.Health/Check about the
// whole server (service "") and exits 0 when it answers SERVING, 1 otherwise
// (NOT_SERVING, UNKNOWN, unreachable, or no answer within --timeout). Meant for
// container health checks (compose, podman) where no grpc_health_probe exists;
// Kubernetes has native gRPC probes and does not need it. Speaks TLS with the
// client's --tls flags, for a coordinator run with --tls_cert.

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, address, "localhost:50051",
          "address of the server to check, HOST:PORT");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(3),
          "deadline of the check, connecting included");
ABSL_FLAG(bool, tls, false, "connect with TLS");
ABSL_FLAG(
    std::string, tls_ca, "",
    "PEM CA the server's certificate must chain to (empty: system roots)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate, for mutual TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate must carry (default: the host)");

int main(int argc, char** argv) {
  fedlearn::ParseFlags(
      argc, argv,
      "fedlearn-health --address=HOST:PORT [--timeout=3s] [--tls ...]\n"
      "Exits 0 when grpc.health.v1.Health/Check answers SERVING, 1 otherwise.");
  const std::string address = absl::GetFlag(FLAGS_address);
  auto credentials = fedlearn::MakeChannelCredentials(
      {absl::GetFlag(FLAGS_tls), absl::GetFlag(FLAGS_tls_ca),
       absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)});
  if (!credentials.ok()) {
    std::fprintf(stderr, "fedlearn-health: %s\n",
                 credentials.status().ToString().c_str());
    return 2;
  }
  grpc::ChannelArguments args;
  if (!absl::GetFlag(FLAGS_tls_server_name).empty()) {
    args.SetSslTargetNameOverride(absl::GetFlag(FLAGS_tls_server_name));
  }
  auto channel = grpc::CreateCustomChannel(address, *credentials, args);
  auto stub = grpc::health::v1::Health::NewStub(channel);

  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
  // Waits for the connection up to the deadline instead of failing at once
  // while the server is still starting.
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;  // service "": the server
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    std::printf("%s: %s\n", address.c_str(),
                fedlearn::FromGrpcStatus(status).ToString().c_str());
    return 1;
  }
  std::printf("%s: %s\n", address.c_str(),
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                  response.status())
                  .c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING
             ? 0
             : 1;
}
