// TLS and mutual TLS between agents and the coordinator, over real sockets
// with real certificates (made by tests/util/make-test-certs.sh with openssl):
// who gets in and who does not, and what bad certificate flags get; and the
// dashboard's HTTPS with the same certificate.

#include "common/tls.h"

#include <httplib.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/agent.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/http_server.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string command =
        absl::StrCat("bash ", FEDLEARN_SOURCE_DIR,
                     "/tests/util/make-test-certs.sh ", dir_.path().string());
    if (std::system(command.c_str()) != 0) {
      GTEST_SKIP() << "openssl could not make test certificates (" << command
                   << "); scripts/setup.sh installs openssl";
    }
  }

  std::string Pem(const std::string& name) const {
    return (dir_.path() / name).string();
  }

  // A coordinator with TLS; with `mutual`, client certificates of the test CA
  // are required.
  void Start(bool mutual) {
    ServerTlsFiles files{Pem("server.pem"), Pem("server.key"),
                         mutual ? Pem("ca.pem") : ""};
    auto credentials = MakeServerCredentials(files);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    auto server = CoordinatorServer::Start(testing::SmallRun(), "127.0.0.1:0",
                                           *credentials);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Joins over a channel with `files`; returns the Join status.
  absl::Status JoinWith(const ClientTlsFiles& files,
                        const std::string& host = "localhost") {
    auto credentials = MakeChannelCredentials(files);
    if (!credentials.ok()) return credentials.status();
    CoordinatorClient client(
        MakeCoordinatorChannel(absl::StrCat(host, ":", server_->port()),
                               absl::Seconds(1), *credentials));
    return client.Join(v1::JoinRequest()).status();
  }

  fedlearn::testing::ScopedTempDir dir_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(TlsTest, ClientTrustingTheCaJoins) {
  Start(/*mutual=*/false);
  EXPECT_TRUE(JoinWith({true, Pem("ca.pem"), "", ""}).ok());
  // The certificate names 127.0.0.1 too.
  EXPECT_TRUE(JoinWith({true, Pem("ca.pem"), "", ""}, "127.0.0.1").ok());
}

TEST_F(TlsTest, PlaintextAndUntrustedClientsDoNotGetIn) {
  Start(/*mutual=*/false);
  const absl::Status plaintext = JoinWith({false, "", "", ""});
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kUnavailable) << plaintext;
  // A client that trusts another CA refuses the coordinator's certificate.
  const absl::Status untrusted = JoinWith({true, Pem("other-ca.pem"), "", ""});
  EXPECT_EQ(untrusted.code(), absl::StatusCode::kUnavailable) << untrusted;
  EXPECT_EQ(server_->controller().GetStatus().clients_size(), 0);
  // The same coordinator takes a client that trusts its CA: the two above
  // were turned away, not missing a listener.
  EXPECT_TRUE(JoinWith({true, Pem("ca.pem"), "", ""}).ok());
  EXPECT_EQ(server_->controller().GetStatus().clients_size(), 1);
}

TEST_F(TlsTest, MutualTlsWantsAClientCertificateOfItsCa) {
  Start(/*mutual=*/true);
  EXPECT_TRUE(
      JoinWith({true, Pem("ca.pem"), Pem("client.pem"), Pem("client.key")})
          .ok());
  const absl::Status without = JoinWith({true, Pem("ca.pem"), "", ""});
  EXPECT_EQ(without.code(), absl::StatusCode::kUnavailable) << without;
  const absl::Status rogue =
      JoinWith({true, Pem("ca.pem"), Pem("rogue.pem"), Pem("rogue.key")});
  EXPECT_EQ(rogue.code(), absl::StatusCode::kUnavailable) << rogue;
  EXPECT_EQ(server_->controller().GetStatus().clients_size(), 1);
}

TEST_F(TlsTest, BadFlagsAreClearErrors) {
  auto half = MakeServerCredentials({Pem("server.pem"), "", ""});
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(half.status().message(), HasSubstr("--tls_key"));

  auto missing =
      MakeServerCredentials({Pem("nope.pem"), Pem("server.key"), ""});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.pem"));

  auto not_pem = MakeServerCredentials({Pem("ca.srl"), Pem("server.key"), ""});
  EXPECT_EQ(not_pem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_pem.status().message(), HasSubstr("not a PEM file"));

  auto ca_alone = MakeServerCredentials({"", "", Pem("ca.pem")});
  EXPECT_EQ(ca_alone.status().code(), absl::StatusCode::kInvalidArgument);

  auto client_without_tls =
      MakeChannelCredentials({false, Pem("ca.pem"), "", ""});
  EXPECT_EQ(client_without_tls.status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client_without_tls.status().message(), HasSubstr("--tls"));
}

TEST_F(TlsTest, DashboardIsServedOverHttpsWithTheSameCertificate) {
  Start(/*mutual=*/true);  // client certificates are for gRPC only
  auto http = HttpServer::Start(*server_, "127.0.0.1", 0,
                                {Pem("server.pem"), Pem("server.key")});
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();

  httplib::SSLClient trusting("localhost", port);
  trusting.set_ca_cert_path(Pem("ca.pem").c_str());
  trusting.enable_server_certificate_verification(true);
  auto page = trusting.Get("/api/status");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr(absl::StrCat(
                              "\"run_id\":\"",
                              server_->controller().GetStatus().run_id())));

  // A client of another CA does not accept the certificate, and plain HTTP
  // gets no page.
  httplib::SSLClient untrusting("localhost", port);
  untrusting.set_ca_cert_path(Pem("other-ca.pem").c_str());
  untrusting.enable_server_certificate_verification(true);
  EXPECT_FALSE(untrusting.Get("/api/status"));
  httplib::Client plain("localhost", port);
  plain.set_read_timeout(2, 0);
  auto plain_page = plain.Get("/api/status");
  EXPECT_TRUE(!plain_page || plain_page->status != 200);

  // A key that is not the certificate's is refused at start.
  auto mismatched = HttpServer::Start(*server_, "127.0.0.1", 0,
                                      {Pem("server.pem"), Pem("client.key")});
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument)
      << mismatched.status();
}

}  // namespace
}  // namespace fedlearn
