#ifndef FEDLEARN_TESTS_INTEGRATION_CHILD_PROCESS_H_
#define FEDLEARN_TESTS_INTEGRATION_CHILD_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace google::protobuf {
class Descriptor;
}  // namespace google::protobuf

namespace fedlearn::testing {

// A program run as a real child process, its stdout and stderr captured through
// one pipe. The destructor kills (SIGKILL) and reaps a child still running, so
// a failing test leaves no process behind. Not thread-safe.
class ChildProcess {
 public:
  // Starts `argv[0]` with arguments argv[1..]. Check started().
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Reads output until a line containing `needle` arrives (returns that line)
  // or the timeout passes or the output ends (nullopt).
  std::optional<std::string> WaitForLine(const std::string& needle,
                                         absl::Duration timeout);

  void Signal(int signal);

  // Waits for the child to exit; returns its exit code (128 + signal if killed
  // by one), or nullopt if it is still running after `timeout`.
  std::optional<int> Wait(absl::Duration timeout);

  // Everything read so far (WaitForLine and Wait read the pipe).
  const std::string& output() const { return output_; }

 private:
  // Reads what is available within `timeout`; false at end of output.
  bool ReadSome(absl::Duration timeout);

  pid_t pid_ = -1;
  int fd_ = -1;
  size_t scanned_ = 0;  // lines before this offset were matched against already
  std::string output_;
  std::optional<int> exit_code_;
};

// The port of a fedlearn-coordinator started with --port=0, read from its
// "listening on ... (port N)" line; 0 if it does not say so within `timeout`.
int CoordinatorPort(ChildProcess& coordinator, absl::Duration timeout);

// The flag names ("--port") a fedlearn binary's --help output lists, in order.
std::vector<std::string> FlagsInHelp(const std::string& help);

// The README of the source tree (FEDLEARN_SOURCE_DIR), or "" if it cannot be
// read.
std::string ReadFile(const std::string& path);

// How a binary's flags (its --help output) and the fields of its --config
// message (its --config_schema output, a .proto declaration) disagree: "--flag
// has no field" and "field NAME names no flag", one entry each; empty when
// every flag but --config has a field of its name and every field a flag.
std::vector<std::string> ConfigMismatches(const std::string& help,
                                          const std::string& schema);

// Writes `contents` to a file called `name` in a new directory under the test
// temp dir; returns its path, or "" if it could not be written.
std::string WriteTempFile(const std::string& name, const std::string& contents);

}  // namespace fedlearn::testing

#endif  // FEDLEARN_TESTS_INTEGRATION_CHILD_PROCESS_H_
