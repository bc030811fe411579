#ifndef FEDLEARN_BENCH_SWARM_REPORT_H_
#define FEDLEARN_BENCH_SWARM_REPORT_H_

// What bench/swarm measures of the coordinator and prints, apart from the
// simulated clients that load it (bench/swarm.cc): the idle window, the
// rounds' table, the resources by round and the final status.

#include <grpcpp/support/status.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/process_stats.h"

namespace fedlearn {

// What happened in one round, as the clients saw it.
struct RoundSeen {
  absl::Time first_task = absl::InfiniteFuture();   // first TRAIN header
  absl::Time last_download = absl::InfinitePast();  // last weights in hand
  absl::Time last_push_sent = absl::InfinitePast();
  int downloads = 0;
  int accepted = 0;
  int rejected = 0;
};

// Statuses counted by call and code, with the first message seen for each.
struct Tally {
  std::map<std::string, int64_t> counts;
  std::map<std::string, std::string> examples;
  // Returns whether this call and code are new.
  bool Add(absl::string_view call, const grpc::Status& s) {
    const std::string key =
        absl::StrCat(call, " code ", static_cast<int>(s.error_code()));
    const bool first = ++counts[key] == 1;
    if (first) examples[key] = s.error_message();
    return first;
  }
  int64_t Total() const {
    int64_t total = 0;
    for (const auto& [key, count] : counts) total += count;
    return total;
  }
  // One line per call and code, each led by `what`.
  void Print(absl::string_view what) const;
};

// What the idle window measured of the coordinator (zeros without its pid).
struct IdleFigures {
  int64_t rss_before_kb = 0;
  int64_t rss_kb = 0;
  double cpu = 0;                       // cores
  std::vector<ResourceSample> samples;  // every 10 s after the first renewals
  // The coordinator's RSS per idle client.
  double KbPerClient(int n) const {
    return static_cast<double>(rss_kb - rss_before_kb) / n;
  }
};

// Holds the joined clients idle (polling, and heartbeating unless
// --heartbeat=false; nothing else) for `window` and measures the coordinator
// `pid` meanwhile (zeros without it); prints what it saw. `renewal`: by then
// every client has renewed its poll once, and the coordinator's resources are
// sampled every 10 s from then on.
IdleFigures Idle(int n, int pid, int64_t rss_before_kb, absl::Duration window,
                 absl::Duration renewal);

// The medians of the rounds' table.
struct RoundMedians {
  double fanout = 0, close_to_next = 0, round = 0;
};

// One line per round seen; a round's own time ends when the next one's first
// task goes out, so the last round has none.
RoundMedians PrintRounds(const std::map<int64_t, RoundSeen>& rounds);

// The coordinator's resources by round (--sample_rounds), and their slopes
// from round 50 on.
void PrintRoundSamples(const std::vector<ResourceSample>& samples);

// The phase, round and records of the coordinator at `coordinator`, counted
// by outcome; 1 if GetStatus failed.
int PrintStatus(const std::string& coordinator);

}  // namespace fedlearn

#endif  // FEDLEARN_BENCH_SWARM_REPORT_H_
