#include "client/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace fedlearn {
namespace {

constexpr int kDefaultWidth = 80;
// Bar widths: as wide as fits, within these bounds.
constexpr int kMinBar = 10;
constexpr int kMaxBar = 30;
// Usual widths of the fields after the bar, with their separators:
// " 52%", "  loss 0.2140  acc 93.1%", "  812 samples/s", "  ETA 1m05s".
constexpr int kPercentWidth = 5;
constexpr int kMetricsWidth = 24;
constexpr int kRateWidth = 16;
constexpr int kTimeWidth = 11;
// Moves to the line's start and erases it.
constexpr absl::string_view kEraseLine = "\r\033[K";

void WriteStderr(absl::string_view text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n =
        ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

int Percent(int64_t done, int64_t total) {
  if (total <= 0) return 0;
  return static_cast<int>(std::clamp<int64_t>(done * 100 / total, 0, 100));
}

// Time left at the pace so far; InfiniteDuration when there is no pace yet.
absl::Duration Remaining(int64_t done, int64_t total, absl::Duration elapsed) {
  if (done <= 0 || elapsed <= absl::ZeroDuration())
    return absl::InfiniteDuration();
  return elapsed * (static_cast<double>(std::max<int64_t>(total - done, 0)) /
                    static_cast<double>(done));
}

std::string EtaField(absl::Duration remaining) {
  if (remaining == absl::InfiniteDuration()) return "ETA --";
  return absl::StrCat("ETA ", FormatEta(remaining));
}

// `text` cut to fit `width` columns less the last one.
std::string Fit(std::string text, int width) {
  const size_t room = static_cast<size_t>(std::max(width - 1, 1));
  if (text.size() > room) text.resize(room);
  return text;
}

}  // namespace

absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "bar") return ProgressMode::kBar;
  if (text == "plain") return ProgressMode::kPlain;
  if (text == "none") return ProgressMode::kNone;
  return absl::InvalidArgumentError(absl::StrCat(
      "progress mode \"", text, "\": expected auto, bar, plain or none"));
}

ProgressMode ResolveProgressMode(ProgressMode mode, int fd) {
  if (mode != ProgressMode::kAuto) return mode;
  const char* term = std::getenv("TERM");
  if (!::isatty(fd) || (term != nullptr && std::strcmp(term, "dumb") == 0))
    return ProgressMode::kPlain;
  return ProgressMode::kBar;
}

int TerminalWidth(int fd) {
  winsize size = {};
  if (::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0)
    return size.ws_col;
  return kDefaultWidth;
}

std::string FormatEta(absl::Duration d) {
  const int64_t s = std::max<int64_t>(
      0, absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1))));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

TrainProgress NormalizedProgress(const TrainProgress& progress) {
  if (progress.has_epochs()) return progress;
  TrainProgress p = progress;
  p.epoch = 1;
  p.epochs = 1;
  p.epoch_batches_done = p.done;
  p.epoch_batches = p.total;
  return p;
}

std::string FormatEpochBar(absl::string_view name, int64_t round,
                           const TrainProgress& p, absl::Duration elapsed,
                           int width) {
  const bool finished = p.epoch_batches_done >= p.epoch_batches;
  const std::string head = absl::StrFormat("%s round %d epoch %d/%d ", name,
                                           round, p.epoch, p.epochs);
  // Which fields fit is decided on their usual widths, not on this draw's,
  // so that the bar keeps its size through an epoch. Dropped first: the rate,
  // then loss and accuracy; the bar shrinks to kMinBar before either goes.
  const bool metrics = p.epoch_examples_done > 0;
  const bool rate = metrics && elapsed > absl::ZeroDuration();
  const int fixed =
      static_cast<int>(head.size()) + 2 + kPercentWidth + kTimeWidth;
  const int usable = width - 1;
  const bool show_metrics =
      metrics && usable >= fixed + kMinBar + kMetricsWidth;
  const bool show_rate = rate && show_metrics &&
                         usable >= fixed + kMinBar + kMetricsWidth + kRateWidth;
  const int bar =
      std::clamp(usable - fixed - (show_metrics ? kMetricsWidth : 0) -
                     (show_rate ? kRateWidth : 0),
                 kMinBar, kMaxBar);
  const int64_t fill =
      p.epoch_batches > 0
          ? std::min<int64_t>(bar, bar * p.epoch_batches_done / p.epoch_batches)
          : 0;
  std::string line = head;
  line += '[';
  line.append(static_cast<size_t>(fill), '#');
  line.append(static_cast<size_t>(bar - fill), '.');
  line += ']';
  absl::StrAppend(&line, absl::StrFormat(" %3d%%", Percent(p.epoch_batches_done,
                                                           p.epoch_batches)));
  if (show_metrics) {
    absl::StrAppend(&line, absl::StrFormat("  loss %.4f  acc %.1f%%", p.loss,
                                           100 * p.accuracy));
  }
  if (show_rate) {
    absl::StrAppend(&line, absl::StrFormat("  %.0f samples/s",
                                           p.epoch_examples_done /
                                               absl::ToDoubleSeconds(elapsed)));
  }
  if (finished) {
    absl::StrAppend(&line,
                    absl::StrFormat("  %.1fs", absl::ToDoubleSeconds(elapsed)));
  } else {
    absl::StrAppend(
        &line, "  ",
        EtaField(Remaining(p.epoch_batches_done, p.epoch_batches, elapsed)));
  }
  return Fit(std::move(line), width);
}

ProgressConsole::ProgressConsole(Options options)
    : options_([&options] {
        if (options.agents < 1) options.agents = 1;
        if (options.mode == ProgressMode::kAuto)
          options.mode = ProgressMode::kPlain;
        if (!options.write) options.write = WriteStderr;
        if (!options.log) options.log = LogLine;
        if (!options.now) options.now = [] { return absl::Now(); };
        if (!options.width)
          options.width = [] { return TerminalWidth(STDERR_FILENO); };
        return std::move(options);
      }()),
      slots_(static_cast<size_t>(options_.agents)) {}

void ProgressConsole::StartRound(int slot, absl::string_view name,
                                 int64_t round) {
  if (!bars() || slot < 0 || slot >= options_.agents) return;
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.name = std::string(name);
  s.round = round;
  s.training = true;
  s.seen = false;
  s.progress = TrainProgress();
  s.round_start = options_.now();
  s.epoch_start = s.round_start;
}

void ProgressConsole::Update(int slot, const TrainProgress& progress) {
  if (!bars() || slot < 0 || slot >= options_.agents) return;
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.training) return;
  const absl::Time now = options_.now();
  const TrainProgress p = NormalizedProgress(progress);
  if (s.seen && p.epoch != s.progress.epoch &&
      s.progress.epoch_batches_done < s.progress.epoch_batches) {
    // The previous epoch ended without its last batch being reported: its
    // line is finished as it stands.
    if (options_.agents == 1 && line_shown_) {
      options_.write("\n");
      line_shown_ = false;
    }
    s.epoch_start = now;
  }
  s.seen = true;
  s.progress = p;
  const bool epoch_done = p.epoch_batches_done >= p.epoch_batches;
  if (options_.agents == 1) {
    if (epoch_done || !line_shown_ ||
        now - last_draw_ >= options_.redraw_interval) {
      DrawLocked();
    }
    if (epoch_done) {
      // Keep the finished epoch on screen; the next one starts a new line.
      options_.write("\n");
      line_shown_ = false;
      s.epoch_start = now;
    }
    return;
  }
  if (epoch_done) s.epoch_start = now;
  if (!line_shown_ || now - last_draw_ >= options_.redraw_interval)
    DrawLocked();
}

void ProgressConsole::EndRound(int slot) {
  if (!bars() || slot < 0 || slot >= options_.agents) return;
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.training) return;
  s.training = false;
  if (options_.agents == 1) {
    // A round cut short mid-epoch: leave its bar as it stands.
    if (line_shown_) options_.write("\n");
    line_shown_ = false;
    return;
  }
  DrawLocked();
}

void ProgressConsole::Log(const std::string& line) {
  if (!bars()) {
    options_.log(line);
    return;
  }
  absl::MutexLock lock(&mu_);
  const bool redraw = line_shown_;
  EraseLocked();
  options_.log(line);
  if (redraw) DrawLocked();
}

void ProgressConsole::EraseLocked() {
  if (!line_shown_) return;
  options_.write(kEraseLine);
  line_shown_ = false;
}

void ProgressConsole::DrawLocked() {
  const absl::Time now = options_.now();
  const int width = std::max(options_.width(), 2);
  std::string line;
  if (options_.agents == 1) {
    const Slot& s = slots_[0];
    if (s.training && s.seen) {
      line = FormatEpochBar(s.name, s.round, s.progress, now - s.epoch_start,
                            width);
    }
  } else {
    line = CombinedLineLocked(now, width);
  }
  if (line.empty()) {
    EraseLocked();
    return;
  }
  // '\r', the line, then erase what a longer previous line left behind.
  options_.write(absl::StrCat("\r", line, "\033[K"));
  line_shown_ = true;
  last_draw_ = now;
}

std::string ProgressConsole::CombinedLineLocked(absl::Time now,
                                                int width) const {
  std::vector<const Slot*> active;
  for (const Slot& s : slots_) {
    if (s.training && s.seen) active.push_back(&s);
  }
  if (active.empty()) return "";
  bool one_round = true;
  for (const Slot* s : active) one_round &= s->round == active[0]->round;
  std::vector<std::string> parts;
  double rate = 0;
  absl::Duration eta = absl::ZeroDuration();
  for (const Slot* s : active) {
    const TrainProgress& p = s->progress;
    std::string part = s->name;
    if (!one_round) absl::StrAppend(&part, " r", s->round);
    if (p.epochs > 1) absl::StrAppend(&part, " e", p.epoch, "/", p.epochs);
    absl::StrAppend(&part, " ", Percent(p.epoch_batches_done, p.epoch_batches),
                    "%");
    parts.push_back(std::move(part));
    const absl::Duration epoch_elapsed = now - s->epoch_start;
    if (p.epoch_examples_done > 0 && epoch_elapsed > absl::ZeroDuration() &&
        p.epoch_batches_done < p.epoch_batches) {
      rate += p.epoch_examples_done / absl::ToDoubleSeconds(epoch_elapsed);
    }
    // The slowest agent's time to the end of its round.
    eta = std::max(eta, Remaining(p.done, p.total, now - s->round_start));
  }
  std::string line;
  if (one_round) absl::StrAppend(&line, "round ", active[0]->round, ": ");
  absl::StrAppend(&line, absl::StrJoin(parts, " | "));
  if (rate > 0)
    absl::StrAppend(&line, " | ", absl::StrFormat("%.0f", rate), " samples/s");
  absl::StrAppend(&line, "  ", EtaField(eta));
  return Fit(std::move(line), width);
}

}  // namespace fedlearn
