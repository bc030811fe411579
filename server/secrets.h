#ifndef FEDLEARN_SERVER_SECRETS_H_
#define FEDLEARN_SERVER_SECRETS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace fedlearn {

// `bytes` random bytes from the OS (getrandom(2) through std::random_device),
// as 2 x bytes lowercase hex digits: session tokens and run ids.
std::string RandomHex(int bytes);

// Compares secrets in time independent of where they first differ.
bool SecretEquals(absl::string_view a, absl::string_view b);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_SECRETS_H_
