#ifndef FEDLEARN_COMMON_TLS_H_
#define FEDLEARN_COMMON_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fedlearn {

// TLS for the coordinator from PEM files: its certificate chain and private
// key, and, for mutual TLS, the CA that client certificates must chain to
// (empty: clients are not asked for one). Empty cert and key: insecure.
// INVALID_ARGUMENT when only one of cert and key is given; an errno-derived
// status naming the file when one cannot be read.
struct ServerTlsFiles {
  std::string cert;
  std::string key;
  std::string client_ca;
};
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files);

// TLS for a client from PEM files: the CA the coordinator's certificate must
// chain to (empty: the system's roots), and for mutual TLS the client's own
// certificate chain and key. `enabled` false: insecure (the files must then be
// empty). INVALID_ARGUMENT when only one of cert and key is given; an
// errno-derived status naming the file when one cannot be read.
struct ClientTlsFiles {
  bool enabled = false;
  std::string ca;
  std::string cert;
  std::string key;
};
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTlsFiles& files);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_TLS_H_
