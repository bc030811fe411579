#ifndef FEDLEARN_SERVER_SYNC_SCHEDULER_H_
#define FEDLEARN_SERVER_SYNC_SCHEDULER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/cohort.h"
#include "server/scheduler.h"

namespace fedlearn {

// Synchronous rounds (FedAvg's): each round samples a cohort of the alive
// clients, posts TRAIN to each, and closes at quorum, when all have pushed, or
// abandoned at its deadline (then retried as the next attempt of the same
// round with a new sample). Only the selected may push, once each, for the
// open round; an update is weighted by its num_examples. Memory: one Cohort.
class SyncScheduler final : public Scheduler {
 public:
  struct Options {
    int min_clients = 2;
    int clients_per_round = 0;  // 0: `fraction` of the alive clients
    double fraction = 1.0;
    double over_selection = 1.0;
    double tolerance = 0.3;
    absl::Duration round_timeout = absl::Minutes(5);
    int rounds_between_validations = 2;  // 0: never
  };
  explicit SyncScheduler(Options options) : options_(options) {}

  absl::string_view mode() const override { return "rounds"; }
  std::optional<int> WantClients(int alive) const override;
  StepBounds UpdatesPerStep(int max_clients) const override;
  Opening Open(std::vector<std::string> sampled, const Weights& weights,
               const std::shared_ptr<const v1::TrainingPlan>& plan,
               int64_t version, absl::Time now) override;
  bool is_open() const override { return cohort_ != nullptr; }
  absl::StatusOr<Ticket> Admit(const v1::UpdateHeader& header,
                               std::shared_ptr<CancelHandle> cancel,
                               int64_t version, Rejection* why) override;
  absl::StatusOr<Acceptance> Accept(const Ticket& ticket,
                                    const v1::UpdateHeader& header,
                                    int64_t bytes, int64_t version,
                                    absl::Time now, Rejection* why) override;
  Closing Close(absl::string_view outcome, int64_t version, int alive,
                absl::Time now) override;
  absl::Time deadline() const override;
  std::optional<Task> Replace(const std::string& gone,
                              const std::string& successor) override;
  void NoteSent(const std::string& client_id, const Task& task,
                int64_t bytes) override;
  std::vector<std::shared_ptr<CancelHandle>> Stop() override;
  std::optional<v1::RoundRecord> OpenRecord(
      absl::Time now, const std::function<bool(const std::string&)>& is_gone,
      bool client_ids) const override;
  bool IsTraining(const std::string& client_id) const override;
  void ForEachTraining(
      const std::function<void(const std::string&)>& visit) const override;
  void ResumeAttempts(int64_t round, int attempts) override {
    last_round_ = round;
    attempt_ = attempts;
  }

 private:
  const Options options_;
  std::unique_ptr<Cohort> cohort_;  // the open attempt, if any
  Task train_;                      // its selected clients' task
  uint64_t step_ = 0;               // attempts opened
  int64_t last_round_ = 0;          // the round of the last attempt opened
  int attempt_ = 0;                 // its attempt number
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_SYNC_SCHEDULER_H_
