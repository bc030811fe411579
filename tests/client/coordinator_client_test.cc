// CoordinatorClient against a coordinator that took the connection and never
// answers (a listening socket nobody serves): every unary call gives up at its
// deadline instead of holding the client.

#include "client/coordinator_client.h"

#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

// A TCP socket on 127.0.0.1 that listens and is never served: the kernel
// completes every connection, nothing is ever read or written.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ < 0 ||
        bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
            0 ||
        listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return;
    }
    port_ = ntohs(address.sin_port);
  }
  ~SilentListener() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(CoordinatorClientTest, UnaryCallsToASilentCoordinatorEndAtTheirDeadline) {
  SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  CoordinatorClient client(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", silent.port()),
                          grpc::InsecureChannelCredentials()),
      size_t{64} << 10, absl::Milliseconds(300));
  const std::vector<std::pair<std::string, std::function<absl::Status()>>>
      calls = {
          {"Join", [&] { return client.Join(v1::JoinRequest()).status(); }},
          {"Heartbeat",
           [&] { return client.Heartbeat(v1::HeartbeatRequest()).status(); }},
          {"ReportEval",
           [&] { return client.ReportEval(v1::ReportEvalRequest()); }},
          {"GetStatus", [&] { return client.GetStatus().status(); }},
      };
  for (const auto& [name, call] : calls) {
    const absl::Time start = absl::Now();
    const absl::Status status = call();
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded)
        << name << ": " << status;
    // gRPC's own connection attempt would give up only after 20 s.
    EXPECT_LT(took, absl::Seconds(10)) << name;
  }
}

// A push waits for the coordinator's go-ahead without a bound of its own (it
// may queue behind other uploads); the deadline its caller gives ends it.
TEST(CoordinatorClientTest, APushToASilentCoordinatorEndsAtItsDeadline) {
  SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  CoordinatorClient client(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", silent.port()),
                          grpc::InsecureChannelCredentials()));
  v1::UpdateHeader header;
  header.set_round(1);
  header.set_num_examples(10);
  const absl::Time start = absl::Now();
  const absl::Status status =
      client
          .PushEncoded(header, /*chunks=*/{},
                       /*deadline=*/start + absl::Milliseconds(300))
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace fedlearn
