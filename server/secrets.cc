#include "server/secrets.h"

#include <random>

#include "absl/strings/str_format.h"

namespace fedlearn {

std::string RandomHex(int bytes) {
  std::random_device device;  // getrandom(2) on Linux: unpredictable
  std::string out;
  out.reserve(bytes * 2 + 8);
  for (int i = 0; i < bytes; i += 4) {
    absl::StrAppendFormat(&out, "%08x", device());
  }
  return out.substr(0, bytes * 2);
}

bool SecretEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace fedlearn
