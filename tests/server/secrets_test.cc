#include "server/secrets.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

TEST(SecretsTest, RandomHexHasTwoLowercaseDigitsPerByte) {
  for (int bytes : {1, 3, 4, 5, 16, 33}) {
    const std::string hex = RandomHex(bytes);
    EXPECT_EQ(hex.size(), 2u * bytes) << bytes;
    EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos)
        << hex;
  }
}

TEST(SecretsTest, RandomHexDoesNotRepeat) {
  // 16 bytes, as a session token: a repeat in a thousand draws would mean a
  // broken source (a fixed seed), not bad luck (odds about 2^-108).
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_TRUE(seen.insert(RandomHex(16)).second) << i;
  }
}

TEST(SecretsTest, SecretEqualsComparesEveryByteAndTheLength) {
  EXPECT_TRUE(SecretEquals("", ""));
  EXPECT_TRUE(SecretEquals("s3cret", "s3cret"));
  EXPECT_FALSE(SecretEquals("s3cret", "x3cret"));  // first byte
  EXPECT_FALSE(SecretEquals("s3cret", "s3crex"));  // last byte
  EXPECT_FALSE(SecretEquals("s3cret", "s3cre"));
  EXPECT_FALSE(SecretEquals("s3cre", "s3cret"));
  EXPECT_FALSE(SecretEquals("", "s"));
  // Bytes that differ only in their high bit.
  EXPECT_FALSE(SecretEquals(std::string(1, '\x01'), std::string(1, '\x81')));
}

}  // namespace
}  // namespace fedlearn
