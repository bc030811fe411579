#ifndef FEDLEARN_SERVER_HISTORY_H_
#define FEDLEARN_SERVER_HISTORY_H_

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
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
// handles it needs under the controller's lock (a pointer per record) and
// parses the records after releasing it, so neither holds the lock for a
// time that grows with the run.
// Memory: a record is kept serialized, its summary then its client ids, packed
// into 64 KiB blocks that live while a handle names them. It costs its wire
// size and 32 bytes of index: about 260 bytes for a round of 10 clients, and
// about 12 bytes more per client id (a client is listed as selected, and again
// if accepted: about 25 KB for a round of 1,000), so 10,000 async versions
// are a few MB. The client ids are kept for the newest records only, as many
// as `id_bytes` (16 MiB by default) hold, up to twice that between two
// trimmings: older records keep their summary, so a run's memory grows by
// about 260 bytes a record however many clients its rounds had (at
// --fraction=1 and 10,000 clients a record's ids are about 200 KB). A status
// never shows more than 512 KiB of records, and the state directory's history
// file holds every record whole (each is written at the save after its round,
// long before its ids are trimmed). Kept as parsed messages, a record was
// about 1.5 KB in a score of small allocations that, made on gRPC's threads
// among a round's short-lived buffers, kept malloc from giving the space around
// them back (README, "Many clients": a long run's RSS grew 6.6 KB a round). Not
// thread-safe: the run controller serialises.
//
// At most `max_records` records are kept (--history_in_memory, 100,000 by
// default: 14 MB of async versions' records, bench/state_bench): older ones are
// let go of, oldest first, and counted (total()). Only those before the mark
// AllowEvictionBefore sets: a coordinator with a state directory moves it as
// its saves write records to the history file, which keeps every record, so
// none is let go of unsaved.
class History {
 public:
  static constexpr size_t kDefaultIdBytes = size_t{16} << 20;
  static constexpr size_t kDefaultMaxRecords = 100'000;
  explicit History(size_t id_bytes = kDefaultIdBytes,
                   size_t max_records = kDefaultMaxRecords)
      : id_budget_(id_bytes), max_records_(max_records) {}

  // A new attempt opens: its rejection counts start at zero.
  void OpenAttempt() { attempt_rejected_.Clear(); }
  // Counts a rejected push, in the run's counters and the open attempt's.
  void Reject(Rejection reason);
  const v1::RejectionCounts& attempt_rejections() const {
    return attempt_rejected_;
  }

  // A record as kept: immutable, shared by every status and save that takes
  // it; it keeps its block alive.
  class Record {
   public:
    // The record as appended; without its selected_clients and
    // accepted_clients unless `client_ids`.
    void CopyTo(v1::RoundRecord* out, bool client_ids) const;
    // The bytes CopyTo parses: the record's wire size, with its client ids or
    // without.
    size_t WireSize(bool client_ids) const {
      return client_ids ? size_ : summary_size_;
    }
    // The record's wire form, client ids included: a RoundRecord's, for
    // writing it out without parsing it.
    absl::string_view wire() const { return {data_, size_}; }

   private:
    friend class History;
    std::shared_ptr<const char[]> block_;
    // The record's wire form: the summary's `summary_size` bytes, then the
    // ids' (a message's wire form followed by another's parses as the two
    // merged).
    const char* data_ = nullptr;
    uint32_t size_ = 0;
    uint32_t summary_size_ = 0;
  };
  void Append(v1::RoundRecord record);
  // The latest `n` records kept (all of them when there are fewer), oldest
  // first.
  std::vector<Record> Latest(size_t n) const;
  // The records from the run's `first` on (counted from the run's first
  // record, 0), oldest first; those let go of are not among them.
  std::vector<Record> From(size_t first) const;
  // Every record the run made, kept or let go of.
  size_t total() const { return dropped_ + records_.size(); }
  // The records kept.
  size_t kept() const { return records_.size(); }
  // Records before the run's `first` may be let go of (all of them by
  // default); those from it on are kept, over max_records if need be.
  void AllowEvictionBefore(size_t first);
  // The mark AllowEvictionBefore set last (the largest size_t: none).
  size_t evictable_before() const { return evictable_before_; }
  // The bytes of client ids the records hold now.
  size_t id_bytes() const { return id_bytes_; }

  RunCounters& counters() { return counters_; }
  const RunCounters& counters() const { return counters_; }

  void AddBytesSent(int64_t bytes) { bytes_sent_ += bytes; }
  void AddBytesReceived(int64_t bytes) { bytes_received_ += bytes; }
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

  // A resumed run's records and byte totals (counters restart at zero: they
  // are this process's). Kept whatever their number until
  // AllowEvictionBefore says otherwise.
  void Restore(std::vector<v1::RoundRecord> records, int64_t bytes_sent,
               int64_t bytes_received);

 private:
  // Room for `size` bytes of a record, in the open block or a new one, which
  // `record` then holds.
  char* Reserve(size_t size, Record* record);
  // Drops the ids of the oldest records that have them until id_bytes_ is
  // id_budget_ at most. Amortised O(1) an Append: it runs when the ids reach
  // twice the budget, and then trims half of them.
  void TrimIds();
  // Lets go of the oldest records over max_records_, those before
  // evictable_before_ only.
  void Evict();

  std::deque<Record> records_;
  const size_t id_budget_;
  const size_t max_records_;
  size_t dropped_ = 0;  // records let go of: records_[0] is the run's dropped_
  size_t evictable_before_ = std::numeric_limits<size_t>::max();
  size_t id_bytes_ = 0;  // of records_[ids_from_] on
  size_t ids_from_ = 0;  // the records before it hold no ids
  // The block records are appended to, and how much of it is taken.
  std::shared_ptr<char[]> block_;
  size_t block_used_ = 0;
  RunCounters counters_;
  v1::RejectionCounts attempt_rejected_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_HISTORY_H_
