#include "common/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace fedlearn {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t size,
                      const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Creates a fresh file next to `path` for writing; its name goes to
// `*temp_path`.
absl::StatusOr<int> CreateTempFile(const std::string& path, int mode,
                                   std::string* temp_path) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0;; ++attempt) {
    *temp_path = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter++);
    const int fd =
        ::open(temp_path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
               static_cast<mode_t>(mode));
    if (fd >= 0) return fd;
    if (errno != EEXIST || attempt >= 100) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("cannot create ", *temp_path));
    }
  }
}

}  // namespace

absl::Status SyncDirectory(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot open directory ", dir));
  }
  if (::fsync(fd.get()) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot fsync directory ", dir));
  }
  return absl::OkStatus();
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int ScopedFd::Close() {
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts,
                                 int mode) {
  std::string temp;
  absl::StatusOr<int> raw_fd = CreateTempFile(path, mode, &temp);
  if (!raw_fd.ok()) return raw_fd.status();
  ScopedFd fd(*raw_fd);
  absl::Status status;
  for (absl::string_view part : parts) {
    if (!status.ok()) break;
    status = WriteAll(fd.get(), part.data(), part.size(), temp);
  }
  if (status.ok() && ::fsync(fd.get()) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync ", temp));
  }
  if (status.ok() && fd.Close() != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot close ", temp));
  }
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = absl::ErrnoToStatus(
        errno, absl::StrCat("cannot rename ", temp, " to ", path));
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(path);
}

absl::Status WriteFileAt(const std::string& path, int64_t offset,
                         absl::string_view bytes, int mode) {
  ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC,
                     static_cast<mode_t>(mode)));
  if (fd.get() < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  const char* data = bytes.data();
  size_t left = bytes.size();
  off_t at = static_cast<off_t>(offset);
  while (left > 0) {
    const ssize_t n = ::pwrite(fd.get(), data, left, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
    }
    data += n;
    left -= static_cast<size_t>(n);
    at += n;
  }
  if (::ftruncate(fd.get(), at) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot truncate ", path));
  }
  if (::fdatasync(fd.get()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot sync ", path));
  }
  if (fd.Close() != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot close ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> LockFileExclusively(const std::string& path, int mode) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  ScopedFd lock(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is locked by another holder"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot lock ", path));
  }
  return lock.Release();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
    }
    if (n == 0) return out;
    out.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace fedlearn
