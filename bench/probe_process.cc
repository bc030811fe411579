#include "bench/probe_process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fedlearn {

ProbeProcess::ProbeProcess(const std::string& coordinator, int http_port) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path = len > 0 ? std::string(self, len) : "";
  path = absl::StrCat(path.substr(0, path.rfind('/') + 1), "status_probe");
  const std::vector<std::string> args = {
      path, absl::StrCat("--coordinator=", coordinator),
      absl::StrCat("--http_port=", http_port)};
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) {
    error_ = "cannot make pipes for the status probe";
    return;
  }
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    error_ = "cannot make pipes for the status probe";
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  const int rc =
      posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    error_ = absl::StrCat("cannot start ", path, ": ", std::strerror(rc));
    close(in[1]);
    close(out[0]);
    pid_ = 0;
    return;
  }
  to_probe_ = in[1];
  from_probe_ = out[0];
}

std::vector<std::string> ProbeProcess::Finish(int64_t* errors) {
  if (pid_ == 0) {
    std::fprintf(stderr, "swarm: %s\n", error_.c_str());
    ++*errors;
    return {};
  }
  close(to_probe_);
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(from_probe_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, n);
  }
  close(from_probe_);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  std::vector<std::string> lines;
  bool reported = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    int64_t failed = 0;
    if (absl::ConsumePrefix(&line, "probe_errors=") &&
        absl::SimpleAtoi(line, &failed)) {
      *errors += failed;
      reported = true;
    } else {
      lines.emplace_back(line);
    }
  }
  if (!reported) {
    std::fprintf(stderr, "swarm: the status probe ended without a report\n");
    ++*errors;
  }
  return lines;
}

}  // namespace fedlearn
