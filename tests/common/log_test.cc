// LogLine and BackgroundLog (common/log.h): with a background log, a caller
// never waits for the log's reader, lines keep their order, and what a full
// queue drops is counted in the log itself.

#include "common/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

// Reads `fd` to its end.
std::string ReadAll(int fd) {
  std::string all;
  char buffer[1 << 16];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0;) {
    all.append(buffer, static_cast<size_t>(n));
  }
  return all;
}

// A pipe, closed at the end of the test.
struct Pipe {
  Pipe() { EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  void CloseWriteEnd() {
    ::close(fds[1]);
    fds[1] = -1;
  }
  int fds[2] = {-1, -1};
};

TEST(BackgroundLogTest, AStalledReaderHoldsUpNoCallerAndDropsAreCounted) {
  Pipe pipe;
  // 100-byte lines: 20,000 of them are 2 MB, far past what the pipe (64 KiB)
  // and the queue (256 KiB) hold while nobody reads.
  constexpr int kLines = 20000;
  const std::string padding(60, 'x');
  std::string logged;
  std::optional<BackgroundLog> log;
  log.emplace(256 << 10, pipe.fds[1], absl::Seconds(30));
  std::atomic<bool> done{false};
  std::thread caller([&] {
    for (int i = 0; i < kLines; ++i) Logf("line %d %s", i, padding);
    done = true;
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!done.load() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const bool returned = done.load();
  // Read from here on (which frees the caller if it was stuck).
  std::thread reader([&] { logged = ReadAll(pipe.fds[0]); });
  caller.join();
  EXPECT_TRUE(returned) << "LogLine waited for the log's reader";
  const uint64_t dropped = log->dropped();
  log.reset();  // writes what is queued
  pipe.CloseWriteEnd();
  reader.join();
  EXPECT_GT(dropped, 0u);

  // Every line is whole and in order; the notices account for the rest.
  int next = 0;
  uint64_t noticed = 0;
  int kept = 0;
  for (absl::string_view line :
       absl::StrSplit(logged, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
    ASSERT_GE(words.size(), 3u) << line;
    if (words[1] == "line") {
      int i = 0;
      ASSERT_TRUE(absl::SimpleAtoi(words[2], &i)) << line;
      EXPECT_GE(i, next) << "out of order: " << line;
      ASSERT_EQ(words.size(), 4u) << line;
      EXPECT_EQ(words[3], padding);
      next = i + 1;
      ++kept;
    } else {
      EXPECT_THAT(line, HasSubstr("log lines dropped: the log's reader fell "
                                  "behind (256 KiB queued)"));
      uint64_t n = 0;
      ASSERT_TRUE(absl::SimpleAtoi(words[1], &n)) << line;
      noticed += n;
    }
  }
  EXPECT_EQ(noticed, dropped);
  EXPECT_EQ(kept + static_cast<int64_t>(dropped), kLines);
  // The queue's bound held: what was written while nobody read is the pipe's
  // and the queue's worth, not everything.
  EXPECT_LT(kept, kLines / 2);
}

TEST(BackgroundLogTest, AReaderThatKeepsUpGetsEveryLineAndNoNotice) {
  Pipe pipe;
  std::string logged;
  std::thread reader;
  {
    BackgroundLog log(1 << 20, pipe.fds[1]);
    reader = std::thread([&] { logged = ReadAll(pipe.fds[0]); });
    for (int i = 0; i < 1000; ++i) Logf("line %d", i);
  }  // writes what is queued before it returns
  pipe.CloseWriteEnd();
  reader.join();
  std::vector<std::string> lines =
      absl::StrSplit(logged, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1000u);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_THAT(lines[i], testing::EndsWith(" line " + std::to_string(i)));
  }
}

}  // namespace
}  // namespace fedlearn
