#include "server/history.h"

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

void History::Restore(std::vector<v1::RoundRecord> records, int64_t bytes_sent,
                      int64_t bytes_received) {
  records_ = std::move(records);
  bytes_sent_ = bytes_sent;
  bytes_received_ = bytes_received;
}

}  // namespace fedlearn
