#ifndef FEDLEARN_SERVER_TASK_BOARD_H_
#define FEDLEARN_SERVER_TASK_BOARD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/task.h"

namespace fedlearn {

// Who should do what, and the long polls waiting to be told: the board holds a
// task posted for particular clients (TRAIN for the selected of a round,
// EVALUATE), and a default task for every other client (WAIT, an async run's
// TRAIN of the latest model, DONE). A poll is answered at once with a task
// other than WAIT; otherwise it is held until a task is posted for its client,
// the default changes, it expires (then it gets WAIT) or it is cancelled.
// A posted task stays until retracted (its client answered, or the round
// closed), so a client that polls again, after a dropped download for
// instance, gets it again.
//
// Every call returns the Deliveries it decided on instead of calling anyone:
// the run controller runs them after releasing its lock. Memory: one entry per
// held poll and per posted task, each a few pointers (the weights are shared
// snapshots). Expiry is kept ordered, so the next deadline is O(log n) to find
// whatever the number of held polls. Not thread-safe: the controller
// serialises.
class TaskBoard {
 public:
  // A poll's answer, to be given outside the lock.
  struct Delivery {
    uint64_t poll_id = 0;
    std::string client_id;
    PollCallback done;
    absl::StatusOr<Task> task;
    // Runs `done` with the task.
    void Run() { done(std::move(task)); }
  };
  using Deliveries = std::vector<Delivery>;

  TaskBoard();

  // The task a poll by `client_id` gets now.
  const Task& TaskFor(const std::string& client_id) const;

  // Sets the default task and answers the held polls of clients without a
  // posted task, unless it is WAIT.
  Deliveries SetDefault(Task task);
  const Task& default_task() const { return default_; }

  // Posts `task` for `client_id` (replacing any) and answers its held polls.
  Deliveries Post(const std::string& client_id, Task task);
  // Takes back `client_id`'s posted task, or every posted task.
  void Retract(const std::string& client_id);
  void RetractAll();
  bool HasPosted(const std::string& client_id) const;

  // A poll by `client_id` until `expiry`: answered now (the delivery) when its
  // task is not WAIT, else held under the returned id.
  // A client holds at most kMaxHeldPerClient polls: a further one is held
  // and its oldest answered now with its task (WAIT), `displaced`. One is all
  // an agent holds; a second is one it gave up on that the coordinator has not
  // seen end yet. So a client opening polls in a loop costs the board and gRPC
  // (each held call's arena, about 14 KiB) two polls, not one per call.
  static constexpr size_t kMaxHeldPerClient = 2;
  struct PollResult {
    uint64_t poll_id = 0;
    std::optional<Delivery> now;
    std::optional<Delivery> displaced;
  };
  PollResult Poll(const std::string& client_id, absl::Time expiry,
                  PollCallback done);

  // Ends a held poll with CANCELLED (nothing when it is no longer held).
  std::optional<Delivery> Cancel(uint64_t poll_id);
  // Answers the held polls of `client_id` with `status`.
  Deliveries CloseClient(const std::string& client_id,
                         const absl::Status& status);
  // Answers the polls whose expiry is at or before `now` with their task
  // (WAIT).
  Deliveries Expire(absl::Time now);
  // Answers every held poll with `status` (UNAVAILABLE at shutdown), its
  // message prefixed with the poll's client.
  Deliveries CloseAll(const absl::Status& status);

  // The earliest expiry of a held poll (InfiniteFuture when none).
  absl::Time NextExpiry() const;
  size_t held() const { return held_.size(); }

 private:
  struct Held {
    std::string client_id;
    absl::Time expiry;
    PollCallback done;
  };
  // Removes held poll `it` and makes its delivery.
  Delivery Take(std::map<uint64_t, Held>::iterator it,
                absl::StatusOr<Task> task);
  // Answers the held polls of `client_id` with its task unless that is WAIT.
  void Answer(const std::string& client_id, Deliveries* out);

  Task default_;
  absl::flat_hash_map<std::string, Task> posted_;
  std::map<uint64_t, Held> held_;
  std::set<std::pair<absl::Time, uint64_t>> by_expiry_;
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> by_client_;
  uint64_t next_poll_id_ = 1;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_TASK_BOARD_H_
