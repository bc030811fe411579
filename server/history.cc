#include "server/history.h"

#include <algorithm>
#include <cstddef>
#include <utility>

namespace fedlearn {
namespace {

void Count(Rejection reason, v1::RejectionCounts* r) {
  switch (reason) {
    case Rejection::kStaleRound:
      r->set_stale_round(r->stale_round() + 1);
      break;
    case Rejection::kDuplicate:
      r->set_duplicate(r->duplicate() + 1);
      break;
    case Rejection::kNotSelected:
      r->set_not_selected(r->not_selected() + 1);
      break;
    case Rejection::kInvalid:
      r->set_invalid(r->invalid() + 1);
      break;
    case Rejection::kTooLarge:
      r->set_too_large(r->too_large() + 1);
      break;
    case Rejection::kIncomplete:
      r->set_incomplete(r->incomplete() + 1);
      break;
    case Rejection::kTooSlow:
      r->set_too_slow(r->too_slow() + 1);
      break;
  }
}

}  // namespace

void History::Reject(Rejection reason) {
  Count(reason, &counters_.updates_rejected);
  Count(reason, &attempt_rejected_);
}

std::vector<History::Record> History::Latest(size_t n) const {
  const size_t from = records_.size() - std::min(n, records_.size());
  return {records_.begin() + static_cast<std::ptrdiff_t>(from), records_.end()};
}

void History::Restore(std::vector<v1::RoundRecord> records, int64_t bytes_sent,
                      int64_t bytes_received) {
  records_.clear();
  records_.reserve(records.size());
  for (v1::RoundRecord& r : records) Append(std::move(r));
  bytes_sent_ = bytes_sent;
  bytes_received_ = bytes_received;
}

}  // namespace fedlearn
