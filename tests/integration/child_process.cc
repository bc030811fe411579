#include "tests/integration/child_process.h"

#include <google/protobuf/descriptor.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace fedlearn::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) == 0)
    pid_ = pid;
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  fd_ = pipe_fds[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (fd_ >= 0) close(fd_);
}

bool ChildProcess::ReadSome(absl::Duration timeout) {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  const int ready =
      poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (ready <= 0) return ready == 0;  // timeout: not the end
  char buffer[4096];
  const ssize_t n = read(fd_, buffer, sizeof(buffer));
  if (n <= 0) {
    close(fd_);
    fd_ = -1;
    return false;
  }
  output_.append(buffer, static_cast<size_t>(n));
  return true;
}

std::optional<std::string> ChildProcess::WaitForLine(const std::string& needle,
                                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    // Match complete lines only, each once.
    size_t end;
    while ((end = output_.find('\n', scanned_)) != std::string::npos) {
      std::string line = output_.substr(scanned_, end - scanned_);
      scanned_ = end + 1;
      if (line.find(needle) != std::string::npos) return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() || !ReadSome(left)) return std::nullopt;
  }
}

void ChildProcess::Signal(int signal) {
  if (pid_ > 0 && !exit_code_.has_value()) kill(pid_, signal);
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  if (exit_code_.has_value() || pid_ <= 0) return exit_code_;
  // A pidfd becomes readable when the child exits: wait on it and on the output
  // pipe (which must keep draining, or a chatty child blocks on a full pipe).
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  const absl::Time deadline = absl::Now() + timeout;
  std::optional<int> result;
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      while (fd_ >= 0 && ReadSome(absl::ZeroDuration())) {
      }
      exit_code_ =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      result = exit_code_;
      break;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    pollfd fds[2] = {{pidfd, POLLIN, 0}, {fd_, POLLIN, 0}};  // poll skips fd -1
    poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (fds[1].revents != 0) ReadSome(absl::ZeroDuration());
  }
  if (pidfd >= 0) close(pidfd);
  return result;
}

int CoordinatorPort(ChildProcess& coordinator, absl::Duration timeout) {
  std::optional<std::string> line =
      coordinator.WaitForLine("listening on", timeout);
  if (!line.has_value()) return 0;
  const size_t at = line->rfind("(port ");
  int port = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(line->substr(at + 6, line->size() - at - 7), &port)) {
    return 0;
  }
  return port;
}

std::vector<std::string> FlagsInHelp(const std::string& help) {
  // Help lines read "    --name (description); default: value;".
  std::vector<std::string> flags;
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (absl::StartsWith(line, "--") &&
        line.find(" (") != absl::string_view::npos) {
      flags.emplace_back(line.substr(0, line.find(' ')));
    }
  }
  return flags;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  return std::string((std::istreambuf_iterator<char>(file)),
                     std::istreambuf_iterator<char>());
}

std::vector<std::string> ConfigMismatches(const std::string& help,
                                          const std::string& schema) {
  // Field lines read "  optional TYPE NAME = NUMBER;".
  std::set<std::string> fields;
  for (absl::string_view line : absl::StrSplit(schema, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "optional ")) continue;
    const std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
    if (words.size() >= 2) fields.emplace(words[1]);
  }
  std::vector<std::string> mismatches;
  std::set<std::string> flags;
  for (const std::string& flag : FlagsInHelp(help)) {
    const std::string name = flag.substr(2);  // without "--"
    if (name == "config") continue;
    flags.insert(name);
    if (fields.count(name) == 0) {
      mismatches.push_back(absl::StrCat(flag, " has no field"));
    }
  }
  for (const std::string& field : fields) {
    if (flags.count(field) == 0) {
      mismatches.push_back(absl::StrCat("field ", field, " names no flag"));
    }
  }
  return mismatches;
}

std::string WriteTempFile(const std::string& name,
                          const std::string& contents) {
  std::string dir = ::testing::TempDir() + "fedlearn-test-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return "";
  const std::string path = dir + "/" + name;
  std::ofstream file(path);
  file << contents;
  file.close();
  return file ? path : "";
}

}  // namespace fedlearn::testing
