#include "server/history.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <limits>
#include <utility>

namespace fedlearn {
namespace {

// Records are packed into blocks of this size; one larger than a quarter of
// it (a round of more than about 650 clients) gets a block of its own, so
// that a block's unused tail stays under a quarter of it.
constexpr size_t kBlockSize = size_t{64} << 10;

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
  // Written by Append from a valid message: parsing cannot fail.
  const bool parsed =
      out->ParseFromArray(data_, client_ids ? size_ : summary_size_);
  assert(parsed);
  (void)parsed;
}

char* History::Reserve(size_t size, Record* record) {
  if (size > kBlockSize / 4) {
    // Its own block; the open one stays open for the records after it.
    std::shared_ptr<char[]> own(new char[size]);
    char* data = own.get();
    record->block_ = std::move(own);
    return data;
  }
  if (block_ == nullptr || kBlockSize - block_used_ < size) {
    block_.reset(new char[kBlockSize]);
    block_used_ = 0;
  }
  char* data = block_.get() + block_used_;
  block_used_ += size;
  record->block_ = block_;
  return data;
}

void History::Append(v1::RoundRecord record) {
  v1::RoundRecord ids;
  ids.mutable_selected_clients()->Swap(record.mutable_selected_clients());
  ids.mutable_accepted_clients()->Swap(record.mutable_accepted_clients());
  const size_t summary_size = record.ByteSizeLong();
  const size_t size = summary_size + ids.ByteSizeLong();
  // A record is bounded by the clients of a round (--max_clients ids).
  assert(size <= std::numeric_limits<uint32_t>::max());
  Record kept;
  char* data = Reserve(size, &kept);
  record.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(data));
  ids.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(data + summary_size));
  kept.data_ = data;
  kept.size_ = static_cast<uint32_t>(size);
  kept.summary_size_ = static_cast<uint32_t>(summary_size);
  records_.push_back(std::move(kept));
  id_bytes_ += size - summary_size;
  if (id_bytes_ > 2 * id_budget_) TrimIds();
  Evict();
}

void History::Evict() {
  while (records_.size() > max_records_ && dropped_ < evictable_before_) {
    const Record& oldest = records_.front();
    if (ids_from_ == 0) {
      id_bytes_ -= oldest.size_ - oldest.summary_size_;
    } else {
      --ids_from_;
    }
    records_.pop_front();
    ++dropped_;
  }
}

void History::AllowEvictionBefore(size_t first) {
  evictable_before_ = first;
  Evict();
}

void History::TrimIds() {
  // The newest record keeps its ids whatever their size.
  while (id_bytes_ > id_budget_ && ids_from_ + 1 < records_.size()) {
    Record& old = records_[ids_from_++];
    if (old.size_ == old.summary_size_) continue;
    id_bytes_ -= old.size_ - old.summary_size_;
    // Its summary copied into the open block: its old block goes once no
    // record or handle holds it.
    Record summary;
    char* data = Reserve(old.summary_size_, &summary);
    std::copy(old.data_, old.data_ + old.summary_size_, data);
    summary.data_ = data;
    summary.size_ = old.summary_size_;
    summary.summary_size_ = old.summary_size_;
    old = std::move(summary);
  }
}

std::vector<History::Record> History::Latest(size_t n) const {
  const size_t from = records_.size() - std::min(n, records_.size());
  return {records_.begin() + static_cast<std::ptrdiff_t>(from), records_.end()};
}

std::vector<History::Record> History::From(size_t first) const {
  return Latest(total() - std::clamp(first, dropped_, total()));
}

void History::Restore(std::vector<v1::RoundRecord> records, int64_t bytes_sent,
                      int64_t bytes_received) {
  records_.clear();
  id_bytes_ = 0;
  ids_from_ = 0;
  dropped_ = 0;
  evictable_before_ = 0;
  for (v1::RoundRecord& r : records) Append(std::move(r));
  bytes_sent_ = bytes_sent;
  bytes_received_ = bytes_received;
}

}  // namespace fedlearn
