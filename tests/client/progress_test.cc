#include "client/progress.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Batch `batch` (1-based) of `batches` in epoch `epoch` of `epochs`, 10
// examples a batch.
TrainProgress At(int epoch, int epochs, int64_t batch, int64_t batches,
                 double loss = 0.214, double accuracy = 0.931) {
  TrainProgress p;
  p.epoch = epoch;
  p.epochs = epochs;
  p.epoch_batches = batches;
  p.epoch_batches_done = batch;
  p.total = batches * epochs;
  p.done = (epoch - 1) * batches + batch;
  p.epoch_examples_done = batch * 10;
  p.loss = loss;
  p.accuracy = accuracy;
  return p;
}

TEST(ProgressFnTest, BothFormsWorkOnBothSides) {
  // A caller that wants only batches, from a trainer that tells everything.
  int64_t done = 0, total = 0;
  ProgressFn batches = [&done, &total](int64_t d, int64_t t) {
    done = d;
    total = t;
  };
  batches(At(2, 3, 4, 10));
  EXPECT_EQ(done, 14);
  EXPECT_EQ(total, 30);
  // A caller that wants everything, from a trainer that tells only batches.
  TrainProgress seen;
  ProgressFn all = [&seen](const TrainProgress& p) { seen = p; };
  all(3, 7);
  EXPECT_EQ(seen.done, 3);
  EXPECT_EQ(seen.total, 7);
  EXPECT_FALSE(seen.has_epochs());
  EXPECT_EQ(NormalizedProgress(seen).epoch_batches, 7);
  // No callback: calls do nothing.
  ProgressFn none = nullptr;
  EXPECT_FALSE(none);
  none(1, 2);
  EXPECT_TRUE(all);
}

TEST(ProgressModeTest, ParsesEveryModeAndRejectsOthers) {
  EXPECT_EQ(*ParseProgressMode("auto"), ProgressMode::kAuto);
  EXPECT_EQ(*ParseProgressMode("bar"), ProgressMode::kBar);
  EXPECT_EQ(*ParseProgressMode("plain"), ProgressMode::kPlain);
  EXPECT_EQ(*ParseProgressMode("none"), ProgressMode::kNone);
  EXPECT_EQ(ParseProgressMode("fancy").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProgressModeTest, AutoIsPlainWhenNotATerminal) {
  // A pipe is never a terminal.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  EXPECT_EQ(ResolveProgressMode(ProgressMode::kAuto, fds[1]),
            ProgressMode::kPlain);
  EXPECT_EQ(ResolveProgressMode(ProgressMode::kBar, fds[1]),
            ProgressMode::kBar);
  EXPECT_EQ(TerminalWidth(fds[1]), 80);
  close(fds[0]);
  close(fds[1]);
}

TEST(FormatEtaTest, RoundsUpToTheSecond) {
  EXPECT_EQ(FormatEta(absl::Milliseconds(3200)), "4s");
  EXPECT_EQ(FormatEta(absl::Seconds(65)), "1m05s");
  EXPECT_EQ(FormatEta(absl::Seconds(7380)), "2h03m");
}

TEST(FormatEpochBarTest, FillsPercentRateAndEta) {
  // 52 of 100 batches (520 examples) in 0.64 s: 812.5 samples/s; 48 batches
  // left at 12.3 ms each: 0.59 s, shown as 1s.
  const std::string line = FormatEpochBar("agent-0", 3, At(1, 5, 52, 100),
                                          absl::Milliseconds(640), 200);
  EXPECT_EQ(line,
            "agent-0 round 3 epoch 1/5 [###############...............]  52%  "
            "loss 0.2140  acc 93.1%  812 samples/s  ETA 1s");
}

TEST(FormatEpochBarTest, BarAdaptsToTheWidthAndNeverFillsIt) {
  const TrainProgress p = At(1, 5, 52, 100);
  // 96 columns: everything fits with a bar of 11, 5 of it filled at 52%.
  EXPECT_EQ(FormatEpochBar("agent-0", 3, p, absl::Seconds(4), 96),
            "agent-0 round 3 epoch 1/5 [#####......]  52%  loss 0.2140  acc "
            "93.1%  130 samples/s  ETA 4s");
  // 80: the rate goes first.
  EXPECT_EQ(FormatEpochBar("agent-0", 3, p, absl::Seconds(4), 80),
            "agent-0 round 3 epoch 1/5 [#####......]  52%  loss 0.2140  acc "
            "93.1%  ETA 4s");
  // 60: then loss and accuracy, and the bar takes the room.
  EXPECT_EQ(FormatEpochBar("agent-0", 3, p, absl::Seconds(4), 60),
            "agent-0 round 3 epoch 1/5 [#######........]  52%  ETA 4s");
  // Too narrow for anything: cut, never wrapped.
  EXPECT_EQ(FormatEpochBar("agent-0", 3, p, absl::Seconds(4), 50).size(), 49u);
  // Wide: the bar stops growing at 30.
  EXPECT_EQ(FormatEpochBar("agent-0", 3, p, absl::Seconds(4), 300),
            "agent-0 round 3 epoch 1/5 [###############...............]  52%  "
            "loss 0.2140  acc 93.1%  130 samples/s  ETA 4s");
}

TEST(FormatEpochBarTest, FinishedEpochShowsItsDuration) {
  EXPECT_EQ(
      FormatEpochBar("a", 1, At(2, 2, 10, 10), absl::Milliseconds(2500), 100),
      "a round 1 epoch 2/2 [#####################] 100%  loss 0.2140  "
      "acc 93.1%  40 samples/s  2.5s");
}

TEST(FormatEpochBarTest, TrainerReportingOnlyBatchesGetsOneEpoch) {
  TrainProgress p;
  p.done = 3;
  p.total = 12;
  const std::string line =
      FormatEpochBar("a", 7, NormalizedProgress(p), absl::Seconds(3), 60);
  EXPECT_EQ(line, "a round 7 epoch 1/1 [#####................]  25%  ETA 9s");
}

// A console writing to strings, with a clock the test moves.
class ConsoleTest : public ::testing::Test {
 protected:
  ProgressConsole::Options Options(ProgressMode mode, int agents) {
    ProgressConsole::Options options;
    options.mode = mode;
    options.agents = agents;
    options.write = [this](absl::string_view text) {
      absl::StrAppend(&out_, text);
    };
    options.log = [this](const std::string& line) {
      absl::StrAppend(&out_, "LOG ", line, "\n");
      logs_.push_back(line);
    };
    options.now = [this] { return now_; };
    options.width = [] { return 120; };
    return options;
  }

  // The draws in out_: each starts with '\r' and ends with an erase to the
  // end of the line.
  int Draws() const {
    int n = 0;
    for (size_t at = out_.find("\033[K"); at != std::string::npos;
         at = out_.find("\033[K", at + 1)) {
      ++n;
    }
    return n;
  }

  std::string out_;
  std::vector<std::string> logs_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(ConsoleTest, PlainModeWritesNothingPerBatch) {
  for (ProgressMode mode :
       {ProgressMode::kPlain, ProgressMode::kNone, ProgressMode::kAuto}) {
    out_.clear();
    ProgressConsole console(Options(mode, 1));
    EXPECT_FALSE(console.bars());
    console.StartRound(0, "a", 1);
    for (int b = 1; b <= 10; ++b) {
      now_ += absl::Seconds(1);
      console.Update(0, At(1, 1, b, 10));
    }
    console.EndRound(0);
    EXPECT_THAT(out_, IsEmpty());
    console.Log("a: round 1: loss 0.2");
    EXPECT_EQ(out_, "LOG a: round 1: loss 0.2\n");
  }
  EXPECT_TRUE(ProgressConsole(Options(ProgressMode::kPlain, 1)).round_lines());
  EXPECT_FALSE(ProgressConsole(Options(ProgressMode::kNone, 1)).round_lines());
}

TEST_F(ConsoleTest, RedrawsAtMostTenTimesASecond) {
  ProgressConsole console(Options(ProgressMode::kBar, 1));
  console.StartRound(0, "a", 1);
  // 100 batches 10 ms apart: the first draws, then one every 100 ms.
  for (int b = 1; b < 100; ++b) {
    now_ += absl::Milliseconds(10);
    console.Update(0, At(1, 1, b, 100));
  }
  EXPECT_EQ(Draws(), 10);
  EXPECT_EQ(out_.find('\n'), std::string::npos);
  // The epoch's last batch is always drawn, and ends the line.
  now_ += absl::Milliseconds(10);
  console.Update(0, At(1, 1, 100, 100));
  EXPECT_EQ(Draws(), 11);
  EXPECT_EQ(out_.back(), '\n');
  EXPECT_THAT(out_,
              HasSubstr("100%  loss 0.2140  acc 93.1%  1000 samples/s  1.0s"));
}

TEST_F(ConsoleTest, OneLinePerEpochEachTimedFromItsStart) {
  ProgressConsole console(Options(ProgressMode::kBar, 1));
  console.StartRound(0, "a", 4);
  for (int epoch = 1; epoch <= 2; ++epoch) {
    for (int b = 1; b <= 4; ++b) {
      now_ += absl::Milliseconds(500);
      console.Update(0, At(epoch, 2, b, 4));
    }
  }
  console.EndRound(0);
  // Batches are 500 ms apart, so each is drawn; each epoch's rate and ETA
  // count from its own start, and each ends its line.
  std::string expected;
  for (int epoch = 1; epoch <= 2; ++epoch) {
    const std::string head = absl::StrCat("\ra round 4 epoch ", epoch, "/2 [");
    const std::string metrics = "loss 0.2140  acc 93.1%  20 samples/s  ";
    absl::StrAppend(&expected, head, "#######.......................]  25%  ",
                    metrics, "ETA 2s\033[K");
    absl::StrAppend(&expected, head, "###############...............]  50%  ",
                    metrics, "ETA 1s\033[K");
    absl::StrAppend(&expected, head, "######################........]  75%  ",
                    metrics, "ETA 1s\033[K");
    absl::StrAppend(&expected, head, "##############################] 100%  ",
                    metrics, "2.0s\033[K\n");
  }
  EXPECT_EQ(out_, expected);
}

TEST_F(ConsoleTest, LogLinesEraseAndRedrawTheBar) {
  ProgressConsole console(Options(ProgressMode::kBar, 1));
  console.StartRound(0, "a", 1);
  now_ += absl::Seconds(1);
  console.Update(0, At(1, 1, 1, 4));
  const std::string bar = out_;
  out_.clear();
  console.Log("a: heartbeat failed");
  EXPECT_EQ(out_, absl::StrCat("\r\033[KLOG a: heartbeat failed\n", bar));
  // A round cut short ends its line; later logs are left alone.
  console.EndRound(0);
  out_.clear();
  console.Log("a: round 1: training: failed");
  EXPECT_EQ(out_, "LOG a: round 1: training: failed\n");
}

TEST_F(ConsoleTest, SeveralAgentsShareOneCombinedLine) {
  ProgressConsole console(Options(ProgressMode::kBar, 2));
  console.StartRound(0, "h-p0", 3);
  console.StartRound(1, "h-p1", 3);
  now_ += absl::Seconds(1);
  console.Update(0, At(1, 1, 5, 10));  // first draw: only p0 has started
  console.Update(1, At(1, 1, 4, 10));  // throttled
  EXPECT_EQ(Draws(), 1);
  now_ += absl::Milliseconds(100);
  console.Update(1, At(1, 1, 5, 10));
  EXPECT_EQ(Draws(), 2);
  // Each has done 50 examples in 1.1 s (45 samples/s); the slower ETA, 1.1s,
  // shows as 2s.
  EXPECT_THAT(out_, ::testing::EndsWith(
                        "\rround 3: h-p0 50% | h-p1 50% | 91 samples/s  ETA "
                        "2s\033[K"));
  EXPECT_EQ(out_.find('\n'), std::string::npos);
  console.EndRound(0);
  EXPECT_THAT(out_, ::testing::EndsWith("\rround 3: h-p1 50% | 45 samples/s  "
                                        "ETA 2s\033[K"));
  console.EndRound(1);
  // Nobody trains: the line is erased, not left behind.
  EXPECT_THAT(out_, ::testing::EndsWith("\r\033[K"));
  out_.clear();
  console.Log("h-p0: round 3: loss 0.2");
  EXPECT_EQ(out_, "LOG h-p0: round 3: loss 0.2\n");
}

}  // namespace
}  // namespace fedlearn
