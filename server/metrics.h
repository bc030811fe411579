#ifndef FEDLEARN_SERVER_METRICS_H_
#define FEDLEARN_SERVER_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fedlearn/v1/coordinator.pb.h"

namespace fedlearn {

// A Prometheus-style histogram: observations counted into fixed buckets by
// upper bound. Not thread-safe; the round manager guards its instances with
// its own mutex, so that a scrape sees counters and histograms of one moment.
class Histogram {
 public:
  // `upper_bounds` ascending; an implicit +Inf bucket follows the last.
  explicit Histogram(std::vector<double> upper_bounds);

  void Observe(double value);

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // Per bucket (not cumulative), upper_bounds().size() + 1 entries.
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

// Counters of a whole run, kept by the round manager next to its history.
struct RunCounters {
  int64_t rounds_completed = 0;       // training rounds closed at quorum or all
  int64_t rounds_abandoned = 0;       // training attempts below quorum
  int64_t evaluations_abandoned = 0;  // evaluation attempts below quorum
  int64_t updates_accepted = 0;
  v1::RejectionCounts updates_rejected;  // by reason
  int64_t evaluations_accepted = 0;
  // Seconds from a round's start to its close (training rounds, abandoned
  // included), and to fold one accepted update into the aggregate.
  Histogram round_duration{{1, 2, 5, 10, 20, 30, 60, 120, 300, 600}};
  Histogram aggregation_latency{
      {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}};
};

// What the coordinator's transfers hold at a moment and what it has cut off
// since it started (CoordinatorService::transfers()): what slow and stalled
// clients cost it (README, "Slow clients").
struct TransferStats {
  // Weights being written to clients (TRAIN and EVALUATE tasks), and the
  // distinct model versions they hold: each is a snapshot of the model's
  // size, which outlives the version's turn as the global model while a
  // download of it runs.
  int64_t downloads = 0;
  int64_t download_versions = 0;
  int64_t download_version_bytes = 0;
  // Downloads cut off: stalled for --stall_timeout, or ended because the run
  // moved past their task (a closed round, or too stale to count).
  int64_t downloads_stalled = 0;
  int64_t downloads_moved_on = 0;
  // Receive buffers (--max_concurrent_updates): held by uploads, and uploads
  // waiting for one.
  int64_t receive_buffers = 0;
  int64_t receive_buffers_in_use = 0;
  int64_t uploads_waiting = 0;
};

// /metrics: the Prometheus text exposition format (version 0.0.4) of one
// consistent snapshot, `status` and `counters` taken under the same lock, and
// of `transfers`, taken just after under the service's own.
std::string RenderPrometheus(const v1::GetStatusResponse& status,
                             const RunCounters& counters,
                             const TransferStats& transfers);

// /api/history.csv: one row per closed or abandoned round and evaluation
// attempt, with a header row. RFC 4180 (CRLF line ends).
std::string RenderHistoryCsv(const v1::GetStatusResponse& status);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_METRICS_H_
