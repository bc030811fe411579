#ifndef FEDLEARN_SERVER_SCHEDULER_H_
#define FEDLEARN_SERVER_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "server/history.h"
#include "server/task.h"

namespace fedlearn {

// A push admitted on its header, carried to its commit so that nothing about
// the header is checked twice.
struct Ticket {
  std::string client_id;
  int64_t round = 0;  // the header's round
  // Sync: the aggregation step it was admitted into; async: which of the
  // client's TRAIN tasks it answers. Accept refuses it when that moved on.
  uint64_t step = 0;
  std::shared_ptr<CancelHandle> cancel;
};

// A step opened: tasks to post for particular clients, and the default task
// for every other client.
struct Opening {
  std::vector<std::pair<std::string, Task>> posts;
  Task default_task;
  std::string log;  // what opened, for the log line (empty: nothing to say)
};

// A committed update, accepted: how it enters the aggregate, and whether the
// aggregate is now complete.
struct Acceptance {
  double weight = 1;  // Aggregator::Fold's weight and scale
  double scale = 1;
  absl::string_view outcome;  // non-empty: the step closes now with it
  int64_t round = 0;          // for the reply
  int accepted = 0;           // updates accepted into this step so far
  // The client has nothing to do until the step closes (an async buffer of
  // K > 1 takes one update per client and model version): its polls are held,
  // rather than handed the same version to train again.
  bool wait_for_next_step = false;
};

// A step closed: its record (without the stop condition's verdict), the train
// loss to hand the stop condition, the pushes and downloads to cut off, and
// whether to save the run now.
struct Closing {
  v1::RoundRecord record;
  std::optional<double> loss;
  bool save = true;
  std::vector<std::shared_ptr<CancelHandle>> cancel;
};

// When aggregation steps start and close, who may push and how an update is
// weighted: one implementation per mode (sync rounds; async, buffered every K
// updates). The run controller owns it and calls it under its lock; it returns
// decisions and never calls out. Each step it opens ends in exactly one Close:
// the controller then steps the model (unless abandoned) and asks for the next
// step with WantClients and Open. A `version` argument is the number of model
// versions made so far.
class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // "rounds" or "async", as --mode and the state directory spell them.
  virtual absl::string_view mode() const = 0;

  // Bounds on the updates one step folds, for the strategy's checks at
  // startup: with at most `max_clients` clients alive a step folds at most
  // `max`, and one that completes has folded at least `min`.
  struct StepBounds {
    int min = 1;
    int max = 1;
  };
  virtual StepBounds UpdatesPerStep(int max_clients) const = 0;

  // Whether a step should open now with `alive` clients alive: nullopt when
  // not (too few clients: the run waits for clients), else how many to sample
  // for it (0: none; the step's default task is for everyone).
  virtual std::optional<int> WantClients(int alive) const = 0;
  // Opens a step over the clients sampled (as many as WantClients asked for)
  // to train `weights`, model version `version`.
  virtual Opening Open(std::vector<std::string> sampled, const Weights& weights,
                       const std::shared_ptr<const v1::TrainingPlan>& plan,
                       int64_t version, absl::Time now) = 0;
  virtual bool is_open() const = 0;

  // Admits a push on its header (metrics already checked) before its update is
  // read. FAILED_PRECONDITION for a stale round or an unselected client,
  // ALREADY_EXISTS for a second update; `why` receives the rejection reason.
  virtual absl::StatusOr<Ticket> Admit(const v1::UpdateHeader& header,
                                       std::shared_ptr<CancelHandle> cancel,
                                       int64_t version, Rejection* why) = 0;
  // Accepts the complete update of an admitted push. Errors as Admit, for a
  // push that can no longer count (its round closed, a duplicate won the race,
  // it went too stale while uploading).
  virtual absl::StatusOr<Acceptance> Accept(const Ticket& ticket,
                                            const v1::UpdateHeader& header,
                                            int64_t bytes, int64_t version,
                                            absl::Time now, Rejection* why) = 0;

  // Closes the open step with `outcome` ("quorum", "all", "async", or
  // "abandoned": nothing is applied). `alive` is the number of clients alive.
  virtual Closing Close(absl::string_view outcome, int64_t version, int alive,
                        absl::Time now) = 0;

  // When the open step must close ("abandoned" below quorum);
  // InfiniteFuture when it has no deadline.
  virtual absl::Time deadline() const = 0;

  // When the open step has at least `min_updates` updates (the strategy's
  // minimum, at least 1) and can get no more (every one of the `alive`
  // clients, `is_alive` tells which, has its update in), the outcome to close
  // it with: a step without a deadline then closes with what it has rather
  // than wait for clients that may never come. Empty otherwise.
  virtual absl::string_view Stranded(
      int /*min_updates*/, int /*alive*/,
      const std::function<bool(const std::string&)>& /*is_alive*/) const {
    return {};
  }

  // `successor` is `gone` restarted under a new id: when `gone` was asked to
  // train in the open step and has not answered, `successor` takes its place
  // and gets the returned task; nullopt otherwise.
  virtual std::optional<Task> Replace(const std::string& gone,
                                      const std::string& successor) = 0;

  // A task was handed to `client_id`, `bytes` of weights with it. A TRAIN
  // task's `retire` handle is the scheduler's to return (Closing::cancel,
  // Stop) once the run can no longer use what the client would train.
  virtual void NoteSent(const std::string& client_id, const Task& task,
                        int64_t bytes) = 0;

  // Training stops: no step is open any more; returns the pushes to cut off.
  virtual std::vector<std::shared_ptr<CancelHandle>> Stop() = 0;

  // The open step's record so far ("open"), for GetStatus, its client ids
  // only when `client_ids` (a status without them copies none: 10,000 of
  // them at --fraction=1); `is_gone` tells which clients are gone (they count
  // as dropped if selected and silent).
  virtual std::optional<v1::RoundRecord> OpenRecord(
      absl::Time now, const std::function<bool(const std::string&)>& is_gone,
      bool client_ids) const = 0;
  // The clients a status should show as training: whether one is, and each
  // of them (as many as are training: a status counts them without a pass
  // over every client, and without a copy of their ids).
  virtual bool IsTraining(const std::string& client_id) const = 0;
  virtual void ForEachTraining(
      const std::function<void(const std::string&)>& visit) const = 0;
  std::vector<std::string> Training() const {
    std::vector<std::string> training;
    ForEachTraining(
        [&training](const std::string& id) { training.push_back(id); });
    return training;
  }

  // The run no longer remembers `client_id` (ClientManager::Forget): what is
  // kept about it goes, and a call under its id later is a stranger's.
  virtual void Forget(const std::string& /*client_id*/) {}

  // A resumed run had already made `attempts` attempts at `round` (its
  // records say so): the next attempt at it is numbered after them.
  virtual void ResumeAttempts(int64_t /*round*/, int /*attempts*/) {}
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_SCHEDULER_H_
