#ifndef FEDLEARN_COMMON_FLAGS_H_
#define FEDLEARN_COMMON_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace fedlearn {

// Parses the command line of a fedlearn binary with absl flags, after setting
// up usage so that --help lists every fedlearn flag with its default (absl's
// default only lists flags from a file named after the binary). Returns the
// positional arguments; exits with a message on a malformed flag.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage);

// As above, for a binary whose options may also come from a file: with
// `--config=FILE` on the command line, FILE holds a `config_type` message in
// protobuf text format whose fields are named after this binary's flags
// (proto/fedlearn/v1/config.proto); a message-typed field sets its flag to the
// message in one-line text format. The file is applied first and the command
// line parsed over it, so a flag given there wins. A file that cannot be read
// or parsed, or a value its flag rejects, exits with status 2 and a message
// naming the file (and line, or field). The binary defines the `config` flag
// itself, so that its --help lists it.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage,
                              const google::protobuf::Message& config_type);

// Sets the flags named by the fields of the `config_type` message in
// protobuf text format in file `path`. INVALID_ARGUMENT for a syntax error or
// an unknown field ("FILE:LINE:COLUMN: ...") and for a value the flag rejects
// ("FILE: FIELD: ..."); NOT_FOUND and other file errors from reading it;
// INTERNAL when a field of `config_type` names no flag of this program. Flags
// set before a failure stay set.
absl::Status ApplyConfigFile(const std::string& path,
                             const google::protobuf::Message& config_type);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_FLAGS_H_
