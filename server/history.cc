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

void History::Record::CopyTo(v1::RoundRecord* out, bool client_ids) const {
  *out = *summary_;
  if (client_ids) out->MergeFrom(*ids_);  // adds the two lists, nothing else
}

void History::Append(v1::RoundRecord record) {
  auto ids = std::make_shared<v1::RoundRecord>();
  ids->mutable_selected_clients()->Swap(record.mutable_selected_clients());
  ids->mutable_accepted_clients()->Swap(record.mutable_accepted_clients());
  Record kept;
  kept.summary_ = std::make_shared<const v1::RoundRecord>(std::move(record));
  kept.ids_ = std::move(ids);
  records_.push_back(std::move(kept));
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
