#ifndef FEDLEARN_SERVER_STRATEGY_UPDATE_STORE_H_
#define FEDLEARN_SERVER_STRATEGY_UPDATE_STORE_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace fedlearn {

// Where an aggregator that keeps every update of a step may keep them: bytes
// in memory, then files in spill_dir (empty: never spill).
struct AggregationBudget {
  size_t memory_bytes = size_t{512} << 20;
  std::string spill_dir;
};

// The updates of one aggregation step, for an aggregator that needs all of
// them at once (median, trimmed mean, Krum), held to a memory budget.
//
// An update is staged first, on the pushing thread and outside the run
// controller's lock: copied into memory while the budget allows, else written
// to a spill file in the spill directory. A spill file has no name (O_TMPFILE,
// or created and unlinked at once): it vanishes when the store lets it go, and
// a crash leaves nothing behind. Keep then adopts the staged update, under the
// lock; a staged update dropped instead (a rejected push) gives its memory or
// its file back at once, so a rejection changes nothing.
//
// Memory: at most `memory_budget` bytes of updates (4 bytes per parameter
// each) plus what the reader of stripes holds (rows x stripe floats). Disk: 4
// bytes per parameter per spilled update, freed by Clear.
class UpdateStore {
 public:
  struct Options {
    size_t num_parameters = 0;
    size_t memory_budget = 0;  // bytes of updates kept in memory
    std::string spill_dir;     // empty: never spill
  };

  // One staged update: owns its memory (and its share of the budget) or its
  // spill file until the store keeps it. Move-only.
  class Staged {
   public:
    Staged() = default;
    Staged(Staged&& other) noexcept;
    Staged& operator=(Staged&& other) noexcept;
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;
    ~Staged();

    bool empty() const { return memory_ == nullptr && fd_ < 0; }
    bool spilled() const { return fd_ >= 0; }

   private:
    friend class UpdateStore;
    void Release();

    std::atomic<size_t>* reserved_ = nullptr;  // the store's budget in use
    size_t bytes_ = 0;
    std::unique_ptr<float[]> memory_;
    int fd_ = -1;
  };

  // Names of spill files in the instant before they are unlinked, where
  // O_TMPFILE is missing.
  static constexpr char kSpillPrefix[] = "fedlearn-spill-";

  explicit UpdateStore(Options options);
  ~UpdateStore();
  UpdateStore(const UpdateStore&) = delete;
  UpdateStore& operator=(const UpdateStore&) = delete;

  const Options& options() const { return options_; }
  size_t bytes_per_update() const { return options_.num_parameters * 4; }

  // Copies `update` (num_parameters values) into memory or a spill file.
  // Thread-safe: runs concurrently with itself and with every call below, and
  // touches nothing they read. RESOURCE_EXHAUSTED when the budget is spent and
  // there is no spill directory; the errno's message (naming the directory)
  // when a spill file cannot be made or written (a full disk).
  absl::StatusOr<Staged> Stage(absl::Span<const float> update);

  // The calls below are not thread-safe: the caller serialises them.

  // Adopts `staged` (from this store's Stage) as update count(), with
  // `scale` > 0 multiplying it wherever it is read.
  void Keep(Staged staged, double scale);

  int count() const { return static_cast<int>(entries_.size()); }
  int spilled() const;

  // Coordinates [begin, begin + length) of every kept update, each multiplied
  // by its scale: row i of `out` (count() rows of `length` floats, row-major)
  // is update i's. DATA_LOSS when a spill file cannot be read back.
  absl::Status ReadStripe(size_t begin, size_t length,
                          absl::Span<float> out) const;

  // Frees every kept update: its memory, or its spill file.
  void Clear() { entries_.clear(); }

  // Bytes of updates in memory now, staged or kept.
  size_t memory_in_use() const { return reserved_.load(); }

 private:
  struct Entry {
    Staged staged;
    double scale = 1;
  };

  Options options_;
  std::atomic<size_t> reserved_{0};
  std::vector<Entry> entries_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_UPDATE_STORE_H_
