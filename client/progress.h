#ifndef FEDLEARN_CLIENT_PROGRESS_H_
#define FEDLEARN_CLIENT_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/trainer.h"
#include "common/log.h"

namespace fedlearn {

// How training progress is shown (--progress).
enum class ProgressMode {
  kAuto,   // kBar when the log stream is a terminal, else kPlain
  kBar,    // a self-overwriting bar per local epoch, plus kPlain's lines
  kPlain,  // one log line per round (the round's result), nothing per batch
  kNone,   // not even that: only events (joins, retries, errors, evaluation)
};

// "auto", "bar", "plain" or "none"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text);

// kAuto decided for the terminal on `fd`: kBar when it is a tty (and TERM is
// not "dumb", which cannot erase a line), else kPlain. Other modes unchanged.
ProgressMode ResolveProgressMode(ProgressMode mode, int fd);

// Columns of the terminal on `fd`, or 80 when it has none.
int TerminalWidth(int fd);

// "4s", "1m05s", "2h03m": an ETA to the second.
std::string FormatEta(absl::Duration d);

// One agent's epoch bar, at most width - 1 columns (the last column is left
// free so that no terminal wraps the line):
//   agent-0 round 3 epoch 1/5 [##########..........] 52%  loss 0.2140  acc
//   93.1%  812 samples/s  ETA 4s
// `elapsed` is the time since the epoch started. A finished epoch shows its
// duration instead of the ETA. The bar shrinks, then the fields go (rate
// first, then loss and accuracy), as the width does. `progress` must have its
// epoch fields set (see NormalizedProgress).
std::string FormatEpochBar(absl::string_view name, int64_t round,
                           const TrainProgress& progress,
                           absl::Duration elapsed, int width);

// `progress` with the epoch fields of a trainer that reports only batches
// filled in as one epoch covering the round.
TrainProgress NormalizedProgress(const TrainProgress& progress);

// The one status line on the terminal that the agents of a process share with
// their log lines. With one agent it draws the agent's bar per local epoch,
// each finished by a newline when its epoch ends, so that the epochs stay on
// screen; with several agents (each on its own thread) one bar line each is
// impossible to redraw with '\r', so it draws one combined transient line,
//   round 3: host-p0 e1/5 52% | host-p1 e1/5 47% | 1624 samples/s  ETA 5s
// which it erases once no agent trains (the per-round log lines are the
// record).
// Either way it redraws at most once per `redraw_interval`, and log lines
// written through Log() erase the status line, print, and redraw it, so the
// two never share a line. In kPlain and kNone modes it draws nothing and Log()
// only logs.
//
// Thread-safe. Output is written with the lock held: serialising it is the
// point; `write` and `log` must not call back into the console.
class ProgressConsole {
 public:
  struct Options {
    ProgressMode mode = ProgressMode::kPlain;  // kAuto is taken as kPlain
    int agents = 1;  // slots; more than 1: the combined line
    // Raw terminal output (default: write(2) to stderr, the log stream).
    std::function<void(absl::string_view)> write;
    // Writes one log line (default: LogLine, to stderr with a timestamp).
    std::function<void(const std::string&)> log;
    std::function<absl::Time()> now;  // default: absl::Now
    std::function<int()> width;       // default: TerminalWidth(stderr)
    absl::Duration redraw_interval = absl::Milliseconds(100);
  };

  explicit ProgressConsole(Options options);

  ProgressConsole(const ProgressConsole&) = delete;
  ProgressConsole& operator=(const ProgressConsole&) = delete;

  // Whether bars are drawn, and whether the per-round result line is logged.
  bool bars() const { return options_.mode == ProgressMode::kBar; }
  bool round_lines() const { return options_.mode != ProgressMode::kNone; }

  // An agent's training, by its slot in [0, agents): a round starts, a batch
  // is done, the round's training is over (successful or not). Update between
  // StartRound and EndRound only.
  void StartRound(int slot, absl::string_view name, int64_t round);
  void Update(int slot, const TrainProgress& progress);
  void EndRound(int slot);

  // Logs `line` without breaking the status line.
  void Log(const std::string& line);

 private:
  struct Slot {
    std::string name;
    int64_t round = 0;
    bool training = false;
    bool seen = false;  // an Update since StartRound
    TrainProgress progress;
    absl::Time round_start;
    absl::Time epoch_start;  // when the epoch in `progress` started
  };

  // Draws the status line from the slots now (single-agent: slot 0's bar).
  void DrawLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases the status line if one is shown.
  void EraseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string CombinedLineLocked(absl::Time now, int width) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  bool line_shown_ ABSL_GUARDED_BY(mu_) = false;  // the cursor is after it
  absl::Time last_draw_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// Logs a printf-style line through `console`, or with LogLine when it is null.
template <typename... Args>
void ConsoleLogf(ProgressConsole* console,
                 const absl::FormatSpec<Args...>& format, const Args&... args) {
  const std::string line = absl::StrFormat(format, args...);
  if (console != nullptr) {
    console->Log(line);
  } else {
    LogLine(line);
  }
}

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_PROGRESS_H_
