#ifndef FEDLEARN_SERVER_ASYNC_SCHEDULER_H_
#define FEDLEARN_SERVER_ASYNC_SCHEDULER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "server/scheduler.h"
#include "server/step_metrics.h"

namespace fedlearn {

// Asynchronous training, buffered as in FedBuff (Nguyen et al. 2022): every
// client that polls trains the latest model; each update is accepted as it
// arrives, and every `buffer` accepted updates make a new model version:
//   Delta = (1/K) sum_k mixing * (1 + s_k)^-staleness_exponent * delta_k,
// s_k being how many versions were made between the weights update k was
// trained from and its arrival. K = 1 applies every update as it arrives (the
// seed's async mode). An update staler than max_staleness (0: no limit) is
// rejected, at its header and again at its commit, and its push is cut off
// while it uploads as soon as it is. Training starts once
// min_clients are alive and goes on with whoever is there: when fewer than K
// clients are alive and every one's update is in, the version is made from
// those (Stranded).
//
// Convergence is judged on windows of as many updates as alive clients (at
// least min_clients): a single update's loss is one client's data. The run is
// saved once a window, and at least every kMaxUnsavedTime of new versions.
// Memory: three integers per client that was sent a task, until the run forgets
// it (--forget_after), the ids of those whose task is outstanding, and the
// handles of pushes and downloads in flight. A download whose update could no
// longer be applied (more than max_staleness behind), or whose version is no
// longer among the newest download_versions, is cut off when the version that
// makes it so is made.
class AsyncScheduler final : public Scheduler {
 public:
  struct Options {
    int min_clients = 2;
    int buffer = 1;       // K
    double mixing = 0.5;  // resolved: never 0
    double staleness_exponent = 0.5;
    int max_staleness = 0;  // 0: no limit
    // Model versions whose downloads are let run (the latest included; 0: no
    // limit).
    int download_versions = 0;
  };
  explicit AsyncScheduler(Options options) : options_(options) {}

  // The most time of applied versions a crash may lose (a save is asked for
  // at the first version made after it).
  static constexpr absl::Duration kMaxUnsavedTime = absl::Seconds(10);

  absl::string_view mode() const override { return "async"; }
  std::optional<int> WantClients(int alive) const override;
  StepBounds UpdatesPerStep(int max_clients) const override {
    (void)max_clients;
    return {options_.buffer, options_.buffer};
  }
  Opening Open(std::vector<std::string> sampled, const Weights& weights,
               const std::shared_ptr<const v1::TrainingPlan>& plan,
               int64_t version, absl::Time now) override;
  bool is_open() const override { return open_; }
  absl::StatusOr<Ticket> Admit(const v1::UpdateHeader& header,
                               std::shared_ptr<CancelHandle> cancel,
                               int64_t version, Rejection* why) override;
  absl::StatusOr<Acceptance> Accept(const Ticket& ticket,
                                    const v1::UpdateHeader& header,
                                    int64_t bytes, int64_t version,
                                    absl::Time now, Rejection* why) override;
  Closing Close(absl::string_view outcome, int64_t version, int alive,
                absl::Time now) override;
  absl::Time deadline() const override { return absl::InfiniteFuture(); }
  // A buffer of K > 1 needs K clients' updates, one each: with fewer alive
  // clients (some died after training started, none came instead) the step
  // is made from every alive client's update.
  absl::string_view Stranded(
      int min_updates, int alive,
      const std::function<bool(const std::string&)>& is_alive) const override;
  void NoteSent(const std::string& client_id, const Task& task,
                int64_t bytes) override;
  // Every client trains the latest model as it asks: nobody to replace.
  std::optional<Task> Replace(const std::string& /*gone*/,
                              const std::string& /*successor*/) override {
    return std::nullopt;
  }
  std::vector<std::shared_ptr<CancelHandle>> Stop() override;
  std::optional<v1::RoundRecord> OpenRecord(
      absl::Time now, const std::function<bool(const std::string&)>& is_gone,
      bool client_ids) const override;
  bool IsTraining(const std::string& client_id) const override;
  void ForEachTraining(
      const std::function<void(const std::string&)>& visit) const override;
  void Forget(const std::string& client_id) override;

  // The factor an update `staleness` versions stale is applied with.
  double Scale(int64_t staleness) const;

 private:
  // Staleness of an update for `round` when `version` versions exist.
  static int64_t Staleness(int64_t round, int64_t version) {
    return version + 1 - round;
  }
  absl::Status CheckStaleness(const std::string& client_id, int64_t round,
                              int64_t version) const;
  // Takes the calls of `by_round`'s rounds before `round` into `cancel`, and
  // forgets those rounds.
  static void CutBefore(int64_t round,
                        std::map<int64_t, InFlightCalls>* by_round,
                        std::vector<std::shared_ptr<CancelHandle>>* cancel);

  // One update per client and model version: with a buffer of K > 1 a client
  // whose update is in waits for the next version (Acceptance::
  // wait_for_next_step), so K updates are K clients' (a robust rule's votes),
  // and an update re-sent after a lost reply is a duplicate. `sent` tells a
  // task from the one before (a client may poll again while its push
  // uploads); a push's ticket carries it from admission to acceptance.
  struct ClientRounds {
    int64_t task = 0;    // round of the TRAIN it was last sent (0: none)
    int64_t pushed = 0;  // round of its last accepted update
    uint64_t sent = 0;   // TRAIN tasks sent to it so far
  };

  const Options options_;
  bool open_ = false;
  bool started_ = false;
  absl::flat_hash_map<std::string, ClientRounds> clients_;
  // Those whose task is outstanding (task != 0): what a status counts as
  // training, without a pass over every client sent a task.
  absl::flat_hash_set<std::string> training_;
  InFlightCalls in_flight_;
  // With a bound (download_versions, max_staleness): TRAIN downloads by task
  // round, older rounds cut off as each version is made, so at most as many
  // rounds as the bound lets run. Without one they go in in_flight_.
  std::map<int64_t, InFlightCalls> downloads_;
  // With max_staleness: admitted pushes by round, cut off as the version that
  // makes them too stale is made, rather than received whole (holding a
  // receive buffer others may wait for) and refused at their commit. Without
  // it they go in in_flight_.
  std::map<int64_t, InFlightCalls> pushes_;
  // The open step (version): its updates so far.
  absl::Time step_start_;
  std::vector<std::string> accepted_;
  StepMetrics metrics_;
  int64_t bytes_sent_ = 0;
  int64_t max_staleness_seen_ = 0;
  double scale_sum_ = 0;
  // The convergence window: updates and their train loss so far.
  WeightedMean window_loss_;
  int window_updates_ = 0;
  // When the last step that asked for a save closed (training's start before).
  absl::Time saved_at_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_ASYNC_SCHEDULER_H_
