#ifndef FEDLEARN_SERVER_HISTORY_H_
#define FEDLEARN_SERVER_HISTORY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "fedlearn/v1/coordinator.pb.h"
#include "server/metrics.h"

namespace fedlearn {

// Why a push was turned away, for the round's history and /metrics.
enum class Rejection {
  kStaleRound,
  kDuplicate,
  kNotSelected,
  kInvalid,
  kTooLarge,
  kIncomplete,
  kTooSlow
};

// The run's record (Flower's History): one RoundRecord per closed or abandoned
// training round (async mode: per model version) and evaluation attempt, the
// run's counters and byte totals, and the rejections of the attempt now open.
// Records are immutable once appended and shared: a status or a save takes the
// pointers it needs under the controller's lock (a pointer per record) and
// copies the records after releasing it, so neither holds the lock for a
// time that grows with the run.
// Memory: a RoundRecord per attempt, a few hundred bytes plus its client ids
// (about 25 bytes each: 25 KB for a round of 1,000 clients), kept apart from
// the rest so that a status that does not ask for them copies none; 10,000
// async versions are a few MB. Not thread-safe: the run controller
// serialises.
class History {
 public:
  // A new attempt opens: its rejection counts start at zero.
  void OpenAttempt() { attempt_rejected_.Clear(); }
  // Counts a rejected push, in the run's counters and the open attempt's.
  void Reject(Rejection reason);
  const v1::RejectionCounts& attempt_rejections() const {
    return attempt_rejected_;
  }

  // A record as kept: immutable, shared by every status and save that takes
  // it.
  class Record {
   public:
    // The record as appended; without its selected_clients and
    // accepted_clients unless `client_ids`.
    void CopyTo(v1::RoundRecord* out, bool client_ids) const;

   private:
    friend class History;
    std::shared_ptr<const v1::RoundRecord> summary_;  // without the ids
    std::shared_ptr<const v1::RoundRecord> ids_;      // only the ids
  };
  void Append(v1::RoundRecord record);
  // The latest `n` records (all of them when there are fewer), oldest first.
  std::vector<Record> Latest(size_t n) const;
  size_t size() const { return records_.size(); }

  RunCounters& counters() { return counters_; }
  const RunCounters& counters() const { return counters_; }

  void AddBytesSent(int64_t bytes) { bytes_sent_ += bytes; }
  void AddBytesReceived(int64_t bytes) { bytes_received_ += bytes; }
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

  // A resumed run's records and byte totals (counters restart at zero: they
  // are this process's).
  void Restore(std::vector<v1::RoundRecord> records, int64_t bytes_sent,
               int64_t bytes_received);

 private:
  std::vector<Record> records_;
  RunCounters counters_;
  v1::RejectionCounts attempt_rejected_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_HISTORY_H_
