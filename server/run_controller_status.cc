// RunController's status: GetStatus and what it reads (the client page and
// history size a request asks for). Split from run_controller.cc, whose job is
// the run itself; this file only reads it, under the same lock.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/run_controller.h"  // what it defines: part of RunController

namespace fedlearn {

namespace {

absl::StatusOr<ClientPage> ParseClientPage(int64_t size,
                                           absl::string_view token) {
  static constexpr int kDefault = 100;
  static constexpr int kMax = 1000;
  if (size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_page_size ", size, " is negative"));
  }
  ClientPage page;
  page.size =
      size == 0 ? kDefault : static_cast<int>(std::min<int64_t>(size, kMax));
  if (!token.empty() && (!absl::SimpleAtoi(token, &page.first_index) ||
                         absl::StrCat(page.first_index) != token)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client_page_token \"", token, "\" is not one a status reply gave"));
  }
  return page;
}

absl::StatusOr<size_t> ParseHistorySize(int64_t size) {
  if (size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("history_size ", size, " is negative"));
  }
  if (size == 0) return kDefaultHistory;
  return static_cast<size_t>(std::min<int64_t>(size, kMaxHistory));
}

}  // namespace

absl::StatusOr<StatusQuery> ParseStatusRequest(
    const v1::GetStatusRequest& request) {
  StatusQuery query;
  absl::StatusOr<ClientPage> page =
      ParseClientPage(request.client_page_size(), request.client_page_token());
  if (!page.ok()) return page.status();
  query.page = *page;
  absl::StatusOr<size_t> history = ParseHistorySize(request.history_size());
  if (!history.ok()) return history.status();
  query.history = *history;
  query.client_ids = request.client_ids();
  return query;
}

v1::GetStatusResponse RunController::GetStatus(const ClientPage& page,
                                               RunCounters* counters,
                                               size_t history, bool client_ids,
                                               size_t history_bytes) const {
  v1::GetStatusResponse status;
  std::vector<History::Record> records;
  {
    absl::MutexLock lock(&mu_);
    records = history_.Latest(history);
    status.set_history_total(static_cast<int64_t>(history_.total()));
    StatusLocked(page, counters, client_ids, &status);
  }
  // The newest that fit in `history_bytes` (the newest one always).
  size_t bytes = 0, fit = 0;
  for (auto it = records.rbegin(); it != records.rend(); ++it, ++fit) {
    bytes += it->WireSize(client_ids);
    if (fit > 0 && bytes > history_bytes) break;
  }
  // The records are immutable: copied without the lock.
  status.mutable_history()->Reserve(static_cast<int>(fit));
  for (size_t i = records.size() - fit; i < records.size(); ++i) {
    records[i].CopyTo(status.add_history(), client_ids);
  }
  return status;
}

void RunController::StatusLocked(const ClientPage& page, RunCounters* counters,
                                 bool client_ids,
                                 v1::GetStatusResponse* out) const {
  v1::GetStatusResponse& status = *out;
  status.set_run_id(run_id_);
  *status.mutable_model() = spec_proto_;
  status.set_strategy(strategy_.name);
  status.set_strategy_config(strategy_.config.ShortDebugString());
  const absl::Time now = absl::Now();  // under the lock: no client seen later
  status.set_phase(phase_);
  status.set_round(RoundLocked());
  status.set_stop_reason(stop_reason_);
  auto is_gone = [this, now](const std::string& id)
                     ABSL_NO_THREAD_SAFETY_ANALYSIS {
                       const Client* c = clients_.Find(id);
                       return c == nullptr || !clients_.IsAlive(*c, now);
                     };
  const Cohort* evaluating = evaluation_.cohort();
  if (evaluating != nullptr) {
    int gone = 0;
    for (const std::string& id : evaluating->selected()) {
      if (!evaluating->HasAnswered(id) && is_gone(id)) ++gone;
    }
    v1::RoundRecord record = evaluating->Record("open", now, gone, client_ids);
    record.set_evaluation(true);
    *record.mutable_rejected() = history_.attempt_rejections();
    *status.mutable_current_round() = std::move(record);
  } else if (std::optional<v1::RoundRecord> open =
                 scheduler_->OpenRecord(now, is_gone, client_ids);
             open.has_value()) {
    *open->mutable_rejected() = history_.attempt_rejections();
    *status.mutable_current_round() = *std::move(open);
  }
  if (final_evaluation_.has_value()) {
    *status.mutable_final_evaluation() = *final_evaluation_;
  }
  if (strategy_.dp.enabled()) {
    privacy_.Fill(strategy_.dp_aggregator->clip_norm(),
                  status.mutable_privacy());
  }
  status.set_bytes_received(history_.bytes_received());
  status.set_bytes_sent(history_.bytes_sent());
  if (counters != nullptr) *counters = history_.counters();
  // Every client is counted, from the kept alive count and the open attempt's
  // clients (what a status costs grows with the attempt and the page, not
  // with every client joined); only the page's are listed.
  const ClientManager::ByIndex& all = clients_.clients();
  auto is_alive = [this, now](const std::string& id)
                      ABSL_NO_THREAD_SAFETY_ANALYSIS {
                        const Client* c = clients_.Find(id);
                        return c != nullptr && clients_.IsAlive(*c, now);
                      };
  v1::ClientCounts* counts = status.mutable_client_counts();
  const int joined = static_cast<int>(clients_.joined());
  const int alive = clients_.CountAlive(now);
  int num_evaluating = 0, num_training = 0;
  if (evaluating != nullptr) {
    for (const std::string& id : evaluating->selected()) {
      if (!evaluating->HasAnswered(id) && is_alive(id)) ++num_evaluating;
    }
  }
  if (phase_ == v1::PHASE_TRAINING) {
    scheduler_->ForEachTraining(
        [&is_alive, &num_training](const std::string& id) {
          if (is_alive(id)) ++num_training;
        });
  }
  counts->set_joined(joined);
  counts->set_gone(joined - alive);
  counts->set_evaluating(num_evaluating);
  counts->set_training(num_training);
  counts->set_ready(alive - num_evaluating - num_training);
  auto it = all.lower_bound(page.first_index);
  for (int listed = 0; it != all.end() && listed < page.size; ++it, ++listed) {
    const Client& c = *it->second;
    absl::string_view state = "ready";
    if (!clients_.IsAlive(c, now)) {
      state = "gone";
    } else if (evaluating != nullptr && evaluating->IsSelected(c.id) &&
               !evaluating->HasAnswered(c.id)) {
      state = "evaluating";
    } else if (phase_ == v1::PHASE_TRAINING && scheduler_->IsTraining(c.id)) {
      state = "training";
    }
    v1::ClientInfo* info = status.add_clients();
    info->set_client_id(c.id);
    info->set_display_name(c.display_name);
    info->set_state(std::string(state));
    info->set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - c.last_seen));
    info->set_rounds_contributed(c.rounds_contributed);
    info->set_batches_done(c.batches_done);
    info->set_batches_total(c.batches_total);
    info->set_polling(c.active_polls > 0);
    // Under DP a client's own norm is a statistic no noise covers.
    if (!strategy_.dp.enabled()) info->set_last_update_norm(c.last_update_norm);
    info->set_last_update_round(c.last_update_round);
  }
  if (it != all.end()) {
    status.set_next_client_page_token(absl::StrCat(it->first));
  }
}

}  // namespace fedlearn
