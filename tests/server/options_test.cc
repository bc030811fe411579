// CoordinatorOptions on their own: defaults resolved, values parsed, ranges
// checked, with no server started.

#include "server/options.h"

#include <cstddef>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

TEST(CoordinatorOptionsTest, GrpcMemoryIsGivenOrScalesWithTheClients) {
  CoordinatorOptions o;
  EXPECT_EQ(o.grpc_memory, "auto");
  o.max_clients = 10000;  // 256 MiB + 10,000 x 16 KiB
  EXPECT_EQ(*o.GrpcMemoryBytes(), size_t{432275456});
  o.max_clients = 50000;  // 256 MiB + 50,000 x 16 KiB
  EXPECT_EQ(*o.GrpcMemoryBytes(), size_t{1087635456});
  o.grpc_memory = "3GiB";  // beyond 2^31 - 1
  EXPECT_EQ(*o.GrpcMemoryBytes(), size_t{3221225472});
  o.grpc_memory = "640KiB";
  EXPECT_EQ(*o.GrpcMemoryBytes(), size_t{655360});
  for (const char* bad :
       {"0", "0MiB", "-1", "12 MB", "lots", "", "1GiBKiB", "1KiBMiB"}) {
    o.grpc_memory = bad;
    EXPECT_THAT(o.Validate().message(), HasSubstr("--grpc_memory: ")) << bad;
    EXPECT_FALSE(o.GrpcMemoryBytes().ok()) << bad;
  }
}

TEST(CoordinatorOptionsTest, AsyncFlagsAreChecked) {
  CoordinatorOptions o;
  EXPECT_TRUE(ParseMode("async", &o).ok());
  EXPECT_EQ(o.mode, Mode::kAsync);
  EXPECT_THAT(ParseMode("sync", &o).message(),
              HasSubstr("--mode: \"sync\": expected rounds or async"));
  EXPECT_DOUBLE_EQ(o.AsyncMixing(), 1.0 / o.min_clients);  // 0: automatic
  o.async_mixing = 1.5;
  EXPECT_THAT(o.Validate().message(), HasSubstr("--async_mixing"));
  o.async_mixing = 1;
  o.staleness_exponent = -1;
  EXPECT_THAT(o.Validate().message(), HasSubstr("--staleness_exponent"));
  o.staleness_exponent = 0.5;
  o.max_staleness = -1;
  EXPECT_THAT(o.Validate().message(), HasSubstr("--max_staleness"));
}

TEST(CoordinatorOptionsTest, ForgetAfterIsNeverOrAtLeastTheClientTimeout) {
  CoordinatorOptions o;
  EXPECT_TRUE(o.Validate().ok());         // 10 minutes against 20 s
  o.forget_after = absl::ZeroDuration();  // never
  EXPECT_TRUE(o.Validate().ok());
  o.forget_after = o.client_timeout;
  EXPECT_TRUE(o.Validate().ok());
  o.forget_after = o.client_timeout - absl::Milliseconds(1);
  EXPECT_THAT(o.Validate().message(),
              HasSubstr("--forget_after: must be 0 (never) or at least "
                        "--client_timeout"));
}

}  // namespace
}  // namespace fedlearn
