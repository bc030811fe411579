#ifndef FEDLEARN_COMMON_FLAGS_H_
#define FEDLEARN_COMMON_FLAGS_H_

#include <vector>

namespace fedlearn {

// Parses the command line of a fedlearn binary with absl flags, after setting
// up usage so that --help lists every fedlearn flag with its default (absl's
// default only lists flags from a file named after the binary). Returns the
// positional arguments; exits with a message on a malformed flag.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_FLAGS_H_
