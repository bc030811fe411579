#ifndef FEDLEARN_COMMON_FILES_H_
#define FEDLEARN_COMMON_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fedlearn {

// A file descriptor closed with the object.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();
  int get() const { return fd_; }
  // Closes now, reporting the error close() gives (which for a written file can
  // be the first sign of a failed write).
  int Close();
  // Gives up ownership: returns the descriptor, which is no longer closed.
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Writes `parts`, one after the other, to `path` so that after a crash `path`
// holds its old contents or the new ones, whole: the bytes go to a fresh
// temporary file in the same directory, which is fsync'ed and renamed over
// `path`, and the directory is fsync'ed too. Errors are errno-derived and name
// the file; nothing is left behind then. A new file gets `mode` less the
// umask.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts,
                                 int mode = 0666);

// Writes `bytes` at `offset` of `path` (created, with `mode` less the umask,
// when missing), cuts the file off after them and fdatasyncs it: for a file
// that only grows, whose reader is told elsewhere how much of it is valid (a
// log whose length a later, atomic write names). Not atomic: after a crash the
// file from `offset` on may hold any part of the bytes. Errno-derived errors
// naming the file.
absl::Status WriteFileAt(const std::string& path, int64_t offset,
                         absl::string_view bytes, int mode = 0666);

// fsyncs the directory that holds `path`, so that `path`'s entry in it (a
// file or directory just made or renamed there) survives a crash.
absl::Status SyncDirectory(const std::string& path);

// Opens `path` (created, with `mode` less the umask, when missing) and takes
// an exclusive flock on it without waiting. The returned descriptor holds the
// lock until it is closed or the process ends, however it ends, so a crashed
// holder never leaves it taken. FAILED_PRECONDITION when another open file
// holds it (another process, or another open of it in this one); other
// errno-derived codes naming the file.
absl::StatusOr<int> LockFileExclusively(const std::string& path,
                                        int mode = 0644);

// The whole file. NOT_FOUND when it does not exist; other errno-derived codes.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_FILES_H_
