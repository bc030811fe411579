#include "common/tls.h"

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace fedlearn {
namespace {

// The file's contents; an empty path gives an empty string.
absl::StatusOr<std::string> ReadPem(const std::string& flag,
                                    const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> pem = ReadFileToString(path);
  if (!pem.ok()) {
    return absl::Status(pem.status().code(),
                        absl::StrCat(flag, ": ", pem.status().message()));
  }
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return pem;
}

absl::Status BothOrNeither(const std::string& prefix, const std::string& cert,
                           const std::string& key) {
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "tls_cert and ", prefix, "tls_key go together"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files) {
  FEDLEARN_RETURN_IF_ERROR(BothOrNeither("--", files.cert, files.key));
  if (files.cert.empty()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  FEDLEARN_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem("--tls_cert", files.cert));
  FEDLEARN_ASSIGN_OR_RETURN(pair.private_key, ReadPem("--tls_key", files.key));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!files.client_ca.empty()) {
    FEDLEARN_ASSIGN_OR_RETURN(options.pem_root_certs,
                              ReadPem("--tls_client_ca", files.client_ca));
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTlsFiles& files) {
  FEDLEARN_RETURN_IF_ERROR(BothOrNeither("--", files.cert, files.key));
  if (!files.enabled) {
    if (!files.ca.empty() || !files.cert.empty()) {
      return absl::InvalidArgumentError(
          "--tls_ca, --tls_cert and --tls_key need --tls");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  FEDLEARN_ASSIGN_OR_RETURN(options.pem_root_certs,
                            ReadPem("--tls_ca", files.ca));
  FEDLEARN_ASSIGN_OR_RETURN(options.pem_cert_chain,
                            ReadPem("--tls_cert", files.cert));
  FEDLEARN_ASSIGN_OR_RETURN(options.pem_private_key,
                            ReadPem("--tls_key", files.key));
  return grpc::SslCredentials(options);
}

}  // namespace fedlearn
