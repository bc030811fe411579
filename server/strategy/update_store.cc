#include "server/strategy/update_store.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cassert>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fedlearn {
namespace {

std::string Errno(absl::string_view what, const std::string& dir) {
  return absl::StrCat(what, " in ", dir, ": ", std::strerror(errno));
}

// A file in `dir` that has no name: O_TMPFILE where the file system has it,
// else one made with mkstemp and unlinked at once.
int AnonymousFile(const std::string& dir) {
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) {
    return fd;
  }
  std::string name =
      absl::StrCat(dir, "/", UpdateStore::kSpillPrefix, "XXXXXX");
  fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd >= 0) unlink(name.c_str());
  return fd;
}

bool WriteAll(int fd, const char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, data + done, size - done, done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, char* data, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n =
        pread(fd, data + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

UpdateStore::Staged::Staged(Staged&& other) noexcept {
  *this = std::move(other);
}

UpdateStore::Staged& UpdateStore::Staged::operator=(Staged&& other) noexcept {
  if (this != &other) {
    Release();
    reserved_ = std::exchange(other.reserved_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    memory_ = std::move(other.memory_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

UpdateStore::Staged::~Staged() { Release(); }

void UpdateStore::Staged::Release() {
  if (memory_ != nullptr) {
    memory_.reset();
    reserved_->fetch_sub(bytes_);
  }
  if (fd_ >= 0) close(fd_);  // the file has no name: this frees it
  fd_ = -1;
  bytes_ = 0;
}

UpdateStore::UpdateStore(Options options) : options_(std::move(options)) {}

UpdateStore::~UpdateStore() { Clear(); }

absl::StatusOr<UpdateStore::Staged> UpdateStore::Stage(
    absl::Span<const float> update) {
  assert(update.size() == options_.num_parameters);
  const size_t bytes = bytes_per_update();
  Staged staged;
  staged.bytes_ = bytes;
  // Take a share of the budget if one is left, without a lock.
  size_t in_use = reserved_.load();
  while (in_use + bytes <= options_.memory_budget) {
    if (reserved_.compare_exchange_weak(in_use, in_use + bytes)) {
      staged.reserved_ = &reserved_;
      staged.memory_ = std::make_unique<float[]>(update.size());
      std::memcpy(staged.memory_.get(), update.data(), bytes);
      return staged;
    }
  }
  if (options_.spill_dir.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the aggregation memory budget (", options_.memory_budget,
                     " bytes) is spent and no spill directory is set"));
  }
  staged.fd_ = AnonymousFile(options_.spill_dir);
  if (staged.fd_ < 0) {
    return absl::ResourceExhaustedError(
        Errno("cannot make a spill file", options_.spill_dir));
  }
  if (!WriteAll(staged.fd_, reinterpret_cast<const char*>(update.data()),
                bytes)) {
    return absl::ResourceExhaustedError(
        Errno("cannot write a spill file", options_.spill_dir));
  }
  return staged;
}

void UpdateStore::Keep(Staged staged, double scale) {
  assert(!staged.empty() && scale > 0);
  entries_.push_back(Entry{std::move(staged), scale});
}

int UpdateStore::spilled() const {
  int n = 0;
  for (const Entry& e : entries_) n += e.staged.spilled() ? 1 : 0;
  return n;
}

absl::Status UpdateStore::ReadStripe(size_t begin, size_t length,
                                     absl::Span<float> out) const {
  assert(begin + length <= options_.num_parameters);
  assert(out.size() == entries_.size() * length);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    float* row = out.data() + i * length;
    if (e.staged.memory_ != nullptr) {
      std::memcpy(row, e.staged.memory_.get() + begin, length * 4);
    } else if (!ReadAll(e.staged.fd_, reinterpret_cast<char*>(row), length * 4,
                        static_cast<off_t>(begin * 4))) {
      return absl::DataLossError(absl::StrCat(
          "cannot read spilled update ", i, " back from ", options_.spill_dir,
          ": ", errno != 0 ? std::strerror(errno) : "short file"));
    }
    if (e.scale != 1) {
      for (size_t j = 0; j < length; ++j) {
        row[j] = static_cast<float>(row[j] * e.scale);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace fedlearn
