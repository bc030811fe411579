#ifndef FEDLEARN_COMMON_FLAGS_H_
#define FEDLEARN_COMMON_FLAGS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace google::protobuf {
class Descriptor;
}  // namespace google::protobuf

namespace fedlearn {

// Parses the command line of a fedlearn binary with absl flags, after setting
// up usage so that --help lists every fedlearn flag with its default (absl's
// default only lists flags from a file named after the binary). Returns the
// positional arguments; exits with a message on a malformed flag.
// It also turns absl::Mutex's deadlock detection off for the process: Debian's
// abseil is built with it on, and it updates a graph of held locks at every
// Lock, gRPC's included: a sixth of the coordinator's CPU with 10,000 clients
// (bench/swarm.sh). Tests keep it; the thread-safety analysis and the
// sanitizer build are the checks.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage);

// The --config file of a binary: a message in protobuf text format with one
// field per flag the program defines in fedlearn's sources (but `config`
// itself), named after the flag and of its type; a flag of another type
// (absl::Duration, ...) is a string in the flag's syntax ("30s"). The message
// is built from the flags at run time, so a new flag is settable from a file
// with no further edit. A flag named in `message_flags` takes a message in
// text format; its field has that message type (`strategy_config { ... }`).
struct ConfigSchema {
  std::string message_name;  // full name, e.g. "fedlearn.v1.CoordinatorConfig"
  std::vector<std::pair<std::string, const google::protobuf::Descriptor*>>
      message_flags;
};

// As above, for a binary whose options may also come from a file: with
// `--config=FILE` on the command line, FILE holds the `schema` message; it is
// applied first and the command line parsed over it, so a flag given there
// wins. A file that cannot be read or parsed, or a value its flag rejects,
// exits with status 2 and a message naming the file (and line, or field).
// `--config_schema` prints the message as a .proto declaration
// (ConfigSchemaProto) and exits 0. The binary defines the `config` flag
// itself, so that its --help lists it.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage,
                              const ConfigSchema& schema);

// Sets the flags named by the fields of the `schema` message in protobuf text
// format in file `path`. INVALID_ARGUMENT for a syntax error or an unknown
// field ("FILE:LINE:COLUMN: ...") and for a value the flag rejects ("FILE:
// FIELD: ..."); NOT_FOUND and other file errors from reading it. Flags set
// before a failure stay set.
absl::Status ApplyConfigFile(const std::string& path,
                             const ConfigSchema& schema);

// The `schema` message as a .proto declaration, each field commented with its
// flag's help and default.
std::string ConfigSchemaProto(const ConfigSchema& schema);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_FLAGS_H_
