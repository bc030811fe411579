#include "server/task_board.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace fedlearn {

TaskBoard::TaskBoard() { default_.type = v1::TASK_TYPE_WAIT; }

const Task& TaskBoard::TaskFor(const std::string& client_id) const {
  auto it = posted_.find(client_id);
  return it == posted_.end() ? default_ : it->second;
}

TaskBoard::Delivery TaskBoard::Take(std::map<uint64_t, Held>::iterator it,
                                    absl::StatusOr<Task> task) {
  Delivery d;
  d.poll_id = it->first;
  d.client_id = std::move(it->second.client_id);
  d.done = std::move(it->second.done);
  d.task = std::move(task);
  by_expiry_.erase({it->second.expiry, it->first});
  auto ids = by_client_.find(d.client_id);
  ids->second.erase(it->first);
  if (ids->second.empty()) by_client_.erase(ids);
  held_.erase(it);
  return d;
}

void TaskBoard::Answer(const std::string& client_id, Deliveries* out) {
  const Task& task = TaskFor(client_id);
  if (task.type == v1::TASK_TYPE_WAIT) return;
  auto ids = by_client_.find(client_id);
  if (ids == by_client_.end()) return;
  // Copied: Take may erase the set.
  const std::vector<uint64_t> polls(ids->second.begin(), ids->second.end());
  for (uint64_t id : polls) out->push_back(Take(held_.find(id), task));
}

TaskBoard::Deliveries TaskBoard::SetDefault(Task task) {
  default_ = std::move(task);
  Deliveries out;
  if (default_.type == v1::TASK_TYPE_WAIT) return out;
  std::vector<std::string> waiting;
  for (const auto& [client_id, ids] : by_client_) {
    if (!posted_.contains(client_id)) waiting.push_back(client_id);
  }
  for (const std::string& client_id : waiting) Answer(client_id, &out);
  return out;
}

TaskBoard::Deliveries TaskBoard::Post(const std::string& client_id, Task task) {
  posted_[client_id] = std::move(task);
  Deliveries out;
  Answer(client_id, &out);
  return out;
}

void TaskBoard::Retract(const std::string& client_id) {
  posted_.erase(client_id);
}

void TaskBoard::RetractAll() { posted_.clear(); }

bool TaskBoard::HasPosted(const std::string& client_id) const {
  return posted_.contains(client_id);
}

TaskBoard::PollResult TaskBoard::Poll(const std::string& client_id,
                                      absl::Time expiry, PollCallback done) {
  PollResult result;
  result.poll_id = next_poll_id_++;
  const Task& task = TaskFor(client_id);
  if (task.type != v1::TASK_TYPE_WAIT) {
    result.now = Delivery{result.poll_id, client_id, std::move(done), task};
    return result;
  }
  held_[result.poll_id] = Held{client_id, expiry, std::move(done)};
  by_expiry_.insert({expiry, result.poll_id});
  absl::flat_hash_set<uint64_t>& mine = by_client_[client_id];
  mine.insert(result.poll_id);
  if (mine.size() > kMaxHeldPerClient) {
    const uint64_t oldest = *std::min_element(mine.begin(), mine.end());
    result.displaced = Take(held_.find(oldest), task);
  }
  return result;
}

std::optional<TaskBoard::Delivery> TaskBoard::Cancel(uint64_t poll_id) {
  auto it = held_.find(poll_id);
  if (it == held_.end()) return std::nullopt;
  return Take(it, absl::CancelledError(absl::StrCat(
                      "client ", it->second.client_id, ": poll cancelled")));
}

TaskBoard::Deliveries TaskBoard::Expire(absl::Time now) {
  Deliveries out;
  while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) {
    auto it = held_.find(by_expiry_.begin()->second);
    out.push_back(Take(it, TaskFor(it->second.client_id)));
  }
  return out;
}

TaskBoard::Deliveries TaskBoard::CloseClient(const std::string& client_id,
                                             const absl::Status& status) {
  Deliveries out;
  auto it = by_client_.find(client_id);
  if (it == by_client_.end()) return out;
  const std::vector<uint64_t> ids(it->second.begin(), it->second.end());
  for (uint64_t id : ids) out.push_back(Take(held_.find(id), status));
  return out;
}

TaskBoard::Deliveries TaskBoard::CloseAll(const absl::Status& status) {
  Deliveries out;
  while (!held_.empty()) {
    const std::string& client_id = held_.begin()->second.client_id;
    out.push_back(Take(
        held_.begin(),
        absl::Status(status.code(), absl::StrCat("client ", client_id, ": ",
                                                 status.message()))));
  }
  return out;
}

absl::Time TaskBoard::NextExpiry() const {
  return by_expiry_.empty() ? absl::InfiniteFuture()
                            : by_expiry_.begin()->first;
}

}  // namespace fedlearn
